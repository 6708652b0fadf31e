// StateTransfer with device buffers, through the simulated device on every machine (its "device
// memory" cannot be touched by host code, and bytes used before their copy completed are
// poisoned) or, as test_transfer_gpu, through CUDA on a GPU machine. Sources and destinations in
// device memory, mixed with host buffers, in every layout pair; deltas, a block corrupted in
// flight, dtype conversion and padding into device buffers.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <optional>

#include "device/staging.h"
#include "engine/transfer.h"
#include "h5ckpt/transfer.h"
#include "support/device_mirror.h"
#include "support/test_model.h"
#include "support/transfer_support.h"
#include "util/dtype_convert.h"

using namespace h5ckpt;
using namespace h5ckpt::testing::transfer;
using h5ckpt::testing::DeviceMirror;
using h5ckpt::testing::Layout;
using h5ckpt::testing::sum_all;
using h5ckpt::testing::TestModel;
using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;

namespace {

bool all(const std::string&) { return true; }
bool model_only(const std::string& key) { return key.rfind("model/", 0) == 0; }

// Trainer ranks (ZeRO over the first half of the world) publish to inference ranks (TP over the
// second half), every buffer in device memory.
struct DevicePublishing {
  Halves h;
  Layout mine = h.source ? Layout{1, h.size(), 1, true}
                         : Layout{h.size() % 2 == 0 ? 2 : 1, h.size() % 2 == 0 ? h.size() / 2 : h.size(), 1, false};
  Topology t = make_topology(h.comm, mine);
  TestModel model{mine, t.coords(), h.source};
  DeviceMirror dev{model.state(), all, true};
  StateTransfer x{MPI_COMM_WORLD};
  StateDict* src = h.source ? &dev.state() : nullptr;
  StateDict* dst = h.source ? nullptr : &dev.state();
  struct Parts {
    Halves& h;
    TestModel& model;
    DeviceMirror& dev;
    StateTransfer& x;
    StateDict* src;
    StateDict* dst;
  };
  Parts parts_{h, model, dev, x, src, dst};
  Parts& parts() { return parts_; }
};

#ifdef H5CKPT_TRANSFER_ON_GPU
// The real device: skipped where none is visible.
class DeviceTransfer : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device::staging().has_device()) GTEST_SKIP() << "no GPU visible";
  }
};
#else
class DeviceTransfer : public ::testing::Test {
 protected:
  // A short copy latency keeps the many row copies of column-split pieces quick while a use
  // before completion still reads poison.
  static void SetUpTestSuite() { device::set_staging_for_testing(device::make_simulated_staging(20)); }
  static void TearDownTestSuite() { device::set_staging_for_testing(nullptr); }
};
#endif

// Every layout pair on the same ranks: sources' model tensors on the device (the rest on the
// host), every destination buffer on the device; verified and unverified in turn.
TEST_F(DeviceTransfer, EveryLayoutPairIntoDeviceBuffers) {
  const auto layouts = h5ckpt::testing::layouts_for(world_size());
  StateTransfer x(MPI_COMM_WORLD);
  int64_t version = 0;
  for (const Layout& s : layouts)
    for (const Layout& d : layouts) {
      Topology ts = make_topology(MPI_COMM_WORLD, s), td = make_topology(MPI_COMM_WORLD, d);
      TestModel src(s, ts.coords(), true), dst(d, td.coords(), false);
      DeviceMirror src_dev(src.state(), model_only, version % 3 == 0);  // declared, or detected
      DeviceMirror dst_dev(dst.state(), all, version % 3 == 1);
      ASSERT_GT(dst_dev.device_items(), 0u);
      TransferOptions o;
      o.version = ++version;
      o.delta = false;
      o.verify = version % 2 == 0;
      auto r = x.transfer(&src_dev.state(), &dst_dev.state(), o);
      ASSERT_TRUE(r.ok()) << s.name() << " -> " << d.name() << ": " << r.status().to_string();
      dst_dev.download();
      std::string first;
      EXPECT_EQ(dst.count_mismatches(&first), 0) << s.name() << " -> " << d.name() << ": first mismatch at " << first;
      EXPECT_EQ(sum_all(r->bytes_received), sum_all(state_bytes(dst.state()))) << s.name() << " -> " << d.name();
    }
}

