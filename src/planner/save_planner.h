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
};

/// What one rank writes: region `region` of tensor `tensor`, from its local item `item`.
struct WriteAssignment {
  int tensor = -1;
  int region = -1;
  int item = -1;
};

struct SavePlan {
  std::vector<TensorPlan> tensors;                    ///< sorted by key
  std::vector<std::vector<WriteAssignment>> by_rank;  ///< index = rank
  std::vector<uint64_t> bytes_by_rank;                ///< bytes each rank writes
};

/// Checks a key's syntax: non-empty, letters/digits/"_.-/", no empty component, not under "meta".
Status validate_key(const std::string& key);

/// Builds the global save plan from every rank's item list (index = rank).
/// Checks: keys valid and unique per rank, shards inside their shapes, dtype and global shape
/// agree across ranks, no key is a group prefix of another, regions are identical or disjoint,
/// and they cover each tensor completely. Identical regions (replicas) are written once, each
/// by one of its holders chosen worst-fit by bytes so the write work is balanced.
Result<SavePlan> plan_save(const std::vector<std::vector<ItemDesc>>& ranks);

}  // namespace h5ckpt::planner
