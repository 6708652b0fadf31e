// Loader-state split/merge: replay consumption across DP changes and check, token by token,
// that every sample is consumed exactly once (an independent count, not only the library's
// own verify_exactly_once).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <tuple>

#include "extras/extra_states.h"
#include "extras/synthetic_loader.h"
#include "h5ckpt/loader_state.h"

using namespace h5ckpt;
using namespace h5ckpt::extras;
using namespace h5ckpt::loader;

namespace {

// A whole loader (all shards) plus everything it ever handed out.
struct Sim {
  ReplicatedState rep;
  std::vector<ShardState> shards;
  std::vector<Piece> ledger;
  // Independent bookkeeping: how often each token of each sample was handed out.
  std::map<SampleId, std::vector<int>> token_count;

  Sim(const LoaderConfig& c, int dp) {
    rep = initial_replicated(c, int64_t{dp} * c.workers_per_rank);
    for (int64_t s = 0; s < rep.num_shards; ++s) shards.push_back(initial_shard(rep, s));
  }
  int dp() const { return static_cast<int>(rep.num_shards / rep.config.workers_per_rank); }

  void window(size_t shard) {
    auto pieces = next_window(rep, shards[shard]);
    int64_t total = 0;
    for (const auto& p : pieces) {
      auto& v = token_count[p.id];
      if (static_cast<int64_t>(v.size()) < p.end) v.resize(static_cast<size_t>(p.end), 0);
      for (int64_t t = p.begin; t < p.end; ++t) ++v[static_cast<size_t>(t)];
      total += p.end - p.begin;
      ledger.push_back(p);
    }
    ASSERT_EQ(total, rep.config.context_len);
  }
  // One training step as the trainer runs it: each DP rank takes a window from worker
  // step % workers; some steps some ranks take an extra one so the shards drift apart.
  void steps(int n, std::mt19937& rng) {
    const int R = rep.config.workers_per_rank;
    for (int i = 0; i < n; ++i) {
      for (int d = 0; d < dp(); ++d) {
        window(static_cast<size_t>(d * R + i % R));
        if (rng() % 3 == 0) window(static_cast<size_t>(d * R + (i + 1) % R));
      }
    }
  }
  // Save every shard to bytes, parse back (as a checkpoint would), then reshard.
  void resize(int new_dp) {
    auto rep_bytes = serialize(rep);
    std::vector<std::vector<uint8_t>> blobs;
    for (const auto& s : shards) blobs.push_back(serialize(s));
    auto rep2 = parse_replicated(rep_bytes.data(), rep_bytes.size());
    ASSERT_TRUE(rep2.ok()) << rep2.status().to_string();
    std::vector<ShardState> parsed;
    for (const auto& b : blobs) {
      auto s = parse_shard(b.data(), b.size());
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      parsed.push_back(*s);
    }
    EXPECT_EQ(parsed, shards);
    auto rs = reshard(*rep2, parsed, int64_t{new_dp} * rep.config.workers_per_rank);
    ASSERT_TRUE(rs.ok()) << rs.status().to_string();
    rep = rs->replicated;
    shards = rs->shards;
    ASSERT_EQ(static_cast<int>(shards.size()), new_dp * rep.config.workers_per_rank);
  }

