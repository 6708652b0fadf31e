// The load plan cache and the index it lets a load skip: a load whose every rank has its plan for
// this checkpoint cached reads, validates and shares no index (LoadReport::index_shared false);
// any rank missing its cache sends every rank the full way; a checkpoint changed between two
// loads is never read through a stale plan. Run on one node and on simulated nodes
// (H5CKPT_RANKS_PER_NODE), where the index goes to every node's shared memory.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "storage/commit.h"
#include "storage/format.h"
#include "storage/meta_v2.h"
#include "storage/region_reader.h"
#include "support/test_model.h"

using namespace h5ckpt;
using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;
namespace fs = std::filesystem;

namespace {

// Every rank gets the same answer: whether `ok` holds on all of them.
bool all_ranks(bool ok) {
  int v = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return v == 1;
}

// How the state is split over the ranks: "w/a" by rows or by columns; "w/b" is replicated and
// "opt/c" a flat range per rank (ZeRO-like) in both.
enum class Split { kRows, kCols };

// The value of element `flat` of tensor number `tensor` in the save made with `seed`: every
// save of a test gets its own values, so a load that read another save's bytes is seen.
double value_of(int seed, int tensor, int64_t flat) { return seed * 10000.0 + tensor * 1000.0 + flat; }

// This rank's part of the state: a [4R, 6] f32 matrix, a [5, 7] f64 replicated matrix and a
// [3R + 1] f32 vector in flat ranges. Filled with the values of `seed` (`seed` 0: zeros, to load into).
class SmallState {
 public:
  SmallState(Split split, int seed) {
    const int R = world_size(), r = world_rank();
    a_shape_ = {4 * R, 6};
    a_shard_ = ShardSpec::split(a_shape_, split == Split::kRows ? 0 : 1, R, r);
    c_shape_ = {3 * R + 1};
    const int64_t n = c_shape_[0], begin = n * r / R, end = n * (r + 1) / R;
    c_shard_ = ShardSpec::flat_range(ShardSpec::whole(c_shape_).box, begin, end);
    a_.resize(static_cast<size_t>(a_shard_.numel()));
    b_.resize(35);
    c_.resize(static_cast<size_t>(c_shard_.numel()));
    if (seed != 0) fill(seed);
    state_.add("w/a", DType::kF32, a_shape_, a_shard_, a_.data());
    state_.add_replicated("w/b", DType::kF64, {5, 7}, b_.data());
    state_.add("opt/c", DType::kF32, c_shape_, c_shard_, c_.data());
  }
  StateDict& state() { return state_; }

  // Elements that differ from the values of `seed`, over every buffer (this rank); names the first.
  int64_t mismatches(int seed, std::string* first) const {
    int64_t bad = 0;
    auto check = [&](const char* key, double got, double want, size_t j) {
      if (got == want) return;
      if (bad++ == 0)
        *first = std::string(key) + "[" + std::to_string(j) + "] = " + std::to_string(got) + ", saved " +
                 std::to_string(want);
    };
    for (size_t j = 0; j < a_.size(); ++j)
      check("w/a", a_[j], static_cast<float>(value_of(seed, 1, a_flat(static_cast<int64_t>(j)))), j);
    for (size_t j = 0; j < b_.size(); ++j) check("w/b", b_[j], value_of(seed, 2, static_cast<int64_t>(j)), j);
    for (size_t j = 0; j < c_.size(); ++j)
      check("opt/c", c_[j], static_cast<float>(value_of(seed, 3, c_shard_.flat->first + static_cast<int64_t>(j))), j);
    return bad;
  }

