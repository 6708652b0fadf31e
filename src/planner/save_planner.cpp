#include "planner/save_planner.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <queue>
#include <set>
#include <string_view>
#include <unordered_map>

#include "planner/box_math.h"
#include "planner/region_overlap.h"
#include "util/checked_math.h"

namespace h5ckpt::planner {

// Keys become HDF5 link paths and appear in every message and metadata entry: bounded.
constexpr size_t kMaxKeyLength = 1024;

Status validate_key(const std::string& key) {
  auto bad = [&](const std::string& why) { return Status(ErrorCode::kInvalidArgument, "key '" + key + "': " + why); };
  if (key.empty()) return bad("empty key");
  if (key.size() > kMaxKeyLength) return bad("longer than " + std::to_string(kMaxKeyLength) + " characters");
  for (char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '.' || c == '-' || c == '/';
    if (!ok) return bad(std::string("character '") + c + "' not allowed (letters, digits, _ . - /)");
  }
  if (key.front() == '/' || key.back() == '/' || key.find("//") != std::string::npos)
    return bad("empty path component");
  if (key == "meta" || key.rfind("meta/", 0) == 0) return bad("the 'meta' group is reserved");
  size_t start = 0;
  while (start <= key.size()) {
    size_t end = key.find('/', start);
    if (end == std::string::npos) end = key.size();
    const std::string comp = key.substr(start, end - start);
    if (comp == "." || comp == "..") return bad("'.' and '..' components not allowed");
    start = end + 1;
  }
  return Status::Ok();
}

namespace {

struct Holder {
  int rank;
  int item;
};

// A unique region of one tensor and the ranks holding it.
struct UniqueRegion {
  ShardSpec shard;
  int64_t bytes = 0;
  std::vector<Holder> holders;
};

std::string region_signature(const ShardSpec& s) {
  std::string sig;
  for (auto v : s.box.offset) sig += std::to_string(v) + ",";
  sig += "|";
  for (auto v : s.box.shape) sig += std::to_string(v) + ",";
  if (s.flat) sig += "|" + std::to_string(s.flat->first) + "-" + std::to_string(s.flat->second);
  return sig;
}

// Coverage by element counts, disjointness by planner::find_overlap (O(n log n) for the usual
// layouts: 100k one-row shards of a tensor would take minutes pairwise).
Status check_disjoint_and_complete(const std::string& key, const Shape& shape,
                                   const std::vector<UniqueRegion>& regions) {
  int64_t total = 1;
  for (auto s : shape)
    if (s < 0 || !checked_mul(total, s, &total))
      return Status(ErrorCode::kInvalidArgument,
                    "key '" + key + "': global shape " + to_string_shape(shape) + " has too many elements");
  std::vector<Box> pieces;
  std::vector<size_t> region_of;
  int64_t covered = 0;
  for (size_t r = 0; r < regions.size(); ++r) {
    for (auto& b : shard_boxes(regions[r].shard)) {
      pieces.push_back(std::move(b));
      region_of.push_back(r);
    }
    if (!checked_add(covered, regions[r].shard.numel(), &covered)) covered = INT64_MAX;
  }
  auto overlap = find_overlap(shape, pieces);
  if (!overlap.ok()) return overlap.status().with_context("key '" + key + "'");
  if (*overlap) {  // pieces of one region never overlap: these are two regions
    const auto& a = regions[region_of[(*overlap)->first]];
    const auto& b = regions[region_of[(*overlap)->second]];
    return Status(ErrorCode::kInvalidArgument, "key '" + key + "': shard " + to_string_spec(a.shard) + " on rank " +
                                                   std::to_string(a.holders[0].rank) + " overlaps shard " +
                                                   to_string_spec(b.shard) + " on rank " +
                                                   std::to_string(b.holders[0].rank) +
                                                   " without being identical (replicas must hold identical regions)");
  }
  if (covered != total)
    return Status(ErrorCode::kInvalidArgument, "key '" + key + "': the ranks' shards cover " + std::to_string(covered) +
                                                   " of " + std::to_string(total) + " elements of global shape " +
                                                   to_string_shape(shape));
  return Status::Ok();
}

}  // namespace

Result<SavePlan> plan_save(const std::vector<std::vector<ItemDesc>>& ranks) {
  struct TensorAcc {
    DType dtype;
    Shape shape;
    int first_rank;
    std::vector<UniqueRegion> regions;
    std::unordered_map<std::string, size_t> by_sig;
  };
  std::map<std::string, TensorAcc> tensors;  // sorted by key: every rank creates datasets in this order

  for (size_t r = 0; r < ranks.size(); ++r) {
    std::set<std::string> seen;
    for (size_t i = 0; i < ranks[r].size(); ++i) {
      const ItemDesc& it = ranks[r][i];
      const std::string where = " (rank " + std::to_string(r) + ")";
      if (auto st = validate_key(it.key); !st.ok()) return st.with_context("rank " + std::to_string(r));
      if (!seen.insert(it.key).second)
        return Status(ErrorCode::kInvalidArgument, "key '" + it.key + "' added twice" + where);
      if (auto st = it.shard.validate(it.global_shape); !st.ok())
        return st.with_context("key '" + it.key + "'" + where);
      auto [pos, inserted] = tensors.try_emplace(it.key, TensorAcc{it.dtype, it.global_shape, (int)r, {}, {}});
      TensorAcc& acc = pos->second;
      if (!inserted && acc.dtype != it.dtype)
        return Status(ErrorCode::kDtypeMismatch, "key '" + it.key + "': dtype " + dtype_name(acc.dtype) + " on rank " +
                                                     std::to_string(acc.first_rank) + " but " + dtype_name(it.dtype) +
                                                     " on rank " + std::to_string(r));
      if (!inserted && acc.shape != it.global_shape)
        return Status(ErrorCode::kShapeMismatch, "key '" + it.key + "': global shape " + to_string_shape(acc.shape) +
                                                     " on rank " + std::to_string(acc.first_rank) + " but " +
                                                     to_string_shape(it.global_shape) + " on rank " +
                                                     std::to_string(r));
      if (it.shard.numel() == 0) continue;  // holds nothing of this tensor
      const std::string sig = region_signature(it.shard);
      auto [rp, fresh] = acc.by_sig.try_emplace(sig, acc.regions.size());
      if (fresh) {
        int64_t bytes = 0;
        if (!checked_mul(it.shard.numel(), static_cast<int64_t>(dtype_size(it.dtype)), &bytes))
          return Status(ErrorCode::kInvalidArgument, "key '" + it.key + "': shard has too many bytes" + where);
        acc.regions.push_back(UniqueRegion{it.shard, bytes, {}});
      }
      acc.regions[rp->second].holders.push_back(Holder{(int)r, (int)i});
    }
  }

  // A key may not be both a dataset and a group ("a" and "a/b"): look up every '/' prefix.
  for (const auto& [key, acc] : tensors) {
    for (size_t pos = key.find('/'); pos != std::string::npos; pos = key.find('/', pos + 1)) {
      if (tensors.count(key.substr(0, pos)))
        return Status(ErrorCode::kInvalidArgument,
                      "key '" + key.substr(0, pos) + "' is also a group prefix of key '" + key + "'");
    }
  }

  SavePlan plan;
  plan.by_rank.resize(ranks.size());
  plan.bytes_by_rank.assign(ranks.size(), 0);
  struct Job {
    int tensor, region;
    int64_t bytes;
  };
  std::vector<Job> jobs;
  for (auto& [key, acc] : tensors) {
    H5CKPT_RETURN_IF_ERROR(check_disjoint_and_complete(key, acc.shape, acc.regions));
    TensorPlan tp{key, acc.dtype, acc.shape, {}};
    for (size_t r = 0; r < acc.regions.size(); ++r) {
      tp.regions.push_back(PlannedRegion{acc.regions[r].shard, -1});
      jobs.push_back(Job{(int)plan.tensors.size(), (int)r, acc.regions[r].bytes});
    }
    plan.tensors.push_back(std::move(tp));
  }

  // Worst-fit balancing: largest regions first, each to its least-loaded holder.
  std::stable_sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.bytes > b.bytes; });
  std::vector<const TensorAcc*> accs;
  std::vector<std::vector<int>> writer_item;  // [tensor][region]: the writer's item index
  for (auto& [key, acc] : tensors) {
    accs.push_back(&acc);
    writer_item.emplace_back(acc.regions.size(), -1);
  }
  for (const Job& j : jobs) {
    const UniqueRegion& ur = accs[j.tensor]->regions[j.region];
    const Holder* best = &ur.holders[0];
    for (const Holder& h : ur.holders)
      if (plan.bytes_by_rank[h.rank] < plan.bytes_by_rank[best->rank]) best = &h;
    plan.tensors[j.tensor].regions[j.region].writer = best->rank;
    plan.bytes_by_rank[best->rank] += j.bytes;
    writer_item[j.tensor][j.region] = best->item;
  }
  // What plan_writes gives each rank with unlimited pieces, made in one pass over the regions
  // (plan_writes per rank would scan every region once per rank).
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    const uint64_t es = dtype_size(plan.tensors[t].dtype);
    for (size_t r = 0; r < plan.tensors[t].regions.size(); ++r) {
      const PlannedRegion& reg = plan.tensors[t].regions[r];
      plan.by_rank[reg.writer].push_back(WriteItem{static_cast<int>(t), static_cast<int>(r), writer_item[t][r],
                                                   reg.shard, 0, static_cast<uint64_t>(reg.shard.numel()) * es, true});
    }
  }
  return plan;
}

