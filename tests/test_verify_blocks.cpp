// Verified reads against a data file written here: tensors laid out row-major at known offsets,
// regions hashed block by block as a save would (BlockHasher over each region's canonical
// stream). Expected values come from the element formula, not from the reader.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>

#include "planner/box_math.h"
#include "storage/region_lookup.h"
#include "storage/region_reader.h"
#include "storage/verify_blocks.h"
#include "util/checked_math.h"
#include "util/work_pool.h"

using namespace h5ckpt;
namespace fs = std::filesystem;

namespace {

float value(int64_t linear) { return static_cast<float>(linear) * 0.5f + 3.0f; }

// A [rows, cols] f32 tensor whose regions are given; its file bytes start at `offset`.
struct Fixture {
  std::string file;
  TensorInfo t;
  std::vector<float> all;
  bool network = false;  // read as on a network file system (through gaps up to 128 KiB)

  Fixture(const std::string& dir, int64_t rows, int64_t cols, std::vector<ShardSpec> regions, uint64_t target,
          bool v1 = false) {
    file = dir + "/data.bin";
    t.key = "model/w";
    t.dtype = DType::kF32;
    t.shape = {rows, cols};
    t.nbytes = static_cast<uint64_t>(rows * cols) * 4;
    t.file_offset = 64;  // something in front, as in an HDF5 file
    all.resize(static_cast<size_t>(rows * cols));
    for (int64_t i = 0; i < rows * cols; ++i) all[i] = value(i);
    std::ofstream out(file, std::ios::binary);
    std::string head(64, 'H');
    out.write(head.data(), head.size());
    out.write(reinterpret_cast<const char*>(all.data()), static_cast<std::streamsize>(t.nbytes));
    out.close();
    const planner::Frame whole{Box{{0, 0}, {rows, cols}}, 0};
    for (const ShardSpec& s : regions) {
      // The region's canonical stream, gathered independently of the reader.
      std::vector<float> canon(static_cast<size_t>(s.numel()));
      const planner::Frame dst = planner::frame_of(s);
      for (const Box& b : planner::shard_boxes(s))
        planner::for_each_run(b, whole, dst,
                              [&](int64_t si, int64_t di, int64_t n) { std::memcpy(&canon[di], &all[si], n * 4); });
      SavedRegion r;
      r.shard = s;
      r.writer_rank = 0;
      if (v1) {
        r.checksum = XXH3_64bits(canon.data(), canon.size() * 4);
      } else {
        r.block_bytes = storage::choose_block_bytes(s, t.dtype, target);
        storage::BlockHasher h(storage::region_identity(t.key, t.dtype, t.shape, s), r.block_bytes, canon.size() * 4);
        // In uneven pieces, as a save's staging would deliver them.
        size_t at = 0, step = 7;
        while (at < canon.size() * 4) {
          const size_t n = std::min(step, canon.size() * 4 - at);
          h.update(reinterpret_cast<const char*>(canon.data()) + at, n);
          at += n;
          step = step * 3 + 1;
        }
        r.block_checksums = h.finish();
      }
      t.regions.push_back(r);
    }
  }

  void flip(int64_t element) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(64 + element * 4 + 1);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(64 + element * 4 + 1);
    f.write(&c, 1);
  }

  // Reads `want` into a buffer of its shape; returns the status and compares values.
  // With `pool`, the block checks run there (RegionReader::defer_checks) and the values are
  // looked at only after the group's checks are done, as a load does.
  Status read(const Box& want, int64_t* wrong, bool verify = true, DType as = DType::kF32,
              detail::WorkPool* pool = nullptr, uint64_t* bytes_read = nullptr) {
    auto r = storage::RegionReader::open(file);
    if (!r.ok()) return r.status();
    r->set_verify(verify);
    if (network) r->set_network_reads(true);
    const int64_t n = want.shape[0] * want.shape[1];
    std::vector<char> buf(static_cast<size_t>(n) * dtype_size(as), 0);
    Status st;
    if (pool) {
      auto group = pool->group();
      r->defer_checks({pool, group, nullptr});
      pool->seal(group, r->read(t, want, planner::Frame{want, 0}, as, buf.data()));
      st = pool->wait(group);
    } else {
      st = r->read(t, want, planner::Frame{want, 0}, as, buf.data());
    }
    if (bytes_read) *bytes_read = r->bytes_read();
    *wrong = 0;
    if (!st.ok()) return st;
    for (int64_t i = 0; i < want.shape[0]; ++i)
      for (int64_t j = 0; j < want.shape[1]; ++j) {
        const int64_t g = (want.offset[0] + i) * t.shape[1] + want.offset[1] + j;
        const int64_t k = i * want.shape[1] + j;
        const double got =
            as == DType::kF64 ? reinterpret_cast<double*>(buf.data())[k] : reinterpret_cast<float*>(buf.data())[k];
        if (got != static_cast<double>(value(g))) ++*wrong;
      }
    return st;
  }
};

