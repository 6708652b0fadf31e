// Multi-piece items (StateDict::add_pieces): several boxes or flat ranges of one global tensor at
// given byte offsets of one buffer, e.g. Megatron's fused SwiGLU fc1 shard [gate_t; up_t] of a
// [2*ffn, hidden] weight. Every expected value here is computed from the global index by formulas
// of its own (never through the pieces or the library); buffers carry gaps between the pieces that
// must stay untouched, so a piece written at the wrong buffer offset shows.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "device/staging.h"
#include "h5ckpt/checkpoint_info.h"
#include "h5ckpt/checkpointer.h"
#include "h5ckpt/reader.h"
#include "h5ckpt/state.h"
#include "h5ckpt/topology.h"
#include "support/test_model.h"

using namespace h5ckpt;
using h5ckpt::testing::sum_all;
using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kF = 24;   // ffn rows of each half (divisible by every TP and world size used: 1, 2, 4, 8)
constexpr int64_t kH = 5;    // hidden
const Shape kW{2 * kF, kH};  // fused fc1 weight [gate; up]
const Shape kB{2 * kF};      // fused fc1 bias
constexpr double kGap = -7.0, kUnset = -1.0;

// The value of global flat index g of the tensor with `salt` (exact in f32 and f64; never negative).
double value(int salt, int64_t g) { return static_cast<double>((g * 7 + salt * 101 + 3) % 1000003); }

int64_t cols_of(const Shape& s) { return s.size() > 1 ? s[1] : 1; }

// Rows [row0, row0 + n) of a 1-D or 2-D tensor.
ShardSpec rows(const Shape& s, int64_t row0, int64_t n) {
  if (s.size() == 1) return ShardSpec::box_of({row0}, {n});
  return ShardSpec::box_of({row0, 0}, {n, s[1]});
}

// What one rank holds of one tensor: its buffer, the pieces (or one ordinary shard), and the
// value each buffer element must have, computed from global indices.
struct Held {
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<double> expected;    // per buffer element; kGap where no piece lies
  std::vector<ShardPiece> pieces;  // buffer offsets in bytes
  std::optional<ShardSpec> single;
  std::vector<char> buf;

  size_t es() const { return dtype_size(dtype); }
  size_t n() const { return expected.size(); }
  void set(size_t i, double v) {
    if (dtype == DType::kF64) std::memcpy(buf.data() + i * 8, &v, 8);
    else {
      const float f = static_cast<float>(v);
      std::memcpy(buf.data() + i * 4, &f, 4);
    }
  }
  double get(size_t i) const {
    if (dtype == DType::kF64) {
      double v;
      std::memcpy(&v, buf.data() + i * 8, 8);
      return v;
    }
    float f;
    std::memcpy(&f, buf.data() + i * 4, 4);
    return f;
  }
  void fill_for_save() {
    buf.assign(n() * es(), 0);
    for (size_t i = 0; i < n(); ++i) set(i, expected[i]);
  }
  void clear_for_load() {
    buf.assign(n() * es(), 0);
    for (size_t i = 0; i < n(); ++i) set(i, expected[i] == kGap ? kGap : kUnset);
  }
  int64_t mismatches(std::string* first) const {
    int64_t bad = 0;
    for (size_t i = 0; i < n(); ++i)
      if (get(i) != expected[i] && bad++ == 0 && first)
        *first = "element " + std::to_string(i) + ": " + std::to_string(get(i)) + " != " + std::to_string(expected[i]);
    return bad;
  }
  StateItem& add_to(StateDict& s, const std::string& key) {
    if (single) return s.add(key, dtype, shape, *single, buf.data());
    return s.add_pieces(key, dtype, shape, pieces, buf.data());
  }
};

// The fused shard of TP rank t of tp: gate rows [t*F/tp, (t+1)*F/tp) and up rows
// [F + t*F/tp, F + (t+1)*F/tp), `gap` elements between them in the buffer, up first if `swapped`.
Held fused(const Shape& shape, int salt, int tp, int t, int64_t gap, bool swapped, DType dtype = DType::kF32) {
  Held h;
  h.dtype = dtype;
  h.shape = shape;
  const int64_t half = kF / tp, cols = cols_of(shape), slab = half * cols;
  const uint64_t es = dtype_size(dtype);
  ShardPiece gate{rows(shape, t * half, half), static_cast<uint64_t>(swapped ? slab + gap : 0) * es};
  ShardPiece up{rows(shape, kF + t * half, half), static_cast<uint64_t>(swapped ? 0 : slab + gap) * es};
  h.pieces = {gate, up};
  for (int64_t i = 0; i < 2 * slab + gap; ++i) {
    if (i >= slab && i < slab + gap) {
      h.expected.push_back(kGap);
      continue;
    }
    const bool first = i < slab;
    const int64_t li = first ? i : i - slab - gap;
    const bool is_up = first == swapped;
    const int64_t row = (is_up ? kF : 0) + t * half + li / cols;
    h.expected.push_back(value(salt, row * cols + li % cols));
  }
  return h;
}

