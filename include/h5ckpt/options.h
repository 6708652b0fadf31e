// What a save or load is asked to do and what it reports: the options and reports of the
// Checkpointer (h5ckpt/checkpointer.h), apart from the façade so that the library's layers use
// them without the façade.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "h5ckpt/checkpoint_info.h"  // CheckpointInfo
#include "h5ckpt/types.h"

namespace h5ckpt {

/// When a save sends its short writes to aggregating ranks (SaveOptions::aggregate_writes).
enum class AggregateWrites : uint8_t {
  kAuto = 0,  ///< writes whose contiguous runs average below 256 KiB (rows of column splits)
  kOn = 1,    ///< every write
  kOff = 2,   ///< none: each rank writes its own runs
};

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
  /// Device buffers: the stream (a cudaStream_t) after whose work queued so far the state is
  /// final, e.g. the one the optimizer step runs on. The snapshot's copies wait for it on the
  /// device. Null: the library synchronizes the whole device before the snapshot. Without device
  /// buffers it is unused.
  void* device_stream = nullptr;
  /// With CheckpointerOptions::local_dir: also persist this save to the shared file system,
  /// whatever persist_every says.
  bool persist = false;
  /// Two-phase writes (docs/design.md, "Aggregated writes"): the bytes of short runs (the rows of
  /// tensors split along a dimension other than the first, and flat ranges of them) go over MPI
  /// to the rank that owns their contiguous domain of the file, which writes its domain in
  /// windows of write_window_bytes: a few long writes per rank instead of one per row, what a
  /// network file system needs (each write call is a round trip there). The file is the same
  /// byte for byte. Used when every rank's bytes stay in place for the whole write phase
  /// (synchronous saves of host buffers; save_async when the snapshot fits the staging pool),
  /// the two windows fit the memory budget, and direct_writes is on; otherwise each rank writes
  /// its own runs. Ranks that disagree fall back to that too.
  AggregateWrites aggregate_writes = AggregateWrites::kAuto;
  /// Bytes an aggregating rank writes at once; two such buffers per rank while it aggregates.
  uint64_t write_window_bytes = 32ull << 20;
};

/// What a load does when the keys of the state and of the checkpoint differ. Whatever the mode,
/// the whole request is checked before any byte is read, and a failing load fails with one error,
/// the same on every rank, listing every missing key, shape mismatch, refused dtype and
/// unexpected key (counts and the first 10 of each; LoadOptions::check_only returns all of them).
/// Global shapes that differ (beyond allow_shape_mismatch) and dtypes the options forbid always fail.
enum class LoadStrictness : uint8_t {
  /// Default: a key the state asks for and the checkpoint lacks fails the load; keys the
  /// checkpoint holds that the state does not ask for (loading a model without its optimizer, one
  /// rank's extra state) are reported in LoadReport::unexpected_keys.
  kIgnoreUnexpected = 0,
  /// Missing and unexpected keys both fail the load (torch's load_state_dict(strict=True)).
  kRaiseAll = 1,
  /// Missing keys are skipped, their buffers left untouched, and reported in
  /// LoadReport::missing_keys; unexpected keys are reported.
  kAllowMissing = 2,
};

