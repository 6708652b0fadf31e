// Unit tests of the pure planner (box math, save planning).
// Expectations are computed independently of the implementation: row-major indices from explicit
// strides, element-by-element enumeration by unravelling linear indices, holder sets and byte
// totals recomputed from the simulated ranks' own descriptions.
#include <gtest/gtest.h>

#include "util/checked_math.h"  // printable

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "planner/box_math.h"
#include "planner/bulk_allocator.h"
#include "planner/region_index.h"
#include "planner/save_planner.h"

namespace h5ckpt::planner {
namespace {

using nlohmann::json;

// ---- independent helpers ------------------------------------------------------------------

int64_t volume_of(const Shape& s) {
  int64_t v = 1;
  for (int64_t e : s) v *= e;
  return v;
}

// Row-major strides: stride[d] = product of shape[d+1..].
std::vector<int64_t> strides_of(const Shape& shape) {
  std::vector<int64_t> st(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) st[d] = st[d + 1] * shape[d + 1];
  return st;
}

// Flat row-major index of global coordinate `c` within `box`.
int64_t flat_in_box(const Box& box, const Shape& c) {
  const auto st = strides_of(box.shape);
  int64_t idx = 0;
  for (size_t d = 0; d < c.size(); ++d) idx += (c[d] - box.offset[d]) * st[d];
  return idx;
}

// The global coordinates of a box's elements, in row-major order (by unravelling 0..vol-1).
std::vector<Shape> elements_of(const Box& box) {
  std::vector<Shape> out;
  const int64_t vol = volume_of(box.shape);
  for (int64_t i = 0; i < vol; ++i) {
    Shape c(box.shape.size());
    int64_t rem = i;
    for (int d = static_cast<int>(box.shape.size()) - 1; d >= 0; --d) {
      c[d] = box.offset[d] + rem % box.shape[d];
      rem /= box.shape[d];
    }
    out.push_back(std::move(c));
  }
  return out;
}

bool inside(const Box& inner, const Box& outer) {
  if (inner.ndim() != outer.ndim()) return false;
  for (size_t d = 0; d < inner.ndim(); ++d)
    if (inner.offset[d] < outer.offset[d] || inner.offset[d] + inner.shape[d] > outer.offset[d] + outer.shape[d])
      return false;
  return true;
}

bool overlaps(const Box& a, const Box& b) {
  for (size_t d = 0; d < a.ndim(); ++d)
    if (std::max(a.offset[d], b.offset[d]) >= std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]))
      return false;
  return true;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

std::string box_str(const Box& b) { return "offset " + shape_str(b.offset) + " shape " + shape_str(b.shape); }

// Our own signature of a shard (for holder lookups; independent of the planner's).
std::string sig_of(const ShardSpec& s) {
  std::string r = shape_str(s.box.offset) + shape_str(s.box.shape);
  if (s.flat) r += "f" + std::to_string(s.flat->first) + ":" + std::to_string(s.flat->second);
  return r;
}

// A random box inside a random global shape.
struct RandomBox {
  Shape global;
  Box box;
};

RandomBox random_box(std::mt19937_64& rng, int ndim, int64_t max_extent) {
  auto uni = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  RandomBox r;
  for (int d = 0; d < ndim; ++d) {
    const int64_t g = uni(1, max_extent);
    const int64_t off = uni(0, g - 1);
    const int64_t len = uni(1, g - off);
    r.global.push_back(g);
    r.box.offset.push_back(off);
    r.box.shape.push_back(len);
  }
  return r;
}

// Checks decompose_flat(box, begin, end) against the definition; returns a failure text or "".
std::string check_decomposition(const Box& box, int64_t begin, int64_t end) {
  const auto boxes = decompose_flat(box, begin, end);
  const std::string ctx = box_str(box) + " range [" + std::to_string(begin) + "," + std::to_string(end) + ")";
  const size_t limit = 2 * box.ndim() - 1;
  if (boxes.size() > limit) return ctx + ": " + std::to_string(boxes.size()) + " boxes > 2*ndim-1";
  if (begin == end && !boxes.empty()) return ctx + ": empty range gave boxes";
  for (size_t i = 0; i < boxes.size(); ++i) {
    const Box& b = boxes[i];
    if (b.ndim() != box.ndim()) return ctx + ": box of another rank";
    for (auto e : b.shape)
      if (e <= 0) return ctx + ": empty or negative box " + box_str(b);
    if (!inside(b, box)) return ctx + ": box " + box_str(b) + " outside";
    for (size_t j = 0; j < i; ++j)
      if (overlaps(boxes[j], b)) return ctx + ": boxes " + box_str(boxes[j]) + " and " + box_str(b) + " overlap";
  }
  int64_t expect = begin;
  for (const Box& b : boxes)
    for (const Shape& c : elements_of(b)) {
      const int64_t f = flat_in_box(box, c);
      if (f != expect)
        return ctx + ": element " + shape_str(c) + " has flat index " + std::to_string(f) + ", expected " +
               std::to_string(expect);
      ++expect;
    }
  if (expect != end) return ctx + ": boxes cover up to " + std::to_string(expect);
  return "";
}

// ---- decompose_flat -------------------------------------------------------------------------

TEST(DecomposeFlat, WorkedExample) {
  // Box rows 1..4, cols 2..6 (4 x 5); elements [3, 17): the tail of row 0, rows 1-2, head of row 3.
  const Box box{{1, 2}, {4, 5}};
  const auto boxes = decompose_flat(box, 3, 17);
  const std::vector<Box> expect = {Box{{1, 5}, {1, 2}}, Box{{2, 2}, {2, 5}}, Box{{4, 2}, {1, 2}}};
  EXPECT_EQ(boxes, expect);
  // The whole flattening is the box itself.
  EXPECT_EQ(decompose_flat(box, 0, 20), std::vector<Box>{box});
}

TEST(DecomposeFlat, ExhaustiveSmallBoxes) {
  const std::vector<Box> cases = {
      Box{{0}, {7}},       Box{{2, 1}, {3, 4}},      Box{{1, 0, 2}, {2, 3, 4}}, Box{{0, 0, 0, 0}, {2, 3, 2, 3}},
      Box{{0, 0}, {1, 5}}, Box{{3, 0, 0}, {4, 1, 3}}};
  for (const Box& box : cases) {
    const int64_t vol = volume_of(box.shape);
    for (int64_t b = 0; b <= vol; ++b)
      for (int64_t e = b; e <= vol; ++e) {
        const std::string err = check_decomposition(box, b, e);
        ASSERT_EQ(err, "");
      }
  }
}

TEST(DecomposeFlat, RandomizedBoxesInsideLargerShape) {
  std::mt19937_64 rng(20240611);
  int checked = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    const int ndim = 1 + iter % 4;
    const RandomBox rb = random_box(rng, ndim, ndim <= 2 ? 12 : 6);
    const int64_t vol = volume_of(rb.box.shape);
    const int64_t b = std::uniform_int_distribution<int64_t>(0, vol)(rng);
    const int64_t e = std::uniform_int_distribution<int64_t>(b, vol)(rng);
    const std::string err = check_decomposition(rb.box, b, e);
    ASSERT_EQ(err, "") << "global shape " << shape_str(rb.global);
    // shard_boxes of the flat spec is the same decomposition, and the spec is valid.
    const ShardSpec spec = ShardSpec::flat_range(rb.box, b, e);
    ASSERT_TRUE(spec.validate(rb.global).ok());
    ASSERT_EQ(shard_boxes(spec), decompose_flat(rb.box, b, e));
    ++checked;
  }
  EXPECT_EQ(checked, 4000);
}

// ---- intersect and for_each_run --------------------------------------------------------------

TEST(Intersect, AgainstPerElementMembership) {
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 1500; ++iter) {
    const int ndim = 1 + iter % 3;
    Shape g;
    for (int d = 0; d < ndim; ++d) g.push_back(std::uniform_int_distribution<int64_t>(1, 7)(rng));
    auto rand_box = [&] {
      Box b;
      for (int d = 0; d < ndim; ++d) {
        const int64_t o = std::uniform_int_distribution<int64_t>(0, g[d] - 1)(rng);
        b.offset.push_back(o);
        b.shape.push_back(std::uniform_int_distribution<int64_t>(1, g[d] - o)(rng));
      }
      return b;
    };
    const Box a = rand_box(), b = rand_box();
    std::set<Shape> expect;
    for (const Shape& c : elements_of(a))
      if (inside(Box{c, Shape(ndim, 1)}, b)) expect.insert(c);
    const auto r = intersect(a, b);
    if (expect.empty()) {
      EXPECT_FALSE(r.has_value()) << box_str(a) << " / " << box_str(b);
      continue;
    }
    ASSERT_TRUE(r.has_value()) << box_str(a) << " / " << box_str(b);
    const auto got = elements_of(*r);
    EXPECT_EQ(std::set<Shape>(got.begin(), got.end()), expect) << box_str(a) << " / " << box_str(b);
    EXPECT_EQ(got.size(), expect.size());
  }
}

struct RunRec {
  int64_t src, dst, count;
};

std::vector<RunRec> runs_of(const Box& region, const Frame& src, const Frame& dst) {
  std::vector<RunRec> runs;
  for_each_run(region, src, dst, [&](int64_t s, int64_t d, int64_t n) { runs.push_back({s, d, n}); });
  return runs;
}

