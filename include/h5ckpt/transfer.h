// Moving live state between ranks without storage: resharding in memory, and publishing a
// trainer's weights to inference ranks in another layout, by delta between versions.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "h5ckpt/export.h"
#include "h5ckpt/state.h"
#include "h5ckpt/status.h"

namespace h5ckpt {

struct TransferOptions {
  /// The version of the source's bytes (e.g. the training step); recorded by every rank once the
  /// transfer has committed.
  int64_t version = 0;
  /// When every rank holds the same previous version (the last transfer of this StateTransfer,
  /// with the same items everywhere), only the checksum blocks that changed since it move.
  /// Assumes the destination's buffers still hold that version (nothing but transfers wrote them).
  bool delta = true;
  /// The source computes the per-block checksums a save records (storage/verify_blocks), the
  /// destination checks every block it receives before anything is written to its buffers.
  /// false: nothing is checked, and pieces that are one contiguous run of a destination buffer
  /// (same dtype) are received in place, without staging: a failed transfer (a lost rank) may then
  /// leave the destination partly updated. Sums are still computed when `delta` is set (the base
  /// of the next delta).
  bool verify = true;
  /// With verify: receive in place (pieces that are one contiguous run of a destination buffer in
  /// the source dtype) and check them there, instead of staging and copying after the check: one
  /// memory pass less after the check, and a corrupted block fails the call with the destination
  /// holding new bytes, and the one corrupted block, in those pieces (the next transfer is then a
  /// full one), unless keep_previous (the default) kept the bytes they overwrote.
  bool in_place = false;
  /// With verify and in_place: the bytes each in-place piece overwrites are first copied aside
  /// (by the helper threads, while earlier pieces are on the wire; a piece's receive waits for its
  /// copy) and put back when the call fails, so a failure leaves the previous version as staging
  /// does. The destination's buffers still change during the call. Costs the staging memory and
  /// one memory pass, which a wire slower than memory hides. false: that pass is saved, and a
  /// failure leaves new bytes as described above.
  bool keep_previous = true;
  /// Every destination key must be held by the sources; otherwise missing keys are skipped
  /// (TransferReport::missing_keys) and their buffers left untouched.
  bool strict = true;
  /// Allow float-to-float conversion (round to nearest even) when the dtypes differ.
  bool convert_dtype = true;
  /// Bound of the staging memory per rank (received bytes, packed sends); 0: no bound. With a
  /// bound smaller than what a rank receives, the transfer runs in rounds, each committed after
  /// its own check: a failure in a later round leaves the destination with the earlier rounds'
  /// bytes of the new version (the next transfer is then a full one).
  uint64_t memory_bytes = 0;
  /// Deadline in seconds of every wait for other ranks; past it the job is aborted naming the
  /// phase and the ranks that did not arrive (process-wide, as CheckpointerOptions::timeout_s).
  /// 0: no deadline.
  double timeout_s = 600;
  /// Device buffers (Device::kCuda, or detected): the CUDA stream (a cudaStream_t) whose work
  /// must be complete before the sources are read, as SaveOptions::device_stream. Null: the
  /// whole device is synchronized first. Device pieces move through host staging over MPI: the
  /// sums are computed and checked on host bytes, and the destination's device buffers are
  /// written only after the agreement (copies complete before transfer() returns). Without
  /// verify and delta, pieces that are one contiguous run of device memory at both ends go
  /// device to device over NCCL where every rank can set it up (TransferReport::transport).
  void* device_stream = nullptr;
  /// Threads per rank that hash, check and copy while the calling thread drives MPI; 0: the
  /// node's hardware threads shared by its ranks.
  int threads = 0;
};

/// Per-call figures of this rank.
struct TransferReport {
  int64_t version = 0;
  bool delta = false;        ///< only changed blocks moved (see TransferOptions::delta)
  bool plan_cached = false;  ///< the plan of the previous call was reused
  int rounds = 1;
  uint64_t bytes_sent = 0;      ///< payload bytes this rank sent (to itself included)
  uint64_t bytes_received = 0;  ///< payload bytes this rank received
  uint64_t bytes_total = 0;     ///< bytes a full transfer sends to this rank (the denominator of a delta)
  uint64_t blocks_sent = 0, blocks_received = 0;
  uint64_t blocks_total = 0;  ///< checksum blocks of every piece this rank receives
  uint64_t memory_peak_bytes = 0;
  std::vector<std::string> missing_keys;  ///< non-strict only
  /// "mpi", or "mpi+nccl" once a device transport is set up: unhashed transfers (verify and
  /// delta off) then move device pieces that are one contiguous run at both ends on it.
  std::string transport = "mpi";
  uint64_t bytes_sent_device = 0;  ///< of bytes_sent: over the device transport
  double plan_s = 0, checksum_s = 0, exchange_s = 0, commit_s = 0, total_s = 0;
};

/// A publisher/receiver of live state over one world. Each rank passes its source items (the
/// ranks that hold the state, e.g. the trainer), its destination items (the ranks that want it,
/// in any layout), or both (an in-memory reshard); the plan and the checksums of the last version
/// are kept between calls for deltas. Move-only; destroy it before MPI_Finalize.
class H5CKPT_API StateTransfer {
 public:
  /// Duplicates `world` (collective over it).
  explicit StateTransfer(MPI_Comm world);
  ~StateTransfer();
  StateTransfer(StateTransfer&&) noexcept;
  StateTransfer& operator=(StateTransfer&&) noexcept;

  /// Fills every destination buffer with the sources' elements: each byte from one source rank
  /// (replicas share the sending), dtype conversion, padding (allow_shape_mismatch) and strictness
  /// as for a load. `source` / `destination` may be null on ranks without that role; buffers may
  /// be host or device memory (device ones need a GPU runtime, else kUnsupported naming the key).
  /// Collective over the world; every rank returns the same
  /// Status; on failure the destination buffers are unchanged (but see memory_bytes), except when
  /// writing device buffers fails after the agreement (a failed host-to-device copy): then they
  /// are partly new, no rank keeps the version, and the next transfer is a full one.
  Result<TransferReport> transfer(const StateDict* source, StateDict* destination, const TransferOptions& options = {});

  /// The version of the last committed transfer, or -1 before the first.
  int64_t version() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace h5ckpt
