// Cross product of save layouts x load layouts: every rank checks every element it loads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include "support/test_model.h"

using h5ckpt::testing::max_all;
using h5ckpt::testing::sum_all;
using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;

using namespace h5ckpt;
using h5ckpt::testing::Layout;

namespace {

Topology make_topology(const Layout& L) {
  auto t = Topology::create(MPI_COMM_WORLD, ParallelSizes{L.tp, L.dp, L.pp});
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(t).value();
}

}  // namespace

TEST(Reshard, EveryLayoutPair) {
  const auto layouts = h5ckpt::testing::layouts_for(world_size());
  const std::string root = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "reshard");
  ASSERT_FALSE(root.empty());
  // Save once per layout, then load every checkpoint under every layout.
  for (const Layout& s : layouts) {
    Topology topo = make_topology(s);
    h5ckpt::testing::TestModel model(s, topo.coords(), /*fill=*/true);
    Checkpointer ck(topo);
    auto saved = ck.save(model.state(), root + "/" + s.name());
    ASSERT_TRUE(saved.ok()) << s.name() << ": " << saved.status().to_string();
  }
  for (const Layout& s : layouts) {
    for (const Layout& l : layouts) {
      Topology topo = make_topology(l);
      h5ckpt::testing::TestModel model(l, topo.coords(), /*fill=*/false);
      Checkpointer ck(topo);
      auto loaded = ck.load(model.state(), root + "/" + s.name());
      ASSERT_TRUE(loaded.ok()) << s.name() << " -> " << l.name() << ": " << loaded.status().to_string();
      std::string first;
      EXPECT_EQ(model.count_mismatches(&first), 0)
          << "saved " << s.name() << ", loaded " << l.name() << ": first mismatch at " << first;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::filesystem::remove_all(root);
}

TEST(Reshard, ReplicasWrittenOnceAndBalanced) {
  // Pure DP: every rank holds the same tensors; each unique region must be written exactly once
  // and the bytes spread over the replicas.
  const int n = world_size();
  Topology topo = make_topology(Layout{1, n, 1, false});
  const std::string root = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "replicas");
  h5ckpt::testing::TestModel model(Layout{1, n, 1, false}, topo.coords(), true);
  Checkpointer ck(topo);
  auto saved = ck.save(model.state(), root + "/ckpt");
  ASSERT_TRUE(saved.ok()) << saved.status().to_string();
  uint64_t mine = saved->bytes_written, total = 0, most = 0;
  MPI_Allreduce(&mine, &total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&mine, &most, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(total, saved->bytes_total) << "replicated bytes must be written exactly once";
  if (n > 1) EXPECT_LT(most, saved->bytes_total) << "one rank wrote everything";
  auto info = read_checkpoint_info(root + "/ckpt");
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  for (const auto& t : info->tensors) EXPECT_EQ(t.regions.size(), 1u) << t.key;
  MPI_Barrier(MPI_COMM_WORLD);
  if (topo.rank() == 0) std::filesystem::remove_all(root);
}

TEST(Reshard, CallerCommunicatorsInAnotherRankOrder) {
  // The caller builds its own grid with PP fastest, then TP, then DP; h5ckpt must take its
  // coordinates from those communicators, and a Megatron-order load must see the same data.
  const int n = world_size();
  const int pp = n % 2 == 0 ? 2 : 1, tp = (n / pp) % 2 == 0 ? 2 : 1, dp = n / (pp * tp);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int c_pp = rank % pp, c_tp = (rank / pp) % tp, c_dp = rank / (pp * tp);
  MPI_Comm tpc, dpc, ppc;
  MPI_Comm_split(MPI_COMM_WORLD, c_dp * pp + c_pp, c_tp, &tpc);
  MPI_Comm_split(MPI_COMM_WORLD, c_tp * pp + c_pp, c_dp, &dpc);
  MPI_Comm_split(MPI_COMM_WORLD, c_dp * tp + c_tp, c_pp, &ppc);
  const std::string root = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "comms");
  {
    auto topo = Topology::from_comms(MPI_COMM_WORLD, tpc, dpc, ppc);
    ASSERT_TRUE(topo.ok()) << topo.status().to_string();
    EXPECT_EQ(topo->coords(), (RankCoords{c_tp, c_dp, c_pp}));
    Layout L{tp, dp, pp, true};
    h5ckpt::testing::TestModel model(L, topo->coords(), true);
    Checkpointer ck(*topo);
    auto saved = ck.save(model.state(), root + "/ckpt");
    ASSERT_TRUE(saved.ok()) << saved.status().to_string();
  }
  MPI_Comm_free(&tpc);
  MPI_Comm_free(&dpc);
  MPI_Comm_free(&ppc);
  Layout M{1, n, 1, false};
  Topology topo = make_topology(M);
  h5ckpt::testing::TestModel model(M, topo.coords(), false);
  Checkpointer ck(topo);
  auto loaded = ck.load(model.state(), root + "/ckpt");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  std::string first;
  EXPECT_EQ(model.count_mismatches(&first), 0) << first;
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(root);
}