  // Consume until no shard has pending samples, then check every token below the slowest
  // walk was handed out exactly once (or still waits, unconsumed, in exactly one buffer).
  void drain_and_check() {
    for (int round = 0; round < 1000; ++round) {
      bool any = false;
      for (size_t s = 0; s < shards.size(); ++s)
        if (!shards[s].pending.empty()) {
          any = true;
          window(s);
        }
      if (!any) break;
    }
    std::map<SampleId, int64_t> in_buffer;
    for (const auto& s : shards) {
      EXPECT_TRUE(s.pending.empty());
      for (const auto& b : s.buffer) EXPECT_TRUE(in_buffer.emplace(b.id, b.offset).second);
    }
    for (const auto& [id, counts] : token_count)
      for (size_t t = 0; t < counts.size(); ++t)
        ASSERT_LE(counts[t], 1) << "source " << id.source << " record " << id.record << " token " << t;
    int64_t checked = 0;
    for (size_t k = 0; k < rep.config.sources.size(); ++k) {
      int64_t frontier = INT64_MAX;
      for (const auto& s : shards) frontier = std::min(frontier, s.next[k]);
      const auto& src = rep.config.sources[k];
      for (int64_t r = 0; r < frontier; ++r) {
        SampleId id{static_cast<int32_t>(k), r};
        int64_t len = sample_length(rep.config, id);
        ASSERT_GE(len, src.min_len);
        ASSERT_LE(len, src.max_len);
        auto it = token_count.find(id);
        int64_t consumed_to = in_buffer.count(id) ? in_buffer[id] : len;
        for (int64_t t = 0; t < len; ++t) {
          int got = (it != token_count.end() && t < static_cast<int64_t>(it->second.size()))
                        ? it->second[static_cast<size_t>(t)]
                        : 0;
          ASSERT_EQ(got, t < consumed_to ? 1 : 0)
              << "source " << k << " record " << r << " token " << t << " of " << len;
        }
        ++checked;
      }
    }
    EXPECT_GT(checked, 10);
    VerifySummary sum;
    Status st = verify_exactly_once(rep, shards, ledger, &sum);
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
};

LoaderConfig small_config(int workers) {
  // Short windows and lengths spanning below and above the window, so buffers hold partial
  // samples and whole ones at the same time.
  LoaderConfig c;
  c.seed = 1234;
  c.workers_per_rank = workers;
  c.context_len = 256;
  c.sources = {{"web", 0.6, 8, 200}, {"code", 0.3, 50, 400}, {"books", 0.1, 300, 900}};
  return c;
}

class Reshard : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(Reshard, SplitMergeAndBackIsExactlyOnce) {
  auto [from, to, workers] = GetParam();
  std::mt19937 rng(static_cast<unsigned>(from * 100 + to * 10 + workers));
  Sim sim(small_config(workers), from);
  sim.steps(9, rng);
  {
    Status st = verify_exactly_once(sim.rep, sim.shards, sim.ledger);
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  sim.resize(to);
  {
    Status st = verify_exactly_once(sim.rep, sim.shards, sim.ledger);
    ASSERT_TRUE(st.ok()) << "right after " << from << "->" << to << ": " << st.to_string();
  }
  sim.steps(7, rng);
  sim.resize(from);
  sim.steps(5, rng);
  sim.drain_and_check();
}

INSTANTIATE_TEST_SUITE_P(Dp, Reshard,
                         ::testing::Values(std::make_tuple(4, 2, 2), std::make_tuple(2, 3, 2), std::make_tuple(3, 4, 2),
                                           std::make_tuple(1, 8, 2), std::make_tuple(4, 2, 1), std::make_tuple(2, 3, 1),
                                           std::make_tuple(3, 4, 1), std::make_tuple(1, 8, 1),
                                           std::make_tuple(8, 1, 3)),
                         [](const auto& info) {
                           return "dp" + std::to_string(std::get<0>(info.param)) + "_to_dp" +
                                  std::to_string(std::get<1>(info.param)) + "_w" +
                                  std::to_string(std::get<2>(info.param));
                         });

TEST(Reshard, ChainOfManySizes) {
  std::mt19937 rng(7);
  Sim sim(small_config(2), 4);
  for (int dp : {2, 3, 4, 1, 8, 5, 8, 2}) {
    sim.steps(4, rng);
    sim.resize(dp);
  }
  sim.steps(3, rng);
  sim.drain_and_check();
}

// Worked example, computed by hand: one source, 2 shards -> 3 shards.
TEST(Reshard, HandComputedExample) {
  LoaderConfig c;
  c.seed = 1;
  c.workers_per_rank = 1;
  c.context_len = 10;
  c.sources = {{"only", 1.0, 5, 5}};
  ReplicatedState rep = initial_replicated(c, 2);
  ShardState s0 = initial_shard(rep, 0), s1 = initial_shard(rep, 1);
  // Shard 0 fetched records 0, 2, 4 and consumed 12 of their 15 tokens: record 4 has 3 left.
  s0.next = {6};
  s0.buffer = {{{0, 4}, 2, 5}};
  // Shard 1 fetched record 1 only, fully consumed.
  s1.next = {3};
  auto rs = reshard(rep, {s1, s0}, 3);
  ASSERT_TRUE(rs.ok()) << rs.status().to_string();
  EXPECT_EQ(rs->replicated.base, std::vector<int64_t>{6});
  EXPECT_EQ(rs->replicated.num_shards, 3);
  ASSERT_EQ(rs->shards.size(), 3u);
  // New walks: 6, 9, ... / 7, 10, ... / 8, 11, ...
  EXPECT_EQ(rs->shards[0].next, std::vector<int64_t>{6});
  EXPECT_EQ(rs->shards[1].next, std::vector<int64_t>{7});
  EXPECT_EQ(rs->shards[2].next, std::vector<int64_t>{8});
  // Partial record 4 goes to shard 0; records 3 and 5 (shard 1's unfetched walk below 6)
  // become pending on shards 1 and 2.
  EXPECT_EQ(rs->shards[0].buffer, (std::vector<BufferedSample>{{{0, 4}, 2, 5}}));
  EXPECT_TRUE(rs->shards[0].pending.empty());
  EXPECT_EQ(rs->shards[1].pending, (std::vector<SampleId>{{0, 3}}));
  EXPECT_EQ(rs->shards[2].pending, (std::vector<SampleId>{{0, 5}}));
  // Shard 1 then serves 3 and continues its walk at 7: window of 10 tokens = 3 (5) + 7 (5).
  auto pieces = next_window(rs->replicated, rs->shards[1]);
  EXPECT_EQ(pieces, (std::vector<Piece>{{{0, 3}, 0, 5}, {{0, 7}, 0, 5}}));
  EXPECT_EQ(rs->shards[1].next, std::vector<int64_t>{10});
  // The ledger so far: records 0, 2 whole, 4 up to 2, 1 whole.
  std::vector<Piece> ledger = {{{0, 0}, 0, 5}, {{0, 2}, 0, 5}, {{0, 4}, 0, 2},
                               {{0, 1}, 0, 5}, {{0, 3}, 0, 5}, {{0, 7}, 0, 5}};
  VerifySummary sum;
  Status st = verify_exactly_once(rs->replicated, rs->shards, ledger, &sum);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(sum.samples_complete, 5);  // 0, 1, 2, 3, 7
  EXPECT_EQ(sum.samples_partial, 1);   // 4
  EXPECT_EQ(sum.samples_pending, 1);   // 5
}

TEST(Reshard, SameShardCountIsIdentity) {
  std::mt19937 rng(3);
  Sim sim(small_config(2), 3);
  sim.steps(6, rng);
  auto before = sim.shards;
  std::reverse(before.begin(), before.end());
  auto rs = reshard(sim.rep, before, sim.rep.num_shards);
  ASSERT_TRUE(rs.ok());
  EXPECT_EQ(rs->shards, sim.shards);
  EXPECT_EQ(rs->replicated, sim.rep);
}

TEST(Reshard, IndependentOfInputOrder) {
  std::mt19937 rng(5);
  Sim sim(small_config(2), 4);
  sim.steps(6, rng);
  auto shuffled = sim.shards;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  auto a = reshard(sim.rep, sim.shards, 6);
  auto b = reshard(sim.rep, shuffled, 6);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->shards, b->shards);
}

TEST(Reshard, RejectsMissingOrForeignShards) {
  std::mt19937 rng(9);
  Sim sim(small_config(1), 3);
  sim.steps(3, rng);
  auto missing = sim.shards;
  missing.pop_back();
  EXPECT_EQ(reshard(sim.rep, missing, 2).status().code(), ErrorCode::kCorrupt);
  auto dup = sim.shards;
  dup[1] = dup[0];
  EXPECT_EQ(reshard(sim.rep, dup, 2).status().code(), ErrorCode::kCorrupt);
  auto off_walk = sim.shards;
  off_walk[0].next[0] += 1;  // not on shard 0's stride any more
  EXPECT_EQ(reshard(sim.rep, off_walk, 2).status().code(), ErrorCode::kCorrupt);
  EXPECT_EQ(reshard(sim.rep, sim.shards, 0).status().code(), ErrorCode::kInvalidArgument);
}

// The verifier must fail on each kind of mistake a reshard could make.
TEST(Verify, DetectsLossAndRepetition) {
  std::mt19937 rng(11);
  Sim sim(small_config(2), 4);
  sim.steps(5, rng);
  sim.resize(3);
  ASSERT_TRUE(verify_exactly_once(sim.rep, sim.shards, sim.ledger).ok());

  // A pending sample dropped: lost.
  auto lost = sim.shards;
  auto with_pending = std::find_if(lost.begin(), lost.end(), [](const ShardState& s) { return !s.pending.empty(); });
  ASSERT_NE(with_pending, lost.end()) << "a 4->3 reshard should leave pending samples";
  with_pending->pending.pop_back();
  Status st = verify_exactly_once(sim.rep, lost, sim.ledger);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("lost"), std::string::npos) << st.message();

