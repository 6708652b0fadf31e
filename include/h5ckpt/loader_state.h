// Data-loader state as checkpointable, reshardable library state.
//
// The loader model (see docs/trainer.md): samples come from K sources; sample (k, r) is record r
// of source k. The loader is split into S = dp * workers shards (shard id s = dp_rank * workers +
// worker). For each source k, shard s fetches records base[k] + s, base[k] + s + S, ... (a strided
// walk of the source), first serving its `pending` whole samples. Fetched samples go into a token
// buffer; each window consumes `context_len` tokens from the front of the buffer, possibly leaving
// the last sample partially consumed. (A synthetic loader that walks this way, with deterministic
// sample lengths, and its exactly-once checker are in src/extras/synthetic_loader.h, outside the
// installed library.)
//
// Exactly-once across a change of S (a DP resize): reshard() moves every source's base to the
// largest `next` of any old shard; records below it that their old shard had not fetched yet
// become pending whole samples, and they are dealt, with the buffered partial samples, to the
// new shards. So every record is, at any time, in exactly one of: consumed (a prefix of its
// tokens was handed out), buffered (the rest of its tokens waits in one shard's buffer),
// pending in one shard, or ahead of one shard's strided walk.
//
// Checkpoint items (all layout-independent names):
//   loader/replicated             bytes, saved once: config, shard count, bases, generation
//   loader/shard/dp<d>/worker<w>  bytes, one per shard (replicated over the TP/PP ranks of DP d)
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "h5ckpt/checkpoint_info.h"
#include "h5ckpt/export.h"
#include "h5ckpt/state.h"
#include "h5ckpt/status.h"

namespace h5ckpt::loader {

/// One data source: its share of the samples and the range of its sample lengths (tokens).
struct SourceSpec {
  std::string name;
  double ratio = 1.0;
  int64_t min_len = 1;
  int64_t max_len = 1;
};

/// What a loader is, independent of how many shards run it.
struct H5CKPT_API LoaderConfig {
  uint64_t seed = 0;
  std::vector<SourceSpec> sources;
  int64_t context_len = 2048;  ///< tokens per window (one window per worker call)
  int32_t workers_per_rank = 1;

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
struct H5CKPT_API ReplicatedState {
  LoaderConfig config;
  int64_t num_shards = 1;     ///< S: shards of the walk (dp * workers at the last reshard)
  std::vector<int64_t> base;  ///< per source: first record of the current strided walk
  int64_t generation = 0;     ///< number of reshards so far (informational)
  bool operator==(const ReplicatedState&) const;
};

/// The sharded part of one shard (one read worker of one DP rank).
struct ShardState {
  int64_t shard = 0;                   ///< global shard id in [0, num_shards)
  std::vector<int64_t> next;           ///< per source: next record of this shard's walk
  int64_t draws = 0;                   ///< source choices made so far (drives the choice hash)
  std::vector<SampleId> pending;       ///< whole samples to fetch before the walk, in order
  std::vector<BufferedSample> buffer;  ///< token buffer, front first
  int64_t tokens_consumed = 0;         ///< statistics
  int64_t samples_fetched = 0;
  bool operator==(const ShardState&) const = default;
};

// ---- pure functions -----------------------------------------------------------------------

/// The state of a fresh loader with `num_shards` shards.
H5CKPT_API ReplicatedState initial_replicated(const LoaderConfig& config, int64_t num_shards);
/// Shard `shard` of a fresh walk (or of the walk described by `rep`, with nothing pending).
H5CKPT_API ShardState initial_shard(const ReplicatedState& rep, int64_t shard);

/// Result of a reshard: the new replicated part and all new shards (index = shard id).
struct Resharded {
  ReplicatedState replicated;
  std::vector<ShardState> shards;
};

/// Splits or merges `old_shards` (all of them, any order, ids 0..S-1) into `new_num_shards`.
/// With the same shard count the state is returned unchanged (a relabelling of ranks).
/// Deterministic: every rank computing it gets the same answer.
H5CKPT_API Result<Resharded> reshard(const ReplicatedState& rep, const std::vector<ShardState>& old_shards,
                                     int64_t new_num_shards);

// ---- serialization and keys ---------------------------------------------------------------

H5CKPT_API std::vector<uint8_t> serialize(const ReplicatedState& rep);
H5CKPT_API std::vector<uint8_t> serialize(const ShardState& shard);
H5CKPT_API Result<ReplicatedState> parse_replicated(const uint8_t* data, size_t size);
H5CKPT_API Result<ShardState> parse_shard(const uint8_t* data, size_t size);

/// "loader/replicated".
H5CKPT_API const char* replicated_key();
/// "loader/shard/dp<d>/worker<w>".
H5CKPT_API std::string shard_key(int64_t dp_rank, int64_t worker);
/// Inverse of shard_key; an error for any other key.
H5CKPT_API Result<std::pair<int64_t, int64_t>> parse_shard_key(const std::string& key);

// ---- checkpoint integration ---------------------------------------------------------------

/// This DP rank's loader: the replicated part and its `workers_per_rank` shards.
struct H5CKPT_API RankLoader {
  ReplicatedState replicated;
  std::vector<ShardState> shards;  ///< index = worker

  /// A fresh loader for DP rank `dp_rank` of `dp_size`.
  static RankLoader fresh(const LoaderConfig& config, int dp_size, int dp_rank);
};

/// Owns the byte buffers that a StateDict points to while the loader is saved or loaded.
/// Usage for save: stage_save(sd, loader, dp_rank), then Checkpointer::save(sd, ...).
/// Usage for load: stage_load(sd, info), Checkpointer::load(sd, ...), finish_load(...).
/// Every rank of a DP group stages the same items (replicas are written once by the library).
class H5CKPT_API LoaderCheckpoint {
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

}  // namespace h5ckpt::loader
