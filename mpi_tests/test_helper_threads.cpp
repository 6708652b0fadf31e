// Work that runs on helper threads: a load's block checks (CheckpointerOptions::verify_threads)
// while its next bytes are read, and save_async's snapshot copy (snapshot_threads). Neither may
// change a value or let a corrupt block through: every loaded element is compared with the
// formula it was saved from, and a flipped byte in any chosen block fails the load on every rank
// naming the key, region and block, with any number of checking and reading threads.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "support/test_model.h"

using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;

using namespace h5ckpt;
namespace fs = std::filesystem;

namespace {

// Every element is a pure function of its tensor's seed and global index.
float f32_value(int seed, int64_t g) { return static_cast<float>((seed * 131 + g) % 1000003) * 0.25f; }
uint8_t u8_value(int seed, int64_t g) { return static_cast<uint8_t>(seed * 7 + g * 13 + (g >> 8)); }

int64_t count(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Tensors with their buffers for one rank: filled from the formula, or zero to be loaded.
struct Tensors {
  struct Entry {
    std::string key;
    DType dtype;
    Shape shape;
    ShardSpec shard;
    int seed;
    std::vector<char> buf;
  };
  std::vector<Entry> entries;

  void add(const std::string& key, DType dtype, Shape shape, ShardSpec shard, bool fill) {
    Entry e{key, dtype, shape, shard, static_cast<int>(entries.size()) + 1, {}};
    e.buf.assign(static_cast<size_t>(shard.numel()) * dtype_size(dtype), 0);
    if (fill) write_values(e, 0);
    entries.push_back(std::move(e));
  }
  // Fills e's buffer from the formula shifted by `salt` (0: the saved values).
  static void write_values(Entry& e, int salt) {
    for (int64_t j = 0; j < e.shard.numel(); ++j) {
      const int64_t g = h5ckpt::testing::global_flat_index(e.shard, e.shape, j);
      if (e.dtype == DType::kF32) reinterpret_cast<float*>(e.buf.data())[j] = f32_value(e.seed + salt, g);
      else reinterpret_cast<uint8_t*>(e.buf.data())[j] = u8_value(e.seed + salt, g);
    }
  }
  StateDict state() {
    StateDict sd;
    for (auto& e : entries) sd.add(e.key, e.dtype, e.shape, e.shard, e.buf.data());
    return sd;
  }
  void scribble() {
    for (auto& e : entries) write_values(e, 1000);
  }
  // Elements that differ from the formula; names the first in *first.
  int64_t mismatches(std::string* first) const {
    int64_t bad = 0;
    for (const auto& e : entries)
      for (int64_t j = 0; j < e.shard.numel(); ++j) {
        const int64_t g = h5ckpt::testing::global_flat_index(e.shard, e.shape, j);
        const bool ok = e.dtype == DType::kF32
                            ? reinterpret_cast<const float*>(e.buf.data())[j] == f32_value(e.seed, g)
                            : reinterpret_cast<const uint8_t*>(e.buf.data())[j] == u8_value(e.seed, g);
        if (!ok && bad++ == 0) *first = e.key + " element " + std::to_string(j) + " (global " + std::to_string(g) + ")";
      }
    return bad;
  }
};

// Several 4 MiB chunks per region, laid out so that loads check in place (row splits loaded in
// the saving layout), through landing buffers (column splits loaded whole by every rank, which
// zero-redundancy turns into one reader and sends) and across flat ZeRO ranges.
Tensors load_model(bool save_side, bool fill) {
  const int n = world_size(), r = world_rank();
  Tensors t;
  const Shape rows{3000, 1000}, cols{2048, 1536}, flat{1500, 999}, small{7, 13};
  t.add("w/rows", DType::kF32, rows, ShardSpec::split(rows, 0, n, r), fill);
  t.add("w/cols", DType::kF32, cols, save_side ? ShardSpec::split(cols, 1, n, r) : ShardSpec::whole(cols), fill);
  const int64_t per = count(flat) / n + 1;
  t.add("w/flat", DType::kF32, flat,
        save_side ? ShardSpec::flat_range(Box{{0, 0}, flat}, std::min(count(flat), per * r),
                                          std::min(count(flat), per * (r + 1)))
                  : ShardSpec::split(flat, 0, n, r),
        fill);
  t.add("w/small", DType::kU8, small, ShardSpec::whole(small), fill);
  return t;
}

bool same_text_on_all_ranks(const std::string& text) {
  uint64_t h = XXH3_64bits(text.data(), text.size()), lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

class HelperThreads : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "helper-threads");
    ASSERT_FALSE(root_.empty());
    auto t = Topology::create(MPI_COMM_WORLD, {1, world_size(), 1});
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    topo_.emplace(std::move(t).value());
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    topo_.reset();
    if (world_rank() == 0) fs::remove_all(root_);
  }
  // Loads load_model() from `path` with the given threads; the loaded values in *mismatched.
  Status load(const std::string& path, int verify_threads, int io_threads, int64_t* mismatched, std::string* first) {
    CheckpointerOptions o;
    o.verify_threads = verify_threads;
    o.io_threads = io_threads;
    o.metrics = false;
    Checkpointer ck(*topo_, o);
    Tensors t = load_model(false, false);
    StateDict sd = t.state();
    auto r = ck.load(sd, path);
    *mismatched = t.mismatches(first);
    if (r.ok()) EXPECT_EQ(r->verify_threads, verify_threads);  // the checks ran on the pool
    // Every rank reads here; io_threads 0 on this local disk means one reader (fs_traits.h).
    if (r.ok()) EXPECT_EQ(r->io_threads, io_threads > 0 ? io_threads : 1);
    return r.status();
  }
  std::string root_;
  std::optional<Topology> topo_;
};

