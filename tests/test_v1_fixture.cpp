// Format-v1 checkpoints keep loading: tests/fixtures/v1-checkpoint was written by library 0.1.0
// (tests/fixtures/write_v1_fixture.cpp, tp 2 x dp 2) and is read here with read_checkpoint_info,
// a CheckpointReader and a collective load under another layout. Every element is compared with
// the formula it was written from (v1_fixture_spec.h), not with anything the library computes.
// With H5CKPT_FIXTURE_DIR / H5CKPT_FIXTURE_FORMAT the same checks run on a checkpoint the
// writer made with today's library (format v2): the two formats must load identically.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "h5ckpt/h5ckpt.hpp"
#include "h5ckpt/loader_state.h"
#include "support/test_model.h"
#include "v1_fixture_spec.h"

using namespace h5ckpt;
using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;
namespace fs = std::filesystem;

namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// The checkpoint under test and the format version it must report.
std::string source_dir() { return env_or("H5CKPT_FIXTURE_DIR", H5CKPT_V1_FIXTURE_DIR); }
int expected_format() { return std::stoi(env_or("H5CKPT_FIXTURE_FORMAT", "1")); }

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t e : s) n *= e;
  return n;
}

// The regions as (offset, shape, flat begin, flat end), flat -1/-1 for a box: what the saving
// layout of each split gives, worked out by hand for these shapes.
using RegionKey = std::tuple<Shape, Shape, int64_t, int64_t>;
std::set<RegionKey> expected_regions(const v1_fixture::Tensor& t) {
  switch (t.split) {
    case v1_fixture::Split::kReplicated: return {{Shape(t.shape.size(), 0), t.shape, -1, -1}};
    case v1_fixture::Split::kTpRows: return {{{0, 0}, {4, 4}, -1, -1}, {{4, 0}, {3, 4}, -1, -1}};  // [7,4]
    case v1_fixture::Split::kTpCols: return {{{0, 0}, {4, 3}, -1, -1}, {{0, 3}, {4, 3}, -1, -1}};  // [4,6]
    case v1_fixture::Split::kTpRowsZero:  // [4,2,3]: two TP boxes of 12 elements, each in two DP halves
      return {{{0, 0, 0}, {2, 2, 3}, 0, 6},
              {{0, 0, 0}, {2, 2, 3}, 6, 12},
              {{2, 0, 0}, {2, 2, 3}, 0, 6},
              {{2, 0, 0}, {2, 2, 3}, 6, 12}};
    case v1_fixture::Split::kFlatAll:  // [7,4] = 28 elements over 4 ranks
      return {{{0, 0}, {7, 4}, 0, 7}, {{0, 0}, {7, 4}, 7, 14}, {{0, 0}, {7, 4}, 14, 21}, {{0, 0}, {7, 4}, 21, 28}};
  }
  return {};
}

std::vector<char> expected_bytes(const v1_fixture::Tensor& t, int64_t begin, int64_t end) {
  const size_t es = dtype_size(t.dtype);
  std::vector<char> out(static_cast<size_t>(end - begin) * es);
  for (int64_t i = begin; i < end; ++i) v1_fixture::element_bytes(t.dtype, t.seed, i, out.data() + (i - begin) * es);
  return out;
}

class V1Fixture : public ::testing::Test {
 protected:
  // A private copy: a load may write its metrics beside the checkpoint.
  void SetUp() override {
    root_ = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "v1fixture");
    dir_ = root_ + "/ckpt";
    if (world_rank() == 0) fs::copy(source_dir(), dir_, fs::copy_options::recursive);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) fs::remove_all(root_);
  }
  std::string root_, dir_;
};