// ZeRO-style mix on rank r of n: a box of up rows [F + r*F/n, F + (r+1)*F/n) first in the buffer,
// then `gap` elements, then a flat range [r*F*H/n, (r+1)*F*H/n) of the gate half's flattening.
Held mixed(const Shape& shape, int salt, int n, int r, int64_t gap, DType dtype = DType::kF32) {
  Held h;
  h.dtype = dtype;
  h.shape = shape;
  const int64_t cols = cols_of(shape), per_rows = kF / n, box_len = per_rows * cols;
  const int64_t flat_len = kF * cols / n;
  const uint64_t es = dtype_size(dtype);
  const ShardSpec gate_box = rows(shape, 0, kF);
  h.pieces = {ShardPiece{rows(shape, kF + r * per_rows, per_rows), 0},
              ShardPiece{ShardSpec::flat_range(gate_box.box, r * flat_len, (r + 1) * flat_len),
                         static_cast<uint64_t>(box_len + gap) * es}};
  for (int64_t i = 0; i < box_len; ++i) h.expected.push_back(value(salt, (kF + r * per_rows) * cols + i));
  for (int64_t i = 0; i < gap; ++i) h.expected.push_back(kGap);
  for (int64_t i = 0; i < flat_len; ++i) h.expected.push_back(value(salt, r * flat_len + i));
  return h;
}

// An ordinary single-box item: rows [r*2F/n, (r+1)*2F/n).
Held plain_rows(const Shape& shape, int salt, int n, int r, DType dtype = DType::kF32) {
  Held h;
  h.dtype = dtype;
  h.shape = shape;
  const int64_t per = 2 * kF / n, cols = cols_of(shape);
  h.single = rows(shape, r * per, per);
  for (int64_t i = 0; i < per * cols; ++i) h.expected.push_back(value(salt, r * per * cols + i));
  return h;
}

uint64_t tensor_bytes(const Shape& s, DType t = DType::kF32) {
  uint64_t n = dtype_size(t);
  for (auto d : s) n *= static_cast<uint64_t>(d);
  return n;
}

// TP sizes a world of n ranks can use.
std::vector<int> tp_sizes(int n) {
  std::vector<int> out;
  for (int tp : {1, 2, 4, 8})
    if (tp <= n && n % tp == 0) out.push_back(tp);
  return out;
}

Topology make_topo(int tp) {
  auto t = Topology::create(MPI_COMM_WORLD, {.tp = tp, .dp = world_size() / tp});
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(t).value();
}

class MultiPiece : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "multipiece");
    ASSERT_FALSE(root_.empty());
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) fs::remove_all(root_);
  }
  // Loads `held` (cleared first) under `key`s from `path` and expects every element.
  void load_and_check(Checkpointer& ck, std::vector<std::pair<std::string, Held*>> held, const std::string& path,
                      const LoadOptions& o, const std::string& what, LoadReport* report = nullptr) {
    StateDict s;
    for (auto& [key, h] : held) {
      h->clear_for_load();
      h->add_to(s, key);
    }
    auto r = ck.load(s, path, o);
    ASSERT_TRUE(r.ok()) << what << ": " << r.status().to_string();
    for (auto& [key, h] : held) {
      std::string first;
      EXPECT_EQ(h->mismatches(&first), 0) << what << " key " << key << " rank " << world_rank() << ": " << first;
    }
    if (report) *report = *r;
  }
  std::string root_;
};

