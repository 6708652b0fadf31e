// Data-loader and extra training states (RNG, step, LR scheduler) as checkpointable,
// reshardable library state.
//
// The loader model (see docs/trainer.md): samples come from K sources; sample (k, r) is record r
// of source k and has a deterministic token length. The loader is split into S = dp * workers
// shards (shard id s = dp_rank * workers + worker). For each source k, shard s fetches records
// base[k] + s, base[k] + s + S, ... (a strided walk of the source), first serving its `pending`
// whole samples. Fetched samples go into a token buffer; each window consumes `context_len`
// tokens from the front of the buffer, possibly leaving the last sample partially consumed.
//
// Exactly-once across a change of S (a DP resize): reshard() moves every source's base to the
// largest `next` of any old shard; records below it that their old shard had not fetched yet
// become pending whole samples, and they are dealt, with the buffered partial samples, to the
// new shards. So every record is, at any time, in exactly one of: consumed (a prefix of its
// tokens was handed out), buffered (the rest of its tokens waits in one shard's buffer),
// pending in one shard, or ahead of one shard's strided walk. verify_exactly_once() checks it.
//
// Checkpoint items (all layout-independent names):
//   loader/replicated             bytes, saved once: config, shard count, bases, generation
//   loader/shard/dp<d>/worker<w>  bytes, one per shard (replicated over the TP/PP ranks of DP d)
//   extra/global_step             int64[1], replicated
//   extra/lr_scheduler            bytes, replicated
//   extra/rng/tp<t>_dp<d>_pp<p>   bytes, one per rank
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "h5ckpt/checkpointer.h"
#include "h5ckpt/state.h"
#include "h5ckpt/status.h"
#include "h5ckpt/topology.h"

namespace h5ckpt::loader {

/// One data source: its share of the samples and the range of its sample lengths (tokens).
struct SourceSpec {
  std::string name;
  double ratio = 1.0;
  int64_t min_len = 1;
  int64_t max_len = 1;
};

/// What a loader is, independent of how many shards run it.
struct LoaderConfig {
  uint64_t seed = 0;
  std::vector<SourceSpec> sources;
  int64_t context_len = 2048;  ///< tokens per window (one window per worker call)
  int32_t workers_per_rank = 1;

  /// Three sources (web, code, books) with different length ranges.
  static LoaderConfig default_config(uint64_t seed, int32_t workers_per_rank = 2,
                                     int64_t context_len = 2048);
  Status validate() const;
};

/// Record `record` of source `source`.
struct SampleId {
  int32_t source = 0;
  int64_t record = 0;
  auto operator<=>(const SampleId&) const = default;
};

/// A fetched sample whose tokens [offset, length) are still waiting in a token buffer.
struct BufferedSample {
  SampleId id;
  int64_t offset = 0;
  int64_t length = 0;
  bool operator==(const BufferedSample&) const = default;
};

/// Tokens [begin, end) of one sample handed to the model.
struct Piece {
  SampleId id;
  int64_t begin = 0;
  int64_t end = 0;
  bool operator==(const Piece&) const = default;
};

/// The replicated part, saved once.
struct ReplicatedState {
  LoaderConfig config;
  int64_t num_shards = 1;       ///< S: shards of the walk (dp * workers at the last reshard)
  std::vector<int64_t> base;    ///< per source: first record of the current strided walk
  int64_t generation = 0;       ///< number of reshards so far (informational)
  bool operator==(const ReplicatedState&) const;
};

/// The sharded part of one shard (one read worker of one DP rank).
struct ShardState {
  int64_t shard = 0;                    ///< global shard id in [0, num_shards)
  std::vector<int64_t> next;            ///< per source: next record of this shard's walk
  int64_t draws = 0;                    ///< source choices made so far (drives the choice hash)
  std::vector<SampleId> pending;        ///< whole samples to fetch before the walk, in order
  std::vector<BufferedSample> buffer;   ///< token buffer, front first
  int64_t tokens_consumed = 0;          ///< statistics
  int64_t samples_fetched = 0;
  bool operator==(const ShardState&) const = default;
};

// ---- pure functions -----------------------------------------------------------------------

/// Token length of a sample: a pure function of (seed, source, record).
int64_t sample_length(const LoaderConfig& config, SampleId id);

/// The state of a fresh loader with `num_shards` shards.
ReplicatedState initial_replicated(const LoaderConfig& config, int64_t num_shards);
/// Shard `shard` of a fresh walk (or of the walk described by `rep`, with nothing pending).
ShardState initial_shard(const ReplicatedState& rep, int64_t shard);

/// Fills `shard`'s buffer up to one window (pending first, then its strided walk) and consumes
/// `context_len` tokens from its front. Returns the consumed pieces, in order.
std::vector<Piece> next_window(const ReplicatedState& rep, ShardState& shard);

/// Result of a reshard: the new replicated part and all new shards (index = shard id).
struct Resharded {
  ReplicatedState replicated;
  std::vector<ShardState> shards;
};

/// Splits or merges `old_shards` (all of them, any order, ids 0..S-1) into `new_num_shards`.
/// With the same shard count the state is returned unchanged (a relabelling of ranks).
/// Deterministic: every rank computing it gets the same answer.
Result<Resharded> reshard(const ReplicatedState& rep, const std::vector<ShardState>& old_shards,
                          int64_t new_num_shards);

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

// ---- serialization and keys ---------------------------------------------------------------

std::vector<uint8_t> serialize(const ReplicatedState& rep);
std::vector<uint8_t> serialize(const ShardState& shard);
Result<ReplicatedState> parse_replicated(const uint8_t* data, size_t size);
Result<ShardState> parse_shard(const uint8_t* data, size_t size);

/// "loader/replicated".
const char* replicated_key();
/// "loader/shard/dp<d>/worker<w>".
std::string shard_key(int64_t dp_rank, int64_t worker);
/// Inverse of shard_key; an error for any other key.
Result<std::pair<int64_t, int64_t>> parse_shard_key(const std::string& key);

// ---- checkpoint integration ---------------------------------------------------------------

/// This DP rank's loader: the replicated part and its `workers_per_rank` shards.
struct RankLoader {
  ReplicatedState replicated;
  std::vector<ShardState> shards;  ///< index = worker

