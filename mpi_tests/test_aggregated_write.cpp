// Two-phase (aggregated) writes: every byte a rank hands over lands at its file offset whatever
// the window, domain and piece boundaries, and nothing else is touched; saves with aggregation on,
// off and auto make byte-identical files that load exactly into every layout and verify; the runs
// really merge (write calls counted); an injected write fault on an aggregator fails every rank
// with the same error and keeps the last good checkpoint.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>

#include "h5ckpt/checkpoint_info.h"

#include "engine/aggregated_write.h"
#include "storage/commit.h"
#include "storage/posix_io.h"
#include "support/test_model.h"

using h5ckpt::testing::max_all;
using h5ckpt::testing::sum_all;
using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;

using namespace h5ckpt;
using h5ckpt::testing::Layout;
using h5ckpt::testing::TestModel;
namespace fs = std::filesystem;
namespace io = h5ckpt::storage::io;

namespace {

unsigned char byte_at(uint64_t i) { return static_cast<unsigned char>((i * 2654435761u >> 13) ^ (i % 251)); }
constexpr unsigned char kUntouched = 0xEE;

std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Rank 0's verdict ("" = fine), given to every rank.
std::string on_rank0(const std::function<std::string()>& check) {
  MPI_Barrier(MPI_COMM_WORLD);
  std::string why = world_rank() == 0 ? check() : "";
  uint64_t n = why.size();
  MPI_Bcast(&n, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  why.resize(n);
  MPI_Bcast(why.data(), static_cast<int>(n), MPI_CHAR, 0, MPI_COMM_WORLD);
  return why;
}

// What differs between checkpoints `a` and `b` ("" = nothing) in what a save decides: every
// dataset's file offset and its bytes there (read raw, not through HDF5), every region with its
// writer and block checksums; and `h5ckpt verify`'s check of `b`. (The rest of data.h5 holds
// HDF5's object modification times, which differ between any two saves.)
std::string tensor_bytes_differ(const std::string& a, const std::string& b) {
  auto ia = read_checkpoint_info(a), ib = read_checkpoint_info(b);
  if (!ia.ok() || !ib.ok()) return "unreadable: " + (ia.ok() ? ib : ia).status().to_string();
  if (Status v = verify_checkpoint(*ib); !v.ok()) return "verify: " + v.to_string();
  if (ia->tensors.size() != ib->tensors.size()) return "tensor counts differ";
  const std::vector<char> fa = file_bytes(ia->data_file), fb = file_bytes(ib->data_file);
  for (size_t t = 0; t < ia->tensors.size(); ++t) {
    const TensorInfo &x = ia->tensors[t], &y = ib->tensors[t];
    if (x.key != y.key || x.file_offset != y.file_offset || x.nbytes != y.nbytes)
      return "'" + x.key + "' placed differently";
    const auto at = static_cast<size_t>(x.file_offset);
    if (at + x.nbytes > fa.size() || at + x.nbytes > fb.size()) return "'" + x.key + "' past the end of the file";
    if (!std::equal(fa.begin() + at, fa.begin() + at + x.nbytes, fb.begin() + at))
      return "'" + x.key + "' bytes differ";
    if (x.regions.size() != y.regions.size()) return "'" + x.key + "' region counts differ";
    for (size_t r = 0; r < x.regions.size(); ++r)
      if (region_to_string(x.regions[r].shard) != region_to_string(y.regions[r].shard) ||
          x.regions[r].writer_rank != y.regions[r].writer_rank ||
          x.regions[r].block_bytes != y.regions[r].block_bytes ||
          x.regions[r].block_checksums != y.regions[r].block_checksums)
        return "'" + x.key + "' region " + std::to_string(r) + " recorded differently";
  }
  return "";
}

class AggregatedWrite : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "aggwrite");
    ASSERT_FALSE(root_.empty());
  }
  void TearDown() override {
    unsetenv("H5CKPT_FAULT");
    (void)io::reload_faults_for_testing();
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) fs::remove_all(root_);
  }
  std::string root_;
};