// Buffer index of global coordinate c in a frame, from the definition (strides, minus range start).
int64_t naive_index(const Frame& f, const Shape& c) { return flat_in_box(f.box, c) - f.flat_begin; }

// A random frame over global shape g: a whole-tensor frame, a box frame, or a flat-range frame.
// `pieces` receives the boxes the frame's buffer actually holds.
Frame random_frame(std::mt19937_64& rng, const Shape& g, std::vector<Box>* pieces) {
  const int kind = std::uniform_int_distribution<int>(0, 2)(rng);
  Box box{Shape(g.size(), 0), g};
  if (kind >= 1) {
    for (size_t d = 0; d < g.size(); ++d) {
      box.offset[d] = std::uniform_int_distribution<int64_t>(0, g[d] - 1)(rng);
      box.shape[d] = std::uniform_int_distribution<int64_t>(1, g[d] - box.offset[d])(rng);
    }
  }
  if (kind == 2) {
    const int64_t vol = volume_of(box.shape);
    const int64_t b = std::uniform_int_distribution<int64_t>(0, vol - 1)(rng);
    const int64_t e = std::uniform_int_distribution<int64_t>(b + 1, vol)(rng);
    *pieces = decompose_flat(box, b, e);
    return Frame{box, b};
  }
  *pieces = {box};
  return Frame{box, 0};
}

TEST(ForEachRun, MatchesPerElementLoopIncludingFlatFrames) {
  std::mt19937_64 rng(99);
  int regions = 0, flat_regions = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const int ndim = 1 + iter % 4;
    Shape g;
    for (int d = 0; d < ndim; ++d) g.push_back(std::uniform_int_distribution<int64_t>(1, ndim <= 2 ? 9 : 5)(rng));
    std::vector<Box> sp, dp;
    const Frame src = random_frame(rng, g, &sp);
    const Frame dst = random_frame(rng, g, &dp);
    for (const Box& a : sp)
      for (const Box& b : dp) {
        const auto region = intersect(a, b);
        if (!region) continue;
        ++regions;
        if (src.flat_begin != 0 || dst.flat_begin != 0) ++flat_regions;
        const auto runs = runs_of(*region, src, dst);
        std::vector<std::pair<int64_t, int64_t>> got, expect;
        for (const RunRec& r : runs) {
          ASSERT_GT(r.count, 0);
          for (int64_t i = 0; i < r.count; ++i) got.emplace_back(r.src + i, r.dst + i);
        }
        for (const Shape& c : elements_of(*region)) expect.emplace_back(naive_index(src, c), naive_index(dst, c));
        ASSERT_EQ(got, expect) << "region " << box_str(*region) << " src " << box_str(src.box) << " @" << src.flat_begin
                               << " dst " << box_str(dst.box) << " @" << dst.flat_begin;
        // Every index must lie inside the buffers the frames describe.
        for (auto [s, d] : got) {
          ASSERT_GE(s, 0);
          ASSERT_GE(d, 0);
        }
        // Runs are maximal: as many as the element sequence has breaks in contiguity.
        size_t breaks = 1;
        for (size_t i = 1; i < expect.size(); ++i)
          if (expect[i].first != expect[i - 1].first + 1 || expect[i].second != expect[i - 1].second + 1) ++breaks;
        EXPECT_EQ(runs.size(), breaks) << "region " << box_str(*region) << " src " << box_str(src.box) << " dst "
                                       << box_str(dst.box);
      }
  }
  EXPECT_GT(regions, 2000);
  EXPECT_GT(flat_regions, 300);
}

TEST(ForEachRun, FullTrailingDimsGiveLongRuns) {
  // Rows 2..4 of a [6, 4, 5] tensor, whole in dims 1 and 2: one run of 3*4*5 in both frames.
  const Frame whole{Box{{0, 0, 0}, {6, 4, 5}}, 0};
  const Frame rows{Box{{2, 0, 0}, {3, 4, 5}}, 0};
  auto runs = runs_of(rows.box, whole, rows);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].src, 2 * 20);
  EXPECT_EQ(runs[0].dst, 0);
  EXPECT_EQ(runs[0].count, 60);

  // Columns 1..2 of dim 1, whole in dim 2: 6 runs (one per row) of 2*5 elements.
  const Frame cols{Box{{0, 1, 0}, {6, 2, 5}}, 0};
  runs = runs_of(cols.box, whole, cols);
  ASSERT_EQ(runs.size(), 6u);
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].count, 10);
    EXPECT_EQ(runs[i].src, static_cast<int64_t>(i) * 20 + 5);
    EXPECT_EQ(runs[i].dst, static_cast<int64_t>(i) * 10);
  }

  // A flat-range frame over the whole tensor starting at element 37: the region rows 2..3 is one
  // run at buffer index 40 - 37 = 3.
  const Frame flat{Box{{0, 0, 0}, {6, 4, 5}}, 37};
  runs = runs_of(Box{{2, 0, 0}, {2, 4, 5}}, whole, flat);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].src, 40);
  EXPECT_EQ(runs[0].dst, 3);
  EXPECT_EQ(runs[0].count, 40);
}

TEST(ForEachRun, FrameIndexOf) {
  const Frame f{Box{{1, 2}, {3, 4}}, 5};
  EXPECT_EQ(f.index_of({1, 2}), -5);
  EXPECT_EQ(f.index_of({2, 3}), 4 + 1 - 5);
  EXPECT_EQ(f.index_of({3, 5}), 11 - 5);
  const ShardSpec s = ShardSpec::flat_range(Box{{0, 0}, {4, 4}}, 6, 11);
  const Frame ff = frame_of(s);
  EXPECT_EQ(ff.box, s.box);
  EXPECT_EQ(ff.flat_begin, 6);
  EXPECT_EQ(frame_of(ShardSpec::box_of({1, 1}, {2, 2})).flat_begin, 0);
}

// ---- ShardSpec::split ---------------------------------------------------------------------

TEST(ShardSpecSplit, UnevenSplitsCoverOnce) {
  const Shape g{37, 5, 3};
  // 37 into 8: the first 37 % 8 = 5 parts get 5 rows, the others 4.
  const std::vector<int64_t> expect_len = {5, 5, 5, 5, 5, 4, 4, 4};
  int64_t next = 0;
  for (int k = 0; k < 8; ++k) {
    const ShardSpec s = ShardSpec::split(g, 0, 8, k);
    EXPECT_TRUE(s.validate(g).ok()) << s.validate(g).to_string();
    EXPECT_EQ(s.box.offset, (Shape{next, 0, 0}));
    EXPECT_EQ(s.box.shape, (Shape{expect_len[k], 5, 3}));
    EXPECT_FALSE(s.flat.has_value());
    next += expect_len[k];
  }
  EXPECT_EQ(next, 37);

  // Any dimension, any part count (including more parts than elements): every index once.
  for (int dim = 0; dim < 3; ++dim)
    for (int parts = 1; parts <= 40; ++parts) {
      std::vector<int> hits(g[dim], 0);
      int64_t min_len = INT64_MAX, max_len = 0;
      for (int k = 0; k < parts; ++k) {
        const ShardSpec s = ShardSpec::split(g, dim, parts, k);
        ASSERT_TRUE(s.validate(g).ok());
        for (int d = 0; d < 3; ++d)
          if (d != dim) {
            ASSERT_EQ(s.box.offset[d], 0);
            ASSERT_EQ(s.box.shape[d], g[d]);
          }
        for (int64_t i = 0; i < s.box.shape[dim]; ++i) ++hits[s.box.offset[dim] + i];
        min_len = std::min(min_len, s.box.shape[dim]);
        max_len = std::max(max_len, s.box.shape[dim]);
      }
      for (int h : hits) ASSERT_EQ(h, 1) << "dim " << dim << " parts " << parts;
      EXPECT_LE(max_len - min_len, 1);
    }
}

TEST(ShardSpecSplit, InvalidArgumentsGiveInvalidSpec) {
  const Shape g{8, 4};
  for (auto [dim, parts, index] : std::vector<std::tuple<int, int, int>>{
           {-1, 2, 0}, {2, 2, 0}, {0, 0, 0}, {0, -3, 0}, {0, 2, -1}, {0, 2, 2}, {1, 4, 7}}) {
    const ShardSpec s = ShardSpec::split(g, dim, parts, index);
    const Status st = s.validate(g);
    EXPECT_FALSE(st.ok()) << dim << " " << parts << " " << index;
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  }
}

TEST(ShardSpecValidate, RejectsOutOfShapeAndBadFlatRanges) {
  const Shape g{4, 6};
  EXPECT_TRUE(ShardSpec::whole(g).validate(g).ok());
  EXPECT_FALSE(ShardSpec::box_of({3, 0}, {2, 6}).validate(g).ok());
  EXPECT_FALSE(ShardSpec::box_of({0, -1}, {1, 1}).validate(g).ok());
  EXPECT_FALSE(ShardSpec::box_of({0}, {4}).validate(g).ok());
  EXPECT_FALSE(ShardSpec::flat_range(Box{{0, 0}, {4, 6}}, 5, 25).validate(g).ok());
  EXPECT_FALSE(ShardSpec::flat_range(Box{{0, 0}, {4, 6}}, 7, 6).validate(g).ok());
  EXPECT_TRUE(ShardSpec::flat_range(Box{{0, 0}, {4, 6}}, 24, 24).validate(g).ok());
  EXPECT_FALSE(ShardSpec::whole({}).validate({}).ok());
}

