// Bad input gives the same clear error on every rank, never a hang, and never damages the
// last good checkpoint.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <filesystem>
#include <fstream>

#include "storage/commit.h"
#include "support/test_model.h"

using h5ckpt::testing::max_all;
using h5ckpt::testing::sum_all;
using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;

using namespace h5ckpt;
using h5ckpt::testing::Layout;
namespace fs = std::filesystem;

namespace {

// Every rank must hold the same error code and message.
void expect_same_on_all_ranks(const Status& st) {
  const std::string text = st.to_string();
  uint64_t h = XXH3_64bits(text.data(), text.size()), lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi) << "ranks disagree; this rank has: " << text;
}

class Errors : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "errors");
    ASSERT_FALSE(root_.empty());
    layout_ = Layout{1, world_size(), 1, true};
    auto t = Topology::create(MPI_COMM_WORLD, {layout_.tp, layout_.dp, layout_.pp});
    ASSERT_TRUE(t.ok());
    topo_.emplace(std::move(t).value());
    h5ckpt::testing::TestModel model(layout_, topo_->coords(), true);
    Checkpointer ck(*topo_);
    auto saved = ck.save(model.state(), good());
    ASSERT_TRUE(saved.ok()) << saved.status().to_string();
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    topo_.reset();
    if (world_rank() == 0) fs::remove_all(root_);
  }
  std::string good() const { return root_ + "/good"; }
  // Loads the test model from `path`; returns the agreed status.
  Status load_model(const std::string& path, const LoadOptions& opts = {}) {
    h5ckpt::testing::TestModel model(layout_, topo_->coords(), false);
    Checkpointer ck(*topo_);
    auto r = ck.load(model.state(), path, opts);
    return r.status();
  }
  // Copies the good checkpoint (rank 0) and applies `damage` to the copy.
  std::string damaged_copy(const std::string& name, const std::function<void(const std::string&)>& damage) {
    const std::string dir = root_ + "/" + name;
    if (world_rank() == 0) {
      fs::copy(good(), dir, fs::copy_options::recursive);
      damage(dir);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return dir;
  }
  std::string root_;
  Layout layout_;
  std::optional<Topology> topo_;
};

TEST_F(Errors, MissingKeyIsNamed) {
  Checkpointer ck(*topo_);
  StateDict state;
  float buf[4];
  state.add_replicated("model/does_not_exist", DType::kF32, {4}, buf);
  auto r = ck.load(state, good());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(r.status().message().find("model/does_not_exist"), std::string::npos) << r.status().to_string();
  expect_same_on_all_ranks(r.status());
  // Non-strict: reported, not an error, buffer untouched.
  buf[0] = 42.0f;
  LoadOptions lax;
  lax.strict = false;
  auto r2 = ck.load(state, good(), lax);
  ASSERT_TRUE(r2.ok()) << r2.status().to_string();
  ASSERT_EQ(r2->missing_keys.size(), 1u);
  EXPECT_EQ(r2->missing_keys[0], "model/does_not_exist");
  EXPECT_EQ(buf[0], 42.0f);
}

TEST_F(Errors, WrongGlobalShape) {
  Checkpointer ck(*topo_);
  StateDict state;
  std::vector<float> buf(16 * 48);
  state.add_replicated("model/layers.0.qkv.weight", DType::kF32, {16, 48}, buf.data());
  auto r = ck.load(state, good());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kShapeMismatch) << r.status().to_string();
  EXPECT_NE(r.status().message().find("[48,16]"), std::string::npos) << r.status().to_string();
  expect_same_on_all_ranks(r.status());
}

TEST_F(Errors, WrongDtype) {
  Checkpointer ck(*topo_);
  StateDict state;
  std::vector<int64_t> buf(16);
  state.add_replicated("model/layers.0.norm.weight", DType::kI64, {16}, buf.data());
  auto r = ck.load(state, good());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kDtypeMismatch) << r.status().to_string();
  EXPECT_NE(r.status().message().find("layers.0.norm.weight"), std::string::npos);
  expect_same_on_all_ranks(r.status());
}

TEST_F(Errors, TruncatedDataFile) {
  auto dir = damaged_copy("truncated", [](const std::string& d) {
    const auto f = fs::path(d) / "data.h5";
    fs::resize_file(f, fs::file_size(f) / 2);
  });
  for (bool aggregate : {false, true}) {
    LoadOptions o;
    o.aggregate_reads = aggregate;
    Status st = load_model(dir, o);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), ErrorCode::kCorrupt) << st.to_string();
    EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.to_string();
    expect_same_on_all_ranks(st);
  }
}