// The file is cut into random chunks, each given to a random rank or left out (a hole that must
// keep its old bytes); each rank hands its chunks over in random order from a shuffled buffer, or
// in file order from one buffer where they lie back to back (as a shard's rows do: they travel as
// one message per window and aggregator, through the landing buffer).
TEST_F(AggregatedWrite, EveryByteLandsAndHolesStayForAnyWindow) {
  const uint64_t size = (3u << 20) + 12345;
  const int n = world_size(), me = world_rank();
  for (bool shuffled : {true, false})
    for (uint64_t window : {uint64_t{64}, uint64_t{10007}, uint64_t{1} << 20, uint64_t{64} << 20}) {
      if (!shuffled && window == 64) continue;  // tens of thousands of windows: the shuffled case has them
      SCOPED_TRACE(shuffled ? "shuffled buffer" : "back to back in file order");
      const std::string path = root_ + "/f" + std::to_string(window) + (shuffled ? "s" : "");
      if (me == 0) std::ofstream(path, std::ios::binary) << std::string(size, static_cast<char>(kUntouched));
      MPI_Barrier(MPI_COMM_WORLD);
      std::mt19937_64 rng(window);  // the same cut on every rank
      std::vector<std::pair<uint64_t, uint64_t>> mine;
      std::vector<int> owner_of;  // per chunk: rank, or -1 for a hole
      std::vector<std::pair<uint64_t, uint64_t>> chunks;
      for (uint64_t off = 0; off < size;) {
        const uint64_t len = std::min<uint64_t>(size - off, 1 + rng() % (rng() % 8 == 0 ? 200000 : 3000));
        const int owner = static_cast<int>(rng() % (n + 1)) - 1;
        chunks.push_back({off, len});
        owner_of.push_back(owner);
        if (owner == me) mine.push_back({off, len});
        off += len;
      }
      if (shuffled) std::shuffle(mine.begin(), mine.end(), std::mt19937_64(window + me));
      uint64_t total = 0;
      for (const auto& c : mine) total += c.second;
      std::vector<char> buf(total);
      std::vector<engine::WritePiece> pieces;
      uint64_t at = 0;
      for (const auto& [off, len] : mine) {
        for (uint64_t k = 0; k < len; ++k) buf[at + k] = static_cast<char>(byte_at(off + k));
        pieces.push_back({off, len, buf.data() + at});
        at += len;
      }
      const int fd = ::open(path.c_str(), O_WRONLY);
      ASSERT_GE(fd, 0);
      uint64_t calls = 0;
      std::vector<char> slots(engine::kWriteWindowBuffers * window);
      auto r = engine::aggregated_write(
          MPI_COMM_WORLD, pieces, window, slots.data(), [&](const char* p, uint64_t len, uint64_t off) {
            ++calls;
            return ::pwrite(fd, p, len, static_cast<off_t>(off)) == static_cast<ssize_t>(len)
                       ? Status::Ok()
                       : Status(ErrorCode::kIo, "pwrite");
          });
      ::fsync(fd);
      ::close(fd);
      ASSERT_TRUE(r.ok()) << "window " << window << ": " << r.status().to_string();
      EXPECT_EQ(r->spans, calls);
      EXPECT_EQ(sum_all(r->bytes_sent), sum_all(r->bytes_received)) << "window " << window;
      EXPECT_EQ(sum_all(r->bytes_written), sum_all(total)) << "every byte written once";
      // Written ranges are merged: never more write calls than chunks handed over, plus the cuts
      // at window and domain edges.
      EXPECT_LE(sum_all(calls), sum_all(mine.size()) + sum_all(r->windows) + n) << "window " << window;
      // Back to back in memory, a rank's pieces for one aggregator's window go as one message: with
      // one window per domain, at most one message to each other rank.
      if (!shuffled && window == (uint64_t{64} << 20)) EXPECT_LE(max_all(r->messages), uint64_t(n - 1));
      const std::string why = on_rank0([&]() -> std::string {
        const std::vector<char> got = file_bytes(path);
        if (got.size() != size) return "file size " + std::to_string(got.size());
        for (size_t c = 0; c < chunks.size(); ++c)
          for (uint64_t k = 0; k < chunks[c].second; ++k) {
            const uint64_t i = chunks[c].first + k;
            const unsigned char want = owner_of[c] < 0 ? kUntouched : byte_at(i);
            if (static_cast<unsigned char>(got[i]) != want)
              return "byte " + std::to_string(i) +
                     (owner_of[c] < 0 ? " of a hole" : " of rank " + std::to_string(owner_of[c])) + " is wrong";
          }
        return "";
      });
      EXPECT_EQ(why, "") << "window " << window;
    }
}

SaveOptions with_mode(AggregateWrites mode, uint64_t window = 32ull << 20) {
  SaveOptions o;
  o.aggregate_writes = mode;
  o.write_window_bytes = window;
  return o;
}

