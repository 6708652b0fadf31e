// save_async: returns after the snapshot, equals a synchronous save even when the caller
// overwrites its buffers at once, respects a small staging bound, reuses the plan, and reports
// failures on wait() and on the next save.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "support/test_model.h"

using h5ckpt::testing::max_all;
using h5ckpt::testing::sum_all;
using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;

using namespace h5ckpt;
using h5ckpt::testing::Layout;
namespace fs = std::filesystem;

namespace {

Layout default_layout() {
  const int n = world_size();
  const int tp = n % 2 == 0 ? 2 : 1, pp = n % 4 == 0 ? 2 : 1;
  return Layout{tp, n / (tp * pp), pp, true};
}

class Async : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "async");
    ASSERT_FALSE(root_.empty());
    L_ = default_layout();
    auto t = Topology::create(MPI_COMM_WORLD, {L_.tp, L_.dp, L_.pp});
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    topo_.emplace(std::move(t).value());
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    const bool root = topo_->rank() == 0;
    topo_.reset();
    if (root) fs::remove_all(root_);
  }
  std::string root_;
  Layout L_;
  std::optional<Topology> topo_;
};

TEST_F(Async, EqualsSyncSaveEvenWhenBuffersAreOverwrittenAtOnce) {
  h5ckpt::testing::TestModel model(L_, topo_->coords(), true);
  Checkpointer ck(*topo_);
  auto h = ck.save_async(model.state(), root_ + "/async");
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  model.scribble();  // the trainer's next step
  auto r = h->wait();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->async);
  EXPECT_EQ(r->blocked_bytes, 0u) << "an unbounded pool must never block";

  h5ckpt::testing::TestModel fresh(L_, topo_->coords(), true);
  ASSERT_TRUE(ck.save(fresh.state(), root_ + "/sync").ok());
  h5ckpt::testing::expect_same_datasets(root_ + "/async", root_ + "/sync");

  h5ckpt::testing::TestModel loaded(L_, topo_->coords(), false);
  ASSERT_TRUE(ck.load(loaded.state(), root_ + "/async").ok());
  std::string first;
  EXPECT_EQ(loaded.count_mismatches(&first), 0) << first;
}

TEST_F(Async, SmallStagingPoolBlocksForWhatDoesNotFitAndStaysCorrect) {
  CheckpointerOptions opts;
  opts.staging_bytes = 1024;  // far below every rank's share
  opts.max_piece_bytes = 256;
  h5ckpt::testing::TestModel model(L_, topo_->coords(), true);
  Checkpointer ck(*topo_, opts);
  auto h = ck.save_async(model.state(), root_ + "/small");
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  model.scribble();
  auto r = h->wait();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  if (r->bytes_written > opts.staging_bytes) EXPECT_GT(r->blocked_bytes, 0u);
  EXPECT_LE(r->blocked_bytes, r->bytes_written);
  h5ckpt::testing::TestModel fresh(L_, topo_->coords(), true);
  ASSERT_TRUE(ck.save(fresh.state(), root_ + "/ref").ok());
  h5ckpt::testing::expect_same_datasets(root_ + "/small", root_ + "/ref");
}

TEST_F(Async, StagingPoolSmallerThanOneElementStillSaves) {
  // 3 bytes hold no f32 or i64 element: the snapshot used to wait forever for space.
  CheckpointerOptions opts;
  opts.staging_bytes = 3;
  h5ckpt::testing::TestModel model(L_, topo_->coords(), true);
  Checkpointer ck(*topo_, opts);
  auto h = ck.save_async(model.state(), root_ + "/tiny");
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  model.scribble();
  auto r = h->wait();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  h5ckpt::testing::TestModel fresh(L_, topo_->coords(), true);
  ASSERT_TRUE(ck.save(fresh.state(), root_ + "/ref").ok());
  h5ckpt::testing::expect_same_datasets(root_ + "/tiny", root_ + "/ref");
}

TEST_F(Async, HdfWritePathAndDirectWritesGiveTheSameFile) {
  // The same state through HDF5's MPI-IO writes and through direct positioned writes.
  h5ckpt::testing::TestModel model(L_, topo_->coords(), true);
  CheckpointerOptions via_hdf5;
  via_hdf5.direct_writes = false;
  via_hdf5.max_piece_bytes = 100;  // many pieces per region on both paths
  Checkpointer a(*topo_, via_hdf5);
  ASSERT_TRUE(a.save(model.state(), root_ + "/hdf5").ok());
  CheckpointerOptions direct;
  direct.max_piece_bytes = 100;
  Checkpointer b(*topo_, direct);
  ASSERT_TRUE(b.save(model.state(), root_ + "/direct").ok());
  h5ckpt::testing::expect_same_datasets(root_ + "/hdf5", root_ + "/direct");
  h5ckpt::testing::TestModel loaded(L_, topo_->coords(), false);
  ASSERT_TRUE(b.load(loaded.state(), root_ + "/hdf5").ok());
  std::string first;
  EXPECT_EQ(loaded.count_mismatches(&first), 0) << first;
}

