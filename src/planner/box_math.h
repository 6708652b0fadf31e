// Pure n-D box arithmetic: flat-range decomposition, intersection, contiguous runs.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "h5ckpt/types.h"

namespace h5ckpt::planner {

/// Splits elements [begin, end) of the row-major flattening of `box` into at most 2*ndim-1
/// boxes (in global coordinates), listed in row-major order; each is contiguous in the
/// flattening of `box`.
std::vector<Box> decompose_flat(const Box& box, int64_t begin, int64_t end);

/// The boxes a shard covers: the box itself, or its flat range decomposed. Empty boxes dropped.
std::vector<Box> shard_boxes(const ShardSpec& shard);

/// Intersection of two boxes of the same rank; nullopt when empty.
std::optional<Box> intersect(const Box& a, const Box& b);

/// A row-major buffer laid over `box`, whose first element is the flattening index `flat_begin`
/// of `box` (0 for a whole-box buffer, the range start for a flat-range buffer).
struct Frame {
  Box box;
  int64_t flat_begin = 0;
  /// Element index in the buffer of global coordinate `coords` (must lie inside box).
  int64_t index_of(const Shape& coords) const;
};

/// The buffer layout of a rank's shard.
Frame frame_of(const ShardSpec& shard);

/// Calls fn(src_index, dst_index, count) for each maximal run of `region` that is contiguous in
/// both frames, in row-major order of `region`. `region` must lie inside both frames' boxes.
void for_each_run(const Box& region, const Frame& src, const Frame& dst,
                  const std::function<void(int64_t, int64_t, int64_t)>& fn);

}  // namespace h5ckpt::planner
