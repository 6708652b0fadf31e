// Bounded memory (CheckpointerOptions::memory_bytes): saves and loads under a budget smaller than
// one tensor, in every layout pair and through the simulated device, end element-by-element equal
// to unbounded runs and to the independent expected values. Two allocation counters must stay
// within the budget: the library's own (Checkpointer::memory_peak_bytes) and an independent one in
// the test, which counts every byte of staging memory the library allocates (a Staging wrapper
// around the real implementation: the pool, read windows, conversion, verification and device
// staging buffers all come from it under a budget).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <functional>

#include "device/staging.h"
#include "support/device_mirror.h"
#include "support/test_model.h"

using namespace h5ckpt;
using h5ckpt::testing::DeviceMirror;
using h5ckpt::testing::Layout;
using h5ckpt::testing::max_all;
using h5ckpt::testing::TestModel;
using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;
namespace fs = std::filesystem;

namespace {

// Below every tensor of TestModel bigger than a vector (qkv and proj shards are up to 3 KiB, the
// embedding 2.3 KiB): every such item must stream through it.
constexpr uint64_t kBudget = 1024;

// Delegates to `inner`, counting the host staging memory live at once (the independent counter).
class CountingStaging final : public device::Staging {
 public:
  CountingStaging(std::unique_ptr<device::Staging> inner, std::string name)
      : inner_(std::move(inner)), name_(std::move(name)) {}
  const char* name() const override { return name_.c_str(); }
  bool has_device() const override { return inner_->has_device(); }
  bool is_device_pointer(const void* p) const override { return inner_->is_device_pointer(p); }
  void* alloc_host(size_t bytes) override {
    void* p = inner_->alloc_host(bytes);
    if (p) {
      const uint64_t now = live_ += bytes;
      uint64_t prev = peak_.load();
      while (now > prev && !peak_.compare_exchange_weak(prev, now)) {
      }
    }
    return p;
  }
  void free_host(void* p, size_t bytes) override {
    inner_->free_host(p, bytes);
    live_ -= bytes;
  }
  void* alloc_device(size_t bytes) override { return inner_->alloc_device(bytes); }
  void free_device(void* p) override { inner_->free_device(p); }
  Status copy_to_host(void* h, const void* d, size_t n) override { return inner_->copy_to_host(h, d, n); }
  Status copy_to_device(void* d, const void* h, size_t n) override { return inner_->copy_to_device(d, h, n); }
  uint64_t record() override { return inner_->record(); }
  Status wait(uint64_t m) override { return inner_->wait(m); }
  Status order_after(void* stream) override { return inner_->order_after(stream); }

  uint64_t peak() const { return peak_; }
  void reset_peak() { peak_ = live_.load(); }

 private:
  std::unique_ptr<device::Staging> inner_;
  std::string name_;
  std::atomic<uint64_t> live_{0}, peak_{0};
};

CountingStaging* g_counter = nullptr;

void use_staging(std::unique_ptr<device::Staging> inner, const std::string& name) {
  auto c = std::make_unique<CountingStaging>(std::move(inner), name);
  g_counter = c.get();
  device::set_staging_for_testing(std::move(c));
}

// Both counters of every rank stay within the budget.
void expect_within_budget(const Checkpointer& ck, const std::string& what) {
  EXPECT_LE(max_all(ck.memory_peak_bytes()), kBudget) << what << ": library peak over memory_bytes";
  EXPECT_LE(max_all(g_counter->peak()), kBudget) << what << ": staging memory allocated over memory_bytes";
}

// Every byte of every item of `a` equals `b`'s (the unbounded run's); names the first difference.
void expect_equal_states(StateDict& a, StateDict& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const StateItem &x = a.items()[i], &y = b.items()[i];
    const size_t es = dtype_size(x.dtype), n = static_cast<size_t>(x.shard.numel());
    for (size_t j = 0; j < n; ++j)
      if (std::memcmp(static_cast<const char*>(x.data) + j * es, static_cast<const char*>(y.data) + j * es, es) != 0) {
        ADD_FAILURE() << what << ": key '" << x.key << "' element " << j << " differs from the unbounded load";
        break;
      }
  }
}