// Trainer ranks publish from device memory to inference ranks' device memory: a full version, a
// delta of one changed element (one block per holder moves), then a version corrupted in flight
// that fails everywhere and leaves the destination's device buffers at the previous version.
TEST_F(DeviceTransfer, DisjointDeltaAndCorruptionKeepThePreviousVersion) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  DevicePublishing p;
  auto& [h, model, dev, x, src, dst] = p.parts();
  TransferOptions o;
  o.version = 1;
  auto r1 = x.transfer(src, dst, o);
  ASSERT_TRUE(r1.ok()) << r1.status().to_string();
  std::string first;
  if (!h.source) {
    dev.download();
    EXPECT_EQ(model.count_mismatches(&first), 0) << first;
  }

  // One element of one tensor changes on the sources (on the host copy, then uploaded).
  const std::string key = "model/layers.0.qkv.weight";
  const int64_t g = 100;
  const float changed = 4242.0f;
  const int64_t held = for_element(model.state(), key, g, [&](float* v) {
    if (h.source) *v = changed;
  });
  const uint64_t holders = sum_all(static_cast<uint64_t>(h.source ? 0 : held));
  ASSERT_GT(holders, 0u);
  if (h.source) dev.upload();
  o.version = 2;
  auto r2 = x.transfer(src, dst, o);
  ASSERT_TRUE(r2.ok()) << r2.status().to_string();
  EXPECT_TRUE(r2->delta);
  EXPECT_EQ(sum_all(r2->blocks_received), holders) << "one block per destination rank holding the element";
  int64_t seen = 0;
  if (!h.source) {
    dev.download();
    seen = for_element(model.state(), key, g, [&](float* v) { EXPECT_EQ(*v, changed); });
    EXPECT_EQ(model.count_mismatches(&first), seen) << "only the changed element differs; first: " << first;
  }

  // Version 3 flips every element; one tensor is corrupted in flight.
  if (h.source) {
    flip_all(model.state());
    dev.upload();
  }
  const std::string bad = "model/embedding.weight";
  engine::set_transfer_fault_for_testing(world_rank(), bad);
  o.version = 3;
  auto r3 = x.transfer(src, dst, o);
  engine::set_transfer_fault_for_testing(-1, "");
  expect_agreed_error(r3.status(), ErrorCode::kCorrupt, "'" + bad + "'");
  EXPECT_EQ(x.version(), 2);
  if (!h.source) {
    dev.download();
    EXPECT_EQ(model.count_mismatches(&first), seen) << "the device buffers lost version 2: " << first;
  }
  auto r4 = x.transfer(src, dst, o);
  ASSERT_TRUE(r4.ok()) << r4.status().to_string();
  if (!h.source) {
    dev.download();
    int64_t wrong = 0;  // version 3: every element flipped, the changed one included
    for (auto& it : model.state().items())
      for (int64_t j = 0; j < it.shard.numel(); ++j) {
        const size_t es = dtype_size(it.dtype);
        unsigned char want[8];
        const int64_t gi = h5ckpt::testing::global_flat_index(it.shard, it.global_shape, j);
        if (it.key == key && gi == g) std::memcpy(want, &changed, 4);
        else h5ckpt::testing::expected_value(it.key, it.dtype, gi, want);
        want[0] ^= 1;
        wrong += std::memcmp(want, static_cast<const unsigned char*>(it.data) + j * es, es) != 0;
      }
    EXPECT_EQ(wrong, 0);
  }
}