 private:
  // Global flat index of element j of this rank's box of "w/a" (row-major in the box).
  int64_t a_flat(int64_t j) const {
    const int64_t cols = a_shard_.box.shape[1];
    return (a_shard_.box.offset[0] + j / cols) * a_shape_[1] + a_shard_.box.offset[1] + j % cols;
  }
  void fill(int seed) {
    for (size_t j = 0; j < a_.size(); ++j)
      a_[j] = static_cast<float>(value_of(seed, 1, a_flat(static_cast<int64_t>(j))));
    for (size_t j = 0; j < b_.size(); ++j) b_[j] = value_of(seed, 2, static_cast<int64_t>(j));
    for (size_t j = 0; j < c_.size(); ++j)
      c_[j] = static_cast<float>(value_of(seed, 3, c_shard_.flat->first + static_cast<int64_t>(j)));
  }
  Shape a_shape_, c_shape_;
  ShardSpec a_shard_, c_shard_;
  std::vector<float> a_;
  std::vector<double> b_;
  std::vector<float> c_;
  StateDict state_;
};

class LoadPlanCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "lpc");
    ASSERT_FALSE(root_.empty());
    auto t = Topology::create(MPI_COMM_WORLD, {world_size(), 1, 1});
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    topo_.emplace(std::move(t).value());
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) fs::remove_all(root_);
  }

  // Saves the values of `seed` (split by rows) as `path`.
  void save(const std::string& path, int seed) {
    SmallState s(Split::kRows, seed);
    Checkpointer ck(*topo_);
    auto r = ck.save(s.state(), path);
    ASSERT_TRUE(all_ranks(r.ok())) << (r.ok() ? "another rank failed" : r.status().to_string());
  }

  // Loads `path` with `ck` into `split`, expects every value of `seed` on every rank and the
  // cache outcome given (the same on every rank); returns whether every rank shared the index.
  bool load_exact(Checkpointer& ck, const std::string& path, Split split, int seed, bool cached,
                  const LoadOptions& o = {}) {
    SmallState s(split, 0);
    auto r = ck.load(s.state(), path, o);
    EXPECT_TRUE(all_ranks(r.ok())) << (r.ok() ? "another rank failed" : r.status().to_string());
    if (!r.ok()) return false;
    std::string first;
    EXPECT_EQ(s.mismatches(seed, &first), 0) << first;
    EXPECT_TRUE(all_ranks(r->plan_cached == cached)) << "plan_cached " << r->plan_cached;
    // Every rank takes the same path: all share the index, or none.
    const bool shared = all_ranks(r->index_shared);
    EXPECT_EQ(shared, !all_ranks(!r->index_shared)) << "some ranks shared the index, others did not";
    return shared;
  }

  // Rank 0 writes `bytes` at `offset` of `file` (in place: same inode); every rank waits for it.
  static void overwrite(const std::string& file, uint64_t offset, const std::vector<char>& bytes) {
    if (world_rank() == 0) {
      const int fd = ::open(file.c_str(), O_WRONLY);
      ASSERT_GE(fd, 0) << file;
      ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset)),
                static_cast<ssize_t>(bytes.size()));
      ::fsync(fd);
      ::close(fd);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }

  std::string root_;
  std::optional<Topology> topo_;
};

TEST_F(LoadPlanCacheTest, RepeatedLoadSkipsTheIndexAndIsExact) {
  const std::string path = root_ + "/ckpt";
  save(path, 1);
  Checkpointer ck(*topo_);
  EXPECT_TRUE(load_exact(ck, path, Split::kCols, 1, /*cached=*/false)) << "the first load reads the index";
  EXPECT_FALSE(load_exact(ck, path, Split::kCols, 1, /*cached=*/true)) << "every plan cached: no index read";
  EXPECT_FALSE(load_exact(ck, path, Split::kCols, 1, /*cached=*/true));
}

TEST_F(LoadPlanCacheTest, NewCheckpointOrLayoutTakesTheFullPath) {
  save(root_ + "/one", 1);
  save(root_ + "/two", 2);
  Checkpointer ck(*topo_);
  EXPECT_TRUE(load_exact(ck, root_ + "/one", Split::kRows, 1, false));
  EXPECT_FALSE(load_exact(ck, root_ + "/one", Split::kRows, 1, true));
  // Another checkpoint of the same structure: its own index, its own values.
  EXPECT_TRUE(load_exact(ck, root_ + "/two", Split::kRows, 2, false));
  EXPECT_FALSE(load_exact(ck, root_ + "/two", Split::kRows, 2, true));
  // Another layout of the same checkpoint.
  EXPECT_TRUE(load_exact(ck, root_ + "/two", Split::kCols, 2, false));
  EXPECT_FALSE(load_exact(ck, root_ + "/two", Split::kCols, 2, true));
  // Other load options are another request.
  LoadOptions every_region;
  every_region.verify_checksums = true;
  EXPECT_TRUE(load_exact(ck, root_ + "/two", Split::kCols, 2, false, every_region));
}

TEST_F(LoadPlanCacheTest, OneRankWithoutItsCacheSendsEveryRankTheFullWay) {
  const std::string path = root_ + "/ckpt";
  save(path, 1);
  // Two Checkpointers on every rank; the last rank loads through a fresh one (its cache empty, as
  // if evicted) while the others still have theirs.
  Checkpointer ck(*topo_);
  Checkpointer fresh(*topo_);
  EXPECT_TRUE(load_exact(ck, path, Split::kCols, 1, false));
  EXPECT_FALSE(load_exact(ck, path, Split::kCols, 1, true));
  const bool last = world_rank() == world_size() - 1;
  EXPECT_TRUE(load_exact(last ? fresh : ck, path, Split::kCols, 1, false));
  // Every rank's plan is cached again (the others kept theirs and planned alike).
  EXPECT_FALSE(load_exact(last ? fresh : ck, path, Split::kCols, 1, true));
}