Result<std::vector<WriteItem>> plan_writes(int rank, const std::vector<TensorPlan>& tensors,
                                           const std::vector<ItemDesc>& items, uint64_t max_bytes) {
  std::unordered_map<std::string_view, int> item_of;
  item_of.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) item_of.emplace(items[i].key, static_cast<int>(i));
  std::vector<WriteItem> out;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const uint64_t es = dtype_size(tensors[t].dtype);
    const int64_t per = static_cast<int64_t>(std::clamp<uint64_t>(max_bytes / es, 1, INT64_MAX));
    for (size_t r = 0; r < tensors[t].regions.size(); ++r) {
      const PlannedRegion& reg = tensors[t].regions[r];
      if (reg.writer != rank) continue;
      auto found = item_of.find(tensors[t].key);
      if (found == item_of.end() || !(items[found->second].shard == reg.shard))
        return Status(ErrorCode::kInternal, "key '" + tensors[t].key + "': rank " + std::to_string(rank) +
                                                " was chosen to write a region it does not hold");
      const int item = found->second;
      const int64_t n = reg.shard.numel();
      if (n <= per) {  // the common case: the region in one write, as planned
        out.push_back(WriteItem{(int)t, (int)r, item, reg.shard, 0, static_cast<uint64_t>(n) * es, true});
        continue;
      }
      // A large region: consecutive flat sub-ranges of its box, each a few hyperslabs.
      const int64_t b0 = reg.shard.flat ? reg.shard.flat->first : 0;
      for (int64_t b = 0; b < n; b += per) {
        const int64_t e = std::min(n, b + per);
        out.push_back(WriteItem{(int)t, (int)r, item, ShardSpec::flat_range(reg.shard.box, b0 + b, b0 + e),
                                static_cast<uint64_t>(b) * es, static_cast<uint64_t>(e - b) * es, e == n});
      }
    }
  }
  return out;
}

}  // namespace h5ckpt::planner