// f32 sources into bf16 device buffers, and a padded device destination (rows past the source
// zeroed on the device), under a memory bound that forces rounds.
TEST_F(DeviceTransfer, ConversionPaddingAndRoundsIntoDeviceBuffers) {
  const int n = world_size(), me = world_rank();
  const Shape shape{37, 8}, padded{40, 8};
  const ShardSpec part = ShardSpec::split(shape, 0, n, me);
  std::vector<float> src_buf(static_cast<size_t>(part.numel()));
  for (int64_t j = 0; j < part.numel(); ++j)
    src_buf[j] = static_cast<float>(h5ckpt::testing::global_flat_index(part, shape, j)) * 0.5f;
  const ShardSpec cols = ShardSpec::split(padded, 1, n % 2 == 0 ? 2 : 1, me % (n % 2 == 0 ? 2 : 1));
  device::Staging& s = device::staging();
  void* src_dev = s.alloc_device(src_buf.size() * 4 + 1);
  void* bf16_dev = s.alloc_device(37 * 8 * 2);
  void* pad_dev = s.alloc_device(static_cast<size_t>(cols.numel()) * 4);
  ASSERT_TRUE(s.copy_to_device(src_dev, src_buf.data(), src_buf.size() * 4).ok());
  std::vector<float> junk(static_cast<size_t>(cols.numel()), -7.0f);  // must be overwritten or zeroed
  ASSERT_TRUE(s.copy_to_device(pad_dev, junk.data(), junk.size() * 4).ok());
  ASSERT_TRUE(s.synchronize().ok());
  StateDict src, dst;
  src.add("model/w", DType::kF32, shape, part, src_dev, Device::kCuda);
  dst.add("model/w", DType::kBF16, shape, ShardSpec::whole(shape), bf16_dev, Device::kCuda);
  StateDict dst_pad;
  dst_pad.add("model/w", DType::kF32, padded, cols, pad_dev, Device::kCuda).allow_shape_mismatch = true;
  StateTransfer x(MPI_COMM_WORLD), y(MPI_COMM_WORLD);
  TransferOptions o;
  o.memory_bytes = 1024;
  auto r = x.transfer(&src, &dst, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_GT(r->rounds, 1);
  EXPECT_LE(r->memory_peak_bytes, o.memory_bytes);
  auto rp = y.transfer(&src, &dst_pad, o);
  ASSERT_TRUE(rp.ok()) << rp.status().to_string();
  std::vector<uint16_t> got16(37 * 8);
  std::vector<float> got_pad(junk.size());
  ASSERT_TRUE(s.copy_to_host(got16.data(), bf16_dev, got16.size() * 2).ok());
  ASSERT_TRUE(s.copy_to_host(got_pad.data(), pad_dev, got_pad.size() * 4).ok());
  ASSERT_TRUE(s.synchronize().ok());
  int64_t bad16 = 0, bad_pad = 0;
  for (int64_t j = 0; j < 37 * 8; ++j) {
    float v = static_cast<float>(j) * 0.5f;  // exact in bf16 (j < 296)
    uint16_t want;
    detail::convert_elements(&v, DType::kF32, &want, DType::kBF16, 1);
    bad16 += got16[j] != want;
  }
  for (int64_t j = 0; j < cols.numel(); ++j) {
    const int64_t gi = h5ckpt::testing::global_flat_index(cols, padded, j), row = gi / 8, col = gi % 8;
    const float want = row < 37 ? static_cast<float>(row * 8 + col) * 0.5f : 0.0f;
    bad_pad += got_pad[j] != want;
  }
  EXPECT_EQ(bad16, 0);
  EXPECT_EQ(bad_pad, 0);
  s.free_device(src_dev);
  s.free_device(bf16_dev);
  s.free_device(pad_dev);
}

// Unverified full transfers of device pieces that are one contiguous run at both ends (rows
// split over the trainer, rows split over the inference ranks) go device to device on the device
// transport (the simulated device's; NCCL on a GPU, where every rank can set it up); verified
// ones through host memory. Either way every element arrives.
TEST_F(DeviceTransfer, UnhashedDevicePiecesGoOverTheDeviceTransport) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  Halves h;
  const int m = h.size();
  const Layout mine{1, m, 1, true};  // ZeRO: flat ranges of every tensor, one run each
  Topology t = make_topology(h.comm, mine);
  StateTransfer x(MPI_COMM_WORLD);
  for (bool verify : {false, true}) {
    TestModel model(mine, t.coords(), h.source);
    DeviceMirror dev(model.state(), all, true);
    TransferOptions o;
    o.delta = false;
    o.verify = verify;
    o.version = verify ? 2 : 1;
    auto r = x.transfer(h.source ? &dev.state() : nullptr, h.source ? nullptr : &dev.state(), o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const bool linked = r->transport != "mpi";
#ifndef H5CKPT_TRANSFER_ON_GPU
    EXPECT_EQ(r->transport, "mpi+simulated-device");
#endif
    const uint64_t sent = sum_all(r->bytes_sent), on_device = sum_all(r->bytes_sent_device);
    EXPECT_GT(sent, 0u);
    if (!verify && linked) EXPECT_EQ(on_device, sent) << "every piece is one run at both ends";
    else EXPECT_EQ(on_device, 0u) << (verify ? "verified pieces are checked on the host" : "no device transport");
    if (!h.source) {
      dev.download();
      std::string first;
      EXPECT_EQ(model.count_mismatches(&first), 0) << (verify ? "verified" : "unverified") << ": " << first;
    }
  }
}

#ifndef H5CKPT_TRANSFER_ON_GPU
// A device copy that fails as an asynchronous CUDA error does (the copy does not happen, the next
// wait reports it), on one rank. Copying a source piece down fails the call on every rank before
// any destination changes: the previous version stays. Writing a destination's device buffers
// fails every rank too, after the agreement: that destination is then partly new, so no rank
// keeps the version and the next transfer sends everything (no delta against it) and is exact.
TEST_F(DeviceTransfer, FailedDeviceCopiesFailEveryRank) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  DevicePublishing p;
  auto& [h, model, dev, x, src, dst] = p.parts();
  TransferOptions o;
  o.version = 1;
  auto r1 = x.transfer(src, dst, o);
  ASSERT_TRUE(r1.ok()) << r1.status().to_string();
  if (h.source) {
    flip_all(model.state());
    dev.upload();
  }
  std::string first;
  // Rank 0 (a source) loses its first copy down: with delta on, of the sums computed first; with
  // it off, of a round's bytes (their sums are computed after the copy).
  o.version = 2;
  for (bool delta : {true, false}) {
    SCOPED_TRACE(delta ? "delta" : "full");
    if (world_rank() == 0) ASSERT_TRUE(device::simulated_fail_copy(device::staging(), false, 1).ok());
    o.delta = delta;
    auto r2 = x.transfer(src, dst, o);
    expect_agreed_error(r2.status(), ErrorCode::kIo, "copy to host failed");
    EXPECT_EQ(x.version(), 1);
    if (!h.source) {
      dev.download();
      EXPECT_EQ(model.count_mismatches(&first), 0) << "the device buffers lost version 1: " << first;
    }
  }
  o.delta = true;
  // The last rank (a destination) loses its first copy up.
  if (world_rank() == world_size() - 1) ASSERT_TRUE(device::simulated_fail_copy(device::staging(), true, 1).ok());
  auto r3 = x.transfer(src, dst, o);
  expect_agreed_error(r3.status(), ErrorCode::kIo, "copy to device failed");
  auto r4 = x.transfer(src, dst, o);
  ASSERT_TRUE(r4.ok()) << r4.status().to_string();
  EXPECT_FALSE(r4->delta) << "a delta against a version a destination no longer holds";
  EXPECT_EQ(x.version(), 2);
  if (!h.source) {
    dev.download();
    int64_t wrong = 0;  // version 2: every element flipped
    for (auto& it : model.state().items())
      for (int64_t j = 0; j < it.shard.numel(); ++j) {
        const size_t es = dtype_size(it.dtype);
        unsigned char want[8];
        h5ckpt::testing::expected_value(it.key, it.dtype,
                                        h5ckpt::testing::global_flat_index(it.shard, it.global_shape, j), want);
        want[0] ^= 1;
        wrong += std::memcmp(want, static_cast<const unsigned char*>(it.data) + j * es, es) != 0;
      }
    EXPECT_EQ(wrong, 0);
  }
}
#endif

#ifndef H5CKPT_TRANSFER_ON_GPU
// Without a GPU runtime a declared device buffer is refused on every rank, naming the key.
TEST(HostOnlyTransfer, DeviceBuffersAreRefusedWithoutAGpuRuntime) {
  if (device::staging().has_device()) GTEST_SKIP() << "a GPU runtime is present here";
  std::vector<float> buf(8, 2.0f), out(8, 0.0f);
  StateDict s, d;
  s.add("model/w", DType::kF32, {8}, ShardSpec::whole({8}), buf.data(), Device::kCuda);
  d.add("model/w", DType::kF32, {8}, ShardSpec::whole({8}), out.data());
  StateTransfer x(MPI_COMM_WORLD);
  auto r = x.transfer(&s, &d);
  expect_agreed_error(r.status(), ErrorCode::kUnsupported, "model/w");
  EXPECT_EQ(out, std::vector<float>(8, 0.0f));
}
#endif

}  // namespace
