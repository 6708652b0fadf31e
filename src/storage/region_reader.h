// Positioned reads of tensor regions straight from the data file at the offsets recorded in
// the validated metadata: no HDF5 parsing of the file, many reads in flight is possible.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "h5ckpt/checkpoint_info.h"
#include "planner/box_math.h"
#include "storage/region_lookup.h"
#include "util/work_pool.h"

namespace h5ckpt::storage {

class RegionReader {
 public:
  static Result<RegionReader> open(const std::string& data_file);
  RegionReader(RegionReader&& o) noexcept;
  RegionReader& operator=(RegionReader&&) = delete;
  ~RegionReader();

  uint64_t file_size() const { return size_; }
  /// Whether the file holds at least `bytes` bytes. Where clients cache attributes
  /// (storage/fs_traits.h: GlusterFS, NFS), a node whose ranks wrote their pieces of a data
  /// file may, for up to the attribute timeout, still see the size it had before the coordinator
  /// appended the index tables; there a short size is asked again every kClientCacheStepMs until it
  /// is large enough or kClientCacheWaitMs passed, and file_size() follows. Elsewhere: no wait.
  bool holds(uint64_t bytes);
  uint64_t bytes_read() const { return bytes_read_; }
  /// The data file as it was opened: a hash of its device, inode, size and modification and
  /// status-change times. Any write to the file, or another file put in its place, changes it
  /// (the change time cannot be set back), so a cache keyed on it never outlives the bytes.
  uint64_t identity() const { return identity_; }

  /// Reads `region` (global coordinates, inside the tensor) of tensor `t` into `dst`, a buffer
  /// laid out as `frame` with elements of `dst_type` (converted with round-to-nearest-even when
  /// it differs from the stored dtype; both must then be float types). With verification on (the
  /// default), every byte delivered is checked against the saved region's block checksums: the
  /// read widens to whole blocks (storage/verify_blocks.h), so nothing is read twice.
  Status read(const TensorInfo& t, const Box& region, const planner::Frame& frame, DType dst_type, void* dst);

  /// Region indexes for read(): with `lookup` (not owned; nullptr: none), the regions a read
  /// touches are found through the index of the tensor read rather than by testing them all.
  void set_lookup(RegionLookup* lookup) { lookup_ = lookup; }

  /// Turns the block checks of read() and read_shard() off (LoadOptions::verify = false).
  void set_verify(bool on) { verify_ = on; }
  bool verify() const { return verify_; }
  /// Whether runs less than a page (4 KiB) apart are read in one pread, gaps included (set at
  /// open: on a network file system, where each separate read waits for a round trip and the
  /// client fetches whole pages anyway; tests set it).
  void set_network_reads(bool on) { network_ = on; }
  bool network_reads() const { return network_; }
  /// Bytes read beyond the requested ones to complete verification blocks.
  uint64_t widened_bytes() const { return widened_bytes_; }

  /// Where the block checks of later read() calls run. By default on the reading thread, right
  /// after each chunk is read. With a pool, each chunk's check (and its copy out of a landing
  /// buffer) becomes a job of `group`, so the next chunk is read while it runs and several run
  /// at once: read() then returns once the bytes are read, and the destination holds checked
  /// bytes only when the caller has sealed and waited for the group (its outcome is the checks').
  /// A check never reads the file again. `busy_ns` (optional) adds up the jobs' time.
  struct CheckSink {
    detail::WorkPool* pool = nullptr;
    std::shared_ptr<detail::WorkPool::Group> group;
    std::atomic<uint64_t>* busy_ns = nullptr;
  };
  void defer_checks(CheckSink sink) { sink_ = std::move(sink); }
  /// Seconds this reader spent checking blocks on its own thread (deferred checks are counted in
  /// their sink's busy_ns instead).
  double check_s() const { return static_cast<double>(check_ns_) * 1e-9; }
  /// Seconds this reader waited in `pread` (the storage's share of a load's read phase).
  double io_s() const { return static_cast<double>(io_ns_) * 1e-9; }
  /// Seconds this reader spent copying or converting read bytes from its bounce buffer into the
  /// destination (copies out of deferred checks' landing buffers count in their busy_ns).
  double copy_s() const { return static_cast<double>(copy_ns_) * 1e-9; }

  /// Reads the part of `t` that `shard` names (a box, or a flat range of one) into `dst`, laid
  /// out as that shard's buffer: shard.numel() elements of `dst_type`. The shard must lie inside
  /// the tensor (ShardSpec::validate). The one "read a shard's boxes" loop of the library.
  Status read_shard(const TensorInfo& t, const ShardSpec& shard, DType dst_type, void* dst);

  /// Reads saved region `index` of `t` whole, in its canonical order and stored dtype, into `dst`
  /// (region numel elements), checking its blocks when verification is on. Touches no other
  /// region, so checking every region of a tensor costs linear time (h5ckpt verify).
  Status read_region(const TensorInfo& t, size_t index, void* dst);

  /// Reads file bytes [off, off + len) into buf; a short file is reported as truncated.
  Status read_bytes(void* buf, uint64_t len, uint64_t off) { return pread_exact(buf, len, off); }

 private:
  RegionReader() = default;
  Status pread_exact(void* buf, uint64_t len, uint64_t off);
  /// `exact`: never read through the gaps between runs (their bytes belong to another region
  /// the same read loads separately, and would be read twice).
  Status read_plain(const TensorInfo& t, const Box& region, const planner::Frame& frame, DType dst_type, void* dst,
                    bool exact = false);
  Status read_checked(const TensorInfo& t, const Box& region, const planner::Frame& frame, DType dst_type, void* dst);
  int fd_ = -1;
  bool verify_ = true;
  bool network_ = false;
  uint64_t widened_bytes_ = 0;
  std::vector<char> verify_buf_;
  CheckSink sink_;
  uint64_t check_ns_ = 0;
  uint64_t io_ns_ = 0;
  uint64_t copy_ns_ = 0;
  struct Spares;                    // landing buffers of deferred checks, reused
  std::shared_ptr<Spares> spares_;  // shared with the jobs that hold them
  uint64_t size_ = 0;
  uint64_t identity_ = 0;
  uint64_t bytes_read_ = 0;
  int64_t delivered_ = 0;  // elements of the current read() placed in the destination
  std::string path_;
  std::vector<char> bounce_;
  RegionLookup* lookup_ = nullptr;
};

/// A checkpoint opened for reading: its validated metadata and its data file.
struct OpenedCheckpoint {
  CheckpointInfo info;
  RegionReader reader;
};

/// Resolves `path` (a checkpoint, or a directory whose `latest` names one), reads its metadata
/// and validates it against the data file, which stays open for the reads that follow.
Result<OpenedCheckpoint> open_checkpoint(const std::string& path);

}  // namespace h5ckpt::storage