// Saved by TP=2 (DP replicas of the fused shards), loaded under every TP this world allows, with
// the halves swapped in the buffer and a different gap: element-exact, replicas written once.
TEST_F(MultiPiece, FusedSwiGluSavedAtTp2LoadsAtEveryTp) {
  const int n = world_size();
  const int tp_s = n >= 2 ? 2 : 1;
  Topology topo = make_topo(tp_s);
  const int t = topo.coords().tp;
  Held w = fused(kW, 1, tp_s, t, 3, false), b = fused(kB, 2, tp_s, t, 1, false);
  w.fill_for_save();
  b.fill_for_save();
  StateDict s;
  w.add_to(s, "model/mlp.fc1.weight");
  b.add_to(s, "model/mlp.fc1.bias");
  Checkpointer ck(topo);
  auto r = ck.save(s, root_ + "/fused");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // DP replicas of every piece are written once: the bytes written add up to the tensors' bytes,
  // and the checkpoint records 2 * tp_s regions per tensor (gate and up of each TP rank).
  const uint64_t total = tensor_bytes(kW) + tensor_bytes(kB);
  EXPECT_EQ(r->bytes_total, total);
  EXPECT_EQ(sum_all(r->bytes_written), total);
  auto info = read_checkpoint_info(root_ + "/fused");
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  for (const char* key : {"model/mlp.fc1.weight", "model/mlp.fc1.bias"}) {
    const TensorInfo* ti = info->find(key);
    ASSERT_NE(ti, nullptr);
    EXPECT_EQ(ti->regions.size(), static_cast<size_t>(2 * tp_s)) << key;
  }
  for (int tp_l : tp_sizes(n)) {
    Topology lt = make_topo(tp_l);
    Checkpointer lck(lt);
    Held lw = fused(kW, 1, tp_l, lt.coords().tp, 5, true), lb = fused(kB, 2, tp_l, lt.coords().tp, 0, true);
    for (bool zr : {true, false}) {
      LoadOptions o;
      o.zero_redundancy = zr;
      load_and_check(lck, {{"model/mlp.fc1.weight", &lw}, {"model/mlp.fc1.bias", &lb}}, root_ + "/fused", o,
                     "load at TP=" + std::to_string(tp_l) + (zr ? " zr" : ""));
    }
  }
}

// A checkpoint saved from ordinary single-box items equals one saved from multi-piece items, and
// each loads into the other's layout; the reader sees the plain global tensor.
TEST_F(MultiPiece, SameFormatAsOrdinaryShards) {
  const int n = world_size(), rank = world_rank();
  const int tp_s = n >= 2 ? 2 : 1;
  Topology rows_topo = make_topo(n);  // ordinary layout: rows split over all ranks
  Held p = plain_rows(kW, 4, n, rank);
  p.fill_for_save();
  {
    StateDict s;
    p.add_to(s, "model/fc1");
    Checkpointer ck(rows_topo);
    auto r = ck.save(s, root_ + "/plain");
    ASSERT_TRUE(r.ok()) << r.status().to_string();
  }
  Topology ftopo = make_topo(tp_s);
  Held f = fused(kW, 4, tp_s, ftopo.coords().tp, 2, rank % 2 == 1);
  f.fill_for_save();
  {
    StateDict s;
    f.add_to(s, "model/fc1");
    Checkpointer ck(ftopo);
    auto r = ck.save(s, root_ + "/pieces");
    ASSERT_TRUE(r.ok()) << r.status().to_string();
  }
  h5ckpt::testing::expect_same_datasets(root_ + "/plain", root_ + "/pieces");
  // The stored dataset is the plain global tensor.
  auto reader = CheckpointReader::open(root_ + "/pieces");
  ASSERT_TRUE(reader.ok()) << reader.status().to_string();
  std::vector<float> whole(2 * kF * kH, -1.0f);
  ASSERT_TRUE(reader->read("model/fc1", Box{{0, 0}, kW}, DType::kF32, whole.data()).ok());
  int64_t bad = 0;
  for (int64_t g = 0; g < 2 * kF * kH; ++g) bad += whole[g] != static_cast<float>(value(4, g));
  EXPECT_EQ(bad, 0);
  // Plain -> multi-piece at every TP, and multi-piece -> plain rows.
  for (int tp_l : tp_sizes(n)) {
    Topology lt = make_topo(tp_l);
    Checkpointer ck(lt);
    Held lf = fused(kW, 4, tp_l, lt.coords().tp, 4, false);
    load_and_check(ck, {{"model/fc1", &lf}}, root_ + "/plain", {}, "plain -> pieces TP=" + std::to_string(tp_l));
  }
  Checkpointer ck(rows_topo);
  Held lp = plain_rows(kW, 4, n, rank);
  load_and_check(ck, {{"model/fc1", &lp}}, root_ + "/pieces", {}, "pieces -> plain");
}

