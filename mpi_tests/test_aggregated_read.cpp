// Two-phase (aggregated) reads: every byte a rank asks for arrives exactly, whatever the window,
// domain and piece boundaries; loads through it are exact under every layout and read each
// checkpoint byte once; a truncated file fails (on every rank, through the load's agreement)
// instead of hanging.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "engine/aggregated_read.h"
#include "engine/staging_pool.h"
#include "support/test_model.h"

using h5ckpt::testing::max_all;
using h5ckpt::testing::sum_all;
using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;

using namespace h5ckpt;
using h5ckpt::testing::Layout;
namespace fs = std::filesystem;

namespace {

// The byte at file offset i: not periodic at any power of two, so a piece from the wrong place
// cannot match by accident.
unsigned char byte_at(uint64_t i) { return static_cast<unsigned char>((i * 2654435761u >> 13) ^ (i % 251)); }

class AggregatedRead : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "aggregated");
    ASSERT_FALSE(root_.empty());
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) fs::remove_all(root_);
  }
  // Rank 0 writes a file of `size` pattern bytes.
  std::string make_file(uint64_t size) {
    const std::string path = root_ + "/pattern.bin";
    if (world_rank() == 0) {
      std::vector<char> bytes(size);
      for (uint64_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(byte_at(i));
      std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(size));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return path;
  }
  std::string root_;
};

// Random pieces per rank (disjoint in memory, overlapping other ranks' in the file, some ranks
// asking nothing), for windows from the minimum to larger than the file.
TEST_F(AggregatedRead, EveryByteArrivesForAnyWindow) {
  const uint64_t size = 3u << 20;
  const std::string file = make_file(size);
  for (uint64_t window : {uint64_t{4096}, uint64_t{10007}, uint64_t{1} << 20, uint64_t{64} << 20}) {
    std::mt19937_64 rng(window * 31 + world_rank());
    const bool idle = world_size() > 2 && world_rank() == 1;  // one rank asks for nothing
    std::vector<engine::ReadPiece> pieces;
    std::vector<std::pair<uint64_t, uint64_t>> asked;  // offset, length
    uint64_t total = 0;
    for (int i = 0; i < 200 && !idle; ++i) {
      const uint64_t len = 1 + rng() % (i % 10 == 0 ? 300000 : 5000);
      const uint64_t off = rng() % (size - len);
      asked.push_back({off, len});
      total += len;
    }
    std::vector<char> buf(total + 1, 0);
    const char guard = '\x5a';
    buf[total] = guard;
    uint64_t at = 0;
    for (const auto& [off, len] : asked) {
      pieces.push_back({off, len, buf.data() + at});
      at += len;
    }
    engine::StagingPool pool;
    auto r = engine::aggregated_read(MPI_COMM_WORLD, file, pieces, window, pool);
    ASSERT_TRUE(r.ok()) << "window " << window << ": " << r.status().to_string();
    at = 0;
    int64_t bad = 0;
    for (const auto& [off, len] : asked) {
      for (uint64_t k = 0; k < len; ++k)
        if (static_cast<unsigned char>(buf[at + k]) != byte_at(off + k) && bad++ == 0)
          ADD_FAILURE() << "window " << window << ": byte " << k << " of piece at " << off << " (length " << len << ")";
      at += len;
    }
    EXPECT_EQ(bad, 0) << "window " << window;
    EXPECT_EQ(buf[total], guard) << "wrote past the last piece";
    // Bytes move once: what was sent was received; storage bytes at most the file once.
    EXPECT_EQ(sum_all(r->bytes_sent), sum_all(r->bytes_received)) << "window " << window;
    EXPECT_LE(sum_all(r->bytes_read), size) << "window " << window;
    if (world_size() > 1 && window < size / 8) EXPECT_GT(max_all(r->windows), 1u);
  }
}

