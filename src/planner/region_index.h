// Which saved regions of a tensor hold elements of a wanted box, without scanning them all: a
// load after a layout change asks this for every box it reads, and a ZeRO-sharded tensor of a
// large job has hundreds of regions (TP x DP flat ranges).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "h5ckpt/types.h"

namespace h5ckpt::planner {

class RegionIndex {
 public:
  RegionIndex() = default;
  /// Indexes `count` regions of a tensor of global shape `shape`; `shard_of(i)` is region i (a
  /// box or a flat range of one, inside `shape`). Regions may overlap; empty ones never match.
  template <class ShardOf>
  RegionIndex(const Shape& shape, size_t count, ShardOf&& shard_of) : shape_(shape), strides_(shape.size(), 1) {
    for (size_t d = shape.size(); d-- > 1;) strides_[d - 1] = strides_[d] * shape[d];
    corners_.reserve(count * 2 * shape.size());
    flat_.reserve(count);
    entries_.reserve(count);
    // A region's box is two heap blocks away from its description: asking for those of a region
    // a few places ahead overlaps the cache misses (a load indexes thousands of cold regions).
    constexpr size_t kAhead = 4;
    for (size_t i = 0; i < count; ++i) {
      if (i + kAhead < count) {
        const ShardSpec& ahead = shard_of(i + kAhead);
        __builtin_prefetch(ahead.box.offset.data());
        __builtin_prefetch(ahead.box.shape.data());
      }
      add(shard_of(i));
    }
    build();
  }

  /// Appends to `out`, in ascending order, the index of every region sharing an element with
  /// `want` (a box of the tensor's rank). With `by_box`, every region whose box meets `want` and
  /// whose flat range (when it has one) reaches from `want`'s first to its last element in the
  /// tensor's row-major order: what a scan testing boxes and element ranges finds, a superset
  /// (storage::checked_spans then drops the ones that touch nothing it reads).
  void find(const Box& want, std::vector<size_t>* out, bool by_box = false) const;
  size_t size() const { return flat_.size(); }

 private:
  // A region as the index keeps it: its box and flat range, and the interval of global row-major
  // indices from its first to its last element (every element lies in it, not every index in it
  // is an element: a column block spans whole rows of the tensor).
  struct Entry {
    int64_t first = 0, last_plus_one = 0;
    size_t region = 0;
  };
  void add(const ShardSpec& shard);
  void build();
  bool holds_part_of(size_t region, const Box& want, bool by_box) const;
  void collect(size_t node, size_t lo, size_t hi, size_t bound, int64_t want_first, const Box& want, bool by_box,
               std::vector<size_t>* out) const;

  Shape shape_;
  Shape strides_;  ///< row-major strides of shape_
  // Region i's box is offset corners_[2*n*i ..+n), shape corners_[2*n*i+n ..+n) (n = rank): kept
  // flat, so indexing the regions of a tensor costs no allocation per region.
  std::vector<int64_t> corners_;
  std::vector<std::pair<int64_t, int64_t>> flat_;  ///< flat range of region i; {-1, -1}: the whole box
  std::vector<Entry> entries_;                     ///< non-empty regions, by `first`
  std::vector<int64_t> max_end_;  ///< implicit tree over entries_: the largest last_plus_one below a node
};

}  // namespace h5ckpt::planner