// LoadReport's split of a load's time: open_s inside plan_s, io_s (pread) and copy_s (bounce
// copies) inside the reads. Rows read whole land in place (no copy); a column shard of narrow
// rows and a dtype conversion go through the bounce buffer. Values are checked too.
TEST(Reshard, LoadReportSaysWhereTheTimeWent) {
  const int n = world_size(), me = world_rank();
  Topology topo = make_topology(Layout{n, 1, 1, false});
  const std::string root = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "reshard_report");
  ASSERT_FALSE(root.empty());
  const Shape shape{512, 64};  // rows of 256 bytes: a column shard's runs are read through the bounce buffer
  auto value = [](int64_t r, int64_t c) { return static_cast<float>(r * 64 + c) * 0.5f; };
  const ShardSpec rows = ShardSpec::split(shape, 0, n, me);
  std::vector<float> saved(static_cast<size_t>(rows.numel()));
  for (int64_t r = 0; r < rows.box.shape[0]; ++r)
    for (int64_t c = 0; c < 64; ++c) saved[static_cast<size_t>(r * 64 + c)] = value(rows.box.offset[0] + r, c);
  Checkpointer ck(topo);
  {
    StateDict st;
    st.add("model/w", DType::kF32, shape, rows, saved.data());
    auto s = ck.save(st, root + "/ckpt");
    ASSERT_TRUE(s.ok()) << s.status().to_string();
  }
  LoadOptions plain;
  plain.verify = false;  // the reads alone: no checks, no landing buffers
  // Loads "model/w" as `dtype` into `buf`, laid out as `shard`, and checks the report's split.
  auto load_into = [&](DType dtype, const ShardSpec& shard, void* buf, const LoadOptions& options, const char* what) {
    StateDict st;
    st.add("model/w", dtype, shape, shard, buf);
    auto loaded = ck.load(st, root + "/ckpt", options);
    EXPECT_TRUE(loaded.ok()) << what << ": " << loaded.status().to_string();
    const LoadReport r = loaded.ok() ? *loaded : LoadReport{};
    EXPECT_GT(r.open_s, 0.0) << what;
    EXPECT_LE(r.open_s, r.plan_s) << what;
    EXPECT_GT(r.io_s, 0.0) << what;
    EXPECT_LE(r.io_s, r.read_s * r.io_threads) << what;
    EXPECT_LE(r.copy_s, r.read_s * r.io_threads) << what;
    return r;
  };
  {  // the saving layout: each row block is one run, read straight into the buffer
    std::vector<float> got(saved.size(), -1.f);
    const LoadReport r = load_into(DType::kF32, rows, got.data(), plain, "rows");
    EXPECT_EQ(r.copy_s, 0.0) << "nothing goes through the bounce buffer";
    EXPECT_EQ(got, saved);
  }
  {  // a column shard (one per rank, so that every rank reads): runs of at most 32 floats 256
     // bytes apart, batched into bounce reads and copied out
    const ShardSpec cols = ShardSpec::split(shape, 1, std::max(2, n), me);
    const int64_t width = cols.box.shape[1];
    std::vector<float> got(static_cast<size_t>(cols.numel()), -1.f);
    EXPECT_GT(load_into(DType::kF32, cols, got.data(), plain, "columns").copy_s, 0.0);
    int64_t bad = 0;
    for (int64_t i = 0; i < 512; ++i)
      for (int64_t c = 0; c < width; ++c)
        bad += got[static_cast<size_t>(i * width + c)] != value(i, cols.box.offset[1] + c);
    EXPECT_EQ(bad, 0);
  }
  {  // f32 into bf16: converted through the bounce buffer
    LoadOptions convert = plain;
    convert.convert_dtype = true;
    std::vector<uint16_t> got(saved.size(), 0);
    EXPECT_GT(load_into(DType::kBF16, rows, got.data(), convert, "bf16").copy_s, 0.0);
    int64_t bad = 0;  // against the f32 bits rounded to nearest even here
    for (size_t i = 0; i < saved.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &saved[i], 4);
      const uint32_t rounded = (bits + 0x7fff + ((bits >> 16) & 1)) >> 16;  // round to nearest even
      bad += got[i] != static_cast<uint16_t>(rounded);
    }
    EXPECT_EQ(bad, 0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == 0) std::filesystem::remove_all(root);
}