// A tensor split along its columns (one short run per row on every rank) and one split along its
// rows (one long run per rank): only the first is aggregated under kAuto.
struct TwoTensors {
  static constexpr int64_t kRows = 256, kCols = 2048, kLongRows = 512;
  std::vector<float> cols, rows;
  StateDict sd;
  static float value(int t, int64_t flat) { return static_cast<float>(t * 7919 + flat) * 0.25f; }
  TwoTensors() {
    const int n = world_size(), r = world_rank();
    const Shape cs{kRows, kCols}, rs{kLongRows, kCols};
    const ShardSpec c = ShardSpec::split(cs, 1, n, r), w = ShardSpec::split(rs, 0, n, r);
    cols.resize(c.numel());
    rows.resize(w.numel());
    for (int64_t j = 0; j < c.numel(); ++j) cols[j] = value(0, h5ckpt::testing::global_flat_index(c, cs, j));
    for (int64_t j = 0; j < w.numel(); ++j) rows[j] = value(1, h5ckpt::testing::global_flat_index(w, rs, j));
    sd.add("model/cols", DType::kF32, cs, c, cols.data());
    sd.add("model/rows", DType::kF32, rs, w, rows.data());
  }
};

// Write calls counted by the direct writer: without aggregation every rank makes one call per
// row of the column split; with it, a handful. kAuto aggregates exactly the column split's bytes.
TEST_F(AggregatedWrite, RunsMergeIntoFewWriteCalls) {
  const int n = world_size();
  auto topo = Topology::create(MPI_COMM_WORLD, {n, 1, 1});
  ASSERT_TRUE(topo.ok());
  TwoTensors s;
  Checkpointer ck(*topo);
  const uint64_t col_bytes = TwoTensors::kRows * TwoTensors::kCols * 4;
  const uint64_t all_bytes = col_bytes + TwoTensors::kLongRows * TwoTensors::kCols * 4;
  std::map<AggregateWrites, uint64_t> max_calls;
  for (AggregateWrites mode : {AggregateWrites::kOff, AggregateWrites::kOn, AggregateWrites::kAuto}) {
    const std::string path = root_ + "/m" + std::to_string(static_cast<int>(mode));
    auto r = ck.save(s.sd, path, with_mode(mode));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    max_calls[mode] = max_all(r->write_calls);
    const uint64_t aggregated = sum_all(r->bytes_aggregated);
    if (mode == AggregateWrites::kOff) {
      EXPECT_EQ(aggregated, 0u);
      if (n > 1) EXPECT_GE(r->write_calls, static_cast<uint64_t>(TwoTensors::kRows)) << "one call per row";
    } else if (mode == AggregateWrites::kOn) {
      EXPECT_EQ(aggregated, all_bytes);
    } else {
      EXPECT_EQ(aggregated, n > 1 ? col_bytes : 0u) << "auto: only the short runs";
    }
    if (mode != AggregateWrites::kOff) EXPECT_LE(max_calls[mode], 12u) << "runs were not merged";
    h5ckpt::testing::expect_same_datasets(root_ + "/m2", path);  // m2: kOff, saved first
    const std::string why = on_rank0([&] { return tensor_bytes_differ(root_ + "/m2", path); });
    EXPECT_EQ(why, "");
  }
  // Loads exactly, every block checksum verified (the holders checksummed what others wrote).
  for (const char* which : {"/m1", "/m0"}) {
    TwoTensors back;
    std::fill(back.cols.begin(), back.cols.end(), -1.f);
    std::fill(back.rows.begin(), back.rows.end(), -1.f);
    LoadOptions lo;
    lo.verify_checksums = true;
    auto l = ck.load(back.sd, root_ + which, lo);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    EXPECT_EQ(back.cols, s.cols) << which;
    EXPECT_EQ(back.rows, s.rows) << which;
  }
}