// ZeRO-style flat ranges mixed with boxes, saved asynchronously through a small staging pool in
// many small writes; loaded through two-phase reads, under a small memory budget, with dtype
// conversion, into DP replicas with zero-redundancy, and with the plan caches.
TEST_F(MultiPiece, FlatRangesAndBoxesThroughEveryLoadPath) {
  const int n = world_size(), rank = world_rank();
  Topology dp_topo = make_topo(1);  // pure DP: the flat ranges and boxes differ per rank
  Held m = mixed(kW, 5, n, rank, 3);
  m.fill_for_save();
  StateDict s;
  m.add_to(s, "optimizer/exp_avg/fc1");
  {
    CheckpointerOptions co;
    co.staging_bytes = 256;   // the snapshot cycles through a pool smaller than the state
    co.max_piece_bytes = 24;  // regions become several writes at offsets inside each piece
    Checkpointer ck(dp_topo, co);
    auto h = ck.save_async(s, root_ + "/mixed");
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    std::vector<char> saved = m.buf;
    std::fill(m.buf.begin(), m.buf.end(), 0);  // the caller may reuse its buffer once save_async returns
    auto r = h->wait();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(sum_all(r->bytes_written), tensor_bytes(kW));
    m.buf = saved;
    // Same structure: the cached plan is used, and the result is the same.
    auto again = ck.save(s, root_ + "/mixed2");
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    EXPECT_TRUE(again->plan_cached);
    h5ckpt::testing::expect_same_datasets(root_ + "/mixed", root_ + "/mixed2");
  }
  const std::string path = root_ + "/mixed";
  {  // two-phase reads into the mixed layout of another rank and into fused TP shards
    Checkpointer ck(dp_topo);
    LoadOptions o;
    o.aggregate_reads = true;
    o.read_window_bytes = 4096;
    Held other = mixed(kW, 5, n, n - 1 - rank, 2);
    load_and_check(ck, {{"optimizer/exp_avg/fc1", &other}}, path, o, "aggregated, mixed");
    const int tp = tp_sizes(n).back();
    Topology lt = make_topo(tp);
    Checkpointer lck(lt);
    Held f = fused(kW, 5, tp, lt.coords().tp, 1, true);
    load_and_check(lck, {{"optimizer/exp_avg/fc1", &f}}, path, o, "aggregated, fused");
  }
  {  // a small memory budget, also with conversion to f64
    CheckpointerOptions co;
    co.memory_bytes = 2048;
    Checkpointer ck(dp_topo, co);
    Held a = mixed(kW, 5, n, (rank + 1) % n, 4);
    load_and_check(ck, {{"optimizer/exp_avg/fc1", &a}}, path, {}, "budget");
    Held d = mixed(kW, 5, n, (rank + 1) % n, 4, DType::kF64);
    load_and_check(ck, {{"optimizer/exp_avg/fc1", &d}}, path, {}, "budget, f32 -> f64");
    EXPECT_LE(ck.memory_peak_bytes(), co.memory_bytes);
  }
  {  // every rank wants the whole tensor as [up; gate]: zero-redundancy reads each byte once;
     // the second load hits the load-plan cache
    Checkpointer ck(dp_topo);
    Held whole = fused(kW, 5, 1, 0, 7, true);
    LoadReport rep;
    load_and_check(ck, {{"optimizer/exp_avg/fc1", &whole}}, path, {}, "replicas", &rep);
    EXPECT_EQ(sum_all(rep.bytes_read), tensor_bytes(kW));
    load_and_check(ck, {{"optimizer/exp_avg/fc1", &whole}}, path, {}, "replicas, cached", &rep);
    EXPECT_TRUE(rep.plan_cached);
  }
}

// A change of pieces with the same keys and shapes must not reuse the cached save plan.
// Ordinary items listed after a multi-piece item: their writes must read their own buffers (the
// planner's descriptions are shifted by the extra pieces), in sync and async saves.
TEST_F(MultiPiece, OrdinaryItemsAfterPiecesWriteTheirOwnBuffers) {
  const int n = world_size(), r = world_rank();
  Topology topo = make_topo(1);
  for (bool async : {false, true}) {
    CheckpointerOptions o;
    o.metrics = false;
    o.async = async;
    Checkpointer ck(topo, o);
    Held a = fused(kW, 31, n, r, 2, false), b = plain_rows(kW, 32, n, r), c = plain_rows(kB, 33, n, r);
    for (Held* h : {&a, &b, &c}) h->fill_for_save();
    StateDict s;
    a.add_to(s, "model/a");
    b.add_to(s, "model/b");
    c.add_to(s, "model/c");
    const std::string path = root_ + (async ? "/async" : "/sync");
    auto h = ck.save_async(s, path);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    ASSERT_TRUE(h->wait().ok());
    load_and_check(ck, {{"model/a", &a}, {"model/b", &b}, {"model/c", &c}}, path, LoadOptions{},
                   async ? "async" : "sync");
  }
}