// ---- plan_save ------------------------------------------------------------------------------

using Ranks = std::vector<std::vector<ItemDesc>>;

ItemDesc item(std::string key, Shape g, ShardSpec s, DType dt = DType::kF32) {
  return ItemDesc{std::move(key), dt, std::move(g), std::move(s)};
}

int64_t bytes_of(const ShardSpec& s, DType dt) { return s.numel() * static_cast<int64_t>(dtype_size(dt)); }

// Every rank's writes as the rank computes them from the plan (plan_writes, unlimited pieces).
std::vector<std::vector<WriteItem>> writes_by_rank(const Ranks& ranks, const SavePlan& plan) {
  std::vector<std::vector<WriteItem>> out;
  for (size_t r = 0; r < ranks.size(); ++r) {
    auto w = plan_writes(static_cast<int>(r), plan.tensors, ranks[r], UINT64_MAX);
    EXPECT_TRUE(w.ok()) << "rank " << r << ": " << w.status().to_string();
    out.push_back(w.ok() ? std::move(w).value() : std::vector<WriteItem>{});
  }
  return out;
}

// Invariants every successful plan must satisfy, recomputed from the inputs.
void check_plan(const Ranks& ranks, const SavePlan& plan) {
  std::map<std::string, std::map<std::string, std::set<int>>> holders;  // key -> sig -> ranks
  std::map<std::string, std::pair<DType, Shape>> kinds;
  for (size_t r = 0; r < ranks.size(); ++r)
    for (const auto& it : ranks[r]) {
      kinds[it.key] = {it.dtype, it.global_shape};
      if (it.shard.numel() > 0) holders[it.key][sig_of(it.shard)].insert(static_cast<int>(r));
    }
  ASSERT_EQ(plan.tensors.size(), kinds.size());
  const auto by_rank = writes_by_rank(ranks, plan);
  ASSERT_EQ(plan.bytes_by_rank.size(), ranks.size());
  std::vector<int64_t> load(ranks.size(), 0);
  std::set<std::pair<int, int>> expected_assignments;
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    const TensorPlan& tp = plan.tensors[t];
    if (t > 0) ASSERT_LT(plan.tensors[t - 1].key, tp.key) << "tensors not sorted by key";
    ASSERT_TRUE(kinds.count(tp.key)) << tp.key;
    EXPECT_EQ(tp.dtype, kinds[tp.key].first);
    EXPECT_EQ(tp.shape, kinds[tp.key].second);
    const auto& hk = holders[tp.key];
    ASSERT_EQ(tp.regions.size(), hk.size()) << tp.key << ": each unique region exactly once";
    int64_t elems = 0;
    std::set<std::string> seen;
    for (size_t r = 0; r < tp.regions.size(); ++r) {
      const auto& reg = tp.regions[r];
      const ShardSpec shard = tp.shard(r);
      const std::string sig = sig_of(shard);
      ASSERT_TRUE(seen.insert(sig).second) << tp.key << " region listed twice";
      auto h = hk.find(sig);
      ASSERT_NE(h, hk.end()) << tp.key << ": planned region held by nobody";
      ASSERT_TRUE(h->second.count(reg.writer)) << tp.key << ": writer " << reg.writer << " does not hold region";
      load[reg.writer] += bytes_of(shard, tp.dtype);
      EXPECT_EQ(reg.numel(), shard.numel());
      elems += shard.numel();
      expected_assignments.insert({static_cast<int>(t), static_cast<int>(r)});
    }
    EXPECT_EQ(elems, volume_of(tp.shape)) << tp.key << ": regions do not add up to the tensor";
  }
  std::set<std::pair<int, int>> assigned;
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_EQ(static_cast<int64_t>(plan.bytes_by_rank[r]), load[r]) << "rank " << r;
    for (const WriteItem& a : by_rank[r]) {
      ASSERT_GE(a.tensor, 0);
      ASSERT_LT(a.tensor, static_cast<int>(plan.tensors.size()));
      ASSERT_GE(a.region, 0);
      ASSERT_LT(a.region, static_cast<int>(plan.tensors[a.tensor].regions.size()));
      ASSERT_GE(a.item, 0);
      ASSERT_LT(a.item, static_cast<int>(ranks[r].size()));
      const auto& reg = plan.tensors[a.tensor].regions[a.region];
      EXPECT_EQ(reg.writer, static_cast<int>(r));
      EXPECT_EQ(ranks[r][a.item].key, plan.tensors[a.tensor].key);
      EXPECT_EQ(ranks[r][a.item].shard, plan.tensors[a.tensor].shard(a.region));
      EXPECT_TRUE(plan.tensors[a.tensor].holds(a.region, ranks[r][a.item].shard));
      EXPECT_TRUE(assigned.insert({a.tensor, a.region}).second) << "region assigned twice";
    }
  }
  EXPECT_EQ(assigned, expected_assignments);
}

TEST(PlanSave, ReplicasWrittenOnce) {
  const Shape g{8, 4};
  Ranks ranks(4);
  for (int r = 0; r < 4; ++r) {
    ranks[r].push_back(item("model/norm", {4}, ShardSpec::whole({4})));
    // TP 2 x DP 2: ranks 0,2 hold rows 0..3; ranks 1,3 rows 4..7.
    ranks[r].push_back(item("model/w", g, ShardSpec::split(g, 0, 2, r % 2)));
  }
  auto plan = plan_save(ranks);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  check_plan(ranks, *plan);
  ASSERT_EQ(plan->tensors.size(), 2u);
  EXPECT_EQ(plan->tensors[0].key, "model/norm");
  EXPECT_EQ(plan->tensors[0].regions.size(), 1u);
  EXPECT_EQ(plan->tensors[1].regions.size(), 2u);
  int assignments = 0;
  for (const auto& v : writes_by_rank(ranks, *plan)) assignments += static_cast<int>(v.size());
  EXPECT_EQ(assignments, 3);
  const uint64_t total = std::accumulate(plan->bytes_by_rank.begin(), plan->bytes_by_rank.end(), uint64_t{0});
  EXPECT_EQ(total, (4u + 32u) * 4u);
}

TEST(PlanSave, EqualReplicasSpreadOnePerRank) {
  Ranks ranks(8);
  for (int r = 0; r < 8; ++r)
    for (int t = 0; t < 8; ++t)
      ranks[r].push_back(item("model/t" + std::to_string(t), {16, 16}, ShardSpec::whole({16, 16})));
  auto plan = plan_save(ranks);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  check_plan(ranks, *plan);
  const auto by_rank = writes_by_rank(ranks, *plan);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(by_rank[r].size(), 1u) << "rank " << r;
    EXPECT_EQ(plan->bytes_by_rank[r], 16u * 16u * 4u) << "rank " << r;
  }
}

TEST(PlanSave, UnequalSizesBalancedWorstFit) {
  std::mt19937_64 rng(31337);
  for (int trial = 0; trial < 20; ++trial) {
    const int nranks = 2 + trial % 7;
    const int ntensors = 5 + trial * 3;
    Ranks ranks(nranks);
    int64_t total = 0, largest = 0;
    for (int t = 0; t < ntensors; ++t) {
      const int64_t rows = std::uniform_int_distribution<int64_t>(1, 300)(rng);
      const Shape g{rows, 16};
      const DType dt = t % 3 == 0 ? DType::kBF16 : DType::kF32;
      const int64_t b = rows * 16 * static_cast<int64_t>(dtype_size(dt));
      total += b;
      largest = std::max(largest, b);
      for (int r = 0; r < nranks; ++r)
        ranks[r].push_back(item("opt/t" + std::to_string(t), g, ShardSpec::whole(g), dt));
    }
    auto plan = plan_save(ranks);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    check_plan(ranks, *plan);
    const int64_t max_load =
        static_cast<int64_t>(*std::max_element(plan->bytes_by_rank.begin(), plan->bytes_by_rank.end()));
    // The optimum is at least max(total / n, largest); greedy worst-fit stays within one item of it.
    const int64_t lower = std::max((total + nranks - 1) / nranks, largest);
    EXPECT_LE(max_load, lower + largest) << "trial " << trial;
    EXPECT_LE(max_load, total / nranks + largest) << "trial " << trial;
  }
}

TEST(PlanSave, BalancesWithinHolderSets) {
  // TP 2 x DP 4: each TP half of 6 tensors is held by the 4 DP ranks of that TP index.
  Ranks ranks(8);
  for (int r = 0; r < 8; ++r)
    for (int t = 0; t < 6; ++t) {
      const Shape g{40 + 8 * t, 8};
      ranks[r].push_back(item("model/layer" + std::to_string(t), g, ShardSpec::split(g, 0, 2, r % 2)));
    }
  auto plan = plan_save(ranks);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  check_plan(ranks, *plan);
  const auto by_rank = writes_by_rank(ranks, *plan);
  for (int r = 0; r < 8; ++r) EXPECT_GE(by_rank[r].size(), 1u) << "rank " << r << " idle";
}