// Each rank asks for its share of every row of a row-major matrix into one buffer, as a
// column-split shard is laid out: the file interleaves the ranks' rows, memory has them back to
// back, so each aggregator's window reaches a rank as one packed message. With every rank asking
// for the same half of each row (replicas without zero-redundancy), the packs of one window
// exceed the packing area and the rest go as types of many blocks.
TEST_F(AggregatedRead, RowsBackToBackArriveAsOneMessagePerWindow) {
  constexpr uint64_t kRowBytes = 8192, kRows = 512, size = kRowBytes * kRows;
  const std::string file = make_file(size);
  const int n = world_size(), me = world_rank();
  for (bool replicas : {false, true})
    for (uint64_t window : {uint64_t{4096}, uint64_t{1} << 20, uint64_t{64} << 20}) {
      SCOPED_TRACE(std::string(replicas ? "replicas" : "column split") + ", window " + std::to_string(window));
      const uint64_t share = replicas ? kRowBytes / 2 : kRowBytes / static_cast<uint64_t>(n);
      const uint64_t first = replicas ? 0 : share * static_cast<uint64_t>(me);
      std::vector<char> buf(share * kRows + 1, 0);
      const char guard = '\x5a';
      buf.back() = guard;
      std::vector<engine::ReadPiece> pieces;
      for (uint64_t row = 0; row < kRows; ++row) pieces.push_back({row * kRowBytes + first, share, &buf[row * share]});
      engine::StagingPool pool;
      auto r = engine::aggregated_read(MPI_COMM_WORLD, file, pieces, window, pool);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      int64_t bad = 0;
      for (uint64_t row = 0; row < kRows; ++row)
        for (uint64_t k = 0; k < share; ++k)
          if (static_cast<unsigned char>(buf[row * share + k]) != byte_at(row * kRowBytes + first + k) && bad++ == 0)
            ADD_FAILURE() << "row " << row << ", byte " << k;
      EXPECT_EQ(bad, 0);
      EXPECT_EQ(buf.back(), guard) << "wrote past the last row";
      EXPECT_EQ(sum_all(r->bytes_sent), sum_all(r->bytes_received));
      // One window per domain: at most one message from each other rank.
      if (window == (uint64_t{64} << 20)) EXPECT_LE(max_all(r->messages), uint64_t(n - 1));
    }
}

// A piece past the end of the file (a truncated checkpoint) fails its aggregator and nobody
// hangs: the aggregator still sends, so every rank returns.
TEST_F(AggregatedRead, TruncatedFileFailsWithoutHanging) {
  const uint64_t size = 1u << 20;
  const std::string file = make_file(size);
  std::vector<char> buf(4096);
  std::vector<engine::ReadPiece> pieces{{static_cast<uint64_t>(world_rank()) * 4096, 2048, buf.data()}};
  if (world_rank() == world_size() - 1) pieces.push_back({size + 100, 1024, buf.data() + 2048});
  engine::StagingPool pool;
  auto r = engine::aggregated_read(MPI_COMM_WORLD, file, pieces, 65536, pool);
  int failed = r.ok() ? 0 : 1, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(any, 1) << "a read past the end must fail somewhere";
  if (!r.ok()) EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status().to_string();
}

// Loads through the aggregation under every layout: exact values, each byte read once.
TEST_F(AggregatedRead, LoadsEveryLayoutExactly) {
  const int n = world_size();
  auto layouts = h5ckpt::testing::layouts_for(n);
  const Layout saved = layouts.back();
  uint64_t total = 0, file_size = 0;
  {
    auto t = Topology::create(MPI_COMM_WORLD, {saved.tp, saved.dp, saved.pp});
    ASSERT_TRUE(t.ok());
    h5ckpt::testing::TestModel m(saved, t->coords(), true);
    Checkpointer ck(*t);
    auto r = ck.save(m.state(), root_ + "/ckpt");
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    total = r->bytes_total;
    file_size = fs::file_size(root_ + "/ckpt/data.h5");
  }
  LoadOptions o;
  o.aggregate_reads = true;
  o.read_window_bytes = 8192;  // many windows and cut pieces even for the small test model
  for (const Layout& L : layouts) {
    auto t = Topology::create(MPI_COMM_WORLD, {L.tp, L.dp, L.pp});
    ASSERT_TRUE(t.ok());
    Checkpointer ck(*t);
    for (int round = 0; round < 2; ++round) {  // the second load reuses the cached plan
      h5ckpt::testing::TestModel m(L, t->coords(), false);
      auto r = ck.load(m.state(), root_ + "/ckpt", o);
      ASSERT_TRUE(r.ok()) << L.name() << ": " << r.status().to_string();
      std::string first;
      EXPECT_EQ(m.count_mismatches(&first), 0) << "saved " << saved.name() << ", loaded " << L.name() << ": " << first;
      EXPECT_EQ(r->plan_cached, round == 1) << L.name();
      if (n > 1) {
        EXPECT_EQ(r->transport, "mpi-aggregated");
        // Every tensor byte once; holes between datasets (alignment) may be read through.
        EXPECT_GE(sum_all(r->bytes_read), total) << L.name();
        EXPECT_LE(sum_all(r->bytes_read), file_size) << L.name();
        EXPECT_EQ(sum_all(r->bytes_sent), sum_all(r->bytes_received)) << L.name();
      }
    }
  }
}

}  // namespace
