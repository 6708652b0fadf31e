// Every dtype round-trips bit-exactly across a layout change; h5dump shows real values;
// conversion on load rounds to nearest even; padded vocabularies; re-save gives identical data.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "support/test_model.h"
#include "util/checked_math.h"

using h5ckpt::testing::max_all;
using h5ckpt::testing::sum_all;
using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;

using namespace h5ckpt;
namespace fs = std::filesystem;

namespace {

Topology topo_of(int tp, int dp) {
  auto t = Topology::create(MPI_COMM_WORLD, {tp, dp, 1});
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(t).value();
}

// Deterministic bytes for element i of a tensor (any bit pattern, NaNs included).
unsigned char pattern_byte(int dtype, int64_t byte_index) {
  return static_cast<unsigned char>((byte_index * 131 + dtype * 29 + 7) % 251);
}

const DType kAll[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2,
                      DType::kI8,  DType::kI16, DType::kI32, DType::kI64,  DType::kU8,     DType::kBool};

std::string key_of(DType t) { return std::string("model/dtypes/") + dtype_name(t); }

// Saves `full`, a [37, 4] f32 vocabulary, split by rows over the ranks as "model/embed".
bool save_vocabulary(const Topology& topo, const std::vector<float>& full, const std::string& path) {
  const Shape saved{37, 4};
  ShardSpec s = ShardSpec::split(saved, 0, topo.sizes().tp, topo.coords().tp);
  std::vector<float> mine(full.begin() + s.box.offset[0] * 4, full.begin() + (s.box.offset[0] + s.box.shape[0]) * 4);
  StateDict st;
  st.add("model/embed", DType::kF32, saved, s, mine.data());
  Checkpointer ck(topo);
  auto r = ck.save(st, path);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok();
}

}  // namespace

class Dtypes : public ::testing::Test {
 protected:
  void SetUp() override { root_ = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "dtypes"); }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) fs::remove_all(root_);
  }
  std::string root_;
};

TEST_F(Dtypes, EveryDtypeBitExactAcrossLayouts) {
  const Shape shape{13, 5};  // 13 rows: uneven over every TP size
  const int n = world_size();
  {
    Topology topo = topo_of(n, 1);  // saved split over all ranks along dim 0
    StateDict st;
    std::vector<std::vector<unsigned char>> bufs;
    for (DType t : kAll) {
      ShardSpec s = ShardSpec::split(shape, 0, n, topo.coords().tp);
      const size_t es = dtype_size(t);
      bufs.emplace_back(s.numel() * es + 1);
      const int64_t first = s.box.offset[0] * shape[1];
      for (int64_t b = 0; b < s.numel() * (int64_t)es; ++b) {
        unsigned char v = pattern_byte((int)t, first * es + b);
        bufs.back()[b] = t == DType::kBool ? v & 1 : v;
      }
      st.add(key_of(t), t, shape, s, bufs.back().data());
    }
    Checkpointer ck(topo);
    auto r = ck.save(st, root_ + "/dt");
    ASSERT_TRUE(r.ok()) << r.status().to_string();
  }
  // Load as flat ranges over DP: a different layout that crosses the saved shards.
  Topology topo = topo_of(1, n);
  StateDict st;
  std::vector<std::vector<unsigned char>> bufs;
  const int64_t total = shape[0] * shape[1];
  const int d = topo.coords().dp;
  const int64_t b0 = total * d / n, b1 = total * (d + 1) / n;
  for (DType t : kAll) {
    bufs.emplace_back((b1 - b0) * dtype_size(t) + 1, 0);
    st.add(key_of(t), t, shape, ShardSpec::flat_range(Box{{0, 0}, shape}, b0, b1), bufs.back().data());
  }
  Checkpointer ck(topo);
  auto r = ck.load(st, root_ + "/dt");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (size_t k = 0; k < std::size(kAll); ++k) {
    const DType t = kAll[k];
    const size_t es = dtype_size(t);
    int64_t bad = 0;
    for (int64_t b = 0; b < (b1 - b0) * (int64_t)es; ++b) {
      unsigned char v = pattern_byte((int)t, b0 * es + b);
      if (t == DType::kBool) v &= 1;
      bad += bufs[k][b] != v;
    }
    EXPECT_EQ(bad, 0) << dtype_name(t);
  }
}