void expect_error(const Ranks& ranks, ErrorCode code, const std::vector<std::string>& needles) {
  auto plan = plan_save(ranks);
  ASSERT_FALSE(plan.ok()) << "accepted, expected: " << error_code_name(code);
  EXPECT_EQ(plan.status().code(), code) << plan.status().to_string();
  for (const auto& n : needles)
    EXPECT_NE(plan.status().message().find(n), std::string::npos)
        << "message '" << plan.status().message() << "' lacks '" << n << "'";
}

TEST(PlanSaveErrors, OverlappingNonIdenticalShards) {
  const Shape g{8, 2};
  Ranks ranks(3);
  ranks[0].push_back(item("model/w", g, ShardSpec::box_of({0, 0}, {5, 2})));
  ranks[1].push_back(item("model/w", g, ShardSpec::box_of({5, 0}, {3, 2})));
  ranks[2].push_back(item("model/w", g, ShardSpec::box_of({3, 1}, {3, 1})));
  expect_error(ranks, ErrorCode::kInvalidArgument, {"model/w", "overlaps", "rank 2"});
  // Overlap between a box and a flat range that are not identical.
  Ranks flat(2);
  flat[0].push_back(item("opt/m", g, ShardSpec::flat_range(Box{{0, 0}, {8, 2}}, 0, 9)));
  flat[1].push_back(item("opt/m", g, ShardSpec::box_of({4, 0}, {4, 2})));
  expect_error(flat, ErrorCode::kInvalidArgument, {"opt/m", "rank 0", "rank 1"});
  // A whole box and the flat range of all its elements: the same elements, not the same shard
  // (the planner tells regions apart by box number, range and flatness).
  Ranks same(2);
  same[0].push_back(item("opt/v", g, ShardSpec::box_of({0, 0}, {8, 2})));
  same[1].push_back(item("opt/v", g, ShardSpec::flat_range(Box{{0, 0}, {8, 2}}, 0, 16)));
  expect_error(same, ErrorCode::kInvalidArgument, {"opt/v", "rank 0", "rank 1", "without being identical"});
}

TEST(PlanSaveErrors, IncompleteCoverage) {
  const Shape g{8, 2};
  Ranks ranks(2);
  ranks[0].push_back(item("model/w", g, ShardSpec::box_of({0, 0}, {4, 2})));
  ranks[1].push_back(item("model/w", g, ShardSpec::box_of({5, 0}, {3, 2})));
  expect_error(ranks, ErrorCode::kInvalidArgument, {"model/w", "14 of 16"});
  // Flat ranges with a gap.
  Ranks flat(2);
  flat[0].push_back(item("opt/m", g, ShardSpec::flat_range(Box{{0, 0}, {8, 2}}, 0, 7)));
  flat[1].push_back(item("opt/m", g, ShardSpec::flat_range(Box{{0, 0}, {8, 2}}, 8, 16)));
  expect_error(flat, ErrorCode::kInvalidArgument, {"opt/m", "15 of 16"});
}

TEST(PlanSaveErrors, DtypeAndShapeMismatchAcrossRanks) {
  Ranks ranks(3);
  for (int r = 0; r < 3; ++r)
    ranks[r].push_back(item("model/w", {4}, ShardSpec::whole({4}), r == 2 ? DType::kBF16 : DType::kF32));
  expect_error(ranks, ErrorCode::kDtypeMismatch, {"model/w", "f32", "bf16", "rank 0", "rank 2"});

  Ranks shapes(2);
  shapes[0].push_back(item("model/emb", {10, 4}, ShardSpec::split({10, 4}, 0, 2, 0)));
  shapes[1].push_back(item("model/emb", {12, 4}, ShardSpec::split({12, 4}, 0, 2, 1)));
  expect_error(shapes, ErrorCode::kShapeMismatch, {"model/emb", "[10,4]", "[12,4]", "rank 0", "rank 1"});

  // The previous rank's shard under another global shape: a replica in its shard only.
  Ranks replica(2);
  replica[0].push_back(item("model/b", {4}, ShardSpec::box_of({0}, {4})));
  replica[1].push_back(item("model/b", {6}, ShardSpec::box_of({0}, {4})));
  expect_error(replica, ErrorCode::kShapeMismatch, {"model/b", "[4]", "[6]", "rank 0", "rank 1"});
}

TEST(PlanSaveErrors, DuplicateKeyOnOneRank) {
  Ranks ranks(2);
  ranks[0].push_back(item("model/w", {4}, ShardSpec::whole({4})));
  ranks[1].push_back(item("model/w", {4}, ShardSpec::whole({4})));
  ranks[1].push_back(item("model/w", {4}, ShardSpec::whole({4})));
  expect_error(ranks, ErrorCode::kInvalidArgument, {"model/w", "twice", "rank 1"});
}

TEST(PlanSaveErrors, KeyThatIsGroupPrefixOfAnother) {
  Ranks ranks(2);
  ranks[0].push_back(item("a", {4}, ShardSpec::whole({4})));
  ranks[1].push_back(item("a/b", {4}, ShardSpec::whole({4})));
  ranks[0].push_back(item("a/b", {4}, ShardSpec::whole({4})));
  ranks[1].push_back(item("a", {4}, ShardSpec::whole({4})));
  expect_error(ranks, ErrorCode::kInvalidArgument, {"'a'", "'a/b'"});
  // "ab" is not inside group "a": accepted.
  Ranks fine(1);
  fine[0].push_back(item("a", {4}, ShardSpec::whole({4})));
  fine[0].push_back(item("ab/c", {4}, ShardSpec::whole({4})));
  EXPECT_TRUE(plan_save(fine).ok());
}

TEST(PlanSaveErrors, GroupPrefixWithKeysSortedBetween) {
  // "model/w" < "model/w-x" < "model/w.b" < "model/w/x" in byte order: the dataset/group clash
  // of "model/w" and "model/w/x" must still be found when other keys sort between them.
  Ranks ranks(1);
  for (const char* k : {"model/w", "model/w-x", "model/w.b", "model/w/x"})
    ranks[0].push_back(item(k, {4}, ShardSpec::whole({4})));
  expect_error(ranks, ErrorCode::kInvalidArgument, {"'model/w'", "'model/w/x'"});
}

