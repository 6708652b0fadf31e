// On a real GPU (label gpu): saves from and loads into CUDA memory at 1-4 ranks sharing the
// GPU, and the NCCL transport at one rank. Skipped where no GPU is visible.
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>

#include "device/staging.h"
#include "support/device_mirror.h"
#include "support/test_model.h"

using namespace h5ckpt;
using h5ckpt::testing::DeviceMirror;
using h5ckpt::testing::Layout;
using h5ckpt::testing::TestModel;
using h5ckpt::testing::world_size;
namespace fs = std::filesystem;

namespace {

bool everything(const std::string&) { return true; }

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(device::staging().name()) != "cuda") GTEST_SKIP() << "no GPU visible";
    root_ = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "gpu");
    ASSERT_FALSE(root_.empty());
  }
  void TearDown() override {
    if (root_.empty()) return;
    MPI_Barrier(MPI_COMM_WORLD);
    if (h5ckpt::testing::world_rank() == 0) fs::remove_all(root_);
  }
  std::string root_;
};

TEST_F(Gpu, SaveFromDeviceAndLoadBackResharded) {
  const int n = world_size();
  const Layout L{n % 2 == 0 ? 2 : 1, n % 2 == 0 ? n / 2 : n, 1, true};
  auto topo = Topology::create(MPI_COMM_WORLD, {L.tp, L.dp, L.pp});
  ASSERT_TRUE(topo.ok());
  TestModel model(L, topo->coords(), true);
  {
    DeviceMirror mirror(model.state(), everything, false);  // detected with cudaPointerGetAttributes
    Checkpointer ck(*topo);
    auto h = ck.save_async(mirror.state(), root_ + "/dev");
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    mirror.scribble();
    auto r = h->wait();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_TRUE(ck.save(model.state(), root_ + "/host").ok());
    std::string why;
    EXPECT_TRUE(h5ckpt::testing::same_datasets(root_ + "/dev", root_ + "/host", &why)) << why;
  }
  // Load into device memory under pure DP (replicas: NCCL where it can start, else MPI).
  auto dp = Topology::create(MPI_COMM_WORLD, {1, n, 1});
  ASSERT_TRUE(dp.ok());
  TestModel loaded(Layout{1, n, 1, false}, dp->coords(), false);
  DeviceMirror mirror(loaded.state(), everything, true);
  Checkpointer ck(*dp);
  auto r = ck.load(mirror.state(), root_ + "/dev");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  mirror.download();
  std::string first;
  EXPECT_EQ(loaded.count_mismatches(&first), 0) << first << " (transport " << r->transport << ")";
}

TEST_F(Gpu, NcclTransportDeliversToItselfAtOneRank) {
  if (world_size() != 1) GTEST_SKIP() << "NCCL needs one GPU per rank; this machine has one";
  device::Staging& s = device::staging();
  std::string why;
  auto t = device::make_device_transport(MPI_COMM_WORLD, s, &why);
  ASSERT_NE(t, nullptr) << why;
  EXPECT_STREQ(t->name(), "nccl");
  const size_t n = 1 << 20;
  std::vector<uint32_t> host(n), back(n, 0);
  std::iota(host.begin(), host.end(), 7u);
  void* src = s.alloc_device(n * 4);
  void* dst = s.alloc_device(n * 4);
  ASSERT_TRUE(src && dst);
  ASSERT_TRUE(s.copy_to_device(src, host.data(), n * 4).ok());
  ASSERT_TRUE(t->post_send(0, src, n * 4, 0).ok());
  ASSERT_TRUE(t->post_recv(0, dst, n * 4, 0).ok());
  ASSERT_TRUE(t->wait_all().ok());
  ASSERT_TRUE(s.copy_to_host(back.data(), dst, n * 4).ok());
  ASSERT_TRUE(s.synchronize().ok());
  EXPECT_EQ(back, host);
  s.free_device(src);
  s.free_device(dst);
}

}  // namespace
