// O_DIRECT writes: long runs bypass the page cache (through the bounce buffer when the caller's
// memory is not block-aligned), their unaligned ends and short runs do not; the file is the same
// as with buffered writes and every element reads back as computed.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "support/test_model.h"

using namespace h5ckpt;
using h5ckpt::testing::sum_all;
using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;
namespace fs = std::filesystem;

namespace {

float value(int tensor, int64_t flat) { return static_cast<float>(tensor * 1000003 + flat) * 0.5f; }

// Shards of three tensors under this rank: row split (long runs with unaligned ends), column
// split (short runs), and uneven flat ranges; buffers start 4 bytes past an aligned address.
struct State {
  std::vector<std::vector<float>> storage;
  std::vector<float*> bufs;
  StateDict sd;
  State(bool fill) {
    const int n = world_size(), r = world_rank();
    const Shape rows{1031, 1000}, cols{300, 1000}, flat{3, 700001};
    add(0, rows, ShardSpec::split(rows, 0, n, r), fill);
    add(1, cols, ShardSpec::split(cols, 1, n, r), fill);
    const int64_t total = flat[0] * flat[1], b = total * r / n + (r ? 17 : 0),
                  e = total * (r + 1) / n + (r + 1 < n ? 17 : 0);
    add(2, flat, ShardSpec::flat_range(Box{{0, 0}, flat}, b, e), fill);
  }
  void add(int t, const Shape& shape, const ShardSpec& spec, bool fill) {
    storage.emplace_back(static_cast<size_t>(spec.numel()) + 1, -1.0f);
    float* p = storage.back().data() + 1;  // deliberately not block-aligned
    for (int64_t j = 0; fill && j < spec.numel(); ++j)
      p[j] = value(t, h5ckpt::testing::global_flat_index(spec, shape, j));
    bufs.push_back(p);
    sd.add("model/t" + std::to_string(t), DType::kF32, shape, spec, p);
  }
};

TEST(DirectIo, SameFileAsBufferedWritesAndExactValues) {
  const std::string root = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "dio");
  ASSERT_FALSE(root.empty());
  auto topo = Topology::create(MPI_COMM_WORLD, {world_size(), 1, 1});
  ASSERT_TRUE(topo.ok());
  State s(true);
  for (bool dio : {true, false}) {
    CheckpointerOptions o;
    o.direct_io = dio;
    o.max_piece_bytes = 1 << 20;  // pieces end mid-run too
    Checkpointer ck(*topo, o);
    auto r = ck.save(s.sd, root + (dio ? "/direct" : "/buffered"));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    if (dio) EXPECT_GT(sum_all(r->bytes_direct), 0u) << "no run took the O_DIRECT path";
    else EXPECT_EQ(sum_all(r->bytes_direct), 0u);
    // Summed: with aggregated writes (the column split's rows) a rank writes other ranks' bytes.
    EXPECT_LE(sum_all(r->bytes_direct), sum_all(r->bytes_written));
  }
  std::string why;
  EXPECT_TRUE(h5ckpt::testing::same_datasets(root + "/direct", root + "/buffered", &why)) << why;
  State back(false);
  Checkpointer ck(*topo);
  auto l = ck.load(back.sd, root + "/direct");
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  for (size_t t = 0; t < back.bufs.size(); ++t) {
    const StateItem& it = back.sd.items()[t];
    int64_t bad = 0;
    for (int64_t j = 0; j < it.shard.numel(); ++j)
      bad += back.bufs[t][j] !=
             value(static_cast<int>(t), h5ckpt::testing::global_flat_index(it.shard, it.global_shape, j));
    EXPECT_EQ(bad, 0) << it.key;
    EXPECT_EQ(back.storage[t][0], -1.0f) << "wrote before the buffer";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(root);
}

}  // namespace
