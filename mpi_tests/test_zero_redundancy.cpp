// Zero-redundancy loading: identical requests are read from storage once per job and sent to
// the other ranks over the transport; values stay exact and the read work is balanced.
#include <gtest/gtest.h>

#include <filesystem>

#include "support/test_model.h"

using h5ckpt::testing::max_all;
using h5ckpt::testing::sum_all;
using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;

using namespace h5ckpt;
using h5ckpt::testing::Layout;
namespace fs = std::filesystem;

namespace {

class ZeroRedundancy : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "zr");
    ASSERT_FALSE(root_.empty());
    // Saved under pure TP so the load layouts below reshard.
    auto t = Topology::create(MPI_COMM_WORLD, {world_size(), 1, 1});
    ASSERT_TRUE(t.ok());
    h5ckpt::testing::TestModel m(Layout{world_size(), 1, 1, false}, t->coords(), true);
    Checkpointer ck(*t);
    auto r = ck.save(m.state(), root_ + "/ckpt");
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    total_ = r->bytes_total;
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) fs::remove_all(root_);
  }
  std::string root_;
  uint64_t total_ = 0;
};

TEST_F(ZeroRedundancy, PureDataParallelReadsEachByteOnce) {
  const int n = world_size();
  const Layout L{1, n, 1, false};  // every rank wants the whole state
  auto topo = Topology::create(MPI_COMM_WORLD, {1, n, 1});
  ASSERT_TRUE(topo.ok());
  Checkpointer ck(*topo);
  for (bool zr : {true, false}) {
    h5ckpt::testing::TestModel m(L, topo->coords(), false);
    LoadOptions o;
    o.zero_redundancy = zr;
    auto r = ck.load(m.state(), root_ + "/ckpt", o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    std::string first;
    EXPECT_EQ(m.count_mismatches(&first), 0) << (zr ? "zr " : "plain ") << first;
    const uint64_t read = sum_all(r->bytes_read);
    if (zr) {
      EXPECT_EQ(read, total_) << "each byte read once per job";
      EXPECT_EQ(sum_all(r->bytes_sent), sum_all(r->bytes_received));
      EXPECT_EQ(sum_all(r->bytes_received), total_ * (n - 1));
      if (n > 1) EXPECT_LT(max_all(r->bytes_read), total_) << "one rank read everything: not balanced";
    } else {
      EXPECT_EQ(read, total_ * n) << "without zero-redundancy every replica reads";
      EXPECT_EQ(r->bytes_received, 0u);
    }
  }
}

TEST_F(ZeroRedundancy, MixedLayoutsAndCachedLoadPlan) {
  // TP x DP with ZeRO: model shards are DP replicas, optimizer flat ranges are unique.
  const int n = world_size();
  const int tp = n % 2 == 0 ? 2 : 1;
  const Layout L{tp, n / tp, 1, true};
  auto topo = Topology::create(MPI_COMM_WORLD, {L.tp, L.dp, L.pp});
  ASSERT_TRUE(topo.ok());
  Checkpointer ck(*topo);
  uint64_t plain_read = 0;
  {
    LoadOptions plain;
    plain.zero_redundancy = false;
    h5ckpt::testing::TestModel m(L, topo->coords(), false);
    auto r = ck.load(m.state(), root_ + "/ckpt", plain);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    plain_read = sum_all(r->bytes_read);
  }
  for (int round = 0; round < 2; ++round) {
    h5ckpt::testing::TestModel m(L, topo->coords(), false);
    auto r = ck.load(m.state(), root_ + "/ckpt");
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->plan_cached, round == 1) << "round " << round;
    std::string first;
    EXPECT_EQ(m.count_mismatches(&first), 0) << first;
    // DP replicas of model shards are read once instead of dp times. (Strided reads count the
    // file spans actually read, so the sum is compared with the plain load, not the size.)
    const uint64_t read = sum_all(r->bytes_read);
    if (L.dp > 1 || world_size() > 1) EXPECT_LT(read, plain_read);  // extra/step is on every rank
    else EXPECT_EQ(read, plain_read);
    if (L.dp > 1) EXPECT_GT(sum_all(r->bytes_received), 0u);
    EXPECT_EQ(r->transport, "mpi");
  }
}

}  // namespace