TEST_F(Async, PlanIsCachedUntilTheStructureChanges) {
  h5ckpt::testing::TestModel model(L_, topo_->coords(), true);
  Checkpointer ck(*topo_);
  auto a = ck.save(model.state(), root_ + "/a");
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->plan_cached);
  auto b = ck.save_async(model.state(), root_ + "/b");
  ASSERT_TRUE(b.ok());
  auto rb = b->wait();
  ASSERT_TRUE(rb.ok()) << rb.status().to_string();
  EXPECT_TRUE(rb->plan_cached);
  // One rank adding an item changes the structure: everyone re-plans.
  float extra[2] = {1, 2};
  if (topo_->rank() == 0) model.state().add_replicated("extra/only_rank0", DType::kF32, {2}, extra);
  auto c = ck.save(model.state(), root_ + "/c");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(c->plan_cached);
  auto info = read_checkpoint_info(root_ + "/c");
  ASSERT_TRUE(info.ok());
  EXPECT_NE(info->find("extra/only_rank0"), nullptr);
  // The synchronous save checks the cache inside its temporary-directory agreement: unchanged
  // structure, cached plan, same bytes.
  auto d = ck.save(model.state(), root_ + "/d");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_TRUE(d->plan_cached);
  h5ckpt::testing::TestModel loaded(L_, topo_->coords(), false);
  ASSERT_TRUE(ck.load(loaded.state(), root_ + "/d").ok());
  std::string first;
  EXPECT_EQ(loaded.count_mismatches(&first), 0) << first;
  // A structure change that cannot be planned (the last rank disagrees on a global shape) fails
  // on every rank and leaves no checkpoint and no temporary directory behind.
  float odd[3] = {1, 2, 3};
  const bool last = topo_->rank() == world_size() - 1;
  model.state().add_replicated("extra/disputed", DType::kF32, {last && world_size() > 1 ? 3 : 2}, odd);
  auto e = ck.save(model.state(), root_ + "/e");
  if (world_size() > 1) {
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find("extra/disputed"), std::string::npos) << e.status().to_string();
    MPI_Barrier(MPI_COMM_WORLD);
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(root_))
      if (entry.is_directory()) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"a", "b", "c", "d"}));
  } else {
    EXPECT_TRUE(e.ok()) << e.status().to_string();
  }
}

TEST_F(Async, FailureSurfacesOnWaitAndOnTheNextSave) {
  h5ckpt::testing::TestModel model(L_, topo_->coords(), true);
  Checkpointer ck(*topo_);
  ASSERT_TRUE(ck.save(model.state(), root_ + "/good").ok());
  const std::string file = root_ + "/plainfile";
  if (topo_->rank() == 0) std::ofstream(file) << "x";
  MPI_Barrier(MPI_COMM_WORLD);

  // The first phase runs on the caller's thread, as in a synchronous save: a checkpoint that
  // cannot be created is save_async's own answer, on every rank, and nothing starts.
  auto early = ck.save_async(model.state(), file + "/bad0");  // cannot create: parent is a file
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.status().code(), ErrorCode::kIo) << early.status().to_string();

  // A failure of the background part (here: `latest` of another directory cannot be replaced,
  // as it is a non-empty directory) surfaces on wait().
  const std::string other = root_ + "/other";
  if (topo_->rank() == 0) fs::create_directories(other + "/latest/blocker");
  MPI_Barrier(MPI_COMM_WORLD);
  auto h = ck.save_async(model.state(), other + "/bad1");
  ASSERT_TRUE(h.ok()) << "the failure belongs to the background part: " << h.status().to_string();
  auto r = h->wait();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("updating 'latest' failed"), std::string::npos) << r.status().to_string();

  // Not waited on: the next save reports it and starts nothing.
  auto h2 = ck.save_async(model.state(), other + "/bad2");
  ASSERT_TRUE(h2.ok());
  auto next = ck.save_async(model.state(), root_ + "/after");
  ASSERT_FALSE(next.ok());
  EXPECT_NE(next.status().message().find("previous asynchronous save failed"), std::string::npos)
      << next.status().to_string();
  EXPECT_FALSE(fs::exists(root_ + "/after"));
  // The last good checkpoint is untouched and `latest` still names it.
  h5ckpt::testing::TestModel loaded(L_, topo_->coords(), false);
  auto l = ck.load(loaded.state(), root_);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  EXPECT_EQ(fs::path(l->path).filename(), "good");
  std::string first;
  EXPECT_EQ(loaded.count_mismatches(&first), 0) << first;
  // And saving works again.
  auto again = ck.save_async(model.state(), root_ + "/after");
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_TRUE(again->wait().ok());
}

TEST_F(Async, BackToBackSavesCommitInOrder) {
  h5ckpt::testing::TestModel model(L_, topo_->coords(), true);
  Checkpointer ck(*topo_);
  std::vector<SaveHandle> handles;
  for (int step = 1; step <= 4; ++step) {
    SaveOptions o;
    o.step = step;
    auto h = ck.save_async(model.state(), root_ + "/step-" + std::to_string(step), o);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    handles.push_back(*h);
  }
  for (auto& h : handles) EXPECT_TRUE(h.wait().ok());
  auto info = read_checkpoint_info(root_);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->step, 4);
}

}  // namespace
