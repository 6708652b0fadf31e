// Bounded waits: every wait of a save or load for its peers has a deadline (timeout_s). When it
// passes, the rank names the operation and phase it is in and the ranks that did not arrive, and
// calls MPI_Abort: a job with a stopped or lost rank ends (and can be restarted) instead of
// hanging, and nothing is committed, as the commit needs every rank past its writes first.
//
// The timeout is process-wide (set by each Checkpointer from CheckpointerOptions::timeout_s,
// read atomically), so the byte collectives and transports need no extra argument; a deadline is
// fixed when a wait (or a chunked collective) starts.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>

#include "h5ckpt/status.h"

namespace h5ckpt::comm {

/// Exit code given to MPI_Abort when a deadline passes.
constexpr int kTimeoutExitCode = 124;

/// Sets the timeout of every later wait, in seconds; 0 (or less, or not finite): no deadline.
void set_timeout(double seconds);
/// The current timeout in seconds (0: none). Default 600, as CheckpointerOptions::timeout_s.
double timeout();

/// When a wait that starts now must end.
class Deadline {
 public:
  Deadline();
  bool bounded() const { return bounded_; }
  bool passed(std::chrono::steady_clock::time_point now) const { return bounded_ && now >= at_; }
  double seconds() const { return seconds_; }  ///< the timeout it was made with
  std::chrono::steady_clock::time_point started() const { return started_; }
  std::chrono::steady_clock::time_point at() const { return at_; }

 private:
  std::chrono::steady_clock::time_point started_, at_;
  double seconds_ = 0;
  bool bounded_ = false;
};

/// Completes `n` requests, sleeping `poll_us` between polls. Past `deadline` (or as soon as a
/// peer of `comm` reports that its own deadline passed) it reports and aborts the job (expire).
/// `comm` (MPI_COMM_NULL if unknown) is the communicator whose peers are waited for.
Status wait_until(int n, MPI_Request* requests, int poll_us, const char* what, MPI_Comm comm, const Deadline& deadline);

/// For waits on something other than MPI requests (NCCL): aborts like wait_until when `deadline`
/// passed or a peer of `comm` expired; returns otherwise. Call it between polls.
void check_deadline(const Deadline& deadline, const char* what, MPI_Comm comm);

/// Logs one line naming the calling thread's operation and phase, `what`, and the ranks of
/// `comm` that did not arrive (asked over comm's side channel, for a short grace time), then
/// calls MPI_Abort(MPI_COMM_WORLD, kTimeoutExitCode). `joined`: a peer expired first.
[[noreturn]] void expire(const char* what, MPI_Comm comm, const Deadline& deadline, bool joined);

/// Bounds a blocking call that cannot be polled, such as a collective inside parallel HDF5
/// (H5Fcreate, H5Fclose): if the guard still exists when the timeout passes, a watchdog thread
/// expires on this rank as wait_until would, with the phase of the thread that made the guard.
/// Reports over `comm`'s side channel need MPI_THREAD_MULTIPLE; otherwise they say "unknown".
class BlockingGuard {
 public:
  BlockingGuard(const char* what, MPI_Comm comm);
  ~BlockingGuard();
  BlockingGuard(const BlockingGuard&) = delete;
  BlockingGuard& operator=(const BlockingGuard&) = delete;

 private:
  uint64_t id_ = 0;  // 0: no deadline
};

/// A duplicate of `c` kept beside it for timeout reports only, so no report can match (or be
/// matched by) the traffic on `c`. Collective over `c`; called by Comm::duplicate.
Status open_side_channel(MPI_Comm c);
/// Frees the side channel of `c`, if any (before `c` itself is freed).
void close_side_channel(MPI_Comm c);

}  // namespace h5ckpt::comm
