// The façade a trainer calls: collective save and load with automatic resharding.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "h5ckpt/state.h"
#include "h5ckpt/status.h"
#include "h5ckpt/topology.h"

namespace h5ckpt {

struct SaveOptions {
  /// xxh3-64 of every written region, recorded in the metadata and checked by `verify`.
  bool checksums = true;
  /// Replace an existing committed checkpoint at the same path (the old one is removed only
  /// after the new one is committed).
  bool overwrite = false;
  /// Update `<parent>/latest` to point at this checkpoint after the commit.
  bool update_latest = true;
  /// Free-form tag stored in the metadata (e.g. the training step).
  int64_t step = -1;
};

struct LoadOptions {
  /// Every requested key must exist with the same global shape; otherwise missing keys are
  /// skipped (reported in LoadReport::missing_keys) and the buffers left untouched.
  bool strict = true;
  /// Allow float-to-float conversion (round to nearest even) when the saved dtype differs.
  bool convert_dtype = true;
  /// Also re-read every saved region once (split over the ranks) and check its xxh3 checksum;
  /// costs one more read of the checkpoint.
  bool verify_checksums = false;
};

/// Per-call figures, the same on the rank that reports them as in the metrics file.
struct SaveReport {
  std::string path;            ///< committed checkpoint directory
  uint64_t bytes_written = 0;  ///< bytes this rank wrote (after de-duplication)
  uint64_t bytes_total = 0;    ///< unique bytes in the checkpoint (all ranks)
  double plan_s = 0, write_s = 0, commit_s = 0, total_s = 0;
  bool plan_cached = false;
};

struct LoadReport {
  std::string path;  ///< checkpoint directory actually read (after following `latest`)
  uint64_t bytes_read = 0;  ///< storage bytes this rank read
  std::vector<std::string> missing_keys;  ///< non-strict loads only
  double plan_s = 0, read_s = 0, total_s = 0;
};

/// One saved region of a tensor as the metadata records it.
struct SavedRegion {
  ShardSpec shard;
  int writer_rank = -1;
  uint64_t checksum = 0;  ///< xxh3-64 of the region's elements in canonical order (0: none)
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
struct CheckpointInfo {
  std::string path;  ///< checkpoint directory
  std::string data_file;  ///< absolute path of the HDF5 file
  int format_version = 0;
  std::string library_version;
  int64_t step = -1;
  ParallelSizes saved_sizes;
  std::vector<RankCoords> saved_coords;
  std::vector<TensorInfo> tensors;  ///< sorted by key
  std::map<std::string, std::string> attributes;  ///< caller's string attributes

  const TensorInfo* find(const std::string& key) const;
  uint64_t total_bytes() const;
};

/// Reads and validates a checkpoint's metadata (following `latest` when `path` is a directory
/// of checkpoints). Refuses uncommitted and malformed checkpoints with a clear error.
Result<CheckpointInfo> read_checkpoint_info(const std::string& path);

/// Re-reads the saved regions with index % nparts == part and checks their checksums; the
/// error names the tensor and region. Needs no MPI (callers split the work over ranks).
Status verify_checkpoint(const CheckpointInfo& info, int part = 0, int nparts = 1);

/// Saves and loads StateDicts over one Topology.
class Checkpointer {
 public:
  explicit Checkpointer(const Topology& topology);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  /// Writes `state` as checkpoint directory `path` and commits it atomically.
  /// Collective over the topology's world; every rank returns the same Status.
  Result<SaveReport> save(const StateDict& state, const std::string& path,
                          const SaveOptions& options = {});

  /// Fills the buffers of `state` from the checkpoint at `path` (a checkpoint directory, or a
  /// directory whose `latest` names one), whatever layout saved it.
  /// Collective over the topology's world; every rank returns the same Status.
  Result<LoadReport> load(StateDict& state, const std::string& path,
                          const LoadOptions& options = {});

  /// String attributes stored with the next save (e.g. trainer configuration).
  void set_attribute(const std::string& name, const std::string& value);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// Library version string, e.g. "0.1.0".
const char* version();

}  // namespace h5ckpt
