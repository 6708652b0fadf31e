#include "planner/box_math.h"

#include <algorithm>

namespace h5ckpt::planner {

namespace {

// Sub-box volume of dims [d, n).
int64_t tail_volume(const Shape& shape, size_t d) {
  int64_t v = 1;
  for (size_t i = d; i < shape.size(); ++i) v *= shape[i];
  return v;
}

// Recursive worker: `base` is the box fixed at coordinates base.offset[0..d) (extent 1 there);
// emits boxes covering flattening range [b, e) of the sub-box spanned by dims [d, n).
void decompose_rec(const Box& box, Box& cur, size_t d, int64_t b, int64_t e, std::vector<Box>& out) {
  if (b >= e) return;
  const size_t n = box.shape.size();
  if (d + 1 == n) {  // last dimension: any range is one box
    Box r = cur;
    r.offset[d] = box.offset[d] + b;
    r.shape[d] = e - b;
    out.push_back(std::move(r));
    return;
  }
  const int64_t inner = tail_volume(box.shape, d + 1);
  const int64_t whole = inner * box.shape[d];
  if (b == 0 && e == whole) {  // full sub-box
    Box r = cur;
    for (size_t i = d; i < n; ++i) {
      r.offset[i] = box.offset[i];
      r.shape[i] = box.shape[i];
    }
    out.push_back(std::move(r));
    return;
  }
  int64_t i0 = b / inner, i1 = (e - 1) / inner;
  auto descend = [&](int64_t idx, int64_t bb, int64_t ee) {
    cur.offset[d] = box.offset[d] + idx;
    cur.shape[d] = 1;
    decompose_rec(box, cur, d + 1, bb, ee, out);
  };
  if (i0 == i1) {
    descend(i0, b - i0 * inner, e - i0 * inner);
    return;
  }
  if (b % inner != 0) {  // partial head row
    descend(i0, b % inner, inner);
    ++i0;
  }
  const bool partial_tail = e % inner != 0;
  const int64_t last_full = partial_tail ? i1 - 1 : i1;
  if (last_full >= i0) {  // block of full rows
    Box r = cur;
    r.offset[d] = box.offset[d] + i0;
    r.shape[d] = last_full - i0 + 1;
    for (size_t i = d + 1; i < n; ++i) {
      r.offset[i] = box.offset[i];
      r.shape[i] = box.shape[i];
    }
    out.push_back(std::move(r));
  }
  if (partial_tail) descend(i1, 0, e % inner);
}

}  // namespace

std::vector<Box> decompose_flat(const Box& box, int64_t begin, int64_t end) {
  std::vector<Box> out;
  if (begin >= end) return out;
  Box cur = box;
  decompose_rec(box, cur, 0, begin, end, out);
  return out;
}

std::vector<Box> shard_boxes(const ShardSpec& shard) {
  if (shard.flat) return decompose_flat(shard.box, shard.flat->first, shard.flat->second);
  if (shard.box.volume() == 0) return {};
  return {shard.box};
}

std::optional<Box> intersect(const Box& a, const Box& b) {
  Box r;
  const size_t n = a.shape.size();
  r.offset.resize(n);
  r.shape.resize(n);
  for (size_t d = 0; d < n; ++d) {
    const int64_t lo = std::max(a.offset[d], b.offset[d]);
    const int64_t hi = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    if (hi <= lo) return std::nullopt;
    r.offset[d] = lo;
    r.shape[d] = hi - lo;
  }
  return r;
}

int64_t Frame::index_of(const Shape& coords) const {
  int64_t idx = 0;
  for (size_t d = 0; d < box.shape.size(); ++d) idx = idx * box.shape[d] + (coords[d] - box.offset[d]);
  return idx - flat_begin;
}

Frame frame_of(const ShardSpec& shard) { return Frame{shard.box, shard.flat ? shard.flat->first : 0}; }

void for_each_run(const Box& region, const Frame& src, const Frame& dst,
                  const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  const size_t n = region.shape.size();
  if (region.volume() == 0) return;
  // Find the outermost dim k such that region spans both frames fully in every dim after k:
  // then dims [k, n) form one contiguous run in both buffers.
  size_t k = n - 1;
  while (k > 0 && region.shape[k] == src.box.shape[k] && region.shape[k] == dst.box.shape[k]) --k;
  int64_t run = 1;
  for (size_t d = k; d < n; ++d) run *= region.shape[d];
  // Odometer over the outer dims [0, k).
  Shape coords = region.offset;
  while (true) {
    fn(src.index_of(coords), dst.index_of(coords), run);
    size_t d = k;
    while (d > 0) {
      --d;
      if (++coords[d] < region.offset[d] + region.shape[d]) break;
      coords[d] = region.offset[d];
      if (d == 0) return;
    }
    if (k == 0) return;
  }
}

}  // namespace h5ckpt::planner