class VerifyBlocks : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/h5ckpt-verify-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

ShardSpec box(int64_t r0, int64_t c0, int64_t nr, int64_t nc) {
  ShardSpec s;
  s.box = Box{{r0, c0}, {nr, nc}};
  return s;
}
ShardSpec flat(int64_t rows, int64_t cols, int64_t b, int64_t e) {
  ShardSpec s;
  s.box = Box{{0, 0}, {rows, cols}};
  s.flat = std::make_pair(b, e);
  return s;
}

std::vector<ShardSpec> column_split() { return {box(0, 0, 37, 20), box(0, 20, 37, 30)}; }
std::vector<ShardSpec> zero_split() {
  return {flat(37, 50, 0, 611), flat(37, 50, 611, 1300), flat(37, 50, 1300, 1850)};
}

Box random_box(std::mt19937& g, int64_t rows, int64_t cols) {
  std::uniform_int_distribution<int64_t> r(0, rows - 1), c(0, cols - 1);
  const int64_t r0 = r(g), c0 = c(g);
  return Box{{r0, c0},
             {std::uniform_int_distribution<int64_t>(1, rows - r0)(g),
              std::uniform_int_distribution<int64_t>(1, cols - c0)(g)}};
}

bool contains(const Box& b, int64_t row, int64_t col) {
  return row >= b.offset[0] && row < b.offset[0] + b.shape[0] && col >= b.offset[1] && col < b.offset[1] + b.shape[1];
}

}  // namespace

TEST_F(VerifyBlocks, BlockLayoutIsWholeSlabs) {
  const ShardSpec s = box(0, 0, 37, 20);  // slab: 20 f32 = 80 bytes
  EXPECT_EQ(storage::region_slab_bytes(s, DType::kF32), 80u);
  EXPECT_EQ(storage::choose_block_bytes(s, DType::kF32, 1000), 960u);
  EXPECT_EQ(storage::choose_block_bytes(s, DType::kF32, 10), 80u);  // at least one slab
  EXPECT_EQ(storage::region_slab_bytes(flat(37, 50, 3, 9), DType::kBF16), 2u);
  EXPECT_EQ(storage::block_count(2960, 960), 4u);
}

// The block sums are XXH3 of each block with its seed, whichever vector unit computes them
// (xxHash's run-time dispatch on x86-64): against the library's plain entry point, at every size
// up to 300 bytes (the algorithm's short-input branches), around its stripes and blocks, at odd
// alignments, one-shot and streamed in uneven pieces. So a checkpoint saved by any build, on any
// CPU, verifies in any other.
TEST_F(VerifyBlocks, BlockSumsArePlainXxh3OfEachBlockWithItsSeed) {
  ASSERT_FALSE(storage::auth::enabled());  // keyed MACs are another function (test_auth)
  std::mt19937_64 g(29);
  std::vector<unsigned char> bytes((3u << 20) + 64);
  for (auto& b : bytes) b = static_cast<unsigned char>(g());
  std::vector<uint64_t> sizes;
  for (uint64_t n = 0; n <= 300; ++n) sizes.push_back(n);
  for (uint64_t n : {1023u, 1024u, 1025u, 4096u, 65543u, (1u << 20) - 1, 1u << 20, (1u << 20) + 129, 3u << 20})
    sizes.push_back(n);
  const uint64_t identity = 0x1234abcd5678ef90ull;
  for (uint64_t n : sizes)
    for (uint64_t align : {0u, 1u, 7u, 33u}) {
      const unsigned char* p = bytes.data() + align;
      const uint64_t b = n % 11;
      ASSERT_EQ(storage::block_checksum(identity, b, p, n),
                XXH3_64bits_withSeed(p, n, storage::block_seed(identity, b)))
          << n << " bytes at alignment " << align;
    }
  const uint64_t region = (3u << 20) + 5, block = (1u << 20) + 3;  // the last block short
  storage::BlockHasher h(identity, block, region);
  for (uint64_t at = 0, step = 5; at < region; step = step * 5 + 3) {
    const uint64_t n = std::min(step, region - at);
    h.update(bytes.data() + at, n);
    at += n;
  }
  const std::vector<uint64_t> sums = h.finish();
  ASSERT_EQ(sums.size(), storage::block_count(region, block));
  for (uint64_t i = 0; i < sums.size(); ++i) {
    const uint64_t lo = i * block, len = std::min(block, region - lo);
    EXPECT_EQ(sums[i], XXH3_64bits_withSeed(bytes.data() + lo, len, storage::block_seed(identity, i))) << "block " << i;
  }
}

