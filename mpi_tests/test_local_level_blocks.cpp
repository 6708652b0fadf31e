// Node-local files checked block by block (storage/local_files.h): a save records each rank
// file's block sums in the manifest; a load checks every block the first time its server reads
// it, moves a file that fails aside and serves it from another copy (or another level). Older
// manifests (a whole-file xxh3 per file) still load, checked whole at resolve. Simulated nodes as
// in test_local_level.cpp (H5CKPT_RANKS_PER_NODE, "{node}" in local_dir).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "h5ckpt/checkpoint_info.h"
#include "h5ckpt/checkpointer.h"
#include "storage/commit.h"
#include "storage/local_files.h"
#include "storage/local_store.h"
#include "support/test_model.h"

using namespace h5ckpt;
using namespace h5ckpt::testing;
namespace fs = std::filesystem;

namespace {

int ranks_per_node() {
  const char* e = std::getenv("H5CKPT_RANKS_PER_NODE");
  return e && std::atoi(e) > 0 ? std::atoi(e) : 1 << 20;
}
int node_count() { return (world_size() + ranks_per_node() - 1) / ranks_per_node(); }
int my_node() { return world_rank() / ranks_per_node(); }
bool node_leader() { return world_rank() % ranks_per_node() == 0; }

// Each rank's shard of a u8 tensor of 2.5 blocks per rank (so every file has three blocks, the
// tensor's part of it first) and a replicated step; values are a function of the global index.
constexpr int64_t kPerRank = 5 * (1 << 20) / 2;
uint8_t value(int64_t i, int64_t step) { return static_cast<uint8_t>(i * 131 + i / 977 + step * 7); }

struct State {
  explicit State(int64_t s) : step(s), data(kPerRank) {
    const int w = world_size();
    for (int64_t i = 0; i < kPerRank; ++i) data[static_cast<size_t>(i)] = value(world_rank() * kPerRank + i, s);
    state.add("big", DType::kU8, {w * kPerRank}, ShardSpec::split({w * kPerRank}, 0, w, world_rank()), data.data());
    state.add_replicated("step", DType::kI64, {1}, &step);
  }
  // Mismatching elements after a load of step `s`.
  int64_t mismatches(int64_t s) const {
    int64_t bad = step == s ? 0 : 1;
    for (int64_t i = 0; i < kPerRank; ++i) bad += data[static_cast<size_t>(i)] != value(world_rank() * kPerRank + i, s);
    return bad;
  }
  void clear() {
    std::fill(data.begin(), data.end(), 0);
    step = -1;
  }
  int64_t step;
  std::vector<uint8_t> data;
  StateDict state;
};

void flip_byte(const std::string& f, uint64_t at) {
  std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(io.good()) << f;
  io.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  io.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  io.seekp(static_cast<std::streamoff>(at));
  io.write(&c, 1);
}

class LocalBlocks : public ::testing::Test {
 protected:
  void SetUp() override {
    root = shared_temp_dir(MPI_COMM_WORLD, "local_blocks");
    shared = root + "/shared";
    if (world_rank() == 0) fs::create_directories(shared);
    MPI_Barrier(MPI_COMM_WORLD);
    opts.local_dir = root + "/node{node}";
    opts.metrics = false;
    opts.async = false;
  }
  Topology topology() {
    auto t = Topology::create(MPI_COMM_WORLD, {1, world_size(), 1});
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return std::move(t).value();
  }
  std::string node_dir(int n) const { return root + "/node" + std::to_string(n); }
  std::string step_path(int64_t s) const { return shared + "/step-" + std::to_string(s); }
  std::string local_file(int node, int64_t s, int rank) const {
    return node_dir(node) + "/step-" + std::to_string(s) + "/" + storage::local_rank_file(rank);
  }
  Status save(Checkpointer& ck, int64_t s, bool persist = false) {
    State st(s);
    SaveOptions so;
    so.step = s;
    so.persist = persist;
    return ck.save(st.state, step_path(s), so).status();
  }
  std::string root, shared;
  CheckpointerOptions opts;
};

}  // namespace