CheckpointerOptions bounded() {
  CheckpointerOptions o;
  o.memory_bytes = kBudget;
  o.metrics = false;
  return o;
}

class MemoryBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "membudget");
    ASSERT_FALSE(root_.empty());
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) fs::remove_all(root_);
    device::set_staging_for_testing(nullptr);
    g_counter = nullptr;
  }
  std::string root_;
};

Topology topology_of(const Layout& L) {
  auto t = Topology::create(MPI_COMM_WORLD, ParallelSizes{L.tp, L.dp, L.pp});
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(t).value();
}

// Saves (sync and async) under the budget in every layout, then loads every checkpoint under
// every layout: per item (zero-redundancy on and off) and two-phase (unverified: a verified
// two-phase read needs a whole verification block, see TooSmallForAVerificationBlock).
TEST_F(MemoryBudgetTest, EveryLayoutPairEqualsUnbounded) {
  use_staging(device::make_host_staging(), "host");
  const auto layouts = h5ckpt::testing::layouts_for(world_size());
  int level = 0;
  MPI_Query_thread(&level);
  for (const Layout& s : layouts) {
    Topology topo = topology_of(s);
    TestModel model(s, topo.coords(), true);
    Checkpointer ck(topo, bounded());
    g_counter->reset_peak();
    auto saved = ck.save(model.state(), root_ + "/" + s.name());
    ASSERT_TRUE(saved.ok()) << s.name() << ": " << saved.status().to_string();
    auto h = ck.save_async(model.state(), root_ + "/async-" + s.name());
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    model.scribble();  // the snapshot was taken: the caller may overwrite its buffers
    auto r = h->wait();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    if (level >= MPI_THREAD_MULTIPLE) {
      EXPECT_GT(max_all(r->blocked_bytes), 0u) << "the snapshot should have streamed through the pool";
    }
    expect_within_budget(ck, "saves " + s.name());
    h5ckpt::testing::expect_same_datasets(root_ + "/async-" + s.name(), root_ + "/" + s.name());
  }
  for (const Layout& s : layouts) {
    for (const Layout& l : layouts) {
      Topology topo = topology_of(l);
      Checkpointer ck(topo, bounded());
      for (int variant = 0; variant < 3; ++variant) {
        LoadOptions o;
        o.zero_redundancy = variant != 1;
        if (variant == 2) {
          o.aggregate_reads = true;
          o.verify = false;
          o.read_window_bytes = 100;  // below the budget's window too: the smaller is used
        }
        const std::string what = s.name() + " -> " + l.name() + " variant " + std::to_string(variant);
        TestModel want(l, topo.coords(), false), got(l, topo.coords(), false);
        {  // the unbounded run's pool is gone before the counter restarts
          Checkpointer unbounded(topo);
          auto a = unbounded.load(want.state(), root_ + "/" + s.name(), o);
          ASSERT_TRUE(a.ok()) << what << ": " << a.status().to_string();
        }
        g_counter->reset_peak();
        ck.reset_memory_peak();
        auto b = ck.load(got.state(), root_ + "/async-" + s.name(), o);
        ASSERT_TRUE(b.ok()) << what << ": " << b.status().to_string();
        std::string first;
        EXPECT_EQ(got.count_mismatches(&first), 0) << what << ": " << first;
        expect_equal_states(got.state(), want.state(), what);
        expect_within_budget(ck, what);
      }
    }
  }
}

