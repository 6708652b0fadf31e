// Device buffers on machines without a GPU: the simulated device (inaccessible "device" memory,
// asynchronous in-order copies) runs the staging and device-transport paths of save, save_async
// and load. Any host access to device memory by the library crashes the test; bytes used before
// their copy completed show up as wrong values.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "device/staging.h"
#include "support/device_mirror.h"
#include "support/test_model.h"

using h5ckpt::testing::sum_all;
using h5ckpt::testing::world_size;

using namespace h5ckpt;
using h5ckpt::testing::DeviceMirror;
using h5ckpt::testing::Layout;
using h5ckpt::testing::TestModel;
namespace fs = std::filesystem;

namespace {

bool all(const std::string&) { return true; }
bool model_only(const std::string& key) { return key.rfind("model/", 0) == 0; }

class DeviceState : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { device::set_staging_for_testing(device::make_simulated_staging()); }
  static void TearDownTestSuite() { device::set_staging_for_testing(nullptr); }
  void SetUp() override {
    root_ = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "device");
    ASSERT_FALSE(root_.empty());
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (h5ckpt::testing::world_rank() == 0) fs::remove_all(root_);
  }
  std::string root_;
};

Layout layout_for(int n, bool zero) {
  const int tp = n % 2 == 0 ? 2 : 1, pp = n % 4 == 0 ? 2 : 1;
  return Layout{tp, n / (tp * pp), pp, zero};
}

TEST_F(DeviceState, SyncSaveFromDeviceEqualsHostSave) {
  const Layout L = layout_for(world_size(), true);
  auto topo = Topology::create(MPI_COMM_WORLD, {L.tp, L.dp, L.pp});
  ASSERT_TRUE(topo.ok());
  TestModel model(L, topo->coords(), true);
  for (bool declare : {true, false}) {  // declared kCuda, or detected from the pointer
    DeviceMirror mirror(model.state(), all, declare);
    ASSERT_GT(mirror.device_items(), 0u);
    CheckpointerOptions o;
    o.max_piece_bytes = 4096;  // many pieces: the two staging halves alternate many times
    Checkpointer ck(*topo, o);
    const std::string dev_path = root_ + (declare ? "/dev_declared" : "/dev_detected");
    auto r = ck.save(mirror.state(), dev_path);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    if (declare) {
      auto h = ck.save(model.state(), root_ + "/host");
      ASSERT_TRUE(h.ok()) << h.status().to_string();
    }
    h5ckpt::testing::expect_same_datasets(dev_path, root_ + "/host");
  }
}

TEST_F(DeviceState, AsyncSaveSnapshotsDeviceBytesBeforeReturning) {
  int level = 0;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE) GTEST_SKIP() << "MPI without MPI_THREAD_MULTIPLE: save_async is synchronous";
  const Layout L = layout_for(world_size(), true);
  auto topo = Topology::create(MPI_COMM_WORLD, {L.tp, L.dp, L.pp});
  ASSERT_TRUE(topo.ok());
  TestModel model(L, topo->coords(), true);
  {
    Checkpointer ck(*topo);
    ASSERT_TRUE(ck.save(model.state(), root_ + "/host").ok());
  }
  for (uint64_t bound : {uint64_t{0}, uint64_t{64} << 10}) {  // whole state, then a pool it must cycle
    DeviceMirror mirror(model.state(), model_only, true);
    CheckpointerOptions o;
    o.staging_bytes = bound;
    Checkpointer ck(*topo, o);
    const std::string p = root_ + "/async" + std::to_string(bound);
    auto h = ck.save_async(mirror.state(), p);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    mirror.scribble();  // the caller's next step overwrites device memory at once
    auto r = h->wait();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_TRUE(r->async);
    h5ckpt::testing::expect_same_datasets(p, root_ + "/host");
  }
}

