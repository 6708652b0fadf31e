// Region indexes of a checkpoint's tensors, built on first use: which saved regions a read of a
// box touches, without testing every region of the tensor (storage::checked_spans). One per
// reading thread (it is not locked), over metadata that outlives it and is not modified while
// the lookup is in use.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "h5ckpt/checkpoint_info.h"
#include "planner/region_index.h"

namespace h5ckpt::storage {

class RegionLookup {
 public:
  explicit RegionLookup(const CheckpointInfo& info) : info_(&info), indexes_(info.tensors.size()) {}

  /// The index of `t`'s regions when `t` is one of this checkpoint's tensors, else nullptr (the
  /// caller then tests every region).
  const planner::RegionIndex* of(const TensorInfo& t);

 private:
  const CheckpointInfo* info_;
  std::vector<std::unique_ptr<planner::RegionIndex>> indexes_;  // by tensor position
};

}  // namespace h5ckpt::storage
