// A few worker threads that run jobs beside the thread that hands them out: the block checks of
// a load while its next read is in flight, and the slices of a snapshot copy. Jobs come in
// groups whose outcome is reported once, when the last of them has run.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "h5ckpt/status.h"

namespace h5ckpt::detail {

/// Threads for a checkpoint operation: `requested` when positive, else the machine's hardware
/// threads shared by the `ranks_here` ranks of this node, less `busy_here` threads this rank keeps
/// busy beside them (a load's readers), at least 1.
int default_threads(int requested, int ranks_here, int busy_here = 0);

class WorkPool {
 public:
  /// Jobs whose outcome is reported together (one loaded item's checks, one snapshot).
  class Group;

  /// `threads` workers (at least 1). At most `max_queued` jobs that hold a buffer wait or run at
  /// once (0: two per worker plus two): submit() blocks beyond that, so a producer stays a bounded
  /// distance ahead of the workers and the buffers its jobs hold stay bounded.
  /// `batch`: the workers run as SCHED_BATCH, so that one woken by a submit does not preempt
  /// the thread that fed it. For a feeder that does work of its own between submits (a load's
  /// reader); not for one that waits or polls for the workers' results (a transfer's progress
  /// loop: with batch hashers, verified transfers on the 2-core VM took 2.18-2.19x their floor
  /// in two runs, against 1.70-2.02x in seven without).
  explicit WorkPool(int threads, int max_queued = 0, bool batch = false);
  /// Runs every job submitted, then joins the workers.
  ~WorkPool();
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()); }

  /// A new group; `on_done(first error, or Ok)` runs once, after seal() and after the group's
  /// last job, on whichever thread finishes last (a worker, or the one that calls seal()).
  std::shared_ptr<Group> group(std::function<void(const Status&)> on_done = {});
  /// Queues `job` in `g`. A job that holds a buffer of the producer's blocks the producer while
  /// max_queued such jobs wait or run; one that holds none (`holds_buffer` false: checks of bytes
  /// already where they belong) never does, so the producer's next read is never held up by it.
  void submit(const std::shared_ptr<Group>& g, std::function<Status()> job, bool holds_buffer = true);
  /// No more jobs for `g`; `producer` (an error of the submitting side, e.g. a failed read) joins
  /// the group's outcome.
  void seal(const std::shared_ptr<Group>& g, const Status& producer = Status::Ok());
  /// Blocks until `g` is sealed and every job of it has run; returns its outcome.
  Status wait(const std::shared_ptr<Group>& g);
  /// Runs queued jobs (of any group) on the calling thread until none is queued: a producer that
  /// has nothing left to produce lends its core, so the last jobs do not wait for the workers.
  void help();

 private:
  struct Job {
    std::shared_ptr<Group> group;
    std::function<Status()> run;
    bool holds_buffer = true;  // counts against max_queued_
  };
  static void run_as_batch();  // the calling worker does not preempt its feeder on wake-up
  void work();
  void run(Job& job);
  void finish_one(const std::shared_ptr<Group>& g, const Status& st);

  std::mutex mu_;
  std::condition_variable has_work_, has_room_;
  std::deque<Job> queue_;
  size_t in_flight_ = 0;  // buffer-holding jobs queued or running
  size_t max_queued_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

class WorkPool::Group {
 public:
  /// The first error of any job or of the producer so far.
  Status status() const {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }

 private:
  friend class WorkPool;
  mutable std::mutex mu_;
  std::condition_variable done_cv_;
  size_t pending_ = 0;
  bool sealed_ = false, done_ = false;
  Status status_;
  std::function<void(const Status&)> on_done_;
};

}  // namespace h5ckpt::detail