  /// A fresh loader for DP rank `dp_rank` of `dp_size`.
  static RankLoader fresh(const LoaderConfig& config, int dp_size, int dp_rank);
  /// One window of worker `worker`.
  std::vector<Piece> next_window(int worker);
};

/// Owns the byte buffers that a StateDict points to while the loader is saved or loaded.
/// Usage for save: stage_save(sd, loader, dp_rank), then Checkpointer::save(sd, ...).
/// Usage for load: stage_load(sd, info), Checkpointer::load(sd, ...), finish_load(...).
/// Every rank of a DP group stages the same items (replicas are written once by the library).
class LoaderCheckpoint {
 public:
  /// Serializes the replicated part and this rank's shards into owned buffers and adds them
  /// to `sd`. The buffers live until the next stage_* call or destruction.
  void stage_save(StateDict& sd, const RankLoader& loader, int dp_rank);
  /// Adds a buffer for every loader item of the checkpoint `info` (all shards: resharding
  /// needs the whole picture; the items are small). Fails if the loader items are malformed.
  Status stage_load(StateDict& sd, const CheckpointInfo& info);
  /// After a successful load: parses the items, reshards to dp_size * workers_per_rank shards
  /// and returns DP rank `dp_rank`'s part. `workers_per_rank` may differ from the saved one.
  Result<RankLoader> finish_load(int dp_size, int dp_rank, int workers_per_rank) const;
  /// After finish_load: every saved shard (for verification tools).
  Result<std::vector<ShardState>> saved_shards() const;
  Result<ReplicatedState> saved_replicated() const;

 private:
  std::map<std::string, std::vector<uint8_t>> buffers_;
};

// ---- extra states -------------------------------------------------------------------------

/// A per-rank random-number generator (splitmix64: a 64-bit state and a draw counter).
struct RngState {
  uint64_t state = 0;
  uint64_t draws = 0;
  uint64_t next_u64();
  bool operator==(const RngState&) const = default;
};

/// The documented rule for a rank whose (tp, dp, pp) coordinate did not exist in the saved
/// layout (and for a fresh run at step 0): the state is a hash of (seed, step, tp, dp, pp),
/// so it is reproducible and differs between ranks.
RngState derive_rank_rng(uint64_t seed, int64_t step, RankCoords coords);
/// "extra/rng/tp<t>_dp<d>_pp<p>".
std::string rng_key(RankCoords coords);

/// Replicated LR-scheduler state: linear warmup then cosine decay to min_lr (constant when
/// warmup_steps == decay_steps == 0). lr() is a pure function of the state and the step.
struct LrSchedulerState {
  double base_lr = 1e-2;
  double min_lr = 1e-2;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;
  int64_t last_step = 0;  ///< step of the last lr() handed out
  float lr(int64_t step) const;
  bool operator==(const LrSchedulerState&) const = default;
};

/// Global step, LR scheduler and this rank's RNG, saved and restored as h5ckpt items.
class ExtraStates {
 public:
  int64_t global_step = 0;
  LrSchedulerState scheduler;
  RngState rng;

  /// Adds extra/global_step, extra/lr_scheduler (replicated) and this rank's RNG to `sd`,
  /// from copies owned by this object (valid until the next stage_* call).
  void stage_save(StateDict& sd, RankCoords coords);
  /// Adds the items to load: step and scheduler always, the RNG only if the checkpoint has
  /// this rank's coordinate. Call finish_load after Checkpointer::load.
  Status stage_load(StateDict& sd, const CheckpointInfo& info, RankCoords coords);
  /// Decodes the loaded items; a rank whose coordinate was not saved gets
  /// derive_rank_rng(seed, global_step, coords). Returns whether the RNG was restored.
  Result<bool> finish_load(uint64_t seed, RankCoords coords);

 private:
  int64_t step_buf_ = 0;
  std::vector<uint8_t> sched_buf_, rng_buf_;
  bool rng_staged_ = false;
};

}  // namespace h5ckpt::loader