TEST_F(VerifyBlocks, EveryRandomBoxReadsRightValues) {
  std::mt19937 g(7);
  for (auto regions : {column_split(), zero_split()}) {
    for (uint64_t target : {64ull, 300ull, 1ull << 20}) {
      Fixture f(dir_, 37, 50, regions, target);
      for (int i = 0; i < 60; ++i) {
        const Box want = random_box(g, 37, 50);
        int64_t wrong = -1;
        Status st = f.read(want, &wrong);
        ASSERT_TRUE(st.ok()) << st.to_string();
        EXPECT_EQ(wrong, 0) << "target " << target;
      }
      int64_t wrong = -1;  // float-to-float conversion on the way out
      ASSERT_TRUE(f.read(Box{{3, 5}, {20, 40}}, &wrong, true, DType::kF64).ok());
      EXPECT_EQ(wrong, 0);
    }
  }
}

TEST_F(VerifyBlocks, AFlippedByteFailsEveryReadThatDeliversIt) {
  std::mt19937 g(11);
  for (auto regions : {column_split(), zero_split()}) {
    Fixture f(dir_, 37, 50, regions, 300);
    const int64_t row = 17, col = 23;
    f.flip(row * 50 + col);
    int failed = 0, passed_without = 0;
    for (int i = 0; i < 200; ++i) {
      const Box want = random_box(g, 37, 50);
      int64_t wrong = -1;
      Status st = f.read(want, &wrong);
      if (contains(want, row, col)) {
        ASSERT_FALSE(st.ok()) << "a read delivering the flipped element passed";
        EXPECT_EQ(st.code(), ErrorCode::kCorrupt);
        EXPECT_NE(st.message().find("model/w"), std::string::npos) << st.message();
        EXPECT_NE(st.message().find("block"), std::string::npos) << st.message();
        ++failed;
      } else if (st.ok()) {
        EXPECT_EQ(wrong, 0);  // what a passing read delivers is right
        ++passed_without;
      }
    }
    EXPECT_GT(failed, 0);
    EXPECT_GT(passed_without, 0);  // blocks are local: reads far from the flip still work
    // Without verification the flipped value is delivered: the check is what stops it.
    int64_t wrong = -1;
    ASSERT_TRUE(f.read(Box{{row, 0}, {1, 50}}, &wrong, false).ok());
    EXPECT_EQ(wrong, 1);
  }
}

