// The whole commit of a save in one call: the metadata assembled from the plan, the file
// offsets and the checksums; written as the format-v2 index tables into the data file's /meta
// group, then metadata.json, the summary that points at them; then the atomic publish and the
// `latest` pointer. Run by the coordinator only.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "h5ckpt/checkpoint_info.h"
#include "planner/save_planner.h"
#include "storage/meta_v2.h"

namespace h5ckpt::storage {

/// What a save knows when every rank has written its bytes.
struct SavedCheckpoint {
  const std::vector<planner::TensorPlan>* tensors = nullptr;
  std::vector<int64_t> offsets;  ///< file offset of every dataset (index = tensor)
  /// blocks[t][r]: verification blocks of region r of tensor t (storage/verify_blocks.h);
  /// block size 0: saved without checksums
  struct Blocks {
    uint64_t block_bytes = 0;
    std::vector<uint64_t> sums;
  };
  std::vector<std::vector<Blocks>> blocks;
  int64_t step = -1;
  ParallelSizes sizes;
  std::vector<RankCoords> coords;
  std::map<std::string, std::string> attributes;
};

/// The metadata of a saved checkpoint (paths excluded), as a CheckpointInfo.
CheckpointInfo assemble_info(const SavedCheckpoint& saved);

/// The format-v2 index of a saved checkpoint, encoded from the plan in place: the same bytes as
/// encoding assemble_info(saved), without its copy of every region (what the commit writes).
Result<v2::Encoded> encode_saved(const SavedCheckpoint& saved);

/// Writes the metadata of `saved` into `temp` (the index tables in the /meta group of its data
/// file, read back to check their offsets, and the metadata.json summary, each fsynced), publishes `temp` as `final_dir` (replacing an existing one only
/// with `overwrite`) and, with `point_latest`, points `latest` at it. On failure before the
/// publish the temporary directory is removed.
Status commit_checkpoint(const std::string& temp, const std::string& final_dir, const SavedCheckpoint& saved,
                         bool overwrite, bool point_latest);

}  // namespace h5ckpt::storage
