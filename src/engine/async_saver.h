// Asynchronous saves: snapshot into the staging pool on the caller's thread, everything else
// (HDF5 writes, checksums, metadata, commit) on a background thread with its own communicators.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/engine.h"
#include "h5ckpt/checkpointer.h"  // SaveHandle::State is defined here
#include "engine/level.h"
#include "engine/staging_pool.h"
#include "util/work_pool.h"

namespace h5ckpt {

struct SaveHandle::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool observed = false;  ///< someone called wait(); an unobserved failure surfaces on the next save
  Result<SaveReport> result = Status(ErrorCode::kInternal, "save still running");
  double snapshot_s = 0;
  uint64_t blocked_bytes = 0;
};

namespace engine {

class AsyncSaver {
 public:
  /// `pool` outlives the saver; loads and synchronous saves use it only after finish_pending().
  AsyncSaver(const Topology::Impl& topo, const CheckpointerOptions& options, StagingPool& pool);
  ~AsyncSaver();

  /// See Checkpointer::save_async. Collective over topo.world: `level` prepares the job on this
  /// thread and saves it on the I/O thread with the snapshot as its source.
  Result<SaveHandle> start(const StateDict& state, const std::string& path, const SaveOptions& options,
                           const std::map<std::string, std::string>& attributes, PlanCache& cache, Level& level);

  /// Waits for the save in flight (if any); returns its state, or null.
  std::shared_ptr<SaveHandle::State> finish_pending();

 private:
  Status ensure_io_comms();
  /// Threads of the host snapshot copy (CheckpointerOptions::snapshot_threads resolved).
  int snapshot_threads() const;
  const Topology::Impl& topo_;
  CheckpointerOptions options_;
  std::unique_ptr<Topology::Impl> io_comms_;  // duplicates used only by the I/O thread
  StagingPool& pool_;
  std::thread worker_;
  std::shared_ptr<SaveHandle::State> pending_;
  std::unique_ptr<detail::WorkPool> copy_pool_;  // the snapshot's copiers, kept between saves
};

}  // namespace engine
}  // namespace h5ckpt