// Loads into device memory under every layout of this world, from a checkpoint saved under
// pure TP, with zero-redundancy on (replicas over the device transport) and off.
TEST_F(DeviceState, SnapshotWaitsForTheTrainersDeviceWork) {
  // An "optimizer step" still running on the trainer's stream when save is called writes the
  // final weights 200 ms later; the checkpoint must hold them, never the weights from before.
  const int n = world_size(), rank = h5ckpt::testing::world_rank();
  auto topo = Topology::create(MPI_COMM_WORLD, {1, n, 1});
  ASSERT_TRUE(topo.ok());
  device::Staging& dev = device::staging();
  constexpr int64_t kPer = 4096;
  const Shape shape{kPer * n};
  void* buf = dev.alloc_device(kPer * sizeof(float));
  ASSERT_NE(buf, nullptr);
  void* const stream = reinterpret_cast<void*>(uintptr_t{0x5});  // any handle names a stream here
  struct Variant {
    const char* name;
    bool async;
    void* stream;
  };
  for (const Variant& v : {Variant{"sync_stream", false, stream}, Variant{"sync_device", false, nullptr},
                           Variant{"async_stream", true, stream}, Variant{"async_device", true, nullptr}}) {
    std::vector<float> before(kPer), after(kPer);
    for (int64_t i = 0; i < kPer; ++i) {
      before[i] = -1.0f - static_cast<float>(i);
      after[i] = static_cast<float>(rank * kPer + i) + 0.25f;
    }
    ASSERT_TRUE(dev.copy_to_device(buf, before.data(), kPer * sizeof(float)).ok());
    ASSERT_TRUE(dev.synchronize().ok());
    ASSERT_TRUE(device::simulated_launch(dev, stream, buf, after.data(), kPer * sizeof(float), 200000).ok());
    StateDict st;
    st.add("model/w", DType::kF32, shape, ShardSpec::split(shape, 0, n, rank), buf, Device::kCuda);
    SaveOptions so;
    so.device_stream = v.stream;
    Checkpointer ck(*topo);
    const std::string path = root_ + "/" + v.name;
    if (v.async) {
      auto h = ck.save_async(st, path, so);
      ASSERT_TRUE(h.ok()) << h.status().to_string();
      ASSERT_TRUE(h->wait().ok());
    } else {
      auto r = ck.save(st, path, so);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
    }
    std::vector<float> whole(kPer * n, 0.0f);
    StateDict back;
    back.add_replicated("model/w", DType::kF32, shape, whole.data());
    ASSERT_TRUE(ck.load(back, path).ok());
    for (int64_t i = 0; i < kPer * n; ++i)
      ASSERT_EQ(whole[i], static_cast<float>(i) + 0.25f) << v.name << ": element " << i << " is from before the step";
  }
  dev.free_device(buf);
}

TEST_F(DeviceState, LoadIntoDeviceReshardsExactly) {
  const int n = world_size();
  {
    auto t = Topology::create(MPI_COMM_WORLD, {n, 1, 1});
    ASSERT_TRUE(t.ok());
    TestModel m(Layout{n, 1, 1, false}, t->coords(), true);
    Checkpointer ck(*t);
    ASSERT_TRUE(ck.save(m.state(), root_ + "/ckpt").ok());
  }
  for (const Layout& L : h5ckpt::testing::layouts_for(n)) {
    auto topo = Topology::create(MPI_COMM_WORLD, {L.tp, L.dp, L.pp});
    ASSERT_TRUE(topo.ok());
    Checkpointer ck(*topo);
    for (bool zr : {true, false}) {
      for (auto* which : {&all, &model_only}) {
        TestModel m(L, topo->coords(), false);
        DeviceMirror mirror(m.state(), which, true);
        LoadOptions o;
        o.zero_redundancy = zr;
        auto r = ck.load(mirror.state(), root_ + "/ckpt", o);
        ASSERT_TRUE(r.ok()) << L.name() << ": " << r.status().to_string();
        mirror.download();
        std::string first;
        EXPECT_EQ(m.count_mismatches(&first), 0) << L.name() << (zr ? " zr" : "") << ": " << first;
        if (zr && L.dp > 1) {
          EXPECT_GT(sum_all(r->bytes_received), 0u) << L.name();
          EXPECT_NE(r->transport.find("simulated-device"), std::string::npos) << r->transport;
        }
      }
    }
  }
}