TEST_F(VerifyBlocks, RelabelledOrMovedBytesAreRefused) {
  Fixture f(dir_, 37, 50, column_split(), 300);
  int64_t wrong = -1;
  const Box all{{0, 0}, {37, 50}};
  ASSERT_TRUE(f.read(all, &wrong).ok());
  {  // same-size dtype relabel: the bytes are intact, their meaning is not
    Fixture g = f;
    g.t.dtype = DType::kI32;
    auto r = storage::RegionReader::open(g.file);
    std::vector<int32_t> buf(37 * 50);
    Status st = r->read(g.t, all, planner::Frame{all, 0}, DType::kI32, buf.data());
    EXPECT_EQ(st.code(), ErrorCode::kCorrupt) << st.to_string();
  }
  {  // another key
    Fixture g = f;
    g.t.key = "model/v";
    EXPECT_EQ(g.read(all, &wrong).code(), ErrorCode::kCorrupt);
  }
  {  // the two regions' boxes trade places with their checksums (same shape needed: rows split)
    Fixture h(dir_, 36, 50, {box(0, 0, 18, 50), box(18, 0, 18, 50)}, 300);
    ASSERT_TRUE(h.read(Box{{0, 0}, {36, 50}}, &wrong).ok());
    std::swap(h.t.regions[0].shard, h.t.regions[1].shard);
    std::swap(h.t.regions[0].shard, h.t.regions[1].shard);  // back, then swap only the sums
    std::swap(h.t.regions[0].block_checksums, h.t.regions[1].block_checksums);
    EXPECT_EQ(h.read(Box{{0, 0}, {36, 50}}, &wrong).code(), ErrorCode::kCorrupt);
  }
  {  // sums that do not fit the region are refused before any read
    Fixture g = f;
    g.t.regions[0].block_checksums.pop_back();
    EXPECT_EQ(g.read(all, &wrong).code(), ErrorCode::kCorrupt);
  }
}

TEST_F(VerifyBlocks, FormatV1WholeRegionChecksumsAreChecked) {
  Fixture f(dir_, 37, 50, zero_split(), 0, /*v1=*/true);
  int64_t wrong = -1;
  ASSERT_TRUE(f.read(Box{{2, 3}, {5, 7}}, &wrong).ok());
  EXPECT_EQ(wrong, 0);
  f.flip(1700);  // in the third flat region
  EXPECT_EQ(f.read(Box{{34, 0}, {1, 1}}, &wrong).code(), ErrorCode::kCorrupt);
  EXPECT_TRUE(f.read(Box{{0, 0}, {2, 50}}, &wrong).ok());  // the first region is intact
  EXPECT_EQ(wrong, 0);
}

TEST_F(VerifyBlocks, SameLayoutReadsWidenNothing) {
  Fixture f(dir_, 37, 50, {box(0, 0, 19, 50), box(19, 0, 18, 50)}, 300);
  auto r = storage::RegionReader::open(f.file);
  std::vector<float> buf(19 * 50);
  const Box want{{0, 0}, {19, 50}};
  ASSERT_TRUE(r->read(f.t, want, planner::Frame{want, 0}, DType::kF32, buf.data()).ok());
  EXPECT_EQ(r->widened_bytes(), 0u);
  EXPECT_EQ(r->bytes_read(), 19u * 50 * 4);  // read once, checked in place
  for (int64_t i = 0; i < 19 * 50; ++i) ASSERT_EQ(buf[i], value(i));
}

