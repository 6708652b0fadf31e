#include "planner/load_planner.h"

#include <algorithm>
#include <numeric>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "planner/box_math.h"
#include "util/checked_math.h"

namespace h5ckpt::planner {

namespace {

// Appends a value's bytes: the signature is compared, never parsed.
template <class T>
void append(std::string& s, const T& v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void append_shape(std::string& s, const Shape& v) {
  append<uint64_t>(s, v.size());
  s.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
}

}  // namespace

LoadRequest make_request(const LoadWant& want) {
  const ItemDesc& d = want.desc;
  LoadRequest q;
  q.signature.reserve(d.key.size() + 96);
  append<uint64_t>(q.signature, d.key.size());
  q.signature += d.key;
  append<uint8_t>(q.signature, static_cast<uint8_t>(d.dtype));
  append_shape(q.signature, d.global_shape);
  append_shape(q.signature, d.shard.box.offset);
  append_shape(q.signature, d.shard.box.shape);
  append<int64_t>(q.signature, d.shard.flat ? d.shard.flat->first : -1);
  append<int64_t>(q.signature, d.shard.flat ? d.shard.flat->second : -1);
  append<uint8_t>(q.signature, static_cast<uint8_t>((want.pad ? 1 : 0) | (want.on_device ? 2 : 0)));
  q.bytes = static_cast<uint64_t>(d.shard.numel()) * dtype_size(d.dtype);
  return q;
}

LoadPlan plan_load(const std::vector<std::vector<LoadRequest>>& ranks, bool deduplicate) {
  LoadPlan plan;
  size_t total = 0;
  for (const auto& r : ranks) total += r.size();
  // Views of the requests' own signatures: millions of requests at 10,000 ranks, none copied.
  std::unordered_map<std::string_view, size_t> by_sig;
  if (deduplicate) by_sig.reserve(total);
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
  // Largest groups first, ties in group order (what a stable sort by bytes gives), sorted as
  // compact (bytes, group) pairs rather than through the groups.
  std::vector<std::pair<uint64_t, size_t>> order(plan.groups.size());
  for (size_t g = 0; g < order.size(); ++g) order[g] = {plan.groups[g].bytes, g};
  std::sort(order.begin(), order.end(),
            [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  for (const auto& [bytes, g] : order) {
    LoadGroup& grp = plan.groups[g];
    int best = grp.members[0].rank;
    for (const auto& m : grp.members)
      if (plan.read_bytes_by_rank[m.rank] < plan.read_bytes_by_rank[best]) best = m.rank;
    grp.reader = best;
    plan.read_bytes_by_rank[best] += grp.bytes;
  }
  return plan;
}

std::vector<std::vector<ItemRole>> assign_roles(const LoadPlan& plan, const std::vector<std::vector<int>>& item_of,
                                                const std::vector<size_t>& items) {
  std::vector<std::vector<ItemRole>> roles(items.size());
  for (size_t r = 0; r < items.size(); ++r) roles[r].resize(items[r]);
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    const LoadGroup& grp = plan.groups[g];
    for (const auto& m : grp.members) {
      ItemRole& role = roles[m.rank][item_of[m.rank][m.item]];
      role.group = static_cast<int32_t>(g);
      if (m.rank == grp.reader) {
        role.role = Role::kRead;
        for (const auto& o : grp.members)
          if (o.rank != grp.reader) role.targets.push_back(o.rank);
      } else {
        role.role = Role::kReceive;
        role.peer = grp.reader;
      }
    }
  }
  return roles;
}

std::vector<Box> wanted_boxes(const StoredTensor& stored, const LoadWant& want) {
  Box readable{Shape(stored.shape.size(), 0), stored.shape};
  if (stored.shape != want.desc.global_shape)
    for (size_t d = 0; d < stored.shape.size() && d < want.desc.global_shape.size(); ++d)
      readable.shape[d] = std::min(stored.shape[d], want.desc.global_shape[d]);
  std::vector<Box> parts;
  for (const Box& box : shard_boxes(want.desc.shard))
    if (auto part = intersect(box, readable)) parts.push_back(*part);
  return parts;
}

RankLoadPlan plan_rank_load(const std::vector<ItemRole>& roles, const std::vector<LoadWant>& wants,
                            const std::vector<StoredTensor>& stored, bool file_order) {
  RankLoadPlan plan;
  for (size_t i = 0; i < roles.size(); ++i) {
    const ItemRole& role = roles[i];
    if (role.role == Role::kSkip) {
      plan.skipped.push_back(static_cast<int>(i));
      continue;
    }
    const LoadWant& want = wants[i];
    ReadItem r;
    r.item = static_cast<int>(i);
    r.role = role.role;
    r.group = role.group;
    r.on_device = want.on_device;
    r.bytes = static_cast<uint64_t>(want.desc.shard.numel()) * dtype_size(want.desc.dtype);
    if (role.role == Role::kRead) {
      r.receivers.assign(role.targets.begin(), role.targets.end());
      r.stored = stored[i];
      r.zero_fill = stored[i].shape != want.desc.global_shape;
      r.boxes = wanted_boxes(stored[i], want);
    } else {
      r.reader = role.peer;
    }
    plan.items.push_back(std::move(r));
  }
  std::stable_sort(plan.items.begin(), plan.items.end(),
                   [](const ReadItem& a, const ReadItem& b) { return a.group < b.group; });
  for (size_t k = 0; k < plan.items.size(); ++k)
    if (plan.items[k].role == Role::kRead) plan.read_order.push_back(k);
  if (file_order)
    std::stable_sort(plan.read_order.begin(), plan.read_order.end(), [&](size_t a, size_t b) {
      return plan.items[a].stored.file_offset < plan.items[b].stored.file_offset;
    });
  return plan;
}

std::string RankLoadPlan::describe(const std::vector<LoadWant>& wants) const {
  std::ostringstream o;
  for (const ReadItem& r : items) {
    o << "group " << r.group << " '" << wants[r.item].desc.key << "' " << to_string_spec(wants[r.item].desc.shard)
      << (r.on_device ? " device" : " host") << ' ' << r.bytes << " B: ";
    if (r.role == Role::kRead) {
      o << "read " << r.boxes.size() << " box(es) at file offset " << r.stored.file_offset;
      if (r.zero_fill) o << " (zero-filled)";
      if (!r.receivers.empty()) {
        o << ", send to";
        for (int t : r.receivers) o << ' ' << t;
      }
    } else {
      o << "receive from " << r.reader;
    }
    o << '\n';
  }
  for (int i : skipped) o << "skip '" << wants[i].desc.key << "' (not in the checkpoint)\n";
  return o.str();
}

}  // namespace h5ckpt::planner
