// The node-local level of multi-level checkpointing (docs/format.md §11): one directory per local
// checkpoint on every node, holding the raw bytes each rank was planned to write (its own and, as
// replicas, those of ranks on partner nodes) and a manifest with the save plan. No MPI here.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "h5ckpt/checkpoint_info.h"
#include "h5ckpt/status.h"
#include "h5ckpt/topology.h"
#include "planner/save_planner.h"

namespace h5ckpt::storage {

inline constexpr const char* kLocalManifestName = "manifest.bin";

/// "rank-<r>.bin": the regions rank r wrote, in plan order, each in its shard's element order.
std::string local_rank_file(int rank);
/// Where a local save is written before it commits: "<dir>/.<name>.partial" (never loadable).
std::string local_partial_dir(const std::string& dir, const std::string& name);
/// `pattern` with every "{node}" replaced by the node's index (several nodes sharing one file
/// system, as in tests, each get their own directory).
std::string expand_local_dir(const std::string& pattern, int node);
/// Absolute, lexically normal, no trailing slash: how save and load paths are compared.
std::string canonical_path(const std::string& path);

struct LocalRankFile {
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;  ///< older manifests only (block_bytes 0): of the whole file
  /// Checksums of the file's blocks (storage/local_files.h): block_bytes each, the last one
  /// shorter. 0: an older manifest, which recorded only `xxh3`.
  uint64_t block_bytes = 0;
  std::vector<uint64_t> blocks;
};

/// What one local checkpoint holds; the same on every node.
struct LocalManifest {
  std::string name;         ///< checkpoint name (the last component of the shared path)
  std::string shared_path;  ///< the shared checkpoint it stands for (canonical_path)
  int64_t step = -1;
  std::string library_version;
  ParallelSizes sizes;
  std::vector<RankCoords> coords;
  std::vector<int> node_of_rank;  ///< node index of every saved rank
  std::map<std::string, std::string> attributes;
  std::vector<LocalRankFile> files;  ///< index: saved world rank
  std::string plan;                  ///< the save plan's tensors (engine wire encoding)

  /// The parent directory of shared_path (the directory of checkpoints a load may name).
  std::string parent() const;
};

/// Manifest file bytes: a magic line, a JSON header and the plan, then the xxh3 of all of it.
std::string encode_local_manifest(const LocalManifest& m);
/// Refuses anything but an intact manifest (kCorrupt naming what is wrong).
Result<LocalManifest> decode_local_manifest(const std::string& bytes);

/// A committed local checkpoint found in one node's local directory.
struct LocalEntry {
  std::string name;
  std::string dir;
  uint64_t manifest_id = 0;  ///< xxh3 of the manifest file: tells re-saves under one name apart
  int64_t step = -1;
  std::vector<int> ranks;         ///< saved ranks whose file is here with the recorded size
  uint64_t world = 0;             ///< ranks that saved it
  std::vector<int> node_of_rank;  ///< the node that saved each rank (for messages)
};

/// The committed local checkpoints in `dir` standing for `path` (a shared checkpoint, or the
/// directory of checkpoints holding it); with `path` empty, all of them. Unreadable or corrupt
/// manifests are skipped with a warning.
std::vector<LocalEntry> list_local_checkpoints(const std::string& dir, const std::string& path);

/// xxh3 of a whole file, which must have `bytes` bytes (the check of older manifests' files).
Result<uint64_t> file_xxh3(const std::string& path, uint64_t bytes);

/// Deletes all but the `keep` newest committed local checkpoints of `dir` (by step, then name),
/// never `keep_name`, and any partial directory but `keep_name`'s. The newest checkpoint it drops
/// is not deleted but becomes the spare (kLocalSpareName, its manifest removed first), whose files
/// the next save overwrites in place. Best effort; logs what it did.
void retain_local(const std::string& dir, int64_t keep, const std::string& keep_name);

/// "<dir>/.h5ckpt-spare": the files of the checkpoint retention dropped last, no longer part of
/// any checkpoint (never listed: a hidden name without a manifest). Writing into an existing file
/// reuses its page-cache pages and disk blocks; a new file takes fresh ones, which on a VM whose
/// free memory goes back to the host costs more than the write itself (docs/performance.md).
inline constexpr const char* kLocalSpareName = ".h5ckpt-spare";

/// Makes a save's `partial` directory in `dir`: the spare renamed, keeping only the files named in
/// `reuse` (the ones this save overwrites whole and cuts to size), or an empty directory when
/// there is no spare. `partial` must not exist.
Status make_partial_dir(const std::string& dir, const std::string& partial, const std::vector<std::string>& reuse);

/// The metadata a load and the trainer see for a local checkpoint (`tensors`: m.plan decoded).
CheckpointInfo local_info(const LocalManifest& m, const std::vector<planner::TensorPlan>& tensors,
                          const std::string& dir);

}  // namespace h5ckpt::storage