// Conversion (f32 stored, bf16 wanted) and verified two-phase reads with a budget that holds a
// verification block: the conversion and checked buffers are taken in rounds.
TEST_F(MemoryBudgetTest, TwoPhaseConversionAndVerificationInRounds) {
  use_staging(device::make_host_staging(), "host");
  const int n = world_size(), rank = world_rank();
  Topology topo = topology_of(Layout{1, n, 1, false});
  const int64_t rows = 64, cols = 3;  // 768 bytes per f32 tensor; blocks of whole rows
  const Shape shape{rows, cols};
  const int kTensors = 6;
  std::vector<std::vector<float>> src(kTensors);
  StateDict st;
  for (int t = 0; t < kTensors; ++t) {
    const ShardSpec shard = ShardSpec::split(shape, 0, n, rank);
    src[t].resize(static_cast<size_t>(shard.numel()));
    for (int64_t j = 0; j < shard.numel(); ++j)
      src[t][j] = static_cast<float>(t * 1000 + (shard.box.offset[0] * cols + j)) + 0.5f;
    st.add("w" + std::to_string(t), DType::kF32, shape, shard, src[t].data());
  }
  {
    Checkpointer ck(topo, bounded());
    ASSERT_TRUE(ck.save(st, root_ + "/c").ok());
  }
  CheckpointerOptions o = bounded();
  o.memory_bytes = 4096;  // room for a few tensors' worth of units per round, not all of them
  for (bool convert : {false, true}) {
    std::vector<std::vector<char>> got(kTensors), want(kTensors);
    StateDict a, b;
    const DType d = convert ? DType::kBF16 : DType::kF32;
    for (int t = 0; t < kTensors; ++t) {
      got[t].assign(rows * cols * dtype_size(d), 0);
      want[t].assign(rows * cols * dtype_size(d), 0);
      a.add_replicated("w" + std::to_string(t), d, shape, got[t].data());
      b.add_replicated("w" + std::to_string(t), d, shape, want[t].data());
    }
    LoadOptions lo;
    lo.aggregate_reads = true;
    {
      Checkpointer unbounded(topo);
      ASSERT_TRUE(unbounded.load(b, root_ + "/c", lo).ok());
    }
    g_counter->reset_peak();
    Checkpointer ck(topo, o);
    auto r = ck.load(a, root_ + "/c", lo);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    expect_equal_states(a, b, convert ? "converted" : "verified");
    EXPECT_LE(max_all(ck.memory_peak_bytes()), o.memory_bytes);
    EXPECT_LE(max_all(g_counter->peak()), o.memory_bytes);
    if (!convert)
      for (int t = 0; t < kTensors; ++t)
        for (int64_t j = 0; j < rows * cols; ++j) {
          float v;
          std::memcpy(&v, got[t].data() + j * 4, 4);
          ASSERT_EQ(v, static_cast<float>(t * 1000 + j) + 0.5f) << "tensor " << t << " element " << j;
        }
  }
}

TEST_F(MemoryBudgetTest, TooSmallIsAClearErrorOnEveryRank) {
  use_staging(device::make_host_staging(), "host");
  const int n = world_size();
  const Layout L{1, n, 1, false};
  Topology topo = topology_of(L);
  TestModel model(L, topo.coords(), true);
  {
    Checkpointer ok(topo);
    ASSERT_TRUE(ok.save(model.state(), root_ + "/c").ok());
  }
  CheckpointerOptions o;
  o.memory_bytes = 100;  // below kMinMemoryBytes: nothing can progress
  Checkpointer ck(topo, o);
  auto s = ck.save(model.state(), root_ + "/small");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("memory_bytes"), std::string::npos) << s.status().to_string();
  auto a = ck.save_async(model.state(), root_ + "/small");
  ASSERT_FALSE(a.ok());
  auto l = ck.load(model.state(), root_ + "/c");
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("too small"), std::string::npos) << l.status().to_string();
  EXPECT_FALSE(fs::exists(root_ + "/small"));
}