  // A piece handed out twice: repeated.
  auto ledger = sim.ledger;
  ledger.push_back(ledger[3]);
  st = verify_exactly_once(sim.rep, sim.shards, ledger);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("twice"), std::string::npos) << st.message();

  // A consumed sample put back on a walk: would be repeated.
  auto behind = sim.shards;
  behind[0].next[0] -= sim.rep.num_shards * 4;
  EXPECT_FALSE(verify_exactly_once(sim.rep, behind, sim.ledger).ok());

  // A partial sample's buffer offset moved back: tokens would repeat.
  auto moved = sim.shards;
  auto with_buf = std::find_if(moved.begin(), moved.end(),
                               [](const ShardState& s) { return !s.buffer.empty() && s.buffer.front().offset > 0; });
  if (with_buf != moved.end()) {
    with_buf->buffer.front().offset -= 1;
    EXPECT_FALSE(verify_exactly_once(sim.rep, moved, sim.ledger).ok());
  }
}

TEST(Serialize, RoundTripAndTruncation) {
  std::mt19937 rng(13);
  Sim sim(small_config(2), 2);
  sim.steps(4, rng);
  sim.resize(3);
  for (const auto& s : sim.shards) {
    auto b = serialize(s);
    auto p = parse_shard(b.data(), b.size());
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, s);
    EXPECT_FALSE(parse_shard(b.data(), b.size() - 1).ok());
    b.push_back(0);
    EXPECT_FALSE(parse_shard(b.data(), b.size()).ok());
  }
  auto r = serialize(sim.rep);
  auto pr = parse_replicated(r.data(), r.size());
  ASSERT_TRUE(pr.ok());
  EXPECT_EQ(*pr, sim.rep);
  EXPECT_FALSE(parse_replicated(r.data(), r.size() / 2).ok());
  r[0] ^= 1;
  EXPECT_FALSE(parse_replicated(r.data(), r.size()).ok());
}

