// MPI wrappers: an owning communicator, the agreement step, and byte collectives.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "h5ckpt/status.h"

namespace h5ckpt::comm {

/// Owns a duplicate of a communicator, with MPI_ERRORS_RETURN so failures become Status values.
class Comm {
 public:
  Comm() = default;
  static Result<Comm> duplicate(MPI_Comm c);
  Comm(Comm&& o) noexcept : c_(o.c_) { o.c_ = MPI_COMM_NULL; }
  Comm& operator=(Comm&& o) noexcept;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm();

  MPI_Comm get() const { return c_; }
  int rank() const;
  int size() const;

 private:
  MPI_Comm c_ = MPI_COMM_NULL;
};

/// Turns an MPI return code into a Status naming the call.
Status mpi_status(int rc, const char* what);

/// The agreement step ending every collective phase: every rank passes its local outcome and
/// every rank gets back the same Status. On failure it carries the first failing rank's
/// message and the list of failing ranks. Ranks that arrive first wait asleep (wait_asleep).
/// Collective over `comm`.
Status agree(const Status& local, MPI_Comm comm);

/// agree() that also carries one flag per rank in the same collective: on success `*flag`
/// becomes the minimum over all ranks (lets a phase fold a yes/no question into its agreement).
Status agree(const Status& local, MPI_Comm comm, int* flag);

/// agree() with `nflags` flags per rank, each becoming its minimum over all ranks on success.
Status agree(const Status& local, MPI_Comm comm, int* flags, int nflags);

/// Completes `n` requests, sleeping `poll_us` between MPI_Testall polls: blocking MPI calls
/// busy-poll, and a rank waiting for slower peers would take the CPU they need wherever ranks
/// outnumber cores (or a background thread would take the trainer's). Bounded by the timeout
/// (comm/deadline.h): past it the job is aborted with a report naming `what` and the ranks of
/// `comm` (the communicator the requests are on; MPI_COMM_NULL if unknown) that did not arrive.
Status wait_asleep(int n, MPI_Request* requests, int poll_us, const char* what, MPI_Comm comm = MPI_COMM_NULL);

/// A barrier that sleeps between polls instead of spinning, for background threads whose wait
/// should leave the CPU to the trainer (blocking MPI collectives busy-poll). Collective.
Status idle_barrier(MPI_Comm comm, int poll_us = 200);

// The byte collectives below take sizes as 64-bit values and move payloads in messages of at
// most chunk_limit() bytes (MPI counts are int), so every rank takes the same path whatever the
// sizes; each is bounded by one deadline (comm/deadline.h) from its start.

/// Broadcasts a byte string from `root`. Collective.
Status bcast_bytes(std::string& bytes, int root, MPI_Comm comm);

/// Broadcasts `bytes` bytes at `data` from `root` (every rank passes the same size). Collective.
Status bcast_into(char* data, uint64_t bytes, int root, MPI_Comm comm);

/// Gathers every rank's bytes to `root` (result[rank]); empty on other ranks. Collective.
Result<std::vector<std::string>> gather_bytes(const std::string& mine, int root, MPI_Comm comm);

/// Scatters parts[rank] from `root` to each rank (`parts` is read on the root only; a missing
/// part is sent empty and fails the call on the root). Collective.
Result<std::string> scatter_bytes(const std::vector<std::string>& parts, int root, MPI_Comm comm);

/// A byte buffer of one node, in MPI shared memory: the node's rank 0 allocates it, every rank of
/// the node reads it in place (one copy per node, e.g. of a checkpoint's index). Allocation and
/// destruction are collective over the node communicator (MPI_Win_allocate_shared / MPI_Win_free):
/// every rank of the node must destroy it at the same point.
class NodeShared {
 public:
  NodeShared() = default;
  static Result<NodeShared> allocate(uint64_t bytes, MPI_Comm node);
  NodeShared(NodeShared&& o) noexcept : win_(o.win_), data_(o.data_), size_(o.size_) { o.win_ = MPI_WIN_NULL; }
  NodeShared& operator=(NodeShared&& o) noexcept;
  NodeShared(const NodeShared&) = delete;
  NodeShared& operator=(const NodeShared&) = delete;
  ~NodeShared();

  char* data() const { return data_; }  ///< written by the node's rank 0 only, before sync()
  uint64_t size() const { return size_; }
  /// Makes rank 0's writes visible to the node's other ranks. Collective over the node.
  Status sync(MPI_Comm node);

 private:
  void release();  // frees the window (collective over the node) unless MPI is finalized
  MPI_Win win_ = MPI_WIN_NULL;
  char* data_ = nullptr;
  uint64_t size_ = 0;
};

/// Messages and bytes this process has received through this layer (all threads, since start):
/// point-to-point pieces as posted, and inside MPI's collectives the messages their algorithms
/// deliver to this rank (linear gathers and scatters, binomial broadcasts, recursive-doubling
/// reductions: ceil(log2 size) messages). Counts coordination traffic for h5ckpt-traffic and the
/// tests of the node tree; tensor bytes (mpi_transport) and HDF5's own MPI-IO are not included.
struct Traffic {
  uint64_t messages = 0;
  uint64_t bytes = 0;
};
Traffic received_traffic();

/// Largest single message of the byte collectives and the MPI transport: 1 GiB, or
/// $H5CKPT_TEST_CHUNK_BYTES (read once), or what set_chunk_limit_for_testing set.
uint64_t chunk_limit();
/// Lowers the message size so tests can cross chunk boundaries with small payloads; 0 restores
/// the default. Every rank must use the same limit.
void set_chunk_limit_for_testing(uint64_t bytes);

}  // namespace h5ckpt::comm