TEST_F(DeviceState, CachedLoadPlanNoticesBuffersMovedToTheDevice) {
  const int n = world_size();
  auto topo = Topology::create(MPI_COMM_WORLD, {1, n, 1});
  ASSERT_TRUE(topo.ok());
  const Layout L{1, n, 1, false};
  {
    TestModel m(L, topo->coords(), true);
    Checkpointer ck(*topo);
    ASSERT_TRUE(ck.save(m.state(), root_ + "/ckpt").ok());
  }
  Checkpointer ck(*topo);
  TestModel host(L, topo->coords(), false);
  ASSERT_TRUE(ck.load(host.state(), root_ + "/ckpt").ok());
  // Same keys, shapes and shards, but now in device memory: the cached plan must not be reused.
  TestModel m(L, topo->coords(), false);
  DeviceMirror mirror(m.state(), all, false);
  auto r = ck.load(mirror.state(), root_ + "/ckpt");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE(r->plan_cached);
  mirror.download();
  std::string first;
  EXPECT_EQ(m.count_mismatches(&first), 0) << first;
}

TEST_F(DeviceState, EmptyDeviceShardsSaveAndLoad) {
  const int n = world_size(), rank = h5ckpt::testing::world_rank();
  auto topo = Topology::create(MPI_COMM_WORLD, {1, n, 1});
  ASSERT_TRUE(topo.ok());
  device::Staging& s = device::staging();
  // Rank 0 holds the whole flat range; every other rank an empty one, in device memory.
  const int64_t len = 4096;
  const ShardSpec spec = ShardSpec::flat_range(Box{{0}, {len}}, rank == 0 ? 0 : len, len);
  std::vector<float> host(static_cast<size_t>(spec.numel()));
  for (size_t j = 0; j < host.size(); ++j) host[j] = 0.25f * static_cast<float>(j);
  void* dev = s.alloc_device(host.size() * sizeof(float));
  ASSERT_TRUE(s.copy_to_device(dev, host.data(), host.size() * sizeof(float)).ok());
  ASSERT_TRUE(s.synchronize().ok());
  StateDict sd;
  sd.add("optimizer/flat", DType::kF32, {len}, spec, dev, Device::kCuda);
  Checkpointer ck(*topo);
  auto w = ck.save(sd, root_ + "/empty");
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  auto a = ck.save_async(sd, root_ + "/empty-async");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(a->wait().ok());
  std::vector<float> zero(host.size(), 0.0f), back(host.size(), -1.0f);
  ASSERT_TRUE(s.copy_to_device(dev, zero.data(), zero.size() * sizeof(float)).ok());
  auto r = ck.load(sd, root_ + "/empty-async");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_TRUE(s.copy_to_host(back.data(), dev, back.size() * sizeof(float)).ok());
  ASSERT_TRUE(s.synchronize().ok());
  EXPECT_EQ(back, host);
  s.free_device(dev);
}

TEST_F(DeviceState, DeclaredDeviceBufferThatIsHostMemoryIsRefused) {
  auto topo = Topology::create(MPI_COMM_WORLD, {1, world_size(), 1});
  ASSERT_TRUE(topo.ok());
  std::vector<float> host(16, 1.0f);
  StateDict s;
  s.add("model/w", DType::kF32, {16}, ShardSpec::whole({16}), host.data(), Device::kCuda);
  Checkpointer ck(*topo);
  auto r = ck.save(s, root_ + "/bad");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << r.status().to_string();
  EXPECT_NE(r.status().message().find("model/w"), std::string::npos) << r.status().to_string();
  EXPECT_FALSE(fs::exists(root_ + "/bad"));
}

TEST(HostOnlyStaging, DeviceBuffersAreRefusedWithoutAGpuRuntime) {
  if (device::staging().has_device()) GTEST_SKIP() << "a GPU runtime is present here";
  auto topo = Topology::create(MPI_COMM_WORLD, {1, world_size(), 1});
  ASSERT_TRUE(topo.ok());
  std::vector<float> buf(8, 2.0f);
  StateDict s;
  s.add("model/w", DType::kF32, {8}, ShardSpec::whole({8}), buf.data(), Device::kCuda);
  const std::string dir = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "hostonly");
  {
    Checkpointer ck(*topo);
    auto w = ck.save(s, dir + "/c");
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), ErrorCode::kUnsupported) << w.status().to_string();
    EXPECT_NE(w.status().message().find("no GPU runtime"), std::string::npos) << w.status().to_string();
    EXPECT_NE(w.status().message().find("model/w"), std::string::npos) << w.status().to_string();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (h5ckpt::testing::world_rank() == 0) fs::remove_all(dir);
}

}  // namespace
