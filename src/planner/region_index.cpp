#include "planner/region_index.h"

#include <algorithm>
#include <climits>

#include "planner/box_math.h"

namespace h5ckpt::planner {

namespace {

// Row-major index in a tensor of `shape` of the element at `coords` (inside the tensor, so the
// index fits: it is below the tensor's element count).
int64_t global_index(const Shape& shape, const int64_t* coords) {
  int64_t idx = 0;
  for (size_t d = 0; d < shape.size(); ++d) idx = idx * shape[d] + coords[d];
  return idx;
}

bool meets(const Box& a, const Box& b) {
  for (size_t d = 0; d < a.shape.size(); ++d)
    if (std::max(a.offset[d], b.offset[d]) >= std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]))
      return false;
  return true;
}

}  // namespace

void RegionIndex::add(const ShardSpec& shard) {
  const size_t n = shape_.size(), region = flat_.size();
  corners_.insert(corners_.end(), shard.box.offset.begin(), shard.box.offset.end());
  corners_.insert(corners_.end(), shard.box.shape.begin(), shard.box.shape.end());
  flat_.push_back(shard.flat ? *shard.flat : std::pair<int64_t, int64_t>{-1, -1});
  if (shard.numel() <= 0) return;
  // Global index of element k of the box's row-major order, its coordinates unravelled on the way
  // (no allocation: a load indexes the regions of every tensor it reads).
  auto index_of = [&](int64_t k) {
    int64_t idx = 0;
    for (size_t d = n; d-- > 0;) {
      idx += (shard.box.offset[d] + k % shard.box.shape[d]) * strides_[d];
      k /= shard.box.shape[d];
    }
    return idx;
  };
  const auto [begin, end] = shard.flat ? *shard.flat : std::pair<int64_t, int64_t>{0, shard.box.volume()};
  entries_.push_back(Entry{index_of(begin), index_of(end - 1) + 1, region});
}

void RegionIndex::build() {
  auto before = [](const Entry& a, const Entry& b) {
    return a.first != b.first ? a.first < b.first : a.region < b.region;
  };
  // Regions usually come in that order already (row blocks, or the flat ranges of one box).
  if (!std::is_sorted(entries_.begin(), entries_.end(), before)) std::sort(entries_.begin(), entries_.end(), before);
  size_t leaves = 1;
  while (leaves < entries_.size()) leaves *= 2;
  max_end_.assign(2 * leaves, INT64_MIN);
  for (size_t i = 0; i < entries_.size(); ++i) max_end_[leaves + i] = entries_[i].last_plus_one;
  for (size_t node = leaves; node-- > 1;) max_end_[node] = std::max(max_end_[2 * node], max_end_[2 * node + 1]);
}

bool RegionIndex::holds_part_of(size_t region, const Box& want, bool by_box) const {
  const size_t n = shape_.size();
  const int64_t* offset = corners_.data() + 2 * n * region;
  const int64_t* extent = offset + n;
  for (size_t d = 0; d < n; ++d)
    if (std::max(offset[d], want.offset[d]) >= std::min(offset[d] + extent[d], want.offset[d] + want.shape[d]))
      return false;
  const auto [begin, end] = flat_[region];
  if (begin < 0 || by_box) return true;
  // A flat range leaves parts of its box out: test its pieces (few, and only for candidates).
  const Box box{Shape(offset, offset + n), Shape(extent, extent + n)};
  for (const Box& piece : decompose_flat(box, begin, end))
    if (meets(piece, want)) return true;
  return false;
}

// Visits the entries [lo, hi) under `node` that start before entry `bound` and end after
// `want_first`, pruning subtrees that end too early.
void RegionIndex::collect(size_t node, size_t lo, size_t hi, size_t bound, int64_t want_first, const Box& want,
                          bool by_box, std::vector<size_t>* out) const {
  if (lo >= bound || max_end_[node] <= want_first) return;
  if (hi - lo == 1) {
    if (holds_part_of(entries_[lo].region, want, by_box)) out->push_back(entries_[lo].region);
    return;
  }
  const size_t mid = lo + (hi - lo) / 2;
  collect(2 * node, lo, mid, bound, want_first, want, by_box, out);
  collect(2 * node + 1, mid, hi, bound, want_first, want, by_box, out);
}

void RegionIndex::find(const Box& want, std::vector<size_t>* out, bool by_box) const {
  const size_t n = shape_.size();
  if (entries_.empty() || want.offset.size() != n || want.shape.size() != n) return;
  // The wanted box cut to the tensor; its elements lie between its first and last corner.
  Box cut{Shape(n), Shape(n)};
  Shape last(n);
  for (size_t d = 0; d < n; ++d) {
    const int64_t lo = std::max<int64_t>(want.offset[d], 0);
    const int64_t hi = std::min(want.offset[d] + want.shape[d], shape_[d]);
    if (hi <= lo) return;
    cut.offset[d] = lo;
    cut.shape[d] = hi - lo;
    last[d] = hi - 1;
  }
  const int64_t want_first = global_index(shape_, cut.offset.data());
  const int64_t want_end = global_index(shape_, last.data()) + 1;
  const size_t bound = static_cast<size_t>(
      std::partition_point(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.first < want_end; }) -
      entries_.begin());
  const size_t start = out->size();
  collect(1, 0, max_end_.size() / 2, bound, want_first, cut, by_box, out);
  std::sort(out->begin() + static_cast<std::ptrdiff_t>(start), out->end());
}

}  // namespace h5ckpt::planner
