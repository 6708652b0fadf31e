// Writes pieces of tensors straight into the datasets' bytes of an HDF5 file that parallel HDF5
// created and closed (contiguous layout, space allocated early): the write-side twin of the
// RegionReader, with plain positioned writes and no MPI-IO layer in between.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "h5ckpt/status.h"
#include "h5ckpt/types.h"

namespace h5ckpt::storage {

/// Allocates the disk blocks of the whole file up front (fallocate): the ranks' concurrent writes
/// then fill one contiguous allocation instead of interleaving their extents, and a full disk is
/// reported before any byte is written. A file system without fallocate is not an error.
/// `bytes`: the size the file will have (0: its current size, for a file HDF5 has closed).
Status preallocate_file(const std::string& data_file, uint64_t bytes = 0);

/// Fails (kIo, ENOSPC's text) when the file system of `dir` reports fewer than `bytes` available
/// to this user. Checked before parallel HDF5 creates the data file: HDF5's own metadata writes
/// failing with ENOSPC inside the collective create or close leave the ranks in mismatched
/// collectives (seen on a full GlusterFS volume: a hang until the deadline), so a save that cannot
/// fit must fail before it. A file system that reports no sizes is not checked.
Status check_free_space(const std::string& dir, uint64_t bytes);

/// Calls fn(buffer_byte, file_byte, bytes) for each run of `shard` (of a tensor of `shape` and
/// `dtype` whose dataset starts at `dataset_offset`) that is contiguous both in the shard's
/// canonical buffer and in the file: whole pieces for flat ranges and dim-0 splits, one run per
/// row for splits along another dimension.
void for_each_file_run(int64_t dataset_offset, const Shape& shape, DType dtype, const ShardSpec& shard,
                       const std::function<void(uint64_t, uint64_t, uint64_t)>& fn);

class DirectWriter {
 public:
  /// `direct_io`: write the block-aligned middle of long runs with O_DIRECT (no page cache: no
  /// page allocation and no write-back of the copy), the unaligned ends through the page cache.
  /// Falls back to buffered writes where the file system refuses O_DIRECT.
  static Result<DirectWriter> open(const std::string& data_file, bool direct_io = false);
  DirectWriter(DirectWriter&& o) noexcept;
  DirectWriter& operator=(DirectWriter&&) = delete;
  ~DirectWriter();

  /// Writes `shard` of a tensor of global `shape` and `dtype`, whose dataset starts at byte
  /// `dataset_offset`, from the contiguous buffer `data` (the shard's canonical order).
  Status write(int64_t dataset_offset, const Shape& shape, DType dtype, const ShardSpec& shard, const void* data);
  /// Writes file bytes [offset, offset + length) from `data`: one positioned write, or three when
  /// the aligned middle of a long range goes through O_DIRECT.
  Status write_bytes(const char* data, uint64_t length, uint64_t offset) { return write_run(data, length, offset); }
  /// fsync, then close; the error of either is returned.
  Status sync_and_close();

  uint64_t direct_bytes() const { return direct_bytes_; }  ///< bytes that bypassed the page cache
  uint64_t write_calls() const { return write_calls_; }    ///< pwrite calls made (each a round trip on FUSE)

 private:
  DirectWriter() = default;
  Status write_run(const char* p, uint64_t len, uint64_t off);
  Status write_direct(const char* p, uint64_t len, uint64_t off);
  Status pwrite_all(int fd, const char* p, uint64_t len, uint64_t off);
  int fd_ = -1;
  int direct_fd_ = -1;  // O_DIRECT handle of the same file; -1 when unavailable
  uint64_t direct_bytes_ = 0;
  uint64_t write_calls_ = 0;
  std::string path_;
};

}  // namespace h5ckpt::storage