// On a network file system a TP column shard (runs of 2 KiB, 2 KiB apart: within pages the client
// fetches anyway) is read in spans, gaps included: far fewer reads, the same values, and the gaps'
// bytes (another region's) are neither checked against this region's blocks nor delivered. On a
// local one, run by run; gaps of a page or more, run by run on both.
TEST_F(VerifyBlocks, NetworkReadsGoThroughGapsAndCheckOnlyTheirRegion) {
  constexpr int64_t kRows = 96, kCols = 1024;
  Fixture f(dir_, kRows, kCols, {box(0, 0, kRows, 512), box(0, 512, kRows, 512)}, 16u << 10);
  const Box mine{{0, 0}, {kRows, 512}};
  const uint64_t exact = kRows * 512 * 4, span = ((kRows - 1) * kCols + 512) * 4;
  {  // a load moves its readers into place: the setting moves with them
    auto r = storage::RegionReader::open(f.file);
    ASSERT_TRUE(r.ok());
    r->set_network_reads(true);
    storage::RegionReader moved = std::move(r).value();
    EXPECT_TRUE(moved.network_reads());
  }
  detail::WorkPool pool(2);
  for (bool network : {false, true})
    for (bool verify : {false, true})
      for (detail::WorkPool* p : {static_cast<detail::WorkPool*>(nullptr), &pool}) {
        SCOPED_TRACE(::testing::Message() << "network " << network << ", verify " << verify << ", pool " << !!p);
        f.network = network;
        int64_t wrong = -1;
        uint64_t read = 0;
        ASSERT_TRUE(f.read(mine, &wrong, verify, DType::kF32, p, &read).ok());
        EXPECT_EQ(wrong, 0);
        EXPECT_EQ(read, network ? span : exact);
      }
  f.network = true;
  int64_t wrong = -1;
  ASSERT_TRUE(f.read(mine, &wrong, true, DType::kF64).ok());  // converted on the way out
  EXPECT_EQ(wrong, 0);
  f.flip(40 * kCols + 700);  // in a gap: region 1's bytes, read but not this read's business
  ASSERT_TRUE(f.read(mine, &wrong, true, DType::kF32, &pool).ok());
  EXPECT_EQ(wrong, 0);
  f.flip(40 * kCols + 100);  // in region 0: caught as the read goes through spans
  for (detail::WorkPool* p : {static_cast<detail::WorkPool*>(nullptr), &pool}) {
    Status st = f.read(mine, &wrong, true, DType::kF32, p);
    EXPECT_EQ(st.code(), ErrorCode::kCorrupt) << st.to_string();
  }
  ASSERT_TRUE(f.read(mine, &wrong, false).ok());  // unverified: delivered, the check is what stops it
  EXPECT_EQ(wrong, 1);
  // 4 KiB runs 4 KiB apart: a gap that holds a whole page is not read through.
  fs::create_directories(dir_ + "/wide");
  Fixture wide(dir_ + "/wide", kRows, 2048, {box(0, 0, kRows, 1024), box(0, 1024, kRows, 1024)}, 16u << 10);
  wide.network = true;
  uint64_t read = 0;
  ASSERT_TRUE(wide.read(Box{{0, 0}, {kRows, 1024}}, &wrong, true, DType::kF32, &pool, &read).ok());
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(read, kRows * 1024 * 4);
}

namespace {
// TP column boxes, each flattened and split over `dp` ranks unevenly (ZeRO): many flat regions
// whose boxes overlap a wanted box while their element ranges may miss it.
std::vector<ShardSpec> tp_zero_split(int64_t rows, int64_t cols, int tp, int dp) {
  std::vector<ShardSpec> out;
  for (int t = 0; t < tp; ++t) {
    const ShardSpec col = ShardSpec::split({rows, cols}, 1, tp, t);
    const int64_t n = col.numel();
    for (int d = 0; d < dp; ++d) {
      const int64_t b = n * d / dp + (d > 0 ? d % 3 : 0), e = d + 1 == dp ? n : n * (d + 1) / dp + (d + 1) % 3;
      out.push_back(ShardSpec::flat_range(col.box, b, e));
    }
  }
  return out;
}
}  // namespace

// storage::checked_spans through a RegionLookup's index returns exactly what testing every region
// returns (region, element range, widening), and reads through it deliver the right values.
TEST_F(VerifyBlocks, CheckedSpansThroughTheIndexEqualTheScan) {
  std::mt19937 g(11);
  const std::vector<std::vector<ShardSpec>> layouts = {
      column_split(),
      zero_split(),
      tp_zero_split(37, 50, 2, 7),
      tp_zero_split(37, 50, 5, 3),
      tp_zero_split(37, 50, 2, 150),  // ranges shorter than a row: some fall between the rows of a box
      {box(0, 0, 20, 50), flat(37, 50, 1000, 1500), flat(37, 50, 1500, 1850)}};
  size_t compared = 0, nonempty = 0;
  for (const auto& regions : layouts) {
    for (uint64_t target : {64ull, 1ull << 20}) {
      Fixture f(dir_, 37, 50, regions, target);
      CheckpointInfo info;
      info.tensors.push_back(f.t);
      storage::RegionLookup lookup(info);
      const TensorInfo& t = info.tensors[0];
      const planner::RegionIndex* index = lookup.of(t);
      ASSERT_NE(index, nullptr);
      EXPECT_EQ(lookup.of(f.t), nullptr) << "a tensor of another CheckpointInfo has no index here";
      for (int i = 0; i < 300; ++i) {
        const Box want = i == 0 ? Box{{0, 0}, {37, 50}} : random_box(g, 37, 50);
        auto scanned = storage::checked_spans(t, want);
        auto indexed = storage::checked_spans(t, want, index);
        ASSERT_TRUE(scanned.ok() && indexed.ok());
        ASSERT_EQ(indexed->size(), scanned->size())
            << "box " << to_string_shape(want.offset) << "+" << to_string_shape(want.shape);
        for (size_t k = 0; k < scanned->size(); ++k) {
          const auto &x = (*indexed)[k], &y = (*scanned)[k];
          EXPECT_EQ(x.region, y.region);
          EXPECT_EQ(x.begin, y.begin);
          EXPECT_EQ(x.end, y.end);
          EXPECT_EQ(x.verified, y.verified);
          EXPECT_EQ(x.widened, y.widened);
        }
        ++compared;
        nonempty += !scanned->empty();
      }
      // Reads through the reader's lookup: right values, every byte checked.
      auto r = storage::RegionReader::open(f.file);
      ASSERT_TRUE(r.ok());
      r->set_lookup(&lookup);
      for (int i = 0; i < 20; ++i) {
        const Box want = random_box(g, 37, 50);
        std::vector<float> buf(static_cast<size_t>(want.volume()), -1.0f);
        ASSERT_TRUE(r->read(t, want, planner::Frame{want, 0}, DType::kF32, buf.data()).ok());
        for (int64_t a = 0; a < want.shape[0]; ++a)
          for (int64_t b = 0; b < want.shape[1]; ++b)
            ASSERT_EQ(buf[static_cast<size_t>(a * want.shape[1] + b)],
                      value((want.offset[0] + a) * 50 + want.offset[1] + b));
      }
    }
  }
  EXPECT_EQ(nonempty, compared);  // every box lies in the tensor: some region always holds it
}