TEST_F(Dtypes, H5dumpPrintsRealValues) {
  // bf16, f16 and e5m2 are HDF5 custom floats: h5dump must print their values.
  Topology topo = topo_of(1, world_size());
  const uint16_t bf16[4] = {0x3FC0, 0xC010, 0x3C00, 0x4040};  // 1.5 -2.25 0.0078125 3
  const uint16_t f16[4] = {0x3E00, 0xC080, 0x2000, 0x4200};   // 1.5 -2.25 0.0078125 3
  const uint8_t e5m2[4] = {0x3E, 0xC0, 0x20, 0x42};           // 1.5 -2 0.0078125 3 (top byte of f16)
  StateDict st;
  st.add_replicated("model/bf16", DType::kBF16, {4}, const_cast<uint16_t*>(bf16));
  st.add_replicated("model/f16", DType::kF16, {4}, const_cast<uint16_t*>(f16));
  st.add_replicated("model/e5m2", DType::kF8E5M2, {4}, const_cast<uint8_t*>(e5m2));
  Checkpointer ck(topo);
  ASSERT_TRUE(ck.save(st, root_ + "/small").ok());
  if (world_rank() != 0) return;
  if (std::system("command -v h5dump >/dev/null 2>&1") != 0) GTEST_SKIP() << "h5dump not installed";
  auto dump = [&](const std::string& ds) {
    std::string cmd = "h5dump -y -w 0 -m '%.9g' -d " + ds + " " + root_ + "/small/data.h5";
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    char buf[512];
    while (p && fgets(buf, sizeof buf, p)) out += buf;
    if (p) pclose(p);
    std::erase_if(out, [](char c) { return std::isspace(static_cast<unsigned char>(c)); });
    return out;  // whitespace removed: h5dump's line breaking is not our concern
  };
  EXPECT_NE(dump("/model/bf16").find("1.5,-2.25,0.0078125,3"), std::string::npos) << dump("/model/bf16");
  EXPECT_NE(dump("/model/f16").find("1.5,-2.25,0.0078125,3"), std::string::npos) << dump("/model/f16");
  EXPECT_NE(dump("/model/e5m2").find("1.5,-2,0.0078125,3"), std::string::npos) << dump("/model/e5m2");
  // The index tables (format v2) print too: record fields by name, dtypes as enumeration names.
  const std::string tensors = dump("/meta/tensors");
  EXPECT_NE(tensors.find("\"key_offset\""), std::string::npos) << tensors;
  EXPECT_NE(tensors.find("bf16"), std::string::npos) << tensors;
  EXPECT_NE(tensors.find("f8e5m2"), std::string::npos) << tensors;
}