TEST(PlanSaveErrors, InvalidAndReservedKeys) {
  for (const char* k : {"", "model/w eight", "model//w", "/model/w", "model/w/", "model/../w", "model/./w", "a$b",
                        "mo\xc3\xa9l", "meta", "meta/index", "meta/x/y"}) {
    Ranks ranks(2);
    ranks[0].push_back(item("model/ok", {2}, ShardSpec::whole({2})));
    ranks[1].push_back(item("model/ok", {2}, ShardSpec::whole({2})));
    ranks[1].push_back(item(k, {2}, ShardSpec::whole({2})));
    auto plan = plan_save(ranks);
    ASSERT_FALSE(plan.ok()) << "key '" << k << "' accepted";
    EXPECT_EQ(plan.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(plan.status().message().find("rank 1"), std::string::npos) << plan.status().message();
    // Keys are quoted printable: bytes outside ASCII as \xNN (a damaged key never cuts the message).
    EXPECT_NE(plan.status().message().find("key '" + h5ckpt::printable(k) + "'"), std::string::npos)
        << plan.status().message();
  }
  EXPECT_NE(validate_key("meta/x").message().find("reserved"), std::string::npos);
  for (const char* k : {"metadata/x", "model/meta", "a", "A.b-c_d/0/e.f"}) EXPECT_TRUE(validate_key(k).ok()) << k;
}

TEST(PlanSaveErrors, ShardOutsideShape) {
  Ranks ranks(1);
  ranks[0].push_back(item("model/w", {4, 4}, ShardSpec::box_of({2, 0}, {3, 4})));
  expect_error(ranks, ErrorCode::kInvalidArgument, {"model/w", "rank 0", "outside"});
}

TEST(PlanSaveErrors, FlatRangeOutsideItsBox) {
  // Rank 1's range ends past its 8-element box; rank 0's range of the same box is fine, so the
  // error is rank 1's (not a coverage count that a range of 4..12 would happen to complete).
  Ranks ranks(2);
  const Box top{{0, 0}, {2, 4}}, bottom{{2, 0}, {2, 4}};
  ranks[0] = {item("model/w", {4, 4}, ShardSpec::flat_range(top, 0, 8)),
              item("optimizer/w", {4, 4}, ShardSpec{Box{{0, 0}, {4, 4}}, std::nullopt})};
  ranks[1] = {item("model/w", {4, 4}, ShardSpec::flat_range(bottom, 4, 12)),
              item("optimizer/w", {4, 4}, ShardSpec{Box{{0, 0}, {4, 4}}, std::nullopt})};
  expect_error(ranks, ErrorCode::kInvalidArgument, {"model/w", "rank 1", "flat range outside the box's 8 elements"});
}

TEST(PlanSaveErrors, GlobalElementCountOverflow) {
  // 2^40 x 2^40 elements do not fit in int64: the tensor can never be covered (or stored), so it
  // must be refused, even when every rank holds an empty box of it.
  const Shape g{int64_t{1} << 40, int64_t{1} << 40};
  Ranks ranks(2);
  for (int r = 0; r < 2; ++r) ranks[r].push_back(item("model/huge", g, ShardSpec::box_of({0, 0}, {0, 0})));
  auto plan = plan_save(ranks);
  EXPECT_FALSE(plan.ok()) << "a tensor of 2^80 elements with no regions was accepted";
  if (!plan.ok()) EXPECT_NE(plan.status().message().find("model/huge"), std::string::npos);
}

TEST(PlanSave, ZeroFlatRangesUnevenAndEmpty) {
  // Tensor [6, 7] (42 elements) split TP 2 along dim 1 (4 + 3 columns); each TP box flattened and
  // split over DP 5 unevenly, with empty ranges.
  const Shape g{6, 7};
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges = {
      {{0, 10}, {10, 10}, {10, 17}, {17, 24}, {24, 24}},  // TP 0 box: 6 x 4 = 24
      {{0, 0}, {0, 5}, {5, 6}, {6, 13}, {13, 18}}};       // TP 1 box: 6 x 3 = 18
  Ranks ranks(10);
  for (int dp = 0; dp < 5; ++dp)
    for (int tp = 0; tp < 2; ++tp) {
      const ShardSpec box = ShardSpec::split(g, 1, 2, tp);
      const auto [b, e] = ranges[tp][dp];
      ranks[tp + 2 * dp].push_back(item("optimizer/exp_avg/w", g, ShardSpec::flat_range(box.box, b, e)));
      ranks[tp + 2 * dp].push_back(item("model/w", g, box));
    }
  auto plan = plan_save(ranks);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  check_plan(ranks, *plan);
  const TensorPlan& opt = plan->tensors[1];
  ASSERT_EQ(opt.key, "optimizer/exp_avg/w");
  EXPECT_EQ(opt.regions.size(), 7u);  // 10 ranges minus 3 empty ones
  // Element coverage, from each region's own decomposition: every element exactly once.
  std::vector<int> hits(42, 0);
  for (size_t k = 0; k < opt.regions.size(); ++k)
    for (const Box& b : shard_boxes(opt.shard(k)))
      for (const Shape& c : elements_of(b)) ++hits[c[0] * 7 + c[1]];
  for (int i = 0; i < 42; ++i) EXPECT_EQ(hits[i], 1) << "element " << i;
  // Ranks whose range is empty write nothing of it.
  for (size_t k = 0; k < opt.regions.size(); ++k) EXPECT_GT(opt.shard(k).numel(), 0);
  EXPECT_EQ(opt.boxes.size(), 2u);  // the two TP boxes, shared by their ranges
}

TEST(PlanSave, FlatRangesInAnyRankOrder) {
  // Two TP boxes of [4, 6], each split over 3 DP ranks, with the ranks listing the ranges in
  // descending order and the boxes interleaved: accepted, every region written once.
  const Shape g{4, 6};
  const ShardSpec left = ShardSpec::split(g, 1, 2, 0), right = ShardSpec::split(g, 1, 2, 1);
  Ranks ranks;
  for (int64_t d = 2; d >= 0; --d)
    for (const ShardSpec* box : {&left, &right})
      ranks.push_back({item("opt/m", g, ShardSpec::flat_range(box->box, 4 * d, 4 * (d + 1)))});
  auto plan = plan_save(ranks);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  check_plan(ranks, *plan);
  ASSERT_EQ(plan->tensors.size(), 1u);
  EXPECT_EQ(plan->tensors[0].regions.size(), 6u);

  // An overlap between the first and the last range listed, with a range between them that
  // overlaps neither: found, and named by the ranks that hold the two.
  Ranks overlap;
  for (auto [b, e] : std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {8, 12}, {4, 8}})
    overlap.push_back({item("opt/m", g, ShardSpec::flat_range(left.box, b, e))});
  overlap.push_back({item("opt/m", g, ShardSpec::flat_range(right.box, 0, 12))});
  expect_error(overlap, ErrorCode::kInvalidArgument, {"opt/m", "rank 0", "rank 2", "without being identical"});
}

TEST(PlanSave, EmptyTensorAndRankHoldingNothing) {
  Ranks ranks(3);
  for (int r = 0; r < 3; ++r) ranks[r].push_back(item("model/empty", {0, 5}, ShardSpec::whole({0, 5})));
  ranks[0].push_back(item("model/w", {4}, ShardSpec::box_of({0}, {4})));
  ranks[1].push_back(item("model/w", {4}, ShardSpec::box_of({4}, {0})));  // owns nothing of it
  auto plan = plan_save(ranks);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  check_plan(ranks, *plan);
  EXPECT_TRUE(plan->tensors[0].regions.empty());
  EXPECT_EQ(plan->tensors[1].regions.size(), 1u);
  EXPECT_EQ(plan->tensors[1].regions[0].writer, 0);
}

// ---- plan_save's disjointness and coverage checks against element counting ------------------

// Element multiplicities of a tensor covered by shards, by enumerating each shard's elements
// (its box's elements in row-major order, cut to its flat range).
std::vector<int> multiplicity(const Shape& g, const std::vector<ShardSpec>& shards) {
  std::vector<int> hits(static_cast<size_t>(volume_of(g)), 0);
  for (const ShardSpec& s : shards) {
    const auto elems = elements_of(s.box);
    const int64_t b = s.flat ? s.flat->first : 0, e = s.flat ? s.flat->second : static_cast<int64_t>(elems.size());
    for (int64_t k = b; k < e; ++k) ++hits[static_cast<size_t>(flat_in_box(Box{Shape(g.size(), 0), g}, elems[k]))];
  }
  return hits;
}

// A random shard of `g`: a box, or a flat range of one; sometimes empty.
ShardSpec random_shard(std::mt19937_64& rng, const Shape& g) {
  auto uni = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Box b;
  for (int64_t extent : g) {
    const int64_t off = uni(0, extent - 1);
    b.offset.push_back(off);
    b.shape.push_back(uni(1, extent - off));
  }
  if (uni(0, 1) == 0) return ShardSpec{b, std::nullopt};
  const int64_t v = b.volume(), begin = uni(0, v), end = uni(begin, v);
  return ShardSpec::flat_range(b, begin, end);
}

TEST(PlanSave, AcceptsExactlyDisjointCompleteRegionSets) {
  // Random tensors split TP-like into boxes, each box's flat order split DP-like into ranges, then
  // sometimes disturbed (a range end moved, a box swapped for a random shard): plan_save must
  // accept exactly the sets whose distinct regions cover every element once.
  std::mt19937_64 rng(2024);
  auto uni = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  int accepted = 0, refused = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int ndim = static_cast<int>(uni(1, 3));
    Shape g;
    for (int d = 0; d < ndim; ++d) g.push_back(uni(1, 6));
    const int dim = static_cast<int>(uni(0, ndim - 1));
    const int tp = static_cast<int>(uni(1, 3)), dp = static_cast<int>(uni(1, 4));
    std::vector<ShardSpec> shards;
    for (int t = 0; t < tp; ++t) {
      const ShardSpec box = ShardSpec::split(g, dim, tp, t);
      const int64_t n = box.numel();
      for (int d = 0; d < dp; ++d) shards.push_back(ShardSpec::flat_range(box.box, n * d / dp, n * (d + 1) / dp));
    }
    switch (uni(0, 3)) {
      case 0: {  // a range end moved: a gap or an overlap with the next range of the same box
        ShardSpec& s = shards[static_cast<size_t>(uni(0, static_cast<int64_t>(shards.size()) - 1))];
        s.flat->second = std::clamp<int64_t>(s.flat->second + uni(-2, 2), s.flat->first, s.box.volume());
        break;
      }
      case 1:  // a random extra shard
        shards.push_back(random_shard(rng, g));
        break;
      case 2:  // one shard replaced by a random one
        shards[static_cast<size_t>(uni(0, static_cast<int64_t>(shards.size()) - 1))] = random_shard(rng, g);
        break;
      default:  // unchanged
        break;
    }
    // Each shard on its own rank, plus a replica of a random one (identical regions are fine).
    Ranks ranks;
    for (const ShardSpec& s : shards) ranks.push_back({item("opt/m", g, s)});
    ranks.push_back({item("opt/m", g, shards[static_cast<size_t>(uni(0, static_cast<int64_t>(shards.size()) - 1))])});
    // Expectation: distinct non-empty shards, each element covered exactly once.
    std::vector<ShardSpec> distinct;
    for (const ShardSpec& s : shards)
      if (s.numel() > 0 && std::find(distinct.begin(), distinct.end(), s) == distinct.end()) distinct.push_back(s);
    const auto hits = multiplicity(g, distinct);
    const bool expect_ok = std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; });
    auto plan = plan_save(ranks);
    ASSERT_EQ(plan.ok(), expect_ok) << "trial " << trial << " shape " << shape_str(g) << ": "
                                    << (plan.ok() ? "accepted" : plan.status().to_string());
    if (plan.ok()) {
      check_plan(ranks, *plan);
      ++accepted;
    } else {
      EXPECT_EQ(plan.status().code(), ErrorCode::kInvalidArgument);
      ++refused;
    }
  }
  EXPECT_GT(accepted, 500);
  EXPECT_GT(refused, 500);
}

// ---- RegionIndex: which regions hold elements of a box, against element enumeration --------