// A region whose blocks do not fit it is reported through the index as through the scan.
TEST_F(VerifyBlocks, CorruptBlockGeometryIsReportedThroughTheIndex) {
  Fixture f(dir_, 37, 50, tp_zero_split(37, 50, 2, 7), 64);
  CheckpointInfo info;
  info.tensors.push_back(f.t);
  info.tensors[0].regions[4].block_checksums.pop_back();  // one checksum short
  storage::RegionLookup lookup(info);
  const TensorInfo& t = info.tensors[0];
  const Box all{{0, 0}, {37, 50}};
  auto scanned = storage::checked_spans(t, all);
  auto indexed = storage::checked_spans(t, all, lookup.of(t));
  ASSERT_FALSE(scanned.ok());
  ASSERT_FALSE(indexed.ok());
  EXPECT_EQ(indexed.status().code(), ErrorCode::kCorrupt);
  EXPECT_EQ(indexed.status().to_string(), scanned.status().to_string());
  EXPECT_NE(indexed.status().to_string().find("region 4"), std::string::npos) << indexed.status().to_string();
}

// Checks handed to a pool (the load's pipelined verification): several chunks of ~4 MiB per
// region, checked on 1 or 3 threads while the next chunk is read, in place (row split: whole
// rows land where they belong) and through landing buffers (column and flat splits). The values
// are the same as inline checking, nothing is read twice, and a flipped byte in ANY block (first,
// middle, last of a chunk, last of a region) fails the read naming that region and block.
TEST_F(VerifyBlocks, PooledChecksCatchAFlipInEveryBlock) {
  constexpr int64_t kRows = 2048, kCols = 1536;  // 12 MiB of f32: 2-3 chunks per region
  const Box all{{0, 0}, {kRows, kCols}};
  const std::vector<std::vector<ShardSpec>> splits = {
      {box(0, 0, 1024, kCols), box(1024, 0, 1024, kCols)},
      {box(0, 0, kRows, 700), box(0, 700, kRows, kCols - 700)},
      {flat(kRows, kCols, 0, 1234567), flat(kRows, kCols, 1234567, kRows * kCols)}};
  for (const auto& regions : splits) {
    Fixture f(dir_, kRows, kCols, regions, storage::kVerifyBlockTarget);
    for (int threads : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << to_string_spec(regions[0]) << ", " << threads << " threads");
      detail::WorkPool pool(threads);
      int64_t wrong = -1;
      uint64_t read = 0;
      ASSERT_TRUE(f.read(all, &wrong, true, DType::kF32, &pool, &read).ok());
      EXPECT_EQ(wrong, 0);
      EXPECT_EQ(read, f.t.nbytes);  // every byte read once
      int checked_blocks = 0;
      for (size_t ri = 0; ri < regions.size(); ++ri) {
        const ShardSpec& s = regions[ri];
        const int64_t be = static_cast<int64_t>(f.t.regions[ri].block_bytes / 4);
        const int64_t n = s.numel();
        const int64_t blocks = (n + be - 1) / be;
        EXPECT_GE(blocks, 5);  // more blocks than one 4 MiB chunk holds
        for (int64_t b = 0; b < blocks; ++b) {
          // The last element of block b, as a global row-major index computed from the region.
          const int64_t k = std::min(n, (b + 1) * be) - 1;
          int64_t global = 0;
          if (s.flat) {
            global = s.flat->first + k;
          } else {
            const int64_t cols = s.box.shape[1];
            global = (s.box.offset[0] + k / cols) * kCols + s.box.offset[1] + k % cols;
          }
          f.flip(global);
          Status st = f.read(all, &wrong, true, DType::kF32, &pool);
          f.flip(global);  // back
          ASSERT_EQ(st.code(), ErrorCode::kCorrupt) << "flip in region " << ri << " block " << b << " was not caught";
          const std::string& m = st.message();
          EXPECT_NE(m.find("model/w"), std::string::npos) << m;
          EXPECT_NE(m.find("region " + std::to_string(ri) + " "), std::string::npos) << m;
          EXPECT_NE(m.find("block " + std::to_string(b) + " ("), std::string::npos) << m;
          ++checked_blocks;
        }
      }
      EXPECT_GT(checked_blocks, 10);
      ASSERT_TRUE(f.read(all, &wrong, true, DType::kF32, &pool).ok());  // intact again
      EXPECT_EQ(wrong, 0);
    }
  }
}

