// Pieces of the trainer workload that the end-to-end scripts rely on: the hash, the bf16
// rounding, exactness of the initial values, layout-independent tensor names, and an in-process
// check that one training step is the same under ZeRO and without it on the ranks given.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <map>

#include "workload.h"

using namespace h5ckpt;
using namespace h5ckpt::workload;

namespace {

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float float_of(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(Workload, Fnv1a32KnownVectors) {
  EXPECT_EQ(fnv1a32(""), 0x811c9dc5u);
  EXPECT_EQ(fnv1a32("a"), 0xe40c292cu);
  EXPECT_EQ(fnv1a32("foobar"), 0xbf9cf968u);
}

TEST(Workload, Bf16RoundsToNearestEven) {
  EXPECT_EQ(to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(to_bf16(float_of(0x3f808000u)), 0x3f80);  // tie, keep even
  EXPECT_EQ(to_bf16(float_of(0x3f818000u)), 0x3f82);  // tie, round up to even
  EXPECT_EQ(to_bf16(float_of(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(to_bf16(float_of(0x7f7fffffu)), 0x7f80);  // FLT_MAX rounds to inf
  uint16_t nan = to_bf16(float_of(0x7fc00001u));
  EXPECT_EQ(nan & 0x7f80, 0x7f80);
  EXPECT_NE(nan & 0x007f, 0);
  EXPECT_EQ(bits_of(from_bf16(0xc040)), 0xc0400000u);
}

TEST(Workload, InitialValuesAreExactInBf16AndFollowTheFormula) {
  for (uint32_t h : {0u, 17u, 250u})
    for (int64_t i = 0; i < 2000; ++i) {
      float v = initial_value(i, h);
      EXPECT_EQ(from_bf16(to_bf16(v)), v);
      EXPECT_EQ(v * 128.0f, static_cast<float>((i * 7 + h) % 251) - 125.0f);
    }
  EXPECT_EQ(target_value(5, 2), 0.0f);     // (15 + 2) mod 17 = 0
  EXPECT_EQ(target_value(5, 1), 1.0f);     // 16 / 16
  EXPECT_EQ(target_value(0, 3), 0.1875f);  // 3 / 16
}

TEST(Workload, TensorNamesDoNotDependOnTheLayout) {
  ModelConfig m;
  m.layers = 5;
  m.vocab = 1001;
  auto names = [&](int tp, int pp) {
    std::map<std::string, Shape> out;
    for (const auto& d : model_tensors(m, tp, pp)) out[d.fqn] = d.shape;
    return out;
  };
  auto a = names(1, 1), b = names(4, 3);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [k, s] : a) {
    ASSERT_TRUE(b.count(k)) << k;
    if (k == "embedding.word_embeddings.weight" || k == "output_layer.weight") {
      EXPECT_EQ(s[0], 1001);
      EXPECT_EQ(b[k][0], 1004);  // padded to a multiple of tp
    } else {
      EXPECT_EQ(s, b[k]) << k;
    }
  }
  // 5 layers over 3 stages: 2, 2, 1.
  int on_stage[3] = {0, 0, 0};
  for (const auto& d : model_tensors(m, 4, 3))
    if (d.fqn.rfind("decoder.layers.", 0) == 0 && d.fqn.find("input_layernorm.weight") != std::string::npos)
      ++on_stage[d.stages.at(0)];
  EXPECT_EQ(on_stage[0], 2);
  EXPECT_EQ(on_stage[1], 2);
  EXPECT_EQ(on_stage[2], 1);
}

TEST(Workload, BadOptionsAreRejectedWithAClearMessage) {
  TrainConfig c;
  c.sizes = {2, 2, 2};
  EXPECT_TRUE(c.validate(8).ok());
  Status st = c.validate(4);
  EXPECT_NE(st.message().find("world size 4 != tp*pp*dp"), std::string::npos) << st.message();
  c.model.kv_heads = 3;
  c.model.heads = 9;
  c.model.hidden = 513;
  EXPECT_NE(c.validate(8).message().find("--kv-heads must be a multiple of --tp"), std::string::npos);
}

// One step on this world's ranks as TP=1, PP=1, DP=world, with and without ZeRO: the saved
// items differ in their sharding, but the model params must be bitwise equal.
TEST(Workload, ZeroAndPlainStepAgree) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  TrainConfig c;
  c.model = {2, 32, 4, 2, 64, 100, DType::kBF16, false};
  c.sizes = {1, world, 1};
  auto topo = Topology::create(MPI_COMM_WORLD, c.sizes);
  ASSERT_TRUE(topo.ok()) << topo.status().to_string();
  Workload plain(c, *topo);
  c.zero = true;
  Workload zero(c, *topo);
  for (int i = 0; i < 3; ++i) {
    plain.train_step();
    zero.train_step();
  }
  StateDict a, b;
  plain.stage_save(a);
  zero.stage_save(b);
  int compared = 0;
  for (const auto& it : a.items()) {
    if (it.key.rfind("model/", 0) != 0) continue;
    const StateItem* o = b.find(it.key);
    ASSERT_NE(o, nullptr) << it.key;
    ASSERT_EQ(it.shard.numel(), o->shard.numel());
    EXPECT_EQ(std::memcmp(it.data, o->data, static_cast<size_t>(it.shard.numel()) * 2), 0) << it.key;
    ++compared;
  }
  EXPECT_GT(compared, 20);
  // ZeRO optimizer items are flat ranges of the TP box; without ZeRO they are the box itself.
  for (const auto& it : b.items())
    if (it.key.rfind("optimizer/exp_avg/", 0) == 0) EXPECT_TRUE(it.shard.flat.has_value()) << it.key;
  EXPECT_EQ(plain.global_step(), 3);
}

}  // namespace