// The reader alone: a flip in block 1 of a three-block file is caught when block 1 is read, with
// the block cache holding whole blocks and with a cache smaller than a block (streamed check);
// blocks 0 and 2 still read back exactly. Mutation caught: skipping the comparison in
// LocalFileReader::check_block (the flipped byte is then returned as data).
TEST(LocalFileReader, CatchesAFlipInTheBlockItReads) {
  const std::string dir = shared_temp_dir(MPI_COMM_WORLD, "local_reader") + "/r" + std::to_string(world_rank());
  fs::create_directories(dir);
  const uint64_t block = storage::local_block_bytes(), n = 2 * block + block / 2;
  std::vector<char> bytes(n);
  for (uint64_t i = 0; i < n; ++i) bytes[i] = static_cast<char>(i * 7 + i / 4096);
  storage::LocalManifest m;
  m.name = "step-1";
  storage::LocalFileHasher h(m.name, 0, n);
  h.update(bytes.data(), n);
  m.files.push_back(h.finish());
  ASSERT_EQ(m.files[0].blocks.size(), 3u);
  const std::string f = dir + "/" + storage::local_rank_file(0);
  ASSERT_TRUE(storage::write_file_atomic(f, std::string(bytes.data(), n)).ok());
  flip_byte(f, block + 12345);
  for (uint64_t cache_bytes : {block, uint64_t{4096}}) {
    std::vector<char> cache(cache_bytes), out(n);
    storage::LocalFileReader reader(dir, m, cache.data(), cache_bytes);
    ASSERT_TRUE(reader.read(0, out.data(), 1000, 10).ok());
    EXPECT_EQ(std::memcmp(out.data(), bytes.data() + 10, 1000), 0);
    ASSERT_TRUE(reader.read(0, out.data(), block / 2, 2 * block).ok());  // block 2, intact
    EXPECT_EQ(std::memcmp(out.data(), bytes.data() + 2 * block, block / 2), 0);
    Status bad = reader.read(0, out.data(), 100, block - 50);  // ends in block 1
    ASSERT_FALSE(bad.ok()) << "cache " << cache_bytes;
    EXPECT_EQ(bad.code(), ErrorCode::kCorrupt);
    EXPECT_NE(bad.to_string().find("block 1"), std::string::npos) << bad.to_string();
    EXPECT_EQ(reader.corrupt(), std::vector<int>{0});
  }
  // The same file with a whole-file xxh3 (an older manifest) is read without block checks.
  storage::LocalManifest old = m;
  old.files[0] = storage::LocalRankFile{n, 0, 0, {}};
  storage::LocalFileReader plain(dir, old, nullptr, 0);
  std::vector<char> out(100);
  EXPECT_TRUE(plain.read(0, out.data(), 100, block + 12300).ok());
}

// A flip in the middle block of one rank's own file: not read at resolve (no partner copy is
// chosen for it), caught as its server reads it, the file moved aside, and the load served from
// the partner copy, every element right. Mutation caught: skipping the block check (the load
// then returns the flipped element).
TEST_F(LocalBlocks, FlipInOneBlockIsCaughtAsItIsServedAndAnotherCopyServes) {
  if (node_count() < 2) GTEST_SKIP() << "one node: no partner copies";
  Topology t = topology();
  Checkpointer ck(t, opts);
  ASSERT_TRUE(save(ck, 2).ok());
  const uint64_t block = storage::local_block_bytes();
  if (world_rank() == 0) flip_byte(local_file(0, 2, 0), block + block / 3);
  MPI_Barrier(MPI_COMM_WORLD);
  auto res = ck.resolve(shared);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_EQ(res->level, "local") << res->reason;
  EXPECT_NE(res->reason.find(" 0 of " + std::to_string(world_size()) + " ranks' files served from partner copies"),
            std::string::npos)
      << "resolve read the file: " << res->reason;
  State s(-1);
  s.clear();
  auto rep = ck.load(s.state, shared);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_EQ(s.mismatches(2), 0);
  if (world_rank() == 0) {
    EXPECT_TRUE(fs::exists(local_file(0, 2, 0) + ".corrupt"));
    EXPECT_FALSE(fs::exists(local_file(0, 2, 0)));
  }
  auto again = ck.resolve(shared);  // the file moved aside is no longer offered
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_NE(again->reason.find(" 1 of "), std::string::npos) << again->reason;
}

// Every copy of rank 0's file is damaged: the load moves them aside as it finds them and ends on
// the newest intact checkpoint (step 4, persisted, and kept locally too), every element right.
TEST_F(LocalBlocks, NoIntactCopyLeftFallsBackToTheNewestIntactCheckpoint) {
  Topology t = topology();
  Checkpointer ck(t, opts);
  ASSERT_TRUE(save(ck, 4, true).ok());
  ASSERT_TRUE(save(ck, 6).ok());
  const uint64_t block = storage::local_block_bytes();
  if (node_leader() && fs::exists(local_file(my_node(), 6, 0))) flip_byte(local_file(my_node(), 6, 0), 2 * block + 5);
  MPI_Barrier(MPI_COMM_WORLD);
  State s(-1);
  s.clear();
  auto rep = ck.load(s.state, shared);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_EQ(s.mismatches(4), 0);
  if (node_leader() && fs::exists(node_dir(my_node()) + "/step-6/" + storage::kLocalManifestName))
    EXPECT_TRUE(fs::exists(local_file(my_node(), 6, 0) + ".corrupt")) << "node " << my_node();
}

