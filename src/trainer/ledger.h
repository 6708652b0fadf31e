// A record of every sample piece the data loader handed out, for the exactly-once check.
// One text line per piece: "step dp source record begin end".
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "h5ckpt/loader_state.h"
#include "h5ckpt/status.h"

namespace h5ckpt::workload {

struct LedgerEntry {
  int64_t step = 0;
  int64_t dp = 0;
  loader::Piece piece;
};

/// Pieces recorded on this rank since the last flush.
class Ledger {
 public:
  void record(int64_t step, int dp_rank, const std::vector<loader::Piece>& pieces);
  /// Gathers every rank's entries to world rank 0, which appends them to `path` sorted by
  /// (step, dp). Collective over `world`; all ranks return rank 0's outcome.
  Status flush(MPI_Comm world, const std::string& path);

 private:
  std::vector<int64_t> rows_;  // 6 int64 per entry
};

/// A ledger line saying the run resumed at `step`: the entries of later steps before it were
/// consumed by a run whose checkpoints were lost, and are re-consumed after it.
inline constexpr const char* kResumedAt = "# resumed-at ";
/// Appends that line (rank 0 only, after a successful resume).
Status mark_resume(const std::string& path, int64_t step);

/// Reads a ledger file; entries with step > max_step are skipped (max_step < 0: none), and so
/// are entries of steps past a later "resumed-at" line.
Result<std::vector<LedgerEntry>> read_ledger(const std::string& path, int64_t max_step = -1);

}  // namespace h5ckpt::workload
