// Two-phase ("aggregated") reads: the ranks cut the span of file bytes the job wants into one
// contiguous domain per rank; each rank reads its domain in large windows and sends every rank
// the pieces of it that rank asked for. Storage sees one sequential stream per rank, every byte
// is read once however many ranks want it, and the cost is one memory transfer through MPI.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "h5ckpt/status.h"

namespace h5ckpt::engine {

class StagingPool;

/// File bytes [offset, offset + length) that land at dst. A rank's pieces must not overlap in
/// memory; they may overlap other ranks' pieces in the file.
struct ReadPiece {
  uint64_t offset = 0;
  uint64_t length = 0;
  char* dst = nullptr;
};

struct AggregatedReadReport {
  uint64_t bytes_read = 0;      ///< storage bytes this rank read for its domain
  uint64_t bytes_sent = 0;      ///< bytes sent to other ranks
  uint64_t bytes_received = 0;  ///< bytes received from other ranks
  uint64_t windows = 0;         ///< windows this rank read
  uint64_t messages = 0;        ///< messages it received (one per run of pieces back to back in memory)
  double io_s = 0;              ///< seconds its reading helper waited in `pread`
};

/// Window-sized buffers a two-phase read uses: two windows (one is read while the other is sent)
/// and, for each, an area where a rank's runs are packed into one contiguous message.
constexpr uint64_t kReadWindowBuffers = 4;

/// Reads every rank's pieces from `data_file`. `window_bytes` (at most 1 GiB) bounds one read and
/// one buffer; kReadWindowBuffers window buffers come from `pool` (which must be idle). Collective over
/// `comm`, which must carry no other point-to-point traffic meanwhile. A failed read still sends
/// (then meaningless) bytes so no rank waits forever: the caller's agreement must follow.
Result<AggregatedReadReport> aggregated_read(MPI_Comm comm, const std::string& data_file, std::vector<ReadPiece> pieces,
                                             uint64_t window_bytes, StagingPool& pool);

/// The same with the window buffers from the caller: `slots` holds kReadWindowBuffers * window_bytes bytes
/// (window_bytes >= 64 and the same on every rank). Used under a memory budget.
Result<AggregatedReadReport> aggregated_read(MPI_Comm comm, const std::string& data_file, std::vector<ReadPiece> pieces,
                                             uint64_t window_bytes, char* slots);

}  // namespace h5ckpt::engine