TEST_F(V1Fixture, MetadataIsWhatWasSaved) {
  auto info = read_checkpoint_info(dir_);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->format_version, expected_format());
  if (expected_format() == 1) EXPECT_EQ(info->library_version, "0.1.0");
  EXPECT_EQ(info->step, v1_fixture::kStep);
  EXPECT_EQ(info->saved_sizes.tp, 2);
  EXPECT_EQ(info->saved_sizes.dp, 2);
  EXPECT_EQ(info->saved_sizes.pp, 1);
  const std::vector<RankCoords> coords = {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0}};  // TP fastest
  EXPECT_EQ(info->saved_coords, coords);
  const std::map<std::string, std::string> attrs = {{"fixture", v1_fixture::kFixtureAttribute},
                                                    {"trainer.layout", v1_fixture::kLayoutAttribute}};
  EXPECT_EQ(info->attributes, attrs);
  const std::vector<std::string> loader_keys = {"loader/replicated", "loader/shard/dp0/worker0",
                                                "loader/shard/dp1/worker0"};
  const auto specs = v1_fixture::tensors();
  ASSERT_EQ(info->tensors.size(), specs.size() + loader_keys.size());
  for (const std::string& k : loader_keys) {
    const TensorInfo* t = info->find(k);
    ASSERT_NE(t, nullptr) << k;
    EXPECT_EQ(t->dtype, DType::kU8);
  }
  for (const auto& s : specs) {
    const TensorInfo* t = info->find(s.key);
    ASSERT_NE(t, nullptr) << s.key;
    EXPECT_EQ(t->dtype, s.dtype) << s.key;
    EXPECT_EQ(t->shape, s.shape) << s.key;
    EXPECT_EQ(t->nbytes, static_cast<uint64_t>(numel_of(s.shape)) * dtype_size(s.dtype)) << s.key;
    ASSERT_EQ(t->regions.size(), static_cast<size_t>(s.regions)) << s.key;
    std::set<RegionKey> got;
    std::set<int> writers;
    for (const SavedRegion& r : t->regions) {
      got.insert({r.shard.box.offset, r.shard.box.shape, r.shard.flat ? r.shard.flat->first : -1,
                  r.shard.flat ? r.shard.flat->second : -1});
      writers.insert(r.writer_rank);
      EXPECT_GE(r.writer_rank, 0);
      EXPECT_LT(r.writer_rank, 4);
      // Every region is small: one verification block of whole slabs.
      EXPECT_GT(r.block_bytes, 0u) << s.key;
      EXPECT_EQ(r.block_checksums.size(), 1u) << s.key;
    }
    EXPECT_EQ(got, expected_regions(s)) << s.key;
    // Replicas are written once, spread over the ranks that hold them.
    if (s.split == v1_fixture::Split::kFlatAll) EXPECT_EQ(writers, (std::set<int>{0, 1, 2, 3})) << s.key;
  }
}

TEST_F(V1Fixture, ReaderReturnsTheSavedValues) {
  auto reader = CheckpointReader::open(dir_);
  ASSERT_TRUE(reader.ok()) << reader.status().to_string();
  for (const auto& s : v1_fixture::tensors()) {
    const int64_t n = numel_of(s.shape);
    std::vector<char> got(static_cast<size_t>(n) * dtype_size(s.dtype));
    ASSERT_TRUE(reader->read_shard(s.key, ShardSpec::whole(s.shape), s.dtype, got.data()).ok()) << s.key;
    EXPECT_EQ(got, expected_bytes(s, 0, n)) << s.key;
    // A range that crosses the saved regions.
    if (n >= 3) {
      const auto part = ShardSpec::flat_range(ShardSpec::whole(s.shape).box, 1, n - 1);
      std::vector<char> mid(static_cast<size_t>(n - 2) * dtype_size(s.dtype));
      ASSERT_TRUE(reader->read_shard(s.key, part, s.dtype, mid.data()).ok()) << s.key;
      EXPECT_EQ(mid, expected_bytes(s, 1, n - 1)) << s.key;
    }
  }
}

// A collective load, every tensor cut into flat ranges over this job's ranks (a layout the
// checkpoint was not saved in), with every region's checksum verified; and the data loader.
TEST_F(V1Fixture, LoadsUnderAnotherLayout) {
  auto topo = Topology::create(MPI_COMM_WORLD, {1, world_size(), 1});
  ASSERT_TRUE(topo.ok()) << topo.status().to_string();
  const int n = world_size(), r = world_rank();
  const auto specs = v1_fixture::tensors();
  StateDict sd;
  std::vector<std::vector<char>> buffers;
  buffers.reserve(specs.size());
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& s : specs) {
    const int64_t numel = numel_of(s.shape);
    ranges.emplace_back(numel * r / n, numel * (r + 1) / n);
    buffers.emplace_back(static_cast<size_t>(ranges.back().second - ranges.back().first) * dtype_size(s.dtype), 0);
    sd.add(s.key, s.dtype, s.shape,
           ShardSpec::flat_range(ShardSpec::whole(s.shape).box, ranges.back().first, ranges.back().second),
           buffers.back().data());
  }
  auto info = read_checkpoint_info(dir_);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  loader::LoaderCheckpoint loader_items;
  ASSERT_TRUE(loader_items.stage_load(sd, *info).ok());
  Checkpointer ck(*topo);
  LoadOptions options;
  options.verify_checksums = true;
  auto report = ck.load(sd, dir_, options);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  for (size_t i = 0; i < specs.size(); ++i)
    EXPECT_EQ(buffers[i], expected_bytes(specs[i], ranges[i].first, ranges[i].second)) << specs[i].key;
  // The loader saved as two fresh shards comes back as exactly those.
  ASSERT_TRUE(loader_items.finish_load(n, r, 1).ok());
  auto rep = loader_items.saved_replicated();
  auto shards = loader_items.saved_shards();
  ASSERT_TRUE(rep.ok() && shards.ok());
  const loader::ReplicatedState fresh = loader::initial_replicated(v1_fixture::loader_config(), v1_fixture::kDp);
  EXPECT_TRUE(*rep == fresh);
  ASSERT_EQ(shards->size(), 2u);
  for (int s = 0; s < 2; ++s) EXPECT_EQ((*shards)[s], loader::initial_shard(fresh, s)) << "shard " << s;
  // A second load of the same request reuses the plan.
  auto again = ck.load(sd, dir_, options);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_TRUE(again->plan_cached);
}

}  // namespace
