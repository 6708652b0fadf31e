// Worst-fit balancing visits its jobs (a save's regions, a load's groups) largest first, ties in
// their given order, as a stable sort by size would. Sizes are few (a tensor's TP shard and its
// ZeRO slices, per distinct shape), so the order is a counting sort over the distinct sizes:
// linear, where sorting the load's 730,000 groups at 8,960 ranks took 6% of its planning.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "planner/bulk_allocator.h"

namespace h5ckpt::planner {

// The distinct sizes of a sequence of jobs, each numbered as it first appears, and the order
// that visits the jobs by size descending, equal sizes in position order.
template <class Bytes>
class SizeClasses {
 public:
  /// The class of a job of `bytes`.
  uint32_t of(Bytes bytes) {
    if (bytes_.empty() || bytes != bytes_[last_]) {  // neighbours are often one size (one box's slices)
      auto [it, fresh] = class_of_.try_emplace(bytes, static_cast<uint32_t>(bytes_.size()));
      if (fresh) bytes_.push_back(bytes);
      last_ = it->second;
    }
    return last_;
  }
  Bytes bytes(uint32_t c) const { return bytes_[c]; }

  /// Positions 0..n-1 by their classes' bytes descending (`class_at[p]`: position p's class), equal
  /// bytes in position order: a counting sort over the classes, which are sorted once. Into
  /// `order` (whose buffer, when large enough, is reused: its pages are already the process's).
  BulkVector<uint32_t> largest_first(std::span<const uint32_t> class_at, BulkVector<uint32_t> order = {}) const {
    std::vector<uint32_t> classes(bytes_.size());
    std::iota(classes.begin(), classes.end(), 0u);
    std::sort(classes.begin(), classes.end(), [&](uint32_t a, uint32_t b) { return bytes_[a] > bytes_[b]; });
    std::vector<size_t> start(bytes_.size(), 0);
    for (uint32_t c : class_at) ++start[c];
    size_t offset = 0;
    for (uint32_t c : classes) offset += std::exchange(start[c], offset);
    order.resize(class_at.size());
    for (size_t p = 0; p < class_at.size(); ++p) order[start[class_at[p]]++] = static_cast<uint32_t>(p);
    return order;
  }

 private:
  std::unordered_map<Bytes, uint32_t> class_of_;
  std::vector<Bytes> bytes_;
  uint32_t last_ = 0;
};

// Positions 0..n-1 of `jobs` (anything with `bytes`) by bytes descending, equal bytes in
// position order.
template <class Jobs>
BulkVector<uint32_t> largest_first(const Jobs& jobs) {
  SizeClasses<std::decay_t<decltype(jobs[0].bytes)>> sizes;
  BulkVector<uint32_t> class_at(jobs.size());
  for (size_t p = 0; p < jobs.size(); ++p) class_at[p] = sizes.of(jobs[p].bytes);
  return sizes.largest_first(class_at);
}

}  // namespace h5ckpt::planner
