// Multi-level checkpoints (CheckpointerOptions::local_dir): saves to node-local storage with copies
// on partner nodes, persisted to the shared file system every persist_every-th save from the local
// copy, and loads from whichever level holds the newest checkpoint that can be served.
//
// A local save runs the same prepare and write source as a shared one, then, collectively:
//   local_write (each rank's planned bytes to <local_dir>/.<name>.partial/rank-<r>.bin, fsync)
//   -> manifest (sizes and block checksums to the coordinator, the manifest to every rank)
//   -> replicate (each file to the same-index rank of the next local_replicas nodes while it is
//      written, engine/replica_stream.h; each copy's block sums checked against the manifest)
//   -> commit (node leaders write the manifest, then rename the partial directory; one
//      agreement before and one after) -> retention -> [persist: save_write + save_commit of the
//      shared checkpoint, reading the local file].
// Every phase ends in one agreement; a failure or crash before the rename leaves the previous local
// checkpoint the newest committed one on every node.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "storage/local_store.h"

namespace h5ckpt::engine {
class MemoryBudget;
}

namespace h5ckpt::engine::local {

class ReplicaWindow;

/// The job's nodes: node index of every world rank (nodes ordered by their leader's rank) and each
/// node's ranks in rank order.
struct NodeMap {
  std::vector<int> node_of;
  std::vector<std::vector<int>> members;
  int my_node = 0;
  int nodes() const { return static_cast<int>(members.size()); }
};
/// Collective over topo.world.
Result<std::shared_ptr<const NodeMap>> make_node_map(const Topology::Impl& topo);

/// The ranks holding copies of `rank`'s file: the rank of the same index (modulo the node's size)
/// on each of the next `replicas` nodes (fewer when there are fewer other nodes).
std::vector<int> replica_targets(const NodeMap& nodes, int rank, int replicas);

/// The local part of a save, captured before the write source starts.
struct LocalSave {
  std::shared_ptr<const NodeMap> nodes;
  std::string dir;   ///< this node's local directory (local_dir with {node} expanded)
  std::string name;  ///< the checkpoint's name (last component of the shared path)
  bool persist = false;
  uint64_t my_bytes = 0;      ///< bytes this rank's writes hold (what its partners receive)
  bool check_private = true;  ///< check first that no two nodes share the local directory
  /// This rank's writes for the persist, in local-file order (pieces of at most kPersistPiece).
  std::vector<planner::WriteItem> persist_writes;
  ReplicaWindow* window = nullptr;  ///< the partner copies' buffers, kept by the level between saves
  MemoryBudget* budget = nullptr;   ///< what the window is leased from (null: not counted)
};

/// Largest piece the persist reads from the local file at once.
inline constexpr uint64_t kPersistPiece = 16ull << 20;

/// Whether save number `count` (1-based) with `options` is persisted: asked for, or every
/// persist_every-th (by step when the step is set, else by count).
bool should_persist(const SaveOptions& options, const CheckpointerOptions& copts, int64_t count);

/// Everything after prepare, from `source` to the local commit and the optional persist. Collective
/// over comms.world. The report's path is the local checkpoint (SaveReport::persisted names the
/// shared one when persisted).
Result<SaveReport> save_local(const Topology::Impl& comms, SaveJob& job, const CheckpointerOptions& copts,
                              LocalSave& local, WriteSource& source);

/// Which checkpoint a load of `path` reads, across levels.
struct Resolution {
  bool local = false;
  std::string reason;  ///< one sentence: which level and step, and why
  CheckpointInfo info;
  /// What a load from the shared level opens: the shared checkpoint chosen here, or (a shared
  /// level's resolution) the path as the caller gave it, which the load resolves itself.
  std::string load_path;
  std::string requested;  ///< the path the caller resolved (for messages)
  // Local only:
  std::vector<planner::TensorPlan> tensors;
  storage::LocalManifest manifest;
  std::vector<int> server;  ///< world rank serving each saved rank's file
  std::string dir;          ///< this node's copy of the checkpoint (may lack files it does not serve)
};

/// Collective over topo.world: the newest servable local checkpoint standing for `path` (every
/// saved rank's file present with its size on a live node; files of older manifests, which have
/// no block sums, read whole and checked) if it is at least as new as the newest shared
/// one at `path`; else the shared one, whose metadata the coordinator reads once. With
/// `with_info` every rank then reads the shared checkpoint's metadata too (for the caller's
/// state); without, only its directory is set (a load reads the metadata itself).
Result<Resolution> resolve(const Topology::Impl& topo, const std::string& path, const CheckpointerOptions& copts,
                           const NodeMap& nodes, bool with_info);

/// Loads `state` from a local resolution (engine/local_load.cpp): the planner's pieces of every
/// wanted shard (planner/local_reads.h) are requested from the ranks serving their files, which
/// read them, checking each file block the first time they read it, and send them in rounds
/// through a bounded window: under memory_bytes, `pool` (leased from its budget); else a buffer
/// of at most about 256 MiB for this load. Collective; `pool` must be idle. When a block fails its
/// check, its file is moved aside (storage::quarantine_local_file), the load fails on every rank
/// and `*retry` is true on every rank: a new resolution serves that file from another copy.
Result<LoadReport> load_local(const Topology::Impl& topo, StateDict& state, const Resolution& res,
                              const LoadOptions& options, StagingPool& pool, bool* retry);

}  // namespace h5ckpt::engine::local
