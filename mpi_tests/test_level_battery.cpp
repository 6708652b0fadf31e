// One battery, every storage level (engine/level.h): the shared file system, the node-local level
// with partner copies, and the node-local level after a node's disk is lost (every load of a file
// of that node is then served from its partner copy). Each case runs against each level, as a
// storage backend's conformance suite would:
//   - every save layout x load layout of a reshard set (TP, DP, PP, ZeRO),
//   - an injected write error on the last rank (the failing save fails everywhere, the last good
//     checkpoint stays selected and loads, and the next save commits),
//   - saves and loads under memory_bytes (the library's peak and the staging memory it allocates),
//   - a multi-piece item loaded into other pieces at other buffer offsets,
//   - dtype conversion (f32 -> f64, f32 -> bf16, bf16 -> f32).
// Every value is a pure function of (key, global index), computed here without the library, and
// compared element by element. Simulated nodes: H5CKPT_RANKS_PER_NODE (as test_local_level).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "device/staging.h"
#include "storage/posix_io.h"
#include "support/test_model.h"

using namespace h5ckpt;
using h5ckpt::testing::Layout;
using h5ckpt::testing::max_all;
using h5ckpt::testing::TestModel;
using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;
namespace fs = std::filesystem;

namespace {

// ---- the levels -------------------------------------------------------------------------------

struct LevelCase {
  const char* name;
  bool local;      // CheckpointerOptions::local_dir set: the node-local level
  bool lose_node;  // after every save, node 0's local directory is deleted (needs 2+ nodes)
};

std::string level_name(const ::testing::TestParamInfo<LevelCase>& info) { return info.param.name; }

int ranks_per_node() {
  const char* e = std::getenv("H5CKPT_RANKS_PER_NODE");
  return e && std::atoi(e) > 0 ? std::atoi(e) : 1 << 20;
}
int node_count() { return (world_size() + ranks_per_node() - 1) / ranks_per_node(); }
int my_node() { return world_rank() / ranks_per_node(); }

// ---- the layouts ------------------------------------------------------------------------------

// DP, DP with ZeRO, TP, PP with ZeRO, and TP x PP with ZeRO where the world divides.
std::vector<Layout> reshard_set(int n) {
  std::vector<Layout> out = {{1, n, 1, false}, {1, n, 1, true}};
  if (n % 2 == 0) {
    out.push_back({2, n / 2, 1, false});
    out.push_back({1, n / 2, 2, true});
  }
  if (n % 4 == 0) out.push_back({2, n / 4, 2, true});
  return out;
}

Topology topology_of(const Layout& l) {
  auto t = Topology::create(MPI_COMM_WORLD, ParallelSizes{l.tp, l.dp, l.pp});
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(t).value();
}

// ---- values computed without the library ------------------------------------------------------

// Exact in f32, f64 and (for bf16_value) bf16.
float f32_value(int salt, int64_t g) { return static_cast<float>(((g * 7 + salt * 13) % 2039) - 1000) / 8.0f; }
float bf16_exact_value(int salt, int64_t g) { return static_cast<float>(((g * 5 + salt) % 251) - 125) / 128.0f; }
uint16_t bf16_bits_of(float f) {  // exact for bf16_exact_value: the low 16 bits are zero
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}
float f32_of_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Every rank holds the same error code and, with `text`, the same message.
void expect_same_on_all_ranks(const Status& st, bool text) {
  const uint64_t h = text ? std::hash<std::string>{}(st.to_string()) : static_cast<uint64_t>(st.code());
  uint64_t lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi) << "ranks disagree; this rank has: " << st.to_string();
}

