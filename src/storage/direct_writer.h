// Writes pieces of tensors straight into the datasets' bytes of an HDF5 file that parallel HDF5
// created and closed (contiguous layout, space allocated early): the write-side twin of the
// RegionReader, with plain positioned writes and no MPI-IO layer in between.
#pragma once

#include <cstdint>
#include <string>

#include "h5ckpt/status.h"
#include "h5ckpt/types.h"

namespace h5ckpt::storage {

class DirectWriter {
 public:
  static Result<DirectWriter> open(const std::string& data_file);
  DirectWriter(DirectWriter&& o) noexcept;
  DirectWriter& operator=(DirectWriter&&) = delete;
  ~DirectWriter();

  /// Writes `shard` of a tensor of global `shape` and `dtype`, whose dataset starts at byte
  /// `dataset_offset`, from the contiguous buffer `data` (the shard's canonical order).
  Status write(int64_t dataset_offset, const Shape& shape, DType dtype, const ShardSpec& shard, const void* data);
  /// fsync, then close; the error of either is returned.
  Status sync_and_close();

 private:
  DirectWriter() = default;
  int fd_ = -1;
  std::string path_;
};

}  // namespace h5ckpt::storage