// Indices of the shards holding an element of `want` (cut to the tensor), by enumeration.
std::vector<size_t> holding_by_enumeration(const Shape& g, const std::vector<ShardSpec>& shards, const Box& want) {
  std::vector<size_t> out;
  for (size_t k = 0; k < shards.size(); ++k) {
    const auto elems = elements_of(shards[k].box);
    const int64_t b = shards[k].flat ? shards[k].flat->first : 0;
    const int64_t e = shards[k].flat ? shards[k].flat->second : static_cast<int64_t>(elems.size());
    bool hit = false;
    for (int64_t i = b; i < e && !hit; ++i) {
      bool in = true;
      for (size_t d = 0; d < g.size(); ++d)
        in = in && elems[i][d] >= want.offset[d] && elems[i][d] < want.offset[d] + want.shape[d];
      hit = in;
    }
    if (hit) out.push_back(k);
  }
  return out;
}

TEST(RegionIndex, RandomRegionsAndBoxesMatchEnumeration) {
  // Arbitrary (overlapping, empty, flat) regions and wanted boxes, some reaching outside.
  std::mt19937_64 rng(77);
  auto uni = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  size_t found = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int ndim = static_cast<int>(uni(1, 4));
    Shape g;
    for (int d = 0; d < ndim; ++d) g.push_back(uni(1, 6));
    std::vector<ShardSpec> shards(static_cast<size_t>(uni(0, 40)));
    for (auto& s : shards) s = random_shard(rng, g);
    const RegionIndex index(g, shards.size(), [&](size_t k) -> const ShardSpec& { return shards[k]; });
    ASSERT_EQ(index.size(), shards.size());
    for (int q = 0; q < 30; ++q) {
      Box want = random_shard(rng, g).box;
      if (q % 5 == 0)
        for (int d = 0; d < ndim; ++d) want.shape[d] += uni(0, 3);  // past the tensor's end
      // find appends: what is already in the vector stays.
      std::vector<size_t> got{999999};
      index.find(want, &got);
      got.erase(got.begin());
      const auto expect = holding_by_enumeration(g, shards, want);
      ASSERT_EQ(got, expect) << "trial " << trial << " shape " << shape_str(g) << " want " << box_str(want);
      found += got.size();
    }
  }
  EXPECT_GT(found, 1000u);  // the inputs do produce matches
}

TEST(RegionIndex, ZeroShardsOfOneLayoutSeenFromAnother) {
  // A [24, 30] tensor saved as TP 3 column blocks x DP 4 flat ranges, read as TP 2 row blocks x
  // DP 5 flat ranges (each range's pieces queried, as a load reads them).
  const Shape g{24, 30};
  std::vector<ShardSpec> saved;
  for (int t = 0; t < 3; ++t) {
    const ShardSpec box = ShardSpec::split(g, 1, 3, t);
    const int64_t n = box.numel();
    for (int d = 0; d < 4; ++d) saved.push_back(ShardSpec::flat_range(box.box, n * d / 4, n * (d + 1) / 4));
  }
  const RegionIndex index(g, saved.size(), [&](size_t k) -> const ShardSpec& { return saved[k]; });
  for (int t = 0; t < 2; ++t) {
    const ShardSpec box = ShardSpec::split(g, 0, 2, t);
    const int64_t n = box.numel();
    for (int d = 0; d < 5; ++d)
      for (const Box& piece : shard_boxes(ShardSpec::flat_range(box.box, n * d / 5, n * (d + 1) / 5))) {
        std::vector<size_t> got;
        index.find(piece, &got);
        EXPECT_EQ(got, holding_by_enumeration(g, saved, piece)) << box_str(piece);
        EXPECT_FALSE(got.empty());
      }
  }
  std::vector<size_t> none;
  index.find(Box{{24, 0}, {1, 30}}, &none);  // entirely outside
  index.find(Box{{0, 0}, {0, 30}}, &none);   // empty
  EXPECT_TRUE(none.empty());
}

// ---- scale: a simulated Megatron-like job of 10,000 ranks -----------------------------------

// ---- plan_save against a plain reference, layout by layout ------------------------------------
// The planner's data structures (region pool, hash tables, sort keys) are optimizations: the plan
// itself is specified by the rules below, which a few lines of maps and linear searches compute
// independently. Every field of both plans is compared, so an optimization that changes a region's
// order, a writer or a byte count fails here.

struct JobLayout {
  int tp = 1, cp = 1, dp = 1, pp = 1, ep = 1;
  bool zero = false;
  int experts = 0;     // experts of the MoE layers (every second layer), 0: dense
  bool fused = false;  // fc1 as a fused [gate; up] item of two pieces per TP rank
  std::string tag() const {
    return "tp" + std::to_string(tp) + ".cp" + std::to_string(cp) + ".dp" + std::to_string(dp) + ".pp" +
           std::to_string(pp) + ".ep" + std::to_string(ep) + (zero ? ".zero" : "") +
           (experts ? ".moe" + std::to_string(experts) : "") + (fused ? ".fused" : "");
  }
};

// What every rank registers: a small GPT (4 layers, uneven sizes, one 5-D weight per layer) under
// the layout. Rank order as the topology's: TP fastest, then CP, DP, PP. CP ranks hold the same
// parameters (replicas); EP splits the expert dimension over groups of DP ranks
// (expert-data-parallel over the rest).
Ranks layout_items(const JobLayout& l) {
  const int64_t H = 24, F = 40, V = 67, E = l.experts;
  const int layers = 4;
  const int world = l.tp * l.cp * l.dp * l.pp;
  Ranks ranks(static_cast<size_t>(world));
  for (int p = 0; p < l.pp; ++p)
    for (int d = 0; d < l.dp; ++d)
      for (int c = 0; c < l.cp; ++c)
        for (int t = 0; t < l.tp; ++t) {
          auto& items = ranks[static_cast<size_t>(t + l.tp * (c + l.cp * (d + l.dp * p)))];
          // Optimizer states: flat slices of the rank's shard over `n` ZeRO ranks (slice `i`).
          auto add = [&](const std::string& name, const Shape& shape, const ShardSpec& shard, int i, int n) {
            items.push_back(item("model/" + name, shape, shard, DType::kBF16));
            if (!l.zero) {
              items.push_back(item("optimizer/exp_avg/" + name, shape, shard));
              return;
            }
            const int64_t numel = shard.numel();
            const int64_t b = numel * i / n, e = numel * (i + 1) / n;
            for (const char* st : {"fp32_param", "exp_avg", "exp_avg_sq"})
              items.push_back(
                  item(std::string("optimizer/") + st + "/" + name, shape, ShardSpec::flat_range(shard.box, b, e)));
          };
          const int dense_i = d * l.cp + c, dense_n = l.dp * l.cp;
          if (p == 0) add("embedding", {V, H}, ShardSpec::split({V, H}, 0, l.tp, t), dense_i, dense_n);
          for (int layer = p * layers / l.pp; layer < (p + 1) * layers / l.pp; ++layer) {
            const std::string pre = "layers." + std::to_string(layer) + ".";
            add(pre + "qkv", {3 * H, H}, ShardSpec::split({3 * H, H}, 0, l.tp, t), dense_i, dense_n);
            add(pre + "proj", {H, H}, ShardSpec::split({H, H}, 1, l.tp, t), dense_i, dense_n);
            add(pre + "ln", {H}, ShardSpec::whole({H}), dense_i, dense_n);
            // A 5-D weight (more dimensions than the planner keeps beside a box's number).
            add(pre + "conv", {2, 3, 4, 5, 6}, ShardSpec::split({2, 3, 4, 5, 6}, 3, l.tp, t), dense_i, dense_n);
            if (E > 0 && layer % 2 == 1) {
              const int ep_rank = d % l.ep, edp_i = d / l.ep, edp_n = l.dp / l.ep;
              ShardSpec s = ShardSpec::split({E, F, H}, 1, l.tp, t);
              s.box.offset[0] = E / l.ep * ep_rank;
              s.box.shape[0] = E / l.ep;
              add(pre + "experts.fc1", {E, F, H}, s, edp_i, edp_n);
            } else if (l.fused) {
              // [gate; up] rows t of each half in one buffer: two pieces of one item.
              const ShardSpec gate = ShardSpec::split({F, H}, 0, l.tp, t);
              ShardSpec up = gate;
              up.box.offset[0] += F;
              items.push_back(item("model/" + pre + "fc1", {2 * F, H}, gate, DType::kBF16));
              items.push_back(item("model/" + pre + "fc1", {2 * F, H}, up, DType::kBF16));
              items.back().continues = true;
            } else {
              add(pre + "fc1", {F, H}, ShardSpec::split({F, H}, 0, l.tp, t), dense_i, dense_n);
            }
          }
          if (p == l.pp - 1) add("final_ln", {H}, ShardSpec::whole({H}), dense_i, dense_n);
          items.push_back(item("optimizer/step", {1}, ShardSpec::whole({1}), DType::kI64));
          items.push_back(item("extra/rng/rank" + std::to_string(items.size() % 7) + "." + std::to_string(t) + "." +
                                   std::to_string(c) + "." + std::to_string(d) + "." + std::to_string(p),
                               {16}, ShardSpec::whole({16}), DType::kU8));
        }
  return ranks;
}