TEST(Keys, ShardKeysRoundTrip) {
  EXPECT_EQ(shard_key(3, 1), "loader/shard/dp3/worker1");
  auto k = parse_shard_key("loader/shard/dp12/worker0");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k->first, 12);
  EXPECT_EQ(k->second, 0);
  for (const char* bad : {"loader/shard/dp/worker0", "loader/shard/dpx/worker1", "loader/replicated",
                          "loader/shard/dp1/worker", "loader/shard/dp1/worker-1"})
    EXPECT_FALSE(parse_shard_key(bad).ok()) << bad;
  EXPECT_EQ(rng_key({1, 2, 3}), "extra/rng/tp1_dp2_pp3");
}

TEST(Walk, FreshShardsPartitionEachSource) {
  // Shard s of S reads records s, s+S, ...: with 3 shards and one source, the first records
  // fetched are 0,3,6 / 1,4,7 / 2,5,8.
  LoaderConfig c;
  c.seed = 2;
  c.workers_per_rank = 1;
  c.context_len = 30;
  c.sources = {{"only", 1.0, 10, 10}};
  ReplicatedState rep = initial_replicated(c, 3);
  for (int s = 0; s < 3; ++s) {
    ShardState sh = initial_shard(rep, s);
    auto p = next_window(rep, sh);
    ASSERT_EQ(p.size(), 3u);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(p[static_cast<size_t>(i)], (Piece{{0, s + 3 * i}, 0, 10}));
    EXPECT_TRUE(sh.buffer.empty());
    EXPECT_EQ(sh.next[0], s + 9);
  }
}

TEST(Walk, SourceMixFollowsRatios) {
  LoaderConfig c = default_loader_config(99, 1, 2048);
  ReplicatedState rep = initial_replicated(c, 1);
  ShardState sh = initial_shard(rep, 0);
  for (int i = 0; i < 400; ++i) next_window(rep, sh);
  int64_t total = sh.next[0] + sh.next[1] + sh.next[2];
  // Ratios 0.6 / 0.3 / 0.1 within a few percent.
  EXPECT_NEAR(static_cast<double>(sh.next[0]) / total, 0.6, 0.05);
  EXPECT_NEAR(static_cast<double>(sh.next[1]) / total, 0.3, 0.05);
  EXPECT_NEAR(static_cast<double>(sh.next[2]) / total, 0.1, 0.03);
}

TEST(Extra, RngRuleIsDeterministicAndPerRank) {
  RngState a = derive_rank_rng(42, 10, {0, 1, 0});
  RngState b = derive_rank_rng(42, 10, {0, 1, 0});
  EXPECT_EQ(a, b);
  EXPECT_NE(a.state, derive_rank_rng(42, 10, {1, 0, 0}).state);
  EXPECT_NE(a.state, derive_rank_rng(42, 11, {0, 1, 0}).state);
  EXPECT_NE(a.state, derive_rank_rng(43, 10, {0, 1, 0}).state);
  uint64_t x = a.next_u64(), y = a.next_u64();
  EXPECT_NE(x, y);
  EXPECT_EQ(a.draws, 2u);
  EXPECT_EQ(b.next_u64(), x);
}

TEST(Extra, LrSchedule) {
  LrSchedulerState constant;
  EXPECT_EQ(constant.lr(0), 1e-2f);
  EXPECT_EQ(constant.lr(1000), 1e-2f);
  LrSchedulerState s{1.0, 0.0, 4, 10, 0};
  EXPECT_FLOAT_EQ(s.lr(0), 0.25f);
  EXPECT_FLOAT_EQ(s.lr(3), 1.0f);
  EXPECT_FLOAT_EQ(s.lr(9), 0.5f);  // halfway through the cosine
  EXPECT_FLOAT_EQ(s.lr(14), 0.0f);
  EXPECT_FLOAT_EQ(s.lr(100), 0.0f);
}

}  // namespace