// A verified two-phase read needs one whole verification block at once (a TestModel region is one
// block): under a budget that cannot hold it, every rank fails with the same error, before any
// transfer, and nobody hangs.
TEST_F(MemoryBudgetTest, TooSmallForAVerificationBlock) {
  use_staging(device::make_host_staging(), "host");
  const int n = world_size();
  const Layout L{1, n, 1, false};
  Topology topo = topology_of(L);
  TestModel model(L, topo.coords(), true);
  Checkpointer ck(topo, bounded());
  ASSERT_TRUE(ck.save(model.state(), root_ + "/c").ok());
  LoadOptions lo;
  lo.aggregate_reads = true;
  auto r = ck.load(model.state(), root_ + "/c", lo);
  if (n == 1) GTEST_SKIP() << "one rank reads per item";
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << r.status().to_string();
  EXPECT_NE(r.status().message().find("verification block"), std::string::npos) << r.status().to_string();
  EXPECT_LE(max_all(ck.memory_peak_bytes()), kBudget);
}

// ---- the simulated device ------------------------------------------------------------------

bool all_items(const std::string&) { return true; }
bool model_only(const std::string& key) { return key.rfind("model/", 0) == 0; }

// Loads into device memory under every layout; with a device transport (replicas move between
// devices) and without one (the name hides it: every rank then reads its own device items).
TEST_F(MemoryBudgetTest, DeviceLoadsEqualUnbounded) {
  const int n = world_size();
  for (const char* name : {"simulated", "simulated-without-transport"}) {
    use_staging(device::make_simulated_staging(50), name);
    {
      Topology t = topology_of(Layout{n, 1, 1, false});
      TestModel m(Layout{n, 1, 1, false}, t.coords(), true);
      Checkpointer ck(t);
      SaveOptions so;
      so.overwrite = true;
      ASSERT_TRUE(ck.save(m.state(), root_ + "/ckpt", so).ok());
    }
    for (const Layout& L : h5ckpt::testing::layouts_for(n)) {
      Topology topo = topology_of(L);
      CheckpointerOptions o = bounded();
      o.io_threads = 2;
      Checkpointer ck(topo, o);
      for (bool zr : {true, false}) {
        for (auto* which : {&all_items, &model_only}) {
          const std::string what = std::string(name) + " " + L.name() + (zr ? " zr" : "");
          TestModel want(L, topo.coords(), false), got(L, topo.coords(), false);
          DeviceMirror dw(want.state(), which, true), dg(got.state(), which, true);
          LoadOptions lo;
          lo.zero_redundancy = zr;
          {
            Checkpointer unbounded(topo);
            ASSERT_TRUE(unbounded.load(dw.state(), root_ + "/ckpt", lo).ok()) << what;
          }
          g_counter->reset_peak();
          ck.reset_memory_peak();
          auto r = ck.load(dg.state(), root_ + "/ckpt", lo);
          ASSERT_TRUE(r.ok()) << what << ": " << r.status().to_string();
          dw.download();
          dg.download();
          std::string first;
          EXPECT_EQ(got.count_mismatches(&first), 0) << what << ": " << first;
          expect_equal_states(got.state(), want.state(), what);
          expect_within_budget(ck, what);
        }
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) fs::remove_all(root_ + "/ckpt");
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_F(MemoryBudgetTest, DeviceSavesEqualHostSaves) {
  use_staging(device::make_simulated_staging(50), "simulated");
  int level = 0;
  MPI_Query_thread(&level);
  const int n = world_size();
  const Layout L{n % 2 == 0 ? 2 : 1, n % 2 == 0 ? n / 2 : n, 1, true};
  Topology topo = topology_of(L);
  TestModel model(L, topo.coords(), true);
  {
    Checkpointer ck(topo);
    ASSERT_TRUE(ck.save(model.state(), root_ + "/host").ok());
  }
  DeviceMirror mirror(model.state(), all_items, true);
  Checkpointer ck(topo, bounded());
  g_counter->reset_peak();
  auto s = ck.save(mirror.state(), root_ + "/sync");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  h5ckpt::testing::expect_same_datasets(root_ + "/sync", root_ + "/host");
  auto h = ck.save_async(mirror.state(), root_ + "/async");
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  auto r = h->wait();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  h5ckpt::testing::expect_same_datasets(root_ + "/async", root_ + "/host");
  expect_within_budget(ck, "device saves");
}

}  // namespace
