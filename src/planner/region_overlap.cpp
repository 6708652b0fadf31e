#include "planner/region_overlap.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <queue>

namespace h5ckpt::planner {
namespace {

using Pair = std::pair<size_t, size_t>;

// A box as a rectangle in the plane (dim 0) x (dims 1.. in row-major order).
struct Rect {
  int64_t a0, a1, b0, b1;
  size_t index;
};

// The box's trailing part must be one contiguous run of the flattened trailing dims: extents 1
// up to some dim j, then any extent at j, then full dims. False when it is not.
bool to_rect(const Shape& shape, const Box& box, size_t index, Rect* out) {
  const size_t d = shape.size();
  if (d == 1) {
    *out = Rect{0, 1, box.offset[0], box.offset[0] + box.shape[0], index};
    return true;
  }
  size_t j = 1;
  while (j + 1 < d && box.shape[j] == 1) ++j;
  for (size_t e = j + 1; e < d; ++e)
    if (box.offset[e] != 0 || box.shape[e] != shape[e]) return false;
  // Strides of dims 1.. fit in int64: their product is at most the tensor's element count.
  int64_t flat = 0, stride = 1, stride_j = 1;
  for (size_t e = d - 1; e >= 1; --e) {
    flat += box.offset[e] * stride;
    if (e == j) stride_j = stride;
    stride *= shape[e];
  }
  *out = Rect{box.offset[0], box.offset[0] + box.shape[0], flat, flat + box.shape[j] * stride_j, index};
  return true;
}

// Sweep along a: rectangles alive at one a-coordinate must be disjoint in b, so an ordered map
// of their b-intervals finds any overlap among the neighbours of a newcomer.
std::optional<Pair> sweep_rects(std::vector<Rect>& rects) {
  std::sort(rects.begin(), rects.end(), [](const Rect& x, const Rect& y) { return x.a0 < y.a0; });
  std::map<int64_t, const Rect*> alive;  // by b0 (unique: alive intervals are disjoint)
  using End = std::pair<int64_t, const Rect*>;
  std::priority_queue<End, std::vector<End>, std::greater<>> ends;  // by a1
  for (const Rect& r : rects) {
    while (!ends.empty() && ends.top().first <= r.a0) {
      alive.erase(ends.top().second->b0);
      ends.pop();
    }
    auto next = alive.lower_bound(r.b0);
    if (next != alive.end() && next->second->b0 < r.b1) return Pair{next->second->index, r.index};
    if (next != alive.begin() && std::prev(next)->second->b1 > r.b0)
      return Pair{std::prev(next)->second->index, r.index};
    alive.emplace(r.b0, &r);
    ends.emplace(r.a1, &r);
  }
  return std::nullopt;
}

bool boxes_meet(const Box& x, const Box& y) {
  for (size_t e = 0; e < x.offset.size(); ++e)
    if (x.offset[e] >= y.offset[e] + y.shape[e] || y.offset[e] >= x.offset[e] + x.shape[e]) return false;
  return true;
}

// About a second of pairwise tests on one core.
constexpr int64_t kPairBudget = int64_t{1} << 26;

}  // namespace

Result<std::optional<Pair>> find_overlap(const Shape& shape, const std::vector<Box>& boxes) {
  std::vector<size_t> live;  // non-empty boxes
  for (size_t i = 0; i < boxes.size(); ++i) {
    bool empty = false;
    for (auto s : boxes[i].shape) empty = empty || s <= 0;
    if (!empty) live.push_back(i);
  }
  std::vector<Rect> rects(live.size());
  bool planar = !shape.empty();
  for (size_t k = 0; planar && k < live.size(); ++k) planar = to_rect(shape, boxes[live[k]], live[k], &rects[k]);
  if (planar) return sweep_rects(rects);

  // General boxes: sweep along dim 0, testing a newcomer against every box alive at its start.
  std::sort(live.begin(), live.end(), [&](size_t x, size_t y) { return boxes[x].offset[0] < boxes[y].offset[0]; });
  std::vector<size_t> alive;
  int64_t tests = 0;
  for (size_t i : live) {
    const int64_t start = boxes[i].offset[0];
    std::erase_if(alive, [&](size_t j) { return boxes[j].offset[0] + boxes[j].shape[0] <= start; });
    tests += static_cast<int64_t>(alive.size());
    if (tests > kPairBudget)
      return Status(ErrorCode::kUnsupported,
                    "too many regions overlapping along dim 0 to check that they are "
                    "disjoint (split the tensor along its first dimension)");
    for (size_t j : alive)
      if (boxes_meet(boxes[j], boxes[i])) return std::optional<Pair>(Pair{j, i});
    alive.push_back(i);
  }
  return std::optional<Pair>();
}

}  // namespace h5ckpt::planner