TEST_F(MultiPiece, ChangedPiecesReplan) {
  const int n = world_size(), rank = world_rank();
  Topology topo = make_topo(1);
  Checkpointer ck(topo);
  Held a = mixed(kW, 6, n, rank, 0);
  a.fill_for_save();
  StateDict s1;
  a.add_to(s1, "model/w");
  auto r1 = ck.save(s1, root_ + "/a");
  ASSERT_TRUE(r1.ok()) << r1.status().to_string();
  // Same keys, shapes and buffer size, other pieces: rank r now holds rank (r+1)'s part.
  Held b = mixed(kW, 6, n, (rank + 1) % n, 0);
  b.fill_for_save();
  StateDict s2;
  b.add_to(s2, "model/w");
  auto r2 = ck.save(s2, root_ + "/b");
  ASSERT_TRUE(r2.ok()) << r2.status().to_string();
  if (n > 1) EXPECT_FALSE(r2->plan_cached);
  Held c = plain_rows(kW, 6, n, rank);
  Topology rt = make_topo(n);
  Checkpointer rck(rt);
  load_and_check(rck, {{"model/w", &c}}, root_ + "/b", {}, "after re-plan");
}

// Errors: each names the key (and the piece), with the same code on every rank although only
// the last rank holds the bad item.
TEST_F(MultiPiece, ErrorsNameTheKeyAndPiece) {
  const int n = world_size(), rank = world_rank();
  Topology topo = make_topo(1);
  Held good = plain_rows(kW, 8, n, rank);
  good.fill_for_save();
  {
    StateDict s;
    good.add_to(s, "model/w");
    Checkpointer ck(topo);
    ASSERT_TRUE(ck.save(s, root_ + "/good").ok());
  }
  std::vector<float> buf(4 * kF * kH, 1.0f);
  const uint64_t row_bytes = kH * sizeof(float);
  struct Case {
    const char* name;
    std::vector<ShardPiece> pieces;
    const char* says;  // part of the message
  };
  const std::vector<Case> cases = {
      {"empty", {}, "empty list of pieces"},
      {"overlap_tensor",
       {ShardPiece{rows(kW, 0, 4), 0}, ShardPiece{rows(kW, 2, 4), 4 * row_bytes}},
       "piece 1 (offset [2,0] shape [4,5], buffer offset 80) overlaps piece 0"},
      {"overlap_flat",  // a flat range reaching into a box
       {ShardPiece{rows(kW, 0, 2), 0},
        ShardPiece{ShardSpec::flat_range(Box{{0, 0}, kW}, 2 * kH - 1, 3 * kH), 2 * row_bytes}},
       "in the global tensor"},
      {"overlap_buffer", {ShardPiece{rows(kW, 0, 4), 0}, ShardPiece{rows(kW, 10, 4), 3 * row_bytes}}, "in the buffer"},
      {"outside",
       {ShardPiece{rows(kW, 0, 4), 0}, ShardPiece{rows(kW, 2 * kF - 2, 4), 4 * row_bytes}},
       "piece 1 (offset [46,0] shape [4,5], buffer offset 80) is outside the global shape"},
  };
  for (const Case& c : cases) {
    const std::string key = std::string("model/bad_") + c.name;
    for (bool load : {false, true}) {
      StateDict s;
      good.add_to(s, "model/w");
      if (rank == n - 1) s.add_pieces(key, DType::kF32, kW, c.pieces, buf.data());
      Checkpointer ck(topo);
      Status st = load ? ck.load(s, root_ + "/good").status() : ck.save(s, root_ + "/bad").status();
      const std::string what = std::string(c.name) + (load ? " (load)" : " (save)");
      ASSERT_FALSE(st.ok()) << what;
      EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << what << ": " << st.to_string();
      EXPECT_NE(st.to_string().find("key '" + key + "'"), std::string::npos) << what << ": " << st.to_string();
      EXPECT_NE(st.to_string().find(c.says), std::string::npos) << what << ": " << st.to_string();
    }
  }
  {  // a multi-piece item and an ordinary item of the same key on one rank are still a duplicate
    StateDict s;
    good.add_to(s, "model/w");
    s.add_pieces("model/dup", DType::kF32, kW,
                 {ShardPiece{rows(kW, 0, 2), 0}, ShardPiece{rows(kW, 4, 2), 2 * row_bytes}}, buf.data());
    s.add("model/dup", DType::kF32, kW, rows(kW, 6, 2), buf.data());
    Checkpointer ck(topo);
    Status st = ck.save(s, root_ + "/dup").status();
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.to_string().find("'model/dup' added twice"), std::string::npos) << st.to_string();
  }
  {  // the same piece twice in one item is an overlap, not a replica
    StateDict s;
    good.add_to(s, "model/w");
    s.add_pieces("model/twice", DType::kF32, kW,
                 {ShardPiece{rows(kW, 0, 2), 0}, ShardPiece{rows(kW, 0, 2), 2 * row_bytes}}, buf.data());
    Checkpointer ck(topo);
    Status st = ck.save(s, root_ + "/twice").status();
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.to_string().find("key 'model/twice': piece 1"), std::string::npos) << st.to_string();
  }
}