struct LoadOptions {
  /// false: the same as strictness = kAllowMissing, whatever `strictness` says (kept for callers
  /// of the first API); true: `strictness` decides.
  bool strict = true;
  /// Allow float-to-float conversion (round to nearest even) when the saved dtype differs.
  bool convert_dtype = true;
  /// Check every byte delivered against the checksums recorded at save time (per block of about
  /// 1 MiB of each saved region), as it is read: reads widen to whole blocks, nothing is read
  /// twice. A mismatch fails the load with kCorrupt naming the tensor, region and block.
  bool verify = true;
  /// Also re-read every saved region once (split over the ranks) and check it, including the
  /// parts no rank asked for; costs one more read of the checkpoint.
  bool verify_checksums = false;
  /// Zero-redundancy loading: when several ranks want identical bytes (DP replicas), one of them
  /// (balanced by bytes) reads them from storage and sends them to the others.
  bool zero_redundancy = true;
  /// Two-phase reads: the file span the job wants is cut into one contiguous domain per rank;
  /// each rank reads its domain in windows of `read_window_bytes` and sends every rank the pieces
  /// it wants over MPI. Storage then sees one sequential stream per rank and every byte is read
  /// once, replicas included (it subsumes zero_redundancy). Host buffers only: with device
  /// buffers on any rank the load reads per item.
  bool aggregate_reads = false;
  /// Bytes read at once by an aggregating rank; two such buffers come from the staging pool.
  uint64_t read_window_bytes = 32ull << 20;
  /// See LoadStrictness (used when `strict` is true).
  LoadStrictness strictness = LoadStrictness::kIgnoreUnexpected;
  /// Check the request against the checkpoint and return the report with every list filled
  /// (missing_keys, unexpected_keys, shape_mismatches, dtype_mismatches) without reading a byte
  /// of tensor data; problems do not fail the call. Collective like a load. Shared-level
  /// checkpoints only: where the load would read a node-local checkpoint it fails (kInvalidArgument).
  bool check_only = false;
};