TEST_F(Dtypes, F32CheckpointIntoBf16BufferRoundsToNearestEven) {
  Topology topo = topo_of(1, world_size());
  std::mt19937 rng(7);
  std::vector<float> src(1000);
  for (auto& v : src) v = std::uniform_real_distribution<float>(-1000, 1000)(rng);
  src[0] = 1.00390625f;  // exactly halfway between two bf16 values: ties to even (1.0)
  src[1] = 1.01171875f;  // halfway, odd below: rounds up to 1.015625
  StateDict st;
  st.add_replicated("model/w", DType::kF32, {1000}, src.data());
  Checkpointer ck(topo);
  ASSERT_TRUE(ck.save(st, root_ + "/f32").ok());
  std::vector<uint16_t> dst(1000);
  StateDict want;
  want.add_replicated("model/w", DType::kBF16, {1000}, dst.data());
  for (bool aggregate : {false, true}) {  // per-item reads, and two-phase reads
    LoadOptions o;
    o.aggregate_reads = aggregate;
    o.read_window_bytes = 1024;
    std::fill(dst.begin(), dst.end(), 0xFFFF);
    auto r = ck.load(want, root_ + "/f32", o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    for (size_t i = 0; i < src.size(); ++i) {
      uint32_t u;
      std::memcpy(&u, &src[i], 4);
      const uint16_t expect = static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);  // RNE, finite inputs
      ASSERT_EQ(dst[i], expect) << "element " << i << " value " << src[i] << (aggregate ? " (aggregated)" : "");
    }
    EXPECT_EQ(dst[0], 0x3F80);
    EXPECT_EQ(dst[1], 0x3F82);
  }
  // Without conversion allowed, the dtype difference is an error.
  LoadOptions strict_types;
  strict_types.convert_dtype = false;
  auto r2 = ck.load(want, root_ + "/f32", strict_types);
  EXPECT_EQ(r2.status().code(), ErrorCode::kDtypeMismatch);
}

// A padded vocabulary loaded into another dtype: the stored rows are converted, the padding rows
// come out as zeros. Through two-phase reads the item lands in uninitialized scratch first (the
// test runs with MALLOC_PERTURB_, so that scratch holds garbage): its padding must be zeroed
// before the conversion, not taken from whatever the memory held.
TEST_F(Dtypes, PaddedVocabularyConvertsPaddingToZeros) {
  const int n = world_size();
  Topology topo = topo_of(n, 1);
  std::vector<float> full(37 * 4);
  for (size_t i = 0; i < full.size(); ++i) full[i] = 0.25f * float(i);  // at most 8 significant bits: exact in bf16
  ASSERT_TRUE(save_vocabulary(topo, full, root_ + "/vocab"));
  const Shape want{40, 4};
  ShardSpec s = ShardSpec::split(want, 0, n, topo.coords().tp);
  std::vector<uint16_t> buf(s.numel() + 1, 0xFFFF);
  StateDict st;
  st.add("model/embed", DType::kBF16, want, s, buf.data()).allow_shape_mismatch = true;
  Checkpointer ck(topo);
  for (bool aggregate : {false, true}) {  // per-item reads, and two-phase reads
    LoadOptions o;
    o.aggregate_reads = aggregate;
    o.read_window_bytes = 64;
    std::fill(buf.begin(), buf.end() - 1, 0xFFFF);
    auto r = ck.load(st, root_ + "/vocab", o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    for (int64_t j = 0; j < s.numel(); ++j) {
      const int64_t row = s.box.offset[0] + j / 4;
      uint32_t u = 0;
      if (row < 37) std::memcpy(&u, &full[row * 4 + j % 4], 4);
      ASSERT_EQ(buf[j], static_cast<uint16_t>(u >> 16))
          << "row " << row << " element " << j % 4 << (aggregate ? " (aggregated)" : "");
    }
    EXPECT_EQ(buf.back(), 0xFFFF) << "wrote past the buffer";
  }
}

TEST_F(Dtypes, PaddedVocabularyShapeMismatch) {
  const int n = world_size();
  Topology topo = topo_of(n, 1);
  std::vector<float> full(37 * 4);
  for (size_t i = 0; i < full.size(); ++i) full[i] = float(i) + 0.5f;
  ASSERT_TRUE(save_vocabulary(topo, full, root_ + "/vocab"));
  for (int64_t rows : {40, 32}) {  // padded up, and shrunk
    const Shape want{rows, 4};
    ShardSpec s = ShardSpec::split(want, 0, n, topo.coords().tp);
    std::vector<float> buf(s.numel() + 1, -1.0f);
    StateDict st;
    StateItem& it = st.add("model/embed", DType::kF32, want, s, buf.data());
    Checkpointer ck(topo);
    auto strict = ck.load(st, root_ + "/vocab");
    EXPECT_EQ(strict.status().code(), ErrorCode::kShapeMismatch);
    it.allow_shape_mismatch = true;
    for (bool aggregate : {false, true}) {  // per-item reads, and two-phase reads
      LoadOptions o;
      o.aggregate_reads = aggregate;
      o.read_window_bytes = 64;
      std::fill(buf.begin(), buf.end() - 1, -1.0f);
      auto r = ck.load(st, root_ + "/vocab", o);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      for (int64_t j = 0; j < s.numel(); ++j) {
        const int64_t row = s.box.offset[0] + j / 4;
        const float expect = row < 37 ? full[row * 4 + j % 4] : 0.0f;
        ASSERT_EQ(buf[j], expect) << "rows " << rows << " element " << j << (aggregate ? " (aggregated)" : "");
      }
      EXPECT_EQ(buf.back(), -1.0f) << "wrote past the buffer";
    }
  }
  // Padding only: a transposed tensor, another hidden size or an emptied vocabulary is refused
  // even with allow_shape_mismatch, and the buffer is left untouched.
  for (const Shape& want : {Shape{4, 37}, Shape{37, 8}, Shape{40, 2}, Shape{0, 4}}) {
    ShardSpec s = ShardSpec::split(want, 0, n, topo.coords().tp);
    std::vector<float> buf(s.numel() + 1, -1.0f);
    StateDict st;
    st.add("model/embed", DType::kF32, want, s, buf.data()).allow_shape_mismatch = true;
    Checkpointer ck(topo);
    auto r = ck.load(st, root_ + "/vocab");
    EXPECT_EQ(r.status().code(), ErrorCode::kShapeMismatch) << to_string_shape(want) << ": " << r.status().to_string();
    for (float x : buf) ASSERT_EQ(x, -1.0f) << "a refused load wrote into the buffer";
  }
}

namespace {
// Reads a whole dataset through the HDF5 library (independent of h5ckpt's reader).
std::vector<unsigned char> h5_read_all(const std::string& file, const std::string& ds) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, ds.c_str(), H5P_DEFAULT);
  hid_t t = H5Dget_type(d);
  std::vector<unsigned char> out(H5Dget_storage_size(d));
  H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data());
  H5Tclose(t);
  H5Dclose(d);
  H5Fclose(f);
  return out;
}
}  // namespace