// Multi-piece items in (simulated) device memory: saved synchronously and asynchronously equal
// the host save, and load back element-exact with the gap untouched.
class MultiPieceDevice : public MultiPiece {
 protected:
  static void SetUpTestSuite() { device::set_staging_for_testing(device::make_simulated_staging(0)); }
  static void TearDownTestSuite() { device::set_staging_for_testing(nullptr); }
};

TEST_F(MultiPieceDevice, SaveAndLoadDevicePieces) {
  const int n = world_size();
  const int tp = n >= 2 ? 2 : 1;
  Topology topo = make_topo(tp);
  device::Staging& dev = device::staging();
  Held h = fused(kW, 9, tp, topo.coords().tp, 3, true);
  h.fill_for_save();
  {
    StateDict s;
    h.add_to(s, "model/fc1");
    Checkpointer ck(topo);
    ASSERT_TRUE(ck.save(s, root_ + "/host").ok());
  }
  void* d = dev.alloc_device(h.buf.size());
  ASSERT_NE(d, nullptr);
  ASSERT_TRUE(dev.copy_to_device(d, h.buf.data(), h.buf.size()).ok());
  ASSERT_TRUE(dev.synchronize().ok());
  StateDict s;
  s.add_pieces("model/fc1", DType::kF32, kW, h.pieces, d, Device::kCuda);
  {
    CheckpointerOptions co;
    co.max_piece_bytes = 40;  // several device writes per piece through the two staging halves
    Checkpointer ck(topo, co);
    ASSERT_TRUE(ck.save(s, root_ + "/dev").ok());
    auto a = ck.save_async(s, root_ + "/dev_async");
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    ASSERT_TRUE(a->wait().ok());
  }
  h5ckpt::testing::expect_same_datasets(root_ + "/host", root_ + "/dev");
  h5ckpt::testing::expect_same_datasets(root_ + "/host", root_ + "/dev_async");
  // Load into device pieces under another layout (TP = world: replicas when tp < n elsewhere).
  for (int tp_l : tp_sizes(n)) {
    Topology lt = make_topo(tp_l);
    Held l = fused(kW, 9, tp_l, lt.coords().tp, 2, false);
    l.clear_for_load();
    void* ld = dev.alloc_device(l.buf.size());
    ASSERT_NE(ld, nullptr);
    ASSERT_TRUE(dev.copy_to_device(ld, l.buf.data(), l.buf.size()).ok());
    ASSERT_TRUE(dev.synchronize().ok());
    StateDict ls;
    ls.add_pieces("model/fc1", DType::kF32, kW, l.pieces, ld, Device::kCuda);
    Checkpointer ck(lt);
    auto r = ck.load(ls, root_ + "/dev");
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_TRUE(dev.copy_to_host(l.buf.data(), ld, l.buf.size()).ok());
    ASSERT_TRUE(dev.synchronize().ok());
    std::string first;
    EXPECT_EQ(l.mismatches(&first), 0) << "device load TP=" << tp_l << ": " << first;
    dev.free_device(ld);
  }
  dev.free_device(d);
}

}  // namespace