/// Settings of a Checkpointer that outlive one call.
struct CheckpointerOptions {
  /// save_async snapshots and returns; false makes it save synchronously (same results).
  bool async = true;
  /// Bound of the host staging pool used by save_async, allocated once and reused. 0: sized to
  /// the largest save so far (every async save snapshots fully). When a save's bytes exceed the
  /// bound, save_async blocks until the writer has drained enough (see SaveReport::blocked_bytes).
  uint64_t staging_bytes = 0;
  /// Bound of all the memory the library takes for a save or a load beyond the caller's buffers:
  /// the staging pool, host staging of device bytes, read windows, conversion and verification
  /// buffers (docs/performance.md, "Memory"). Saves and loads stream through it, so a small
  /// budget costs time, not correctness. 0: no bound (each pipeline sizes its buffers as it
  /// likes). Non-zero values below 1 KiB are refused at the start of every call. Must be the
  /// same on every rank. A staging_bytes above it is lowered to it.
  uint64_t memory_bytes = 0;
  /// How tensor bytes reach the file. true: parallel HDF5 creates the file and its datasets
  /// collectively, then each rank writes its pieces with positioned writes at the dataset
  /// offsets HDF5 allocated, and fsyncs (fast path). false: independent H5Dwrite calls through
  /// HDF5's MPI-IO driver. Both produce the same file.
  bool direct_writes = true;
  /// With direct_writes: write the block-aligned middle of long runs with O_DIRECT, bypassing the
  /// page cache (no page allocation, no second copy to write back); unaligned ends and short runs
  /// go through the page cache. Buffers that are not block-aligned are copied through an 8 MiB
  /// aligned bounce buffer. Falls back to buffered writes where the file system refuses O_DIRECT.
  bool direct_io = true;
  /// Largest single write; regions are split into pieces of at most this many bytes.
  uint64_t max_piece_bytes = 256ull << 20;
  /// Datasets of at least this many bytes start at a multiple of it in the data file (HDF5
  /// H5Pset_alignment); 1 MiB suits striped parallel file systems. 0 or 1: no alignment.
  uint64_t alignment = 1ull << 20;
  /// MPI-IO hints passed to the parallel HDF5 file (e.g. romio_cb_write=enable, cb_nodes=4,
  /// striping_factor=8 on Lustre). Unknown hints are ignored by MPI.
  std::map<std::string, std::string> mpi_hints;
  /// Threads reading from storage during a load (each with its own file handle). 0: 2 where the
  /// checkpoint is on a network file system (NFS, GlusterFS and other FUSE clients, Lustre, GPFS,
  /// BeeGFS, CephFS, SMB), 1 on a local one.
  int io_threads = 0;
  /// Threads checking a load's verification blocks while the next bytes are read (each chunk of
  /// about 4 MiB is one job, so they also run side by side). 0: the hardware threads divided by
  /// the ranks on this node, less the reader threads (io_threads), at least 1. Loads under
  /// memory_bytes check on the reading thread.
  int verify_threads = 0;
  /// Threads copying save_async's host snapshot into the staging pool (slices of at least
  /// 1 MiB, several pieces at once). 0: the hardware threads divided by the ranks on this node,
  /// at most 8; 1: one copy at a time on the calling thread.
  int snapshot_threads = 0;
  /// Deadline in seconds of every wait of a save or load for other ranks (agreements, broadcasts,
  /// gathers, transfers, the async writer's phases, NCCL set-up). When it passes, every rank still
  /// alive logs the operation, phase and the ranks that did not arrive, and calls MPI_Abort, so the
  /// job ends and can be restarted; nothing is committed. 0: no deadline. Must exceed how far apart
  /// ranks may reach a save or load, and the slowest rank's write or read time. Process-wide: the
  /// last Checkpointer constructed sets it for all.
  double timeout_s = 600;
  /// Write per-rank phase timings and bytes of every save/load as JSON (see metrics_dir).
  bool metrics = true;
  /// Directory for the metrics files; empty: beside the checkpoint, as <checkpoint>.save.json
  /// and <checkpoint>.load.json.
  std::string metrics_dir;
  /// Retention, applied by the coordinator after each committed save (and `latest` update) to
  /// the directory the checkpoint was saved into: keep the `keep_last` newest committed
  /// checkpoints there (by recorded step, then name) and delete the others. 0: keep all.
  /// Never deletes the checkpoint just written or the one `latest` names.
  int64_t keep_last = 0;
  /// With keep_last: also keep forever every checkpoint whose step is a multiple of this. 0: none.
  int64_t keep_every = 0;
  /// Multi-level checkpoints (docs/user-guide.md, "Node-local checkpoints"). Non-empty: a node-local
  /// directory; saves write each rank's bytes there and copies to partner nodes, and commit a
  /// local checkpoint named after the save path's last component; loads read the newest
  /// checkpoint that can be served, local or shared. "{node}" is replaced by the node's index
  /// (several simulated nodes on one file system). Must be the same string on every rank.
  std::string local_dir;
  /// Copies of each node's files kept on the next local_replicas nodes (at most nodes - 1).
  int local_replicas = 1;
  /// Every persist_every-th save (by SaveOptions::step when set, else by count) is also written
  /// as the normal shared checkpoint at the save path, from the local copy, in the background of
  /// an async save. 0: only saves with SaveOptions::persist.
  int64_t persist_every = 0;
  /// Local checkpoints each node keeps (the newest by step); older ones are deleted after each
  /// local commit.
  int64_t local_keep = 2;
  /// Authenticated checkpoints (docs/user-guide.md, "Authenticated checkpoints"): a file of at
  /// least 16 secret bytes, the same on every rank. Saves then sign the summary, every index
  /// table and every verification block with a keyed MAC (BLAKE2b), and loads and verify refuse
  /// what is unauthenticated, tampered with or made with another key. Empty: no key (xxh3 only,
  /// which guards against accidents, not against someone who can write the files). Process-wide,
  /// like timeout_s: the last Checkpointer constructed with a key file sets it (see also
  /// set_auth_key_file).
  std::string auth_key_file;
};