TEST_F(Dtypes, SaveReshardLoadResaveIsIdentical) {
  using h5ckpt::testing::Layout;
  const auto layouts = h5ckpt::testing::layouts_for(world_size());
  const Layout a = layouts.front(), b = layouts.back();
  {
    auto t = Topology::create(MPI_COMM_WORLD, {a.tp, a.dp, a.pp});
    h5ckpt::testing::TestModel m(a, t->coords(), true);
    Checkpointer ck(*t);
    ASSERT_TRUE(ck.save(m.state(), root_ + "/a").ok());
  }
  {
    auto t = Topology::create(MPI_COMM_WORLD, {b.tp, b.dp, b.pp});
    h5ckpt::testing::TestModel m(b, t->coords(), false);
    Checkpointer ck(*t);
    ASSERT_TRUE(ck.load(m.state(), root_ + "/a").ok());
    ASSERT_TRUE(ck.save(m.state(), root_ + "/b").ok());
  }
  if (world_rank() != 0) return;
  auto ia = read_checkpoint_info(root_ + "/a");
  auto ib = read_checkpoint_info(root_ + "/b");
  ASSERT_TRUE(ia.ok() && ib.ok());
  ASSERT_EQ(ia->tensors.size(), ib->tensors.size());
  for (size_t i = 0; i < ia->tensors.size(); ++i) {
    ASSERT_EQ(ia->tensors[i].key, ib->tensors[i].key);
    const std::string ds = "/" + ia->tensors[i].key;
    EXPECT_EQ(h5_read_all(root_ + "/a/data.h5", ds), h5_read_all(root_ + "/b/data.h5", ds)) << ds;
  }
}