// Small tensors (norm weights, biases) lie back to back in the file, not between HDF5's object
// headers: the aggregator writes them as one stretch, in a few calls rather than one call each
// (on a network file system each call is a round trip).
TEST_F(AggregatedWrite, SmallTensorsLieBackToBackAndMergeIntoFewWriteCalls) {
  const int n = world_size(), r = world_rank();
  constexpr int kTensors = 24;
  constexpr int64_t kLen = 1000;  // 4000 bytes: neither a block nor a page
  auto topo = Topology::create(MPI_COMM_WORLD, {n, 1, 1});
  ASSERT_TRUE(topo.ok());
  const ShardSpec part = ShardSpec::split(Shape{kLen}, 0, n, r);
  auto value = [](int t, int64_t i) { return static_cast<float>(t * 100003 + i) * 0.5f; };
  std::vector<std::vector<float>> data(kTensors), back(kTensors);
  StateDict sd, into;
  for (int t = 0; t < kTensors; ++t) {
    data[t].resize(part.numel());
    for (int64_t j = 0; j < part.numel(); ++j) data[t][j] = value(t, part.box.offset[0] + j);
    back[t].assign(part.numel(), -1.f);
    const std::string key = "model/norm" + std::to_string(100 + t);
    sd.add(key, DType::kF32, Shape{kLen}, part, data[t].data());
    into.add(key, DType::kF32, Shape{kLen}, part, back[t].data());
  }
  Checkpointer ck(*topo);
  const std::string path = root_ + "/small";
  auto saved = ck.save(sd, path);
  ASSERT_TRUE(saved.ok()) << saved.status().to_string();
  if (n > 1) {
    EXPECT_EQ(sum_all(saved->bytes_aggregated), static_cast<uint64_t>(kTensors * kLen * 4));
    EXPECT_LE(max_all(saved->write_calls), 4u) << "the small tensors were written one call each";
  }
  const std::string why = on_rank0([&]() -> std::string {
    auto info = read_checkpoint_info(path);
    if (!info.ok()) return info.status().to_string();
    std::vector<std::pair<int64_t, uint64_t>> placed;  // {file offset, bytes}
    for (const TensorInfo& t : info->tensors)
      if (t.key.rfind("model/norm", 0) == 0) placed.emplace_back(t.file_offset, t.nbytes);
    if (placed.size() != kTensors) return "found " + std::to_string(placed.size()) + " small tensors";
    std::sort(placed.begin(), placed.end());
    for (size_t i = 1; i < placed.size(); ++i)
      if (placed[i].first != placed[i - 1].first + static_cast<int64_t>(placed[i - 1].second))
        return "a gap of " + std::to_string(placed[i].first - placed[i - 1].first - placed[i - 1].second) +
               " bytes between two small tensors at " + std::to_string(placed[i - 1].first);
    return "";
  });
  EXPECT_EQ(why, "");
  auto loaded = ck.load(into, path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  for (int t = 0; t < kTensors; ++t)
    for (int64_t j = 0; j < part.numel(); ++j)
      ASSERT_EQ(back[t][j], value(t, part.box.offset[0] + j)) << "tensor " << t << " element " << j;
}

// Every TP/PP/ZeRO layout saved with aggregation on, off and auto: the same data file byte for
// byte, and each checkpoint loads exactly into another layout with every checksum verified.
TEST_F(AggregatedWrite, EveryLayoutSameFileAndExactReload) {
  const int n = world_size();
  auto layouts = h5ckpt::testing::layouts_for(n);
  if (n > 4) {  // 14 layouts at 8 ranks: one of each (tp, pp) pair, ZeRO off and on in turn (under a minute)
    std::vector<Layout> some;
    for (size_t i = 0; i < layouts.size(); ++i)
      if (i % 2 == (i / 2) % 2) some.push_back(layouts[i]);
    layouts = some;
  }
  for (size_t i = 0; i < layouts.size(); ++i) {
    const Layout& L = layouts[i];
    const Layout& other = layouts[(i + 1) % layouts.size()];
    auto t = Topology::create(MPI_COMM_WORLD, {L.tp, L.dp, L.pp});
    ASSERT_TRUE(t.ok());
    TestModel m(L, t->coords(), true);
    Checkpointer ck(*t);
    const std::string base = root_ + "/" + L.name();
    for (AggregateWrites mode : {AggregateWrites::kOff, AggregateWrites::kOn, AggregateWrites::kAuto}) {
      // A window far below the state: many windows, pieces cut at window and domain edges.
      auto r = ck.save(m.state(), base + std::to_string(static_cast<int>(mode)), with_mode(mode, 4096));
      ASSERT_TRUE(r.ok()) << L.name() << ": " << r.status().to_string();
      const uint64_t aggregated = sum_all(r->bytes_aggregated);
      if (mode == AggregateWrites::kOn) EXPECT_EQ(aggregated, r->bytes_total) << L.name() << ": every byte";
      if (mode == AggregateWrites::kOff) EXPECT_EQ(aggregated, 0u) << L.name();
    }
    const std::string why = on_rank0([&] {
      for (const char* s : {"1", "0"})
        if (std::string d = tensor_bytes_differ(base + "2", base + s); !d.empty())
          return L.name() + ", mode " + s + " against kOff: " + d;
      return std::string();
    });
    EXPECT_EQ(why, "");
    auto t2 = Topology::create(MPI_COMM_WORLD, {other.tp, other.dp, other.pp});
    ASSERT_TRUE(t2.ok());
    Checkpointer ck2(*t2);
    for (const char* s : {"1", "0"}) {
      TestModel fresh(other, t2->coords(), false);
      LoadOptions lo;
      lo.verify_checksums = true;
      auto l = ck2.load(fresh.state(), base + s, lo);
      ASSERT_TRUE(l.ok()) << L.name() << " -> " << other.name() << ": " << l.status().to_string();
      std::string first;
      EXPECT_EQ(fresh.count_mismatches(&first), 0) << L.name() << " -> " << other.name() << ": " << first;
    }
  }
}

// Saves through the async writer: aggregated when the snapshot fits the pool (its pieces stay
// put), per run when the pool streams (a rank's pieces are gone once written); exact either way.
TEST_F(AggregatedWrite, AsyncAggregatesOnlyWhenTheSnapshotStaysPut) {
  const int n = world_size();
  auto topo = Topology::create(MPI_COMM_WORLD, {n, 1, 1});
  ASSERT_TRUE(topo.ok());
  for (uint64_t staging : {uint64_t{0}, uint64_t{64} << 10}) {
    CheckpointerOptions co;
    co.staging_bytes = staging;  // 0: the whole snapshot; 64 KiB: it streams
    co.max_piece_bytes = 32 << 10;
    Checkpointer ck(*topo, co);
    TwoTensors s;
    const std::string path = root_ + "/async" + std::to_string(staging);
    auto h = ck.save_async(s.sd, path, with_mode(AggregateWrites::kOn));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    std::fill(s.cols.begin(), s.cols.end(), 7.f);  // the trainer moves on: the snapshot must hold
    std::fill(s.rows.begin(), s.rows.end(), 7.f);
    auto r = h->wait();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const uint64_t aggregated = sum_all(r->bytes_aggregated);
    if (staging == 0) EXPECT_EQ(aggregated, r->bytes_total);
    else EXPECT_EQ(aggregated, 0u) << "a streaming snapshot cannot aggregate";
    TwoTensors want, back;
    std::fill(back.cols.begin(), back.cols.end(), -1.f);
    auto l = ck.load(back.sd, path);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    EXPECT_EQ(back.cols, want.cols) << "staging " << staging;
    EXPECT_EQ(back.rows, want.rows) << "staging " << staging;
  }
}

// A write that fails on an aggregator (rank 0 always owns the first domain) fails the save on every
// rank with the same message naming the call and the rank; nothing is committed, `latest` still
// names the previous checkpoint, which loads exactly.
TEST_F(AggregatedWrite, InjectedFaultOnAnAggregatorFailsEveryRankAndKeepsTheLastCheckpoint) {
  const int n = world_size();
  auto topo = Topology::create(MPI_COMM_WORLD, {n, 1, 1});
  ASSERT_TRUE(topo.ok());
  TwoTensors s;
  Checkpointer ck(*topo);
  auto good = ck.save(s.sd, root_ + "/step1", with_mode(AggregateWrites::kOn));
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  for (int nth : {1, 2}) {  // the first window write, and one after it
    setenv("H5CKPT_FAULT", ("op=pwrite,phase=write,rank=0,errno=EIO,nth=" + std::to_string(nth)).c_str(), 1);
    ASSERT_TRUE(io::reload_faults_for_testing().ok());
    auto bad = ck.save(s.sd, root_ + "/step2", with_mode(AggregateWrites::kOn, 256 << 10));
    unsetenv("H5CKPT_FAULT");
    ASSERT_TRUE(io::reload_faults_for_testing().ok());
    ASSERT_FALSE(bad.ok()) << "nth " << nth << ": the injected fault was not reported";
    const std::string text = bad.status().to_string();
    EXPECT_NE(text.find("pwrite"), std::string::npos) << text;
    EXPECT_NE(text.find("injected fault on rank 0"), std::string::npos) << text;
    uint64_t h = std::hash<std::string>{}(text), lo = 0, hi = 0;
    MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(lo, hi) << "ranks disagree; this rank has: " << text;
    const std::string why = on_rank0([&]() -> std::string {
      if (fs::exists(root_ + "/step2")) return "step2 was committed";
      std::ifstream in(root_ + "/latest");
      std::string latest;
      std::getline(in, latest);
      if (latest.find("step1") == std::string::npos) return "latest is '" + latest + "'";
      for (const auto& e : fs::directory_iterator(root_))
        if (storage::is_temp_name(e.path().string())) return "left " + e.path().string();
      return "";
    });
    EXPECT_EQ(why, "") << "nth " << nth;
  }
  TwoTensors back;
  std::fill(back.cols.begin(), back.cols.end(), -1.f);
  auto l = ck.load(back.sd, root_);  // the directory: follows `latest`
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  EXPECT_EQ(back.cols, s.cols);
  EXPECT_EQ(back.rows, s.rows);
}

}  // namespace
