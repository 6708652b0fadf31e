// Pure save planning: from what every rank holds to who writes what (no MPI, no HDF5).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "h5ckpt/status.h"
#include "h5ckpt/types.h"

namespace h5ckpt::planner {

/// One item as a rank describes it for planning.
struct ItemDesc {
  std::string key;
  DType dtype = DType::kF32;
  Shape global_shape;
  ShardSpec shard;
  /// Another piece of the previous description's item (StateItem::pieces): the same key again
  /// on this rank, which is otherwise an error.
  bool continues = false;
  /// Local only (not sent to the coordinator): the rank's item whose buffer holds the bytes
  /// (-1: the description's own index) and where the shard's first element is in that buffer.
  int source = -1;
  uint64_t buffer_offset = 0;
};

/// A unique saved region of a tensor and the rank chosen to write it.
struct PlannedRegion {
  ShardSpec shard;
  int writer = -1;
};

/// One dataset of the checkpoint.
struct TensorPlan {
  std::string key;
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<PlannedRegion> regions;  ///< disjoint, covering the whole tensor

  /// Bytes of the whole dataset (the planner has checked the product does not overflow).
  uint64_t nbytes() const {
    uint64_t n = dtype_size(dtype);
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
  }
};

/// One write a rank performs, as plain data: a region of the plan, or a flat sub-range of its
/// box when the region is larger than the piece limit. The dataset's file offset is known only
/// once HDF5 has created it, so the engine looks it up by `tensor`.
struct WriteItem {
  int tensor = -1;          ///< index into the plan's tensors
  int region = -1;          ///< index into that tensor's regions
  int item = -1;            ///< index into the writer's own items: the source buffer
  ShardSpec box;            ///< the elements written (in the dataset's global coordinates)
  uint64_t src_offset = 0;  ///< byte offset of the first element in the source buffer
  uint64_t bytes = 0;
  bool region_end = true;  ///< the last write of its region (the region's checksum is complete)
};

/// Each rank derives its own writes from `tensors` with plan_writes (the coordinator does not
/// list them: at 10,000 ranks that list alone would cost it more than the plan).
struct SavePlan {
  std::vector<TensorPlan> tensors;      ///< sorted by key
  std::vector<uint64_t> bytes_by_rank;  ///< bytes each rank writes
};

/// Checks a key's syntax: non-empty, letters/digits/"_.-/", no empty component, not under "meta".
Status validate_key(const std::string& key);

/// Builds the global save plan from every rank's item list (index = rank).
/// Checks: keys valid and unique per rank, shards inside their shapes, dtype and global shape
/// agree across ranks, no key is a group prefix of another, regions are identical or disjoint,
/// and they cover each tensor completely. Identical regions (replicas) are written once, each
/// by one of its holders chosen worst-fit by bytes so the write work is balanced.
Result<SavePlan> plan_save(const std::vector<std::vector<ItemDesc>>& ranks);
/// The same plan, made from item lists the caller gives up (the coordinator's gathered copy):
/// each region's shard is moved into the plan instead of copied, which leaves the items' shards
/// in a valid but unspecified state (the caller frees them when it likes: not inside this call).
Result<SavePlan> plan_save(std::vector<std::vector<ItemDesc>>&& ranks);

/// The writes of `rank` in a global plan: every region it was chosen to write, found through its
/// own `items` (O(items x log tensors + their tensors' regions), not O(every region)), in plan
/// order (tensor, region, offset), each at most `max_bytes` (regions above that become consecutive
/// flat sub-ranges). An item whose key the plan lacks, or a region chosen for this rank that
/// differs from its item, is a planning bug and reported as kInternal. (plan_save chooses writers
/// among a region's holders only, so a region of a key the rank does not hold is never its.)
Result<std::vector<WriteItem>> plan_writes(int rank, const std::vector<TensorPlan>& tensors,
                                           const std::vector<ItemDesc>& items, uint64_t max_bytes);

}  // namespace h5ckpt::planner
