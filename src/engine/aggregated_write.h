// Two-phase ("aggregated") writes, the twin of aggregated_read: the span of file bytes the ranks
// write is cut into one contiguous domain per rank; every rank sends each domain's owner the
// pieces that fall in it, and each owner writes its domain in large windows. Storage then sees a
// few long writes per rank instead of one per short run (the rows of a tensor split along a
// dimension other than the first), which is what costs on a network file system (one round trip
// per call). The cost is one memory transfer through MPI.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "h5ckpt/status.h"

namespace h5ckpt::engine {

/// Bytes [src, src + length) for file bytes [offset, offset + length). Pieces of all ranks must be
/// disjoint in the file; `src` must stay valid and unchanged until aggregated_write returns.
struct WritePiece {
  uint64_t offset = 0;
  uint64_t length = 0;
  const char* src = nullptr;
};

struct AggregatedWriteReport {
  uint64_t bytes_written = 0;   ///< bytes this rank wrote for its domain
  uint64_t bytes_sent = 0;      ///< bytes sent to other ranks
  uint64_t bytes_received = 0;  ///< bytes received from other ranks
  uint64_t windows = 0;         ///< windows this rank wrote
  uint64_t spans = 0;           ///< contiguous file ranges it wrote them as (one write call each)
  uint64_t messages = 0;        ///< messages it sent (one per run of pieces back to back in memory)
};

/// Writes a contiguous range of the file (one positioned write, or a few for O_DIRECT ends).
using WriteBytes = std::function<Status(const char* data, uint64_t length, uint64_t offset)>;

/// Window-sized buffers aggregated_write needs in `slots`.
constexpr uint64_t kWriteWindowBuffers = 3;

/// Writes every rank's `pieces` through `write`. `slots` holds kWriteWindowBuffers * window_bytes
/// bytes (window_bytes >= 64, at most 1 GiB, the same on every rank): one window is received while
/// the previous one is written, and a sender's rows that the file interleaves with another rank's
/// land in the third buffer as one contiguous message before they are copied into place. Collective over `comm`, which must carry no other point-to-point
/// traffic meanwhile. A failed write stops this rank's writes but not its receives, so no sender
/// waits forever: the caller's agreement must follow.
Result<AggregatedWriteReport> aggregated_write(MPI_Comm comm, std::vector<WritePiece> pieces, uint64_t window_bytes,
                                               char* slots, const WriteBytes& write);

}  // namespace h5ckpt::engine