// A manifest as older versions wrote it (a whole-file xxh3 per file, no block sums) loads; a flip
// in such a file is caught at resolve, which reads it whole, and another copy serves it.
TEST_F(LocalBlocks, OlderManifestsWithoutBlockSumsStillLoad) {
  Topology t = topology();
  Checkpointer ck(t, opts);
  ASSERT_TRUE(save(ck, 3).ok());
  // Every rank hashes its own file whole; every node leader rewrites its manifest in the old form.
  auto own =
      storage::file_xxh3(local_file(my_node(), 3, world_rank()), fs::file_size(local_file(my_node(), 3, world_rank())));
  ASSERT_TRUE(own.ok()) << own.status().to_string();
  std::vector<uint64_t> sums(static_cast<size_t>(world_size()));
  uint64_t mine = *own;
  MPI_Allgather(&mine, 1, MPI_UINT64_T, sums.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  if (node_leader()) {
    const std::string mf = node_dir(my_node()) + "/step-3/" + storage::kLocalManifestName;
    auto bytes = storage::read_whole_file(mf);
    ASSERT_TRUE(bytes.ok());
    auto m = storage::decode_local_manifest(*bytes);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    for (size_t r = 0; r < m->files.size(); ++r)
      m->files[r] = storage::LocalRankFile{m->files[r].bytes, sums[r], 0, {}};
    ASSERT_TRUE(storage::write_file_atomic(mf, storage::encode_local_manifest(*m)).ok());
  }
  if (node_count() > 1 && world_rank() == 0) flip_byte(local_file(0, 3, 0), 100);
  MPI_Barrier(MPI_COMM_WORLD);
  auto res = ck.resolve(shared);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_EQ(res->level, "local") << res->reason;
  State s(-1);
  s.clear();
  auto rep = ck.load(s.state, shared);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_EQ(rep->transport, "mpi-local");
  EXPECT_EQ(s.mismatches(3), 0);
}

// The manifest's file entries with block sums round-trip; entries whose sums do not fit the size
// and block size are refused (a truncated or padded sums string could otherwise pass a file whose
// tail is not checked).
TEST(LocalManifestBlocks, RoundTripAndRefuseSumsThatDoNotFit) {
  storage::LocalManifest m;
  m.name = "step-5";
  m.shared_path = "/x/ck/step-5";
  m.step = 5;
  m.library_version = "t";
  m.sizes = {2, 1, 1, 1, 1};
  m.coords = {{0, 0, 0, 0, 0, 0}, {1, 0, 0, 0, 0, 0}};
  m.node_of_rank = {0, 1};
  m.files = {{2500, 0, 1000, {0x11, 0x2222, 0xffffffffffffffffull}}, {0, 0, 1000, {}}};
  auto back = storage::decode_local_manifest(storage::encode_local_manifest(m));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->files[0].block_bytes, 1000u);
  EXPECT_EQ(back->files[0].blocks, m.files[0].blocks);
  EXPECT_TRUE(back->files[1].blocks.empty());
  storage::LocalManifest short_sums = m;
  short_sums.files[0].blocks.pop_back();  // 2500 bytes need 3 blocks of 1000
  auto bad = storage::decode_local_manifest(storage::encode_local_manifest(short_sums));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().to_string().find("block sums"), std::string::npos) << bad.status().to_string();
}

// The block sums of local files are never keyed: a local checkpoint saved while a key was
// configured loads from the local level after the key is dropped (a keyed sum would make every
// block look damaged and move every file aside). Mutation caught: hashing local blocks with
// block_checksum (keyed when a key is set) instead of unkeyed xxh3.
TEST_F(LocalBlocks, LocalFilesReadTheSameWithOrWithoutAKey) {
  const std::string key = root + "/key";
  if (world_rank() == 0) std::ofstream(key) << "0123456789abcdef-a-local-level-test-key";
  MPI_Barrier(MPI_COMM_WORLD);
  Topology t = topology();
  {
    CheckpointerOptions keyed = opts;
    keyed.auth_key_file = key;
    Checkpointer ck(t, keyed);
    ASSERT_TRUE(save(ck, 8).ok());
  }
  ASSERT_TRUE(set_auth_key_file("").ok());
  Checkpointer ck(t, opts);
  State s(-1);
  s.clear();
  auto rep = ck.load(s.state, shared);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_EQ(rep->transport, "mpi-local");
  EXPECT_EQ(s.mismatches(8), 0);
  EXPECT_FALSE(fs::exists(local_file(my_node(), 8, world_rank()) + ".corrupt"));
}