TEST_F(Errors, FlippedByteInMetadata) {
  // Flip bytes at several places: each must be caught (checksum or parse), never crash.
  for (double where : {0.1, 0.5, 0.9}) {
    auto dir = damaged_copy("flipped" + std::to_string(int(where * 10)), [where](const std::string& d) {
      const auto f = fs::path(d) / "metadata.json";
      std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
      const auto pos = static_cast<std::streamoff>(fs::file_size(f) * where);
      io.seekg(pos);
      char c = 0;
      io.get(c);
      io.seekp(pos);
      io.put(static_cast<char>(c ^ 0x04));
    });
    Status st = load_model(dir);
    ASSERT_FALSE(st.ok()) << "flip at " << where;
    EXPECT_EQ(st.code(), ErrorCode::kCorrupt) << st.to_string();
    expect_same_on_all_ranks(st);
  }
}

TEST_F(Errors, FlippedByteInTensorDataCaughtByChecksums) {
  // Damage one byte inside the first tensor's bytes: a plain load cannot tell, a verifying
  // load must name the tensor.
  auto info = read_checkpoint_info(good());
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  const TensorInfo& victim = info->tensors.front();
  auto dir = damaged_copy("bitrot", [&](const std::string& d) {
    std::fstream io(fs::path(d) / "data.h5", std::ios::in | std::ios::out | std::ios::binary);
    const std::streamoff pos = victim.file_offset + static_cast<std::streamoff>(victim.nbytes / 2);
    io.seekg(pos);
    char c = 0;
    io.get(c);
    io.seekp(pos);
    io.put(static_cast<char>(c ^ 0x10));
  });
  LoadOptions verify;
  verify.verify_checksums = true;
  Status st = load_model(dir, verify);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kCorrupt) << st.to_string();
  EXPECT_NE(st.message().find(victim.key), std::string::npos) << st.to_string();
  expect_same_on_all_ranks(st);
  EXPECT_TRUE(load_model(good(), verify).ok());
}

TEST_F(Errors, UncommittedCheckpointRefused) {
  // A crash before the commit leaves data without metadata.
  auto dir = damaged_copy("crashed", [](const std::string& d) { fs::remove(fs::path(d) / "metadata.json"); });
  Status st = load_model(dir);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kNotCommitted) << st.to_string();
  expect_same_on_all_ranks(st);
  // A temporary in-progress directory is never loadable, even with metadata inside.
  auto tmp = damaged_copy(".good.inprogress-123", [](const std::string&) {});
  Status st2 = load_model(tmp);
  ASSERT_FALSE(st2.ok());
  EXPECT_EQ(st2.code(), ErrorCode::kNotCommitted) << st2.to_string();
}

TEST_F(Errors, UnwritablePath) {
  // A path below a regular file cannot be created, even as root.
  const std::string file = root_ + "/plainfile";
  if (world_rank() == 0) std::ofstream(file) << "x";
  MPI_Barrier(MPI_COMM_WORLD);
  h5ckpt::testing::TestModel model(layout_, topo_->coords(), true);
  Checkpointer ck(*topo_);
  auto r = ck.save(model.state(), file + "/ckpt");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kIo) << r.status().to_string();
  EXPECT_NE(r.status().message().find("plainfile"), std::string::npos) << r.status().to_string();
  expect_same_on_all_ranks(r.status());
}

TEST_F(Errors, FailedSaveKeepsLastGoodCheckpoint) {
  Checkpointer ck(*topo_);
  StateDict bad;
  std::vector<float> buf(8, 1.0f);
  // Every rank claims the first half, nobody the second: incomplete coverage.
  bad.add("model/half", DType::kF32, {16}, ShardSpec::box_of({0}, {8}), buf.data());
  auto r = ck.save(bad, root_ + "/next");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << r.status().to_string();
  EXPECT_NE(r.status().message().find("model/half"), std::string::npos) << r.status().to_string();
  expect_same_on_all_ranks(r.status());
  EXPECT_FALSE(fs::exists(root_ + "/next"));
  // `latest` still names the good one, and it loads.
  Status st = load_model(root_);
  EXPECT_TRUE(st.ok()) << st.to_string();
  // Overwriting an existing checkpoint needs the flag.
  h5ckpt::testing::TestModel model(layout_, topo_->coords(), true);
  auto again = ck.save(model.state(), good());
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), ErrorCode::kAlreadyExists);
  SaveOptions ow;
  ow.overwrite = true;
  auto replaced = ck.save(model.state(), good(), ow);
  EXPECT_TRUE(replaced.ok()) << replaced.status().to_string();
}

TEST_F(Errors, OneRankWithBadShardFailsAll) {
  // Only the last rank passes an invalid shard: all ranks get the same error naming it.
  Checkpointer ck(*topo_);
  StateDict state;
  std::vector<float> buf(16, 0.0f);
  const bool culprit = world_rank() == world_size() - 1;
  state.add("model/x", DType::kF32, {16}, culprit ? ShardSpec::box_of({10}, {16}) : ShardSpec::whole({16}), buf.data());
  auto r = ck.save(state, root_ + "/never");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("rank " + std::to_string(world_size() - 1)), std::string::npos)
      << r.status().to_string();
  expect_same_on_all_ranks(r.status());
}

}  // namespace