TEST_F(HelperThreads, PooledVerificationLoadsEveryValueAndCatchesAFlipInAnyBlock) {
  const std::string good = root_ + "/good";
  {
    Tensors t = load_model(true, true);
    Checkpointer ck(*topo_);
    StateDict sd = t.state();
    auto saved = ck.save(sd, good);
    ASSERT_TRUE(saved.ok()) << saved.status().to_string();
  }
  for (int vt : {1, 3})
    for (int io : {0, 1, 2}) {
      int64_t bad = -1;
      std::string first;
      Status st = load(good, vt, io, &bad, &first);
      ASSERT_TRUE(st.ok()) << st.to_string();
      EXPECT_EQ(bad, 0) << "verify_threads " << vt << " io_threads " << io << ": " << first;
    }

  auto info = read_checkpoint_info(good);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  // Which block to damage, named by region and block of the saved layout: the last block of
  // the first chunk, the region's last block, its first block. The global element to flip is
  // worked out from the region's geometry here, not by the reader.
  struct Target {
    std::string key;
    bool last_region;
    int block;  // -1: the region's last block
    bool last_element;
  };
  const std::vector<Target> targets = {
      {"w/cols", false, 3, true}, {"w/rows", true, -1, true}, {"w/flat", true, 1, false}, {"w/cols", true, 0, false}};
  int case_no = 0;
  for (const Target& target : targets) {
    const TensorInfo* t = info->find(target.key);
    ASSERT_NE(t, nullptr);
    const size_t ri = target.last_region ? t->regions.size() - 1 : 0;
    const SavedRegion& reg = t->regions[ri];
    const int64_t be = static_cast<int64_t>(reg.block_bytes / 4), n = reg.shard.numel();
    const int64_t blocks = (n + be - 1) / be;
    const int64_t b = target.block < 0 ? blocks - 1 : std::min<int64_t>(target.block, blocks - 1);
    const int64_t k = target.last_element ? std::min(n, (b + 1) * be) - 1 : b * be;
    int64_t g = 0;
    if (reg.shard.flat) {
      g = reg.shard.flat->first + k;
    } else {
      const Box& box = reg.shard.box;
      g = (box.offset[0] + k / box.shape[1]) * t->shape[1] + box.offset[1] + k % box.shape[1];
    }
    const std::string dir = root_ + "/bad" + std::to_string(case_no++);
    if (world_rank() == 0) {
      fs::copy(good, dir, fs::copy_options::recursive);
      std::fstream io(fs::path(dir) / "data.h5", std::ios::in | std::ios::out | std::ios::binary);
      const std::streamoff pos = t->file_offset + g * 4 + 2;
      io.seekg(pos);
      char c = 0;
      io.get(c);
      io.seekp(pos);
      io.put(static_cast<char>(c ^ 0x04));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (int vt : {1, 3})
      for (int io : {0, 1, 2}) {
        SCOPED_TRACE(::testing::Message() << target.key << " region " << ri << " block " << b << ", verify_threads "
                                          << vt << ", io_threads " << io);
        int64_t bad = 0;
        std::string first;
        Status st = load(dir, vt, io, &bad, &first);
        ASSERT_FALSE(st.ok()) << "the flipped block was loaded";
        EXPECT_EQ(st.code(), ErrorCode::kCorrupt) << st.to_string();
        const std::string& m = st.message();
        EXPECT_NE(m.find("'" + target.key + "'"), std::string::npos) << m;
        EXPECT_NE(m.find("region " + std::to_string(ri) + " "), std::string::npos) << m;
        EXPECT_NE(m.find("block " + std::to_string(b) + " ("), std::string::npos) << m;
        EXPECT_TRUE(same_text_on_all_ranks(st.to_string())) << "ranks disagree; this rank has: " << st.to_string();
      }
  }
  // The good checkpoint is untouched by all this.
  int64_t bad = -1;
  std::string first;
  ASSERT_TRUE(load(good, 3, 1, &bad, &first).ok());
  EXPECT_EQ(bad, 0) << first;
}

// The snapshot copy on several threads: many small tensors of odd sizes, tensors larger than
// one thread's slice, a tensor cut into several pieces (max_piece_bytes), with the pool holding
// the whole snapshot and with a pool smaller than it (the copies are handed to the writer when
// it fills). The caller overwrites its buffers as soon as save_async returns; what was saved
// must be exactly the values at the call.
TEST_F(HelperThreads, ParallelSnapshotSavesExactlyTheValuesAtTheCall) {
  const int n = world_size(), r = world_rank();
  auto model = [&](bool fill) {
    Tensors t;
    for (int i = 0; i < 150; ++i) {
      const Shape s{1 + (i * 37) % 101, 1 + (i * 11) % 13};  // odd sizes, some a few bytes
      t.add("small/" + std::to_string(i), i % 3 ? DType::kU8 : DType::kF32, s, ShardSpec::whole(s), fill);
    }
    const Shape big{1237, 1031};       // about 5 MiB of f32 per rank: several 1 MiB slices
    const Shape odd{3 * 1048577 + 5};  // bytes: larger than a slice, an odd length
    const Shape cut{777, 2049};        // with max_piece_bytes below: several pieces
    t.add("big", DType::kF32, big, ShardSpec::split(big, 0, n, r), fill);
    t.add("odd", DType::kU8, odd, ShardSpec::split(odd, 0, n, r), fill);
    t.add("cut", DType::kF32, cut, ShardSpec::split(cut, 1, n, r), fill);
    return t;
  };
  int case_no = 0;
  for (int threads : {1, 2, 3, 5})
    for (uint64_t staging : {uint64_t{0}, uint64_t{3} << 20}) {
      SCOPED_TRACE(::testing::Message() << threads << " snapshot threads, staging_bytes " << staging);
      CheckpointerOptions o;
      o.snapshot_threads = threads;
      o.staging_bytes = staging;
      o.max_piece_bytes = 1u << 20;
      o.metrics = false;
      const std::string path = root_ + "/snap" + std::to_string(case_no++);
      {
        Tensors t = model(true);
        Checkpointer ck(*topo_, o);
        StateDict sd = t.state();
        auto h = ck.save_async(sd, path);
        ASSERT_TRUE(h.ok()) << h.status().to_string();
        t.scribble();  // the trainer's next step, at once
        auto done = h->wait();
        ASSERT_TRUE(done.ok()) << done.status().to_string();
        if (staging == 0) EXPECT_EQ(done->blocked_bytes, 0u);
      }
      Tensors loaded = model(false);
      Checkpointer ck(*topo_);
      StateDict sd = loaded.state();
      auto l = ck.load(sd, path);
      ASSERT_TRUE(l.ok()) << l.status().to_string();
      std::string first;
      EXPECT_EQ(loaded.mismatches(&first), 0) << first;
    }
}

}  // namespace