// The reader must not wait for the checks of bytes it read in place (they hold no buffer of its),
// while chunks read through landing buffers stay bounded by the pool's limit. The one checking
// thread is kept busy by a job of the test's; the in-place read must still finish, the landing
// read must not until that job ends, and both are then checked and right.
TEST_F(VerifyBlocks, InPlaceChecksNeverHoldUpTheReader) {
  constexpr int64_t kRows = 2048, kCols = 1536;  // 12 MiB: each half splits into 2+ check jobs
  const Box all{{0, 0}, {kRows, kCols}};
  for (bool in_place : {true, false}) {
    SCOPED_TRACE(in_place ? "row split, read in place" : "column split, through landing buffers");
    const std::vector<ShardSpec> regions =
        in_place ? std::vector<ShardSpec>{box(0, 0, 1024, kCols), box(1024, 0, 1024, kCols)}
                 : std::vector<ShardSpec>{box(0, 0, kRows, 700), box(0, 700, kRows, kCols - 700)};
    Fixture f(dir_, kRows, kCols, regions, storage::kVerifyBlockTarget);
    detail::WorkPool pool(1, /*max_queued=*/1);
    std::promise<void> release;
    std::shared_future<void> gate = release.get_future().share();
    auto busy = pool.group();
    pool.submit(busy, [gate] {
      gate.wait();
      return Status::Ok();
    });  // the bound is now full, and the only worker is taken
    pool.seal(busy);
    auto r = storage::RegionReader::open(f.file);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    std::vector<float> got(static_cast<size_t>(kRows * kCols), -1.0f);
    auto checks = pool.group();
    r->defer_checks({&pool, checks, nullptr});
    auto reading = std::async(std::launch::async, [&] {
      return r->read(f.t, all, planner::Frame{all, 0}, DType::kF32, got.data());
    });
    const bool returned = reading.wait_for(std::chrono::seconds(in_place ? 20 : 1)) == std::future_status::ready;
    release.set_value();
    pool.seal(checks, reading.get());
    const Status st = pool.wait(checks);
    EXPECT_EQ(returned, in_place) << (in_place ? "the in-place read waited for the checking thread"
                                               : "landing buffers were handed out beyond the pool's bound");
    ASSERT_TRUE(st.ok()) << st.to_string();
    int64_t wrong = 0;
    for (int64_t i = 0; i < kRows * kCols; ++i) wrong += got[static_cast<size_t>(i)] != value(i);
    EXPECT_EQ(wrong, 0);
    EXPECT_TRUE(pool.wait(busy).ok());
  }
}
