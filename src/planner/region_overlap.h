// Disjointness of many n-D boxes in O(n log n): shared by the save planner (the ranks' shards)
// and the metadata reader (a checkpoint's recorded regions), which may hold 100k regions.
#pragma once

#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "h5ckpt/status.h"
#include "h5ckpt/types.h"

namespace h5ckpt::planner {

/// Two boxes of `boxes` that share an element, or nullopt when all are pairwise disjoint.
/// Every box must have the rank of `shape` and lie inside it; empty boxes never overlap.
/// Boxes that are rectangles once dims 1.. are flattened (row blocks, column blocks of 2-D
/// tensors, flat-range pieces, anything with full trailing dims) take O(n log n); others fall
/// back to a sweep along dim 0 with a bounded number of pairwise tests, past which the answer is
/// kUnsupported ("too fragmented") rather than minutes of work.
Result<std::optional<std::pair<size_t, size_t>>> find_overlap(const Shape& shape, const std::vector<Box>& boxes);

}  // namespace h5ckpt::planner
