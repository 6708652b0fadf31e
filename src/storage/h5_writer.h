// Collective parallel-HDF5 writing of a planned checkpoint: one contiguous dataset per tensor,
// global shape, created by every rank in plan order; each rank writes its assigned regions.
#pragma once

#include <mpi.h>

#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "planner/save_planner.h"
#include "storage/hdf5_util.h"
#include "storage/meta_v2.h"

namespace h5ckpt::storage {

class ParallelWriter {
 public:
  /// Creates `file` and every dataset of `tensors` (with its dtype attribute).
  /// Collective over `comm`; call with the lock from hdf5_lock() held.
  static Result<ParallelWriter> create(const std::string& file, MPI_Comm comm,
                                       const std::vector<planner::TensorPlan>& tensors, uint64_t alignment,
                                       const std::map<std::string, std::string>& mpi_hints);

  /// Byte offset of each dataset in the file (-1 for empty tensors); the same on all ranks.
  const std::vector<int64_t>& offsets() const { return offsets_; }

  /// Writes `shard` of tensor `index` from the contiguous buffer `data` (independent I/O: any
  /// number of calls per rank, in any order; `shard` null writes nothing).
  Status write(size_t index, const ShardSpec* shard, const void* data);

  /// Flushes (MPI_File_sync) and closes. Collective.
  Status close();

 private:
  Hid file_;
  std::vector<Hid> datasets_;
  std::vector<Hid> types_;
  std::vector<int64_t> offsets_;
  Hid dxpl_;
};

/// Adds the `/meta` group to a closed data file, serially: the format attributes and one
/// contiguous dataset per index table (format v2, storage/meta_v2.h). Returns where each table's
/// bytes start in the file (-1 for an empty table), known once the file is closed again.
/// Called by the coordinator only, after all ranks closed the file.
Result<std::array<int64_t, v2::kTableCount>> write_meta_group(const std::string& file, const v2::Encoded& index,
                                                              const std::string& library_version);

}  // namespace h5ckpt::storage
