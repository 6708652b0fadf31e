// A synthetic data loader over the library's loader state (h5ckpt/loader_state.h): K sources
// whose sample lengths are a hash of (seed, source, record), the strided walk that advances a
// shard, and the exactly-once checker. Used by h5ckpt-train, the benchmark and the tests; not
// part of the installed library (target h5ckpt_extras).
#pragma once

#include <cstdint>
#include <vector>

#include "h5ckpt/loader_state.h"

namespace h5ckpt::extras {

using loader::LoaderConfig;
using loader::Piece;
using loader::RankLoader;
using loader::ReplicatedState;
using loader::SampleId;
using loader::ShardState;

/// Three sources (web, code, books) with different length ranges.
LoaderConfig default_loader_config(uint64_t seed, int32_t workers_per_rank = 2, int64_t context_len = 2048);

/// Token length of a sample: a pure function of (seed, source, record).
int64_t sample_length(const LoaderConfig& config, SampleId id);

/// Fills `shard`'s buffer up to one window (pending first, then its strided walk) and consumes
/// `context_len` tokens from its front. Returns the consumed pieces, in order.
std::vector<Piece> next_window(const ReplicatedState& rep, ShardState& shard);
/// One window of worker `worker` of a DP rank's loader.
std::vector<Piece> next_window(RankLoader& loader, int worker);

/// Checks that `consumed` (every piece handed out over the whole run, any order) together with
/// the loader's current state accounts for every token of every sample exactly once:
/// each sample's consumed tokens form a prefix [0, c) without overlap; c == length, or the rest
/// [c, length) sits in exactly one buffer; untouched samples are pending in exactly one shard
/// or ahead of exactly one shard's walk. Returns counts in `summary` when given.
struct VerifySummary {
  int64_t samples_complete = 0, samples_partial = 0, samples_pending = 0, tokens_consumed = 0;
};
Status verify_exactly_once(const ReplicatedState& rep, const std::vector<ShardState>& shards,
                           const std::vector<Piece>& consumed, VerifySummary* summary = nullptr);

}  // namespace h5ckpt::extras
