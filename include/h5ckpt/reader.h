// Reading tensors out of a checkpoint without MPI and without a StateDict: any box of any
// tensor, or the part a ShardSpec names, for tools, evaluation jobs and conversions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "h5ckpt/checkpoint_info.h"
#include "h5ckpt/export.h"
#include "h5ckpt/status.h"
#include "h5ckpt/types.h"

namespace h5ckpt {

/// One committed checkpoint opened for reading. Bytes come straight from the data file at the
/// offsets its validated metadata records (no HDF5 parsing of the file). Move-only (a moved-from
/// reader may only be assigned or destroyed); one reader serves one thread at a time (open one
/// per thread to read in parallel).
class H5CKPT_API CheckpointReader {
 public:
  /// Opens a checkpoint directory, or a directory whose `latest` names one. Refuses
  /// uncommitted checkpoints and metadata that fails validation, like read_checkpoint_info.
  static Result<CheckpointReader> open(const std::string& path);

  CheckpointReader(CheckpointReader&& other) noexcept;
  CheckpointReader& operator=(CheckpointReader&& other) noexcept;
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;
  ~CheckpointReader();

  /// The validated metadata (tensors sorted by key).
  const CheckpointInfo& info() const;
  /// Keys of the stored tensors, sorted.
  std::vector<std::string> keys() const;
  /// The stored tensor `key`, or nullptr.
  const TensorInfo* find(const std::string& key) const;

  /// Reads `box` (global coordinates, inside the tensor) of tensor `key` into `dst`: a dense
  /// row-major buffer laid out as the box, box.volume() elements of `dst_dtype`. A `dst_dtype`
  /// other than the stored one converts between float types (round to nearest even).
  Status read(const std::string& key, const Box& box, DType dst_dtype, void* dst);

  /// Reads the part of tensor `key` that `shard` names into `dst`, laid out as that shard's
  /// buffer in a StateDict (shard.numel() elements of `dst_dtype`): a box, or elements
  /// [begin, end) of the row-major flattening of a box (ZeRO shards, bounded chunks of a tensor).
  Status read_shard(const std::string& key, const ShardSpec& shard, DType dst_dtype, void* dst);

  /// Bytes read from the data file so far.
  uint64_t bytes_read() const;

 private:
  struct Impl;
  explicit CheckpointReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Converts n elements between float dtypes (f64, f32, f16, bf16, f8e4m3, f8e5m2) with the
/// rounding reads and loads use (nearest even); equal dtypes (any) copy. Other pairs are refused
/// with kDtypeMismatch, null pointers (n > 0) with kInvalidArgument. src and dst must not overlap.
H5CKPT_API Status convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n);

}  // namespace h5ckpt