// The rules of docs/design.md, computed plainly: tensors sorted by key; a tensor's regions are its
// distinct non-empty shards in order of first appearance (ranks ascending, items in order); each
// region's holders ascending; regions written largest first (ties in plan order), each by its
// least-loaded holder (ties to the lowest rank).
SavePlan reference_plan(const Ranks& ranks) {
  struct Ref {
    DType dtype;
    Shape shape;
    std::vector<ShardSpec> regions;
    std::vector<std::vector<int>> holders;
  };
  std::map<std::string, Ref> tensors;
  for (size_t r = 0; r < ranks.size(); ++r)
    for (const ItemDesc& it : ranks[r]) {
      Ref& t = tensors.try_emplace(it.key, Ref{it.dtype, it.global_shape, {}, {}}).first->second;
      if (it.shard.numel() == 0) continue;
      size_t k = 0;
      while (k < t.regions.size() && !(t.regions[k] == it.shard)) ++k;
      if (k == t.regions.size()) {
        t.regions.push_back(it.shard);
        t.holders.emplace_back();
      }
      t.holders[k].push_back(static_cast<int>(r));
    }
  SavePlan plan;
  plan.bytes_by_rank.assign(ranks.size(), 0);
  std::vector<std::tuple<int64_t, size_t, size_t>> jobs;  // bytes, tensor, region
  for (auto& [key, t] : tensors) {
    TensorPlan tp{key, t.dtype, t.shape, {}, {}};
    for (size_t k = 0; k < t.regions.size(); ++k) {
      tp.add_region(t.regions[k], -1);
      jobs.emplace_back(bytes_of(t.regions[k], t.dtype), plan.tensors.size(), k);
    }
    plan.tensors.push_back(std::move(tp));
  }
  std::stable_sort(jobs.begin(), jobs.end(),
                   [](const auto& a, const auto& b) { return std::get<0>(a) > std::get<0>(b); });
  for (const auto& [bytes, ti, k] : jobs) {
    const auto& holders = tensors.at(plan.tensors[ti].key).holders[k];
    int best = holders[0];
    for (int h : holders)
      if (plan.bytes_by_rank[h] < plan.bytes_by_rank[best]) best = h;
    plan.tensors[ti].regions[k].writer = best;
    plan.bytes_by_rank[best] += static_cast<uint64_t>(bytes);
  }
  return plan;
}

void expect_same_plan(const SavePlan& got, const SavePlan& want, const std::string& what) {
  ASSERT_EQ(got.tensors.size(), want.tensors.size()) << what;
  for (size_t t = 0; t < want.tensors.size(); ++t) {
    const TensorPlan &g = got.tensors[t], &w = want.tensors[t];
    ASSERT_EQ(g.key, w.key) << what;
    EXPECT_EQ(g.dtype, w.dtype) << what << " " << w.key;
    EXPECT_EQ(g.shape, w.shape) << what << " " << w.key;
    EXPECT_EQ(g.boxes, w.boxes) << what << " " << w.key;  // each distinct box once, by first appearance
    ASSERT_EQ(g.regions.size(), w.regions.size()) << what << " " << w.key;
    for (size_t k = 0; k < w.regions.size(); ++k) {
      EXPECT_EQ(sig_of(g.shard(k)), sig_of(w.shard(k))) << what << " " << w.key << " region " << k;
      EXPECT_EQ(g.regions[k].box, w.regions[k].box) << what << " " << w.key << " region " << k;
      EXPECT_EQ(g.regions[k].begin, w.regions[k].begin) << what << " " << w.key << " region " << k;
      EXPECT_EQ(g.regions[k].end, w.regions[k].end) << what << " " << w.key << " region " << k;
      EXPECT_EQ(g.regions[k].writer, w.regions[k].writer) << what << " " << w.key << " region " << k;
    }
  }
  EXPECT_EQ(got.bytes_by_rank, want.bytes_by_rank) << what;
}

// The save planner's per-tensor tables grow in a BulkArena: vectors that outgrow its reservation
// continue in ordinary memory with their values, and arena memory is never handed to free().
TEST(BulkArena, VectorsOutgrowingTheReservationKeepTheirValues) {
  BulkArena arena(size_t{4} << 20);  // mapped with huge pages requested: the smallest such arena
  std::vector<ArenaVector<uint64_t>> vecs;
  for (int v = 0; v < 3; ++v) vecs.emplace_back(ArenaAllocator<uint64_t>(arena));
  constexpr uint64_t kEach = 400'000;  // 3 x 3.2 MB of values, more with the doubling: past 4 MiB
  for (uint64_t i = 0; i < kEach; ++i)
    for (size_t v = 0; v < vecs.size(); ++v) vecs[v].push_back(i * 3 + v);
  for (size_t v = 0; v < vecs.size(); ++v) {
    ASSERT_EQ(vecs[v].size(), kEach);
    for (uint64_t i = 0; i < kEach; ++i) ASSERT_EQ(vecs[v][i], i * 3 + v) << "vector " << v << " value " << i;
  }
  vecs.clear();  // frees the vectors that moved to operator new, and only those
}

// Blocks given back are handed out again by size when the size is a power of two, as a vector's
// doublings and a hash table's are: tables that grow one after another reuse each other's
// outgrown blocks instead of fresh memory.
TEST(BulkArena, BlocksGivenBackAreReusedByPowerOfTwoSize) {
  BulkArena arena(size_t{4} << 20);
  void* a = arena.allocate(256);
  void* b = arena.allocate(256);
  const size_t used = arena.used();
  arena.deallocate(a, 256);
  EXPECT_EQ(arena.allocate(256), a);
  EXPECT_EQ(arena.used(), used) << "a block given back was not taken again";
  arena.deallocate(b, 256);
  EXPECT_NE(arena.allocate(512), b) << "a block went to a request of another size";
  void* c = arena.allocate(48);  // no power of two: not kept
  arena.deallocate(c, 48);
  EXPECT_NE(arena.allocate(48), c);
  void* d = arena.allocate(12);  // rounded up to 16 bytes, a power of two
  arena.deallocate(d, 12);
  EXPECT_EQ(arena.allocate(16), d);

  // A vector grown after another was grown and freed takes the first one's blocks: no more
  // reservation is used (up to the last block, which the first vector still held when freed).
  auto grow = [&](uint32_t n) {
    ArenaVector<uint32_t> v{ArenaAllocator<uint32_t>(arena)};
    for (uint32_t i = 0; i < n; ++i) v.push_back(i * 7);
    for (uint32_t i = 0; i < n; ++i) EXPECT_EQ(v[i], i * 7);
  };
  grow(5000);
  const size_t after_first = arena.used();
  grow(5000);
  EXPECT_EQ(arena.used(), after_first) << "the second vector grew into fresh memory";
}

// After its scan the save planner recycles the arena of its hash tables, all dead by then, so
// that the plan's per-region arrays land on pages already faulted in: the next request starts at
// the reservation's beginning, and no block given back before is handed out again.
TEST(BulkArena, RecycledArenaStartsOverAtItsBeginning) {
  BulkArena arena(size_t{4} << 20);
  char* first = static_cast<char*>(arena.allocate(1024));
  void* freed = arena.allocate(256);
  arena.deallocate(freed, 256);
  arena.recycle();
  EXPECT_EQ(arena.used(), 0u);
  EXPECT_EQ(arena.allocate(256), first) << "a block given back before the recycle, or fresh memory";
  EXPECT_EQ(arena.allocate(32), first + 256);
  ArenaVector<int> v{ArenaAllocator<int>(arena)};
  v.assign(1000, -3);  // over pages holding the old blocks' bytes: assigned, so read back as written
  EXPECT_EQ(static_cast<void*>(v.data()), first + 288);
  EXPECT_EQ(std::count(v.begin(), v.end(), -3), 1000);
}

// Huge pages are asked for unless the kernel hands free blocks of a huge page or less back to its
// hypervisor (free page reporting, seen to have reported): there a fresh huge page costs more.
TEST(BulkAllocator, HugePagesAreNotAskedForWhereFreeOnesGoBackToTheHost) {
  constexpr long long k4K = 4096;
  EXPECT_FALSE(huge_pages_pay_with(9, 11'392'128, k4K)) << "reporting of 2 MiB blocks (the 2-core VM's)";
  EXPECT_FALSE(huge_pages_pay_with(0, 1, k4K)) << "reporting of single pages";
  EXPECT_TRUE(huge_pages_pay_with(10, 11'392'128, k4K)) << "only 4 MiB blocks go back: a free huge page may stay";
  EXPECT_TRUE(huge_pages_pay_with(11, 1, k4K));
  EXPECT_TRUE(huge_pages_pay_with(9, 0, k4K)) << "nothing reported: no device takes pages back";
  EXPECT_TRUE(huge_pages_pay_with(-1, -1, k4K)) << "no free page reporting (bare metal)";
  EXPECT_TRUE(huge_pages_pay_with(9, -1, k4K));
  EXPECT_FALSE(huge_pages_pay_with(5, 1, 65536)) << "64 KiB pages: 2 MiB blocks again";
  EXPECT_TRUE(huge_pages_pay_with(6, 1, 65536));
}

