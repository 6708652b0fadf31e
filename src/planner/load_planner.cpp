#include "planner/load_planner.h"

#include <algorithm>
#include <numeric>
#include <unordered_map>

namespace h5ckpt::planner {

LoadPlan plan_load(const std::vector<std::vector<LoadRequest>>& ranks, bool deduplicate) {
  LoadPlan plan;
  std::unordered_map<std::string, size_t> by_sig;
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (size_t i = 0; i < ranks[r].size(); ++i) {
      const LoadRequest& q = ranks[r][i];
      size_t g = plan.groups.size();
      if (deduplicate) {
        auto [it, fresh] = by_sig.try_emplace(q.signature, g);
        g = it->second;
        if (fresh) plan.groups.push_back(LoadGroup{{}, -1, q.bytes});
      } else {
        plan.groups.push_back(LoadGroup{{}, -1, q.bytes});
      }
      plan.groups[g].members.push_back({static_cast<int>(r), static_cast<int>(i)});
    }
  }
  plan.read_bytes_by_rank.assign(ranks.size(), 0);
  std::vector<size_t> order(plan.groups.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return plan.groups[a].bytes > plan.groups[b].bytes; });
  for (size_t g : order) {
    LoadGroup& grp = plan.groups[g];
    int best = grp.members[0].rank;
    for (const auto& m : grp.members)
      if (plan.read_bytes_by_rank[m.rank] < plan.read_bytes_by_rank[best]) best = m.rank;
    grp.reader = best;
    plan.read_bytes_by_rank[best] += grp.bytes;
  }
  return plan;
}

}  // namespace h5ckpt::planner
