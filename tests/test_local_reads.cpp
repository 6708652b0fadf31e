// planner::plan_local_reads against an independent model: every element of a wanted shard is
// looked up by brute force (which region holds it, that region's writer, the element's position
// in the writer's file) and must be delivered exactly once, by the piece the planner gives it.
#include <gtest/gtest.h>

#include <map>
#include <tuple>
#include <vector>

#include "planner/box_math.h"
#include "planner/local_reads.h"

using namespace h5ckpt;
using namespace h5ckpt::planner;

namespace {

// Row-major index of `c` in a box of shape `shape` at `offset`.
int64_t index_in(const Shape& offset, const Shape& shape, const Shape& c) {
  int64_t i = 0;
  for (size_t d = 0; d < shape.size(); ++d) i = i * shape[d] + (c[d] - offset[d]);
  return i;
}

// Every global coordinate of a box, row-major.
std::vector<Shape> coords_of(const Box& b) {
  std::vector<Shape> out;
  int64_t n = 1;
  for (int64_t s : b.shape) n *= s;
  for (int64_t k = 0; k < n; ++k) {
    Shape c(b.shape.size());
    int64_t r = k;
    for (size_t d = b.shape.size(); d-- > 0;) c[d] = b.offset[d] + r % b.shape[d], r /= b.shape[d];
    out.push_back(c);
  }
  return out;
}

bool inside(const Box& b, const Shape& c) {
  for (size_t d = 0; d < c.size(); ++d)
    if (c[d] < b.offset[d] || c[d] >= b.offset[d] + b.shape[d]) return false;
  return true;
}

// Two tensors, each split over writers in a different way, so file offsets interleave.
std::vector<TensorPlan> two_tensors() {
  TensorPlan a;  // 6x4 f32, rows split over writers 0,1,2
  a.key = "a", a.dtype = DType::kF32, a.shape = {6, 4};
  for (int w = 0; w < 3; ++w) a.add_region(ShardSpec{Box{{2 * w, 0}, {2, 4}}}, w);
  TensorPlan b;  // 4x6 bf16, columns split over writers 2,0 (writer 2 holds the left half)
  b.key = "b", b.dtype = DType::kBF16, b.shape = {4, 6};
  b.add_region(ShardSpec{Box{{0, 0}, {4, 3}}}, 2);
  b.add_region(ShardSpec{Box{{0, 3}, {4, 3}}}, 0);
  return {a, b};
}

}  // namespace

TEST(LocalReads, FileOffsetsFollowPlanOrderPerWriter) {
  const auto tensors = two_tensors();
  const auto off = local_file_offsets(tensors, 3);
  // writer 0: a[0] (32 bytes) then b[1]; writer 1: a[1]; writer 2: a[2] (32 bytes) then b[0].
  EXPECT_EQ(off[0], (std::vector<uint64_t>{0, 0, 0}));
  EXPECT_EQ(off[1], (std::vector<uint64_t>{32, 32}));
}

TEST(LocalReads, EveryWantedElementComesOnceFromItsWritersFile) {
  const auto tensors = two_tensors();
  const auto off = local_file_offsets(tensors, 3);
  const std::vector<int> server = {5, 3, 4};  // live ranks serving saved ranks 0, 1, 2
  std::vector<ShardSpec> wants = {
      ShardSpec{Box{{1, 1}, {4, 2}}},                                           // a box across three regions
      ShardSpec{Box{{0, 0}, {6, 4}}, std::make_pair<int64_t, int64_t>(5, 19)},  // a flat range
      ShardSpec{Box{{0, 2}, {4, 4}}},                                           // b: across the column split
  };
  const std::vector<size_t> tensor_of = {0, 0, 1};
  for (size_t k = 0; k < wants.size(); ++k) {
    const TensorPlan& t = tensors[tensor_of[k]];
    const uint64_t es = dtype_size(t.dtype);
    const Frame dst = frame_of(wants[k]);
    // Expected: destination element -> (server, writer, file offset), by brute force.
    std::map<int64_t, std::tuple<int, int, uint64_t>> expect;
    for (const Box& wb : shard_boxes(wants[k]))
      for (const Shape& c : coords_of(wb))
        for (size_t g = 0; g < t.regions.size(); ++g) {
          const Box& rb = t.box_of(g);
          if (!inside(rb, c)) continue;
          const int w = t.regions[g].writer;
          expect[dst.index_of(c)] = {server[w], w, off[tensor_of[k]][g] + index_in(rb.offset, rb.shape, c) * es};
        }
    std::map<int64_t, std::tuple<int, int, uint64_t>> got;
    for (const LocalReadItem& p : plan_local_reads(tensors, tensor_of[k], wants[k], server, off)) {
      ASSERT_EQ(p.esize, es);
      ASSERT_EQ(p.bytes % es, 0u);
      for (uint64_t e = 0; e < p.bytes / es; ++e) {
        const int64_t d = static_cast<int64_t>(p.dst_element + e);
        EXPECT_EQ(got.count(d), 0u) << "element " << d << " delivered twice";
        got[d] = {p.server, p.writer, p.file_offset + e * es};
      }
    }
    EXPECT_EQ(got, expect) << "want " << k;
  }
}

TEST(LocalReads, OneRegionAtATimeGivesTheSamePiecesInOrder) {
  const auto tensors = two_tensors();
  const auto off = local_file_offsets(tensors, 3);
  const std::vector<int> server = {0, 1, 2};
  const ShardSpec want{Box{{1, 0}, {4, 3}}};
  const auto all = plan_local_reads(tensors, 0, want, server, off);
  std::vector<LocalReadItem> joined;
  for (int g = 0; g < 3; ++g)
    for (const auto& p : plan_local_reads(tensors, 0, want, server, off, g)) {
      EXPECT_EQ(p.region, static_cast<uint32_t>(g));
      joined.push_back(p);
    }
  ASSERT_EQ(joined.size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(joined[i].file_offset, all[i].file_offset);
    EXPECT_EQ(joined[i].dst_element, all[i].dst_element);
    EXPECT_EQ(joined[i].bytes, all[i].bytes);
  }
}

TEST(LocalReads, PaddedWantIsCutToTheStoredShape) {
  const auto tensors = two_tensors();
  const auto off = local_file_offsets(tensors, 3);
  // A wanted shard of a larger (padded) tensor: rows 4..7 of 8; only rows 4,5 exist.
  const ShardSpec want{Box{{4, 0}, {4, 4}}};
  uint64_t bytes = 0;
  for (const auto& p : plan_local_reads(tensors, 0, want, {0, 1, 2}, off)) {
    EXPECT_EQ(p.writer, 2);
    EXPECT_LT(p.dst_element, 8u);  // rows 4,5 of the want: its first 8 elements
    bytes += p.bytes;
  }
  EXPECT_EQ(bytes, 2u * 4u * 4u);
}