// TP 4 x DP 3: the previous rank holds another row block of "model/w" and its replicas lie 4 ranks
// apart, found by hash rather than beside the previous rank's item. What a replica 4 ranks back
// shares is still checked: dtype, global shape, and the key itself.
TEST(PlanSaveErrors, ReplicasFoundTpRanksBackAreStillChecked) {
  const Shape g{8, 4};
  auto layout = [&] {
    Ranks ranks(12);
    for (int r = 0; r < 12; ++r) {
      ranks[r].push_back(item("model/norm", {4}, ShardSpec::whole({4})));
      ranks[r].push_back(item("model/w", g, ShardSpec::split(g, 0, 4, r % 4)));
      ranks[r].push_back(item("model/v", g, ShardSpec::split(g, 0, 4, r % 4)));
    }
    return ranks;
  };
  const Ranks good = layout();
  auto plan = plan_save(good);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  expect_same_plan(*plan, reference_plan(good), "tp4.dp3");
  check_plan(good, *plan);

  Ranks dtype = layout();
  dtype[9][1].dtype = DType::kBF16;
  expect_error(dtype, ErrorCode::kDtypeMismatch, {"model/w", "f32", "bf16", "rank 0", "rank 9"});

  // Rank 10 gives "model/v" the global shape [16,4] but keeps the box of rank 6's: not a replica.
  Ranks shape = layout();
  shape[10][2].global_shape = Shape{16, 4};
  expect_error(shape, ErrorCode::kShapeMismatch, {"model/v", "[8,4]", "[16,4]", "rank 10"});

  // Ranks 9 to 11 list "model/v" before "model/w": at each position the item 4 ranks back has the
  // same extents under the other key, whose region is not this item's.
  Ranks swapped = layout();
  for (int r = 9; r < 12; ++r) std::swap(swapped[r][1], swapped[r][2]);
  auto swapped_plan = plan_save(swapped);
  ASSERT_TRUE(swapped_plan.ok()) << swapped_plan.status().to_string();
  expect_same_plan(*swapped_plan, reference_plan(swapped), "tp4.dp3, keys swapped on the last DP rank");
  check_plan(swapped, *swapped_plan);

  // Rank 8 holds the second row block of "model/w" (rank 9's), not the first of rank 4 before it:
  // a replica of ranks 1, 5 and 9, and the first block is still held by ranks 0 and 4.
  Ranks shifted = layout();
  shifted[8][1].shard = ShardSpec::split(g, 0, 4, 1);
  auto shifted_plan = plan_save(shifted);
  ASSERT_TRUE(shifted_plan.ok()) << shifted_plan.status().to_string();
  expect_same_plan(*shifted_plan, reference_plan(shifted), "tp4.dp3, rank 8 holding rank 9's block");
  check_plan(shifted, *shifted_plan);
}

TEST(PlanSave, EqualsTheReferenceOnEveryLayout) {
  const std::vector<JobLayout> layouts = {
      {1, 1, 1, 1, 1, false, 0, false}, {2, 1, 2, 2, 1, false, 0, false}, {2, 1, 3, 1, 1, true, 0, false},
      {2, 2, 2, 2, 1, true, 0, false},  {1, 1, 4, 2, 2, true, 4, false},  {2, 1, 4, 1, 4, true, 8, false},
      {2, 1, 2, 2, 1, false, 0, true},  {4, 2, 3, 1, 1, true, 0, true},   {2, 2, 4, 2, 2, true, 4, true}};
  for (const JobLayout& l : layouts) {
    const Ranks ranks = layout_items(l);
    const SavePlan want = reference_plan(ranks);
    auto got = plan_save(ranks);
    ASSERT_TRUE(got.ok()) << l.tag() << ": " << got.status().to_string();
    expect_same_plan(*got, want, l.tag());
    check_plan(ranks, *got);
  }
}

TEST(PlanSaveScale, MegatronLike10000Ranks) {
  const int TP = 8, PP = 10, DP = 125, kLayersPerStage = 2;
  const int64_t H = 500, V = 1003;  // uneven TP splits on purpose
  const int world = TP * PP * DP;
  struct Weight {
    std::string name;
    Shape shape;
    int split_dim;  // -1: replicated over TP
  };
  auto layer_weights = [&](int layer) {
    const std::string p = "layers." + std::to_string(layer) + ".";
    return std::vector<Weight>{{p + "attn.qkv.weight", {3 * H, H}, 0},
                               {p + "attn.proj.weight", {H, H}, 1},
                               {p + "mlp.fc1.weight", {4 * H, H}, 0},
                               {p + "mlp.fc2.weight", {H, 4 * H}, 1},
                               {p + "ln.weight", {H}, -1}};
  };
  const std::vector<std::string> kOptStates = {"fp32_param", "exp_avg", "exp_avg_sq"};

  Ranks ranks(world);
  for (int pp = 0; pp < PP; ++pp) {
    std::vector<Weight> ws;
    if (pp == 0) ws.push_back({"embedding.weight", {V, H}, 0});
    for (int l = pp * kLayersPerStage; l < (pp + 1) * kLayersPerStage; ++l)
      for (auto& w : layer_weights(l)) ws.push_back(w);
    if (pp == PP - 1) ws.push_back({"final_ln.weight", {H}, -1});
    for (int dp = 0; dp < DP; ++dp)
      for (int tp = 0; tp < TP; ++tp) {
        const int rank = tp + TP * (dp + DP * pp);  // Megatron order: TP fastest, then DP, then PP
        auto& items = ranks[rank];
        for (const auto& w : ws) {
          const ShardSpec local =
              w.split_dim < 0 ? ShardSpec::whole(w.shape) : ShardSpec::split(w.shape, w.split_dim, TP, tp);
          items.push_back(item("model/" + w.name, w.shape, local, DType::kBF16));
          // Distributed optimizer: the TP-local tensor flattened and split over DP (uneven).
          const int64_t n = local.numel(), base = n / DP, extra = n % DP;
          const int64_t b = dp * base + std::min<int64_t>(dp, extra);
          const int64_t e = b + base + (dp < extra ? 1 : 0);
          for (const auto& s : kOptStates)
            items.push_back(item("optimizer/" + s + "/" + w.name, w.shape, ShardSpec::flat_range(local.box, b, e)));
        }
      }
  }
  size_t nitems = 0;
  for (const auto& r : ranks) nitems += r.size();

  const auto t0 = std::chrono::steady_clock::now();
  auto plan = plan_save(ranks);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();

  // Independent accounting: holders per (key, region), total unique bytes.
  std::map<std::string, std::map<std::string, std::set<int>>> holders;
  std::map<std::string, int64_t> tensor_bytes;
  for (int r = 0; r < world; ++r)
    for (const auto& it : ranks[r]) {
      tensor_bytes[it.key] = volume_of(it.global_shape) * static_cast<int64_t>(dtype_size(it.dtype));
      if (it.shard.numel() > 0) holders[it.key][sig_of(it.shard)].insert(r);
    }
  int64_t expect_total = 0;
  for (auto& [k, b] : tensor_bytes) expect_total += b;
  ASSERT_EQ(plan->tensors.size(), tensor_bytes.size());
  int64_t planned = 0;
  size_t nregions = 0;
  for (const auto& t : plan->tensors) {
    const auto& hk = holders.at(t.key);
    ASSERT_EQ(t.regions.size(), hk.size()) << t.key;
    int64_t tb = 0;
    for (size_t k = 0; k < t.regions.size(); ++k) {
      const auto& reg = t.regions[k];
      auto h = hk.find(sig_of(t.shard(k)));
      ASSERT_NE(h, hk.end()) << t.key;
      ASSERT_TRUE(h->second.count(reg.writer)) << t.key << ": writer " << reg.writer << " is not a holder";
      tb += bytes_of(t.shard(k), t.dtype);
    }
    ASSERT_EQ(tb, tensor_bytes.at(t.key)) << t.key << ": regions do not account for every byte";
    planned += tb;
    nregions += t.regions.size();
  }
  EXPECT_EQ(planned, expect_total);
  int64_t by_rank_total = 0, max_load = 0, min_load = INT64_MAX;
  size_t assignments = 0;
  const auto by_rank = writes_by_rank(ranks, *plan);
  for (int r = 0; r < world; ++r) {
    by_rank_total += static_cast<int64_t>(plan->bytes_by_rank[r]);
    max_load = std::max<int64_t>(max_load, plan->bytes_by_rank[r]);
    min_load = std::min<int64_t>(min_load, plan->bytes_by_rank[r]);
    for (const auto& a : by_rank[r]) {
      ASSERT_EQ(plan->tensors[a.tensor].regions[a.region].writer, r);
      ASSERT_EQ(ranks[r][a.item].key, plan->tensors[a.tensor].key);
      ++assignments;
    }
  }
  EXPECT_EQ(by_rank_total, expect_total);
  EXPECT_EQ(assignments, nregions);
  std::printf(
      "[ scale    ] %d ranks (TP %d, PP %d, DP %d), %zu items, %zu tensors, %zu regions, %.1f MiB: "
      "plan_save %.3f s; per-rank write load min %.2f / max %.2f MiB\n",
      world, TP, PP, DP, nitems, plan->tensors.size(), nregions, expect_total / 1048576.0, secs, min_load / 1048576.0,
      max_load / 1048576.0);
}

}  // namespace
}  // namespace h5ckpt::planner