/// Per-call figures of this rank.
struct SaveReport {
  std::string path;               ///< committed checkpoint directory
  uint64_t bytes_written = 0;     ///< bytes this rank wrote (after de-duplication)
  uint64_t bytes_direct = 0;      ///< of those, bytes written with O_DIRECT (see direct_io)
  uint64_t write_calls = 0;       ///< positioned write calls this rank made for tensor bytes (direct_writes)
  uint64_t bytes_aggregated = 0;  ///< bytes this rank wrote as an aggregator (SaveOptions::aggregate_writes)
  uint64_t bytes_total = 0;       ///< unique bytes in the checkpoint (all ranks)
  uint64_t blocked_bytes = 0;     ///< async only: bytes snapshotted only after waiting for the writer
  double plan_s = 0;              ///< planning (0 when the cached plan was reused, but for one allreduce)
  double snapshot_s = 0;          ///< async only: copying into the staging pool (the blocking part)
  double write_s = 0, commit_s = 0, total_s = 0;
  bool plan_cached = false;
  bool async = false;
  std::string level = "shared";  ///< "local" when saved to the node-local level (path is then local)
  std::string persisted;         ///< local saves: the shared checkpoint also written, if any
  double replicate_s = 0;        ///< local saves: sending and receiving the partner copies
  double persist_s = 0;          ///< local saves: the shared-level write and commit, if persisted
};

struct LoadReport {
  std::string path;             ///< checkpoint directory actually read (after following `latest`)
  uint64_t bytes_read = 0;      ///< storage bytes this rank read
  uint64_t bytes_sent = 0;      ///< bytes this rank sent to replicas (zero-redundancy loading)
  uint64_t bytes_received = 0;  ///< bytes this rank received instead of reading them
  /// Keys some rank asked for that the checkpoint lacks (kAllowMissing or check_only), sorted;
  /// the same on every rank.
  std::vector<std::string> missing_keys;
  /// Keys the checkpoint holds that no rank asked for, sorted; the same on every rank.
  std::vector<std::string> unexpected_keys;
  /// check_only: every global shape that differs, as "'key': checkpoint has global shape [..],
  /// the state wants [..]"; sorted, the same on every rank.
  std::vector<std::string> shape_mismatches;
  /// check_only: every dtype the options refuse, as "'key': checkpoint holds f32, the state wants i64".
  std::vector<std::string> dtype_mismatches;
  double plan_s = 0;      ///< metadata, validation and the load plan
  double open_s = 0;      ///< of plan_s: `latest` followed, metadata.json read, the data file opened
  double read_s = 0;      ///< storage reads
  double exchange_s = 0;  ///< waiting for transfers after the reads
  /// Of read_s, summed over the reader threads: seconds waiting in `pread` (io_s), and seconds
  /// copying or converting read bytes from a bounce buffer into place (copy_s; copies out of the
  /// checks' landing buffers are in verify_s). Bytes read in place are copied by the kernel only.
  double io_s = 0, copy_s = 0;
  /// Seconds spent checking verification blocks (and copying checked bytes out of landing
  /// buffers), summed over the threads that did it; with verify_threads they run beside the
  /// reads, so this is work hidden inside read_s rather than added to it.
  double verify_s = 0;
  int verify_threads = 0;  ///< threads that checked blocks beside the reads (0: inline)
  int io_threads = 0;      ///< threads that read from storage (0: this rank read nothing)
  double total_s = 0;
  bool plan_cached = false;
  /// This load read the checkpoint's index (format v2) on the coordinator, validated it and copied
  /// it into every node's shared memory. False when every rank's load plan was cached for this
  /// checkpoint and data file (plan_cached): such a load skips that step.
  bool index_shared = false;
  std::string transport;  ///< "mpi", "mpi-aggregated" (aggregate_reads) or "mpi+<device transport>"
};

/// Which checkpoint a load reads (Checkpointer::resolve).
struct ResolvedCheckpoint {
  CheckpointInfo info;  ///< its metadata (for a local checkpoint: no data file, format_version 0)
  std::string level;    ///< "local" or "shared"
  std::string reason;   ///< which checkpoint and why, e.g. which files had no live copy
};

}  // namespace h5ckpt
