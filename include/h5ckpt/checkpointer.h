// The façade a trainer calls: collective save and load with automatic resharding.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "h5ckpt/checkpoint_info.h"  // CheckpointInfo, read_checkpoint_info, verify_checkpoint
#include "h5ckpt/export.h"
#include "h5ckpt/options.h"  // SaveOptions, LoadOptions, CheckpointerOptions, the reports
#include "h5ckpt/state.h"
#include "h5ckpt/status.h"
#include "h5ckpt/topology.h"

namespace h5ckpt {
namespace detail {
struct SaveHandleAccess;  // constructs handles inside the library (src/api/handle_access.h)
}  // namespace detail

/// An asynchronous save in flight. Copyable; all copies refer to the same save.
class H5CKPT_API SaveHandle {
 public:
  SaveHandle() = default;
  bool valid() const { return state_ != nullptr; }
  /// True once the save has committed or failed (never blocks).
  bool test() const;
  /// Blocks until the save has committed or failed; every rank gets the same outcome.
  Result<SaveReport> wait();

  struct State;

 private:
  friend struct detail::SaveHandleAccess;
  explicit SaveHandle(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

/// Saves and loads StateDicts over one Topology.
///
/// At most one save is in flight per Checkpointer: a save, save_async or load first waits for
/// the previous asynchronous save to commit. Destroying the Checkpointer waits too, so destroy it
/// before MPI_Finalize.
class H5CKPT_API Checkpointer {
 public:
  explicit Checkpointer(const Topology& topology, const CheckpointerOptions& options = {});
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  /// Writes `state` as checkpoint directory `path` and commits it atomically.
  /// Collective over the topology's world; every rank returns the same Status.
  Result<SaveReport> save(const StateDict& state, const std::string& path, const SaveOptions& options = {});

  /// Like save(), but returns once this rank's part of `state` has been copied into the staging
  /// pool; the caller may then modify its buffers. Writing, checksumming and the commit run on a
  /// background I/O thread with its own communicators. If the previous asynchronous save failed
  /// and nobody called wait() on it, its error is returned here and nothing new is started.
  /// Falls back to a synchronous save (with a warning) when MPI was not initialized with
  /// MPI_THREAD_MULTIPLE. Collective over the topology's world.
  Result<SaveHandle> save_async(const StateDict& state, const std::string& path, const SaveOptions& options = {});

  /// Waits for the asynchronous save in flight, if any (its outcome stays on its handle).
  void wait_pending();

  /// Reads one byte of every page of the staging pool (after waiting for the save in flight).
  /// Where idle memory is taken back by the host (some VMs), the next save_async's snapshot would
  /// otherwise pay for mapping the pool again; benchmarks call this before timing one.
  void touch_staging();

  /// Fills the buffers of `state` from the checkpoint at `path` (a checkpoint directory, or a
  /// directory whose `latest` names one), whatever layout saved it.
  /// Collective over the topology's world; every rank returns the same Status.
  Result<LoadReport> load(StateDict& state, const std::string& path, const LoadOptions& options = {});

  /// The checkpoint load(state, path) would read and its metadata: without local_dir the one at
  /// `path` (following `latest`); with it, the newest checkpoint standing for `path` that can be
  /// served: a local one when every rank's bytes are intact on some node (original or partner
  /// copy), else the newest shared one. The next load of the same path uses this answer (once;
  /// later loads resolve again).
  /// Collective over the topology's world; every rank returns the same.
  Result<ResolvedCheckpoint> resolve(const std::string& path);

  /// String attributes stored with the next save (e.g. trainer configuration).
  void set_attribute(const std::string& name, const std::string& value);

  /// The most memory this rank's library buffers held at once (the staging pool included) since
  /// the Checkpointer was made or reset_memory_peak() was called: at most memory_bytes when set.
  uint64_t memory_peak_bytes() const;
  /// Restarts memory_peak_bytes() from what is held now (after waiting for a save in flight).
  void reset_memory_peak();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// Library version string, e.g. "0.1.0".
H5CKPT_API const char* version();

}  // namespace h5ckpt
