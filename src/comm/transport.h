// The seam for bulk redistribution of loaded bytes between ranks. The MPI implementation is
// always built; a device transport (NCCL) plugs in behind the same interface.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>

#include "h5ckpt/status.h"

namespace h5ckpt::comm {

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  /// Starts sending `bytes` from `data` to `peer`; `data` must stay valid until wait_all().
  /// Messages between one pair of ranks with one tag arrive in the order they were posted.
  virtual Status post_send(int peer, const void* data, uint64_t bytes, int tag) = 0;
  /// Starts receiving `bytes` into `data` from `peer`.
  virtual Status post_recv(int peer, void* data, uint64_t bytes, int tag) = 0;
  /// Lets posted transfers advance without blocking (call between reads to overlap them).
  virtual Status progress() = 0;
  /// Completes every posted transfer.
  virtual Status wait_all() = 0;
  /// Whether every posted transfer has completed (then they are released, as by wait_all), without
  /// blocking. A transport that cannot tell waits for them.
  virtual Result<bool> test() {
    H5CKPT_RETURN_IF_ERROR(wait_all());
    return true;
  }
};

/// Point-to-point MPI over `comm` (which must outlive the transport); splits messages at
/// comm::chunk_limit() (1 GiB). wait_all() is bounded by the timeout (comm/deadline.h) and sleeps
/// `poll_us` between polls (0: polls without sleeping, for bulk bytes that advance only inside
/// MPI calls).
std::unique_ptr<Transport> make_mpi_transport(MPI_Comm comm, int poll_us = 50);

}  // namespace h5ckpt::comm