TEST_F(LoadPlanCacheTest, ReplacedDirectoryIsReadThroughItsOwnIndex) {
  const std::string path = root_ + "/ckpt";
  save(path, 1);
  Checkpointer ck(*topo_);
  EXPECT_TRUE(load_exact(ck, path, Split::kCols, 1, false));
  EXPECT_FALSE(load_exact(ck, path, Split::kCols, 1, true));
  // Another save of the same structure with other values takes the directory's place.
  save(root_ + "/other", 2);
  if (world_rank() == 0) {
    fs::rename(path, root_ + "/old");
    fs::rename(root_ + "/other", path);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_TRUE(load_exact(ck, path, Split::kCols, 2, false)) << "a replaced checkpoint is planned again";
  // Without block checks (`verify` does not change the plan, so it stays cached) no checksum
  // would stop a stale plan: only the cache key does.
  LoadOptions unverified;
  unverified.verify = false;
  save(root_ + "/third", 3);
  EXPECT_FALSE(load_exact(ck, path, Split::kCols, 2, true, unverified));
  if (world_rank() == 0) {
    fs::rename(path, root_ + "/old2");
    fs::rename(root_ + "/third", path);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_TRUE(load_exact(ck, path, Split::kCols, 3, false, unverified));
}

TEST_F(LoadPlanCacheTest, IndexChangedInPlaceIsFoundByTheNextLoad) {
  const std::string path = root_ + "/ckpt";
  save(path, 1);
  Checkpointer ck(*topo_);
  EXPECT_TRUE(load_exact(ck, path, Split::kCols, 1, false));
  EXPECT_FALSE(load_exact(ck, path, Split::kCols, 1, true));
  // One byte of the index's `names` table changes in data.h5; metadata.json stays as it was.
  auto text = storage::read_whole_file(path + "/" + storage::kMetadataFileName);
  ASSERT_TRUE(text.ok());
  auto summary = storage::v2::parse_summary(*text);
  ASSERT_TRUE(summary.ok()) << summary.status().to_string();
  const auto& names = summary->table(storage::v2::Table::kNames);
  ASSERT_GT(names.bytes, 0u);
  const std::string data = path + "/" + storage::kDataFileName;
  std::vector<char> byte(1);
  {
    auto reader = storage::RegionReader::open(data);
    ASSERT_TRUE(reader.ok());
    ASSERT_TRUE(reader->read_bytes(byte.data(), 1, static_cast<uint64_t>(names.offset)).ok());
  }
  byte[0] = static_cast<char>(byte[0] ^ 0x20);
  overwrite(data, static_cast<uint64_t>(names.offset), byte);
  SmallState s(Split::kCols, 0);
  auto r = ck.load(s.state(), path);
  ASSERT_TRUE(all_ranks(!r.ok())) << "a load through the cached plan did not see the changed index";
  const std::string msg = r.status().to_string();
  EXPECT_NE(msg.find("names"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
}

TEST_F(LoadPlanCacheTest, TensorBytesChangedInPlaceAreFoundByTheNextLoad) {
  const std::string path = root_ + "/ckpt";
  save(path, 1);
  Checkpointer ck(*topo_);
  EXPECT_TRUE(load_exact(ck, path, Split::kRows, 1, false));
  EXPECT_FALSE(load_exact(ck, path, Split::kRows, 1, true));
  auto info = read_checkpoint_info(path);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  const TensorInfo* a = info->find("w/a");
  ASSERT_NE(a, nullptr);
  const float other = 12345.5f;
  std::vector<char> bytes(sizeof other);
  std::memcpy(bytes.data(), &other, sizeof other);
  overwrite(path + "/" + storage::kDataFileName, static_cast<uint64_t>(a->file_offset) + 4 * sizeof(float), bytes);
  SmallState s(Split::kRows, 0);
  auto r = ck.load(s.state(), path);
  ASSERT_TRUE(all_ranks(!r.ok())) << "changed tensor bytes were loaded";
  const std::string msg = r.status().to_string();
  EXPECT_NE(msg.find("w/a"), std::string::npos) << msg;
}

}  // namespace