// Counts the host staging memory the library allocates (pool, windows, conversion and check
// buffers all come from device::staging() under a budget): an independent second counter beside
// Checkpointer::memory_peak_bytes.
class CountingStaging final : public device::Staging {
 public:
  explicit CountingStaging(std::unique_ptr<device::Staging> inner) : inner_(std::move(inner)) {}
  const char* name() const override { return inner_->name(); }
  bool has_device() const override { return inner_->has_device(); }
  bool is_device_pointer(const void* p) const override { return inner_->is_device_pointer(p); }
  void* alloc_host(size_t bytes) override {
    void* p = inner_->alloc_host(bytes);
    if (p) {
      const uint64_t now = live_ += bytes;
      for (uint64_t prev = peak_.load(); now > prev && !peak_.compare_exchange_weak(prev, now);) {
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
  std::atomic<uint64_t> live_{0}, peak_{0};
};

// ---- the fixture ------------------------------------------------------------------------------

class LevelBattery : public ::testing::TestWithParam<LevelCase> {
 protected:
  void SetUp() override {
    if (GetParam().lose_node && node_count() < 2) GTEST_SKIP() << "one node: no partner copies";
    root_ = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, std::string("battery_") + GetParam().name);
    ASSERT_FALSE(root_.empty());
    shared_ = root_ + "/shared";
    if (world_rank() == 0) fs::create_directories(shared_);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  void TearDown() override {
    unsetenv("H5CKPT_FAULT");
    (void)storage::io::reload_faults_for_testing();
    device::set_staging_for_testing(nullptr);
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0 && !root_.empty()) fs::remove_all(root_);
  }

  CheckpointerOptions options() const {
    CheckpointerOptions o;
    o.metrics = false;
    o.async = false;
    if (GetParam().local) o.local_dir = root_ + "/node{node}";
    return o;
  }
  std::string node_dir(int n) const { return root_ + "/node" + std::to_string(n); }

  // Checks what every save of this level reports, then, for the lost-node level, deletes node 0's
  // local directory (its disk is gone: loads must take its files from the partner copies).
  void after_save(const Result<SaveReport>& rep, const std::string& what) {
    ASSERT_TRUE(rep.ok()) << what << ": " << rep.status().to_string();
    EXPECT_EQ(rep->level, GetParam().local ? "local" : "shared") << what;
    if (!GetParam().lose_node) return;
    if (world_rank() == 0) fs::remove_all(node_dir(0));
    MPI_Barrier(MPI_COMM_WORLD);
  }
  // What every load of this level reports: a local checkpoint is read by the local level.
  void expect_served_here(const LoadReport& rep, const std::string& what) {
    if (GetParam().local) EXPECT_EQ(rep.transport, "mpi-local") << what << ": not served by the local level";
  }

  std::string root_, shared_;
};

// ---- every layout pair ------------------------------------------------------------------------

TEST_P(LevelBattery, EveryLayoutPair) {
  const auto layouts = reshard_set(world_size());
  // One save per layout, loaded under every layout before the next save (the local level keeps
  // its newest local_keep checkpoints only).
  for (const Layout& s : layouts) {
    const std::string path = shared_ + "/" + s.name();
    {
      Topology topo = topology_of(s);
      TestModel model(s, topo.coords(), /*fill=*/true);
      Checkpointer ck(topo, options());
      after_save(ck.save(model.state(), path), "save " + s.name());
    }
    for (const Layout& l : layouts) {
      const std::string what = s.name() + " -> " + l.name();
      Topology topo = topology_of(l);
      TestModel model(l, topo.coords(), /*fill=*/false);
      Checkpointer ck(topo, options());
      auto rep = ck.load(model.state(), path);
      ASSERT_TRUE(rep.ok()) << what << ": " << rep.status().to_string();
      expect_served_here(*rep, what);
      std::string first;
      EXPECT_EQ(model.count_mismatches(&first), 0) << what << ": first mismatch at " << first;
    }
  }
}

// ---- an injected fault ------------------------------------------------------------------------

// The last rank's first write of save B fails (EIO). Every rank gets the same error naming the
// rank; B is not selected anywhere; the level's newest checkpoint is still A, which loads (in
// another layout) with A's values (B's were scribbled over); the next save commits and loads.
TEST_P(LevelBattery, InjectedWriteErrorKeepsTheLastGoodCheckpoint) {
  const int n = world_size();
  const Layout a{1, n, 1, true};
  const Layout b = n % 2 == 0 ? Layout{2, n / 2, 1, false} : Layout{1, n, 1, false};
  Topology topo = topology_of(a);
  Checkpointer ck(topo, options());
  TestModel model(a, topo.coords(), /*fill=*/true);
  SaveOptions so;
  so.aggregate_writes = AggregateWrites::kOff;  // every rank writes its own bytes: the last one too
  so.step = 1;
  after_save(ck.save(model.state(), shared_ + "/A", so), "save A");

  const int victim = n - 1;
  ASSERT_EQ(setenv("H5CKPT_FAULT", ("op=pwrite,errno=EIO,rank=" + std::to_string(victim)).c_str(), 1), 0);
  ASSERT_TRUE(storage::io::reload_faults_for_testing().ok());
  model.scribble();  // B's values differ from A's: a load of B instead of A shows
  so.step = 2;
  auto failed = ck.save(model.state(), shared_ + "/B", so);
  unsetenv("H5CKPT_FAULT");
  ASSERT_TRUE(storage::io::reload_faults_for_testing().ok());
  ASSERT_FALSE(failed.ok()) << "the injected write error did not fail the save";
  EXPECT_EQ(failed.status().code(), ErrorCode::kIo) << failed.status().to_string();
  EXPECT_NE(failed.status().message().find("injected fault on rank " + std::to_string(victim)), std::string::npos)
      << failed.status().to_string();
  // The shared level's message is the same text everywhere; the local level's names each rank's
  // own node directory as its context, so there only the code and the failing rank must agree.
  expect_same_on_all_ranks(failed.status(), /*text=*/!GetParam().local);
  EXPECT_FALSE(fs::exists(shared_ + "/B")) << "the failed save left its checkpoint on the shared level";
  if (GetParam().local)
    EXPECT_FALSE(fs::exists(node_dir(my_node()) + "/B")) << "the failed save left a local checkpoint";

  auto res = ck.resolve(shared_);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_EQ(res->level, GetParam().local ? "local" : "shared") << res->reason;
  EXPECT_EQ(res->info.step, 1) << res->reason;
  {
    Topology tb = topology_of(b);
    Checkpointer cb(tb, options());
    TestModel got(b, tb.coords(), /*fill=*/false);
    auto rep = cb.load(got.state(), shared_);
    ASSERT_TRUE(rep.ok()) << rep.status().to_string();
    expect_served_here(*rep, "load after the failed save");
    std::string first;
    EXPECT_EQ(got.count_mismatches(&first), 0) << "the last good checkpoint does not load as A: " << first;
  }
  TestModel fresh(a, topo.coords(), /*fill=*/true);
  so.step = 3;
  after_save(ck.save(fresh.state(), shared_ + "/C", so), "save C after the failure");
  TestModel got(a, topo.coords(), /*fill=*/false);
  auto rep = ck.load(got.state(), shared_);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  std::string first;
  EXPECT_EQ(got.count_mismatches(&first), 0) << first;
}

// ---- the memory budget ------------------------------------------------------------------------

// Saves under one layout and loads under another with memory_bytes far below a rank's share of
// the state (the test model plus a vector each rank loads whole): both counters stay within it.
TEST_P(LevelBattery, SavesAndLoadsWithinTheMemoryBudget) {
  constexpr uint64_t kBudget = 2048;
  const int n = world_size();
  const int64_t per = 768;  // f32 elements per rank: 3 KiB each, the whole vector 3 KiB x n
  auto counter_owner = std::make_unique<CountingStaging>(device::make_host_staging());
  CountingStaging* counter = counter_owner.get();
  device::set_staging_for_testing(std::move(counter_owner));
  CheckpointerOptions o = options();
  o.memory_bytes = kBudget;
  const Layout s{1, n, 1, true};
  const Layout l = n % 2 == 0 ? Layout{2, n / 2, 1, false} : Layout{1, n, 1, false};
  uint64_t save_peak = 0;
  {
    Topology topo = topology_of(s);
    TestModel model(s, topo.coords(), /*fill=*/true);
    std::vector<float> mine(per);
    for (int64_t i = 0; i < per; ++i) mine[i] = f32_value(1, world_rank() * per + i);
    StateDict all;  // the model's own check covers only its items
    all.items() = model.state().items();
    all.add("big/vector", DType::kF32, {n * per}, ShardSpec::split({n * per}, 0, n, world_rank()), mine.data());
    Checkpointer ck(topo, o);
    counter->reset_peak();
    ck.reset_memory_peak();
    after_save(ck.save(all, shared_ + "/budget"), "save under the budget");
    save_peak = max_all(ck.memory_peak_bytes());
    EXPECT_LE(save_peak, kBudget) << "save: library peak over memory_bytes";
    EXPECT_LE(max_all(counter->peak()), kBudget) << "save: staging memory allocated over memory_bytes";
  }
  Topology topo = topology_of(l);
  TestModel model(l, topo.coords(), /*fill=*/false);
  std::vector<float> whole(static_cast<size_t>(n * per), -1.0f);
  StateDict all;
  all.items() = model.state().items();
  all.add_replicated("big/vector", DType::kF32, {n * per}, whole.data());
  Checkpointer ck(topo, o);
  counter->reset_peak();
  ck.reset_memory_peak();
  auto rep = ck.load(all, shared_ + "/budget");
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  expect_served_here(*rep, "load under the budget");
  std::string first;
  EXPECT_EQ(model.count_mismatches(&first), 0) << first;
  int64_t bad = 0;
  for (int64_t g = 0; g < n * per; ++g) bad += whole[static_cast<size_t>(g)] != f32_value(1, g);
  EXPECT_EQ(bad, 0) << "elements of big/vector wrong";
  const uint64_t load_peak = max_all(ck.memory_peak_bytes());
  EXPECT_LE(load_peak, kBudget) << "load: library peak over memory_bytes";
  EXPECT_LE(max_all(counter->peak()), kBudget) << "load: staging memory allocated over memory_bytes";
  // Each level leases from the budget somewhere (the shared level its aggregated write windows, the
  // local level its load window): the counter measures something.
  EXPECT_GT(save_peak + load_peak, 0u) << "nothing was leased from the budget by this level";
}

// ---- a multi-piece item -----------------------------------------------------------------------

// A fused [gate; up] weight of shape [2F, H]. Saved: rank r holds gate rows and up rows of block r
// (in that order, a gap between). Loaded: rank r holds block (r + 1) % n, up rows first, at other
// offsets, with gaps that must stay untouched.
TEST_P(LevelBattery, MultiPieceItemLoadsIntoOtherPieces) {
  const int n = world_size();
  constexpr int64_t kF = 24, kH = 5;  // kF divides over 1, 2, 4 and 8 ranks
  const Shape shape{2 * kF, kH};
  const int64_t rows = kF / n;
  const float kGap = -7.0f, kUnset = -1.0f;
  auto value = [](int64_t g) { return static_cast<float>((g * 7 + 3) % 1000003); };
  // A buffer: `lead` gap elements, piece 0, `mid` gap elements, piece 1.
  struct Held {
    std::vector<float> buf;
    std::vector<ShardPiece> pieces;
    std::vector<int64_t> global;  // per element: its global flat index, or -1 in a gap
  };
  auto make = [&](int64_t first_row0, int64_t second_row0, int64_t lead, int64_t mid, bool fill) {
    Held h;
    const int64_t piece = rows * kH;
    h.global.assign(static_cast<size_t>(lead + piece + mid + piece), -1);
    int64_t at = lead;
    for (int64_t row0 : {first_row0, second_row0}) {
      h.pieces.push_back({ShardSpec::box_of({row0, 0}, {rows, kH}), static_cast<uint64_t>(at) * sizeof(float)});
      for (int64_t j = 0; j < piece; ++j) h.global[static_cast<size_t>(at + j)] = row0 * kH + j;
      at += piece + mid;
    }
    h.buf.resize(h.global.size());
    for (size_t i = 0; i < h.buf.size(); ++i) h.buf[i] = h.global[i] < 0 ? kGap : fill ? value(h.global[i]) : kUnset;
    return h;
  };
  const int r = world_rank(), q = (r + 1) % n;
  {
    Topology topo = topology_of(Layout{1, n, 1, false});
    Held saved = make(r * rows, kF + r * rows, 0, 3, /*fill=*/true);
    StateDict state;
    state.add_pieces("model/fused.fc1.weight", DType::kF32, shape, saved.pieces, saved.buf.data());
    Checkpointer ck(topo, options());
    after_save(ck.save(state, shared_ + "/pieces"), "save multi-piece");
  }
  Topology topo = topology_of(Layout{1, n, 1, false});
  Held got = make(kF + q * rows, q * rows, 2, 1, /*fill=*/false);
  StateDict state;
  state.add_pieces("model/fused.fc1.weight", DType::kF32, shape, got.pieces, got.buf.data());
  Checkpointer ck(topo, options());
  auto rep = ck.load(state, shared_ + "/pieces");
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  expect_served_here(*rep, "load multi-piece");
  int64_t bad = 0;
  std::string first;
  for (size_t i = 0; i < got.buf.size(); ++i) {
    const float want = got.global[i] < 0 ? kGap : value(got.global[i]);
    if (got.buf[i] != want && bad++ == 0)
      first = "buffer element " + std::to_string(i) + " is " + std::to_string(got.buf[i]) + ", expected " +
              std::to_string(want) + (got.global[i] < 0 ? " (a gap between pieces)" : "");
  }
  EXPECT_EQ(bad, 0) << first;
}

// ---- dtype conversion -------------------------------------------------------------------------

// Saved split over the ranks by rows; loaded whole (f32 -> f64) and split the other way (f32 ->
// bf16, bf16 -> f32), each element compared with the value computed here in the wanted dtype.
TEST_P(LevelBattery, ConvertsDtypesOnLoad) {
  const int n = world_size();
  constexpr int64_t kCols = 6;
  const int64_t rows = 4 * n;
  const Shape shape{rows, kCols};
  const int r = world_rank();
  const ShardSpec mine = ShardSpec::split(shape, 0, n, r);
  const ShardSpec other = ShardSpec::split(shape, 0, n, n - 1 - r);  // another rank's rows
  auto global_of = [&](const ShardSpec& s, int64_t j) { return h5ckpt::testing::global_flat_index(s, shape, j); };
  {
    Topology topo = topology_of(Layout{1, n, 1, false});
    const int64_t m = mine.numel();
    std::vector<float> a(m), b(m);
    std::vector<uint16_t> c(m);
    for (int64_t j = 0; j < m; ++j) {
      a[j] = f32_value(2, global_of(mine, j));
      b[j] = bf16_exact_value(3, global_of(mine, j));
      c[j] = bf16_bits_of(bf16_exact_value(4, global_of(mine, j)));
    }
    StateDict state;
    state.add("conv/f32_to_f64", DType::kF32, shape, mine, a.data());
    state.add("conv/f32_to_bf16", DType::kF32, shape, mine, b.data());
    state.add("conv/bf16_to_f32", DType::kBF16, shape, mine, c.data());
    Checkpointer ck(topo, options());
    after_save(ck.save(state, shared_ + "/dtypes"), "save f32 and bf16");
  }
  Topology topo = topology_of(Layout{1, n, 1, false});
  std::vector<double> a(static_cast<size_t>(rows * kCols), -1.0);
  std::vector<uint16_t> b(static_cast<size_t>(other.numel()), 0xFFFF);
  std::vector<float> c(static_cast<size_t>(other.numel()), -1.0f);
  StateDict state;
  state.add_replicated("conv/f32_to_f64", DType::kF64, shape, a.data());
  state.add("conv/f32_to_bf16", DType::kBF16, shape, other, b.data());
  state.add("conv/bf16_to_f32", DType::kF32, shape, other, c.data());
  Checkpointer ck(topo, options());
  LoadOptions lo;
  lo.convert_dtype = true;
  auto rep = ck.load(state, shared_ + "/dtypes", lo);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  expect_served_here(*rep, "load with conversion");
  int64_t bad_a = 0, bad_b = 0, bad_c = 0;
  for (int64_t g = 0; g < rows * kCols; ++g) bad_a += a[g] != static_cast<double>(f32_value(2, g));
  for (int64_t j = 0; j < other.numel(); ++j) {
    bad_b += b[j] != bf16_bits_of(bf16_exact_value(3, global_of(other, j)));
    bad_c += c[j] != f32_of_bf16(bf16_bits_of(bf16_exact_value(4, global_of(other, j))));
  }
  EXPECT_EQ(bad_a, 0) << "f32 -> f64 elements wrong";
  EXPECT_EQ(bad_b, 0) << "f32 -> bf16 elements wrong";
  EXPECT_EQ(bad_c, 0) << "bf16 -> f32 elements wrong";
}

INSTANTIATE_TEST_SUITE_P(Levels, LevelBattery,
                         ::testing::Values(LevelCase{"shared", false, false}, LevelCase{"local", true, false},
                                           LevelCase{"local_lost_node", true, true}),
                         level_name);

}  // namespace
