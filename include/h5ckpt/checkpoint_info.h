// What a checkpoint holds, read from its validated metadata: the data model shared by the
// storage layer, the façade, the reader and the CLI. Reading it needs no MPI.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "h5ckpt/export.h"
#include "h5ckpt/status.h"
#include "h5ckpt/topology.h"  // ParallelSizes, RankCoords
#include "h5ckpt/types.h"

namespace h5ckpt {

/// File names inside a checkpoint directory, and of the pointer beside it (docs/format.md §2).
inline constexpr const char* kDataFileName = "data.h5";
inline constexpr const char* kMetadataFileName = "metadata.json";
inline constexpr const char* kLatestFileName = "latest";

/// One saved region of a tensor as the metadata records it.
struct SavedRegion {
  ShardSpec shard;
  int writer_rank = -1;
  uint64_t checksum = 0;  ///< xxh3-64 of the region's elements in canonical order (0: none; format v1)
  /// Verification blocks: the region's canonical byte stream cut every `block_bytes` bytes (a
  /// whole number of outermost-dimension slabs), each block's xxh3-64 seeded with the region's
  /// identity (key, dtype, shape, region) and the block index. Loads check every block they read.
  uint64_t block_bytes = 0;  ///< 0: no blocks (checkpoints written before blocks existed)
  std::vector<uint64_t> block_checksums;
};

/// What the metadata says about one stored tensor.
struct TensorInfo {
  std::string key;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t nbytes = 0;
  int64_t file_offset = -1;  ///< byte offset of the contiguous dataset in the data file
  std::vector<SavedRegion> regions;
};

/// A checkpoint's validated global metadata. Reading it needs no MPI.
struct H5CKPT_API CheckpointInfo {
  std::string path;       ///< checkpoint directory
  std::string data_file;  ///< absolute path of the HDF5 file
  int format_version = 0;
  std::string library_version;
  int64_t step = -1;
  ParallelSizes saved_sizes;
  std::vector<RankCoords> saved_coords;
  std::vector<TensorInfo> tensors;                ///< sorted by key
  std::map<std::string, std::string> attributes;  ///< caller's string attributes

  const TensorInfo* find(const std::string& key) const;
  uint64_t total_bytes() const;
};

/// A saved region as error messages and the CLI print it: "offset [0,0] shape [2,6]", plus
/// " flat [0,10)" for a flat range.
H5CKPT_API std::string region_to_string(const ShardSpec& shard);

/// Reads and validates a checkpoint's metadata. For a directory of checkpoints: what `latest`
/// names when that validates, else the newest checkpoint there that does (with a warning in the
/// library log), as Checkpointer::load selects (docs/format.md §2). Refuses uncommitted and
/// malformed checkpoints with a clear error.
H5CKPT_API Result<CheckpointInfo> read_checkpoint_info(const std::string& path);

/// Re-reads the saved regions with index % nparts == part and checks their checksums; the
/// error names the tensor and region. Needs no MPI (callers split the work over ranks).
H5CKPT_API Status verify_checkpoint(const CheckpointInfo& info, int part = 0, int nparts = 1);

/// True when `path` is one checkpoint directory, committed or not: it holds a data or metadata
/// file, or carries the temporary name of a save in flight. False for a directory of checkpoints.
H5CKPT_API bool is_checkpoint_dir(const std::string& path);

/// Sets the process-wide key of authenticated checkpoints (CheckpointerOptions::auth_key_file)
/// for the readers here (read_checkpoint_info, verify_checkpoint, CheckpointReader) and for
/// saves; an empty path turns authentication off. The `h5ckpt` tool sets it from
/// H5CKPT_AUTH_KEY_FILE or --auth-key-file.
H5CKPT_API Status set_auth_key_file(const std::string& path);

/// A checkpoint directory found directly under a directory of checkpoints.
struct CheckpointDirEntry {
  std::string name;          ///< directory name, e.g. "step-00000020"
  std::string path;          ///< root/name
  bool in_progress = false;  ///< temporary name of a save that never committed: never loadable
  bool latest = false;       ///< the one root/latest names
};

/// The checkpoints of a directory and its `latest` pointer.
struct CheckpointListing {
  std::string latest;  ///< name that root/latest holds; empty when there is none or it is unreadable
  std::vector<CheckpointDirEntry> checkpoints;  ///< in directory order; other entries are skipped
};

/// Lists the checkpoint directories (see is_checkpoint_dir) directly under `root`. Whether one
/// is committed and intact is for read_checkpoint_info to say: it refuses in-progress saves,
/// directories with data but no metadata, and malformed metadata.
H5CKPT_API Result<CheckpointListing> list_checkpoints(const std::string& root);

/// Retention for a directory of checkpoints (`h5ckpt prune`; a Checkpointer applies the same
/// rule after each save with CheckpointerOptions::keep_last / keep_every).
struct PruneOptions {
  int64_t keep_last = 1;   ///< keep the N newest committed checkpoints (by recorded step, then name); >= 1
  int64_t keep_every = 0;  ///< also keep every checkpoint whose step is a multiple of K (0: none)
  bool dry_run = false;    ///< only say what would be deleted
};

struct PruneResult {
  std::vector<std::string> deleted;  ///< checkpoint names deleted (dry run: that would be), oldest first
  std::vector<std::string> kept;     ///< committed checkpoint names kept, newest first
};

/// Deletes the committed checkpoints directly under `root` that the rule does not keep. Never
/// deletes what `latest` names, what a load of `root` would select, temporary (in-progress)
/// directories or checkpoints whose metadata cannot be read. Takes the directory's save lock, so
/// it fails (kAlreadyExists, naming the holder) while a job is saving there.
H5CKPT_API Result<PruneResult> prune_checkpoints(const std::string& root, const PruneOptions& options);

}  // namespace h5ckpt
