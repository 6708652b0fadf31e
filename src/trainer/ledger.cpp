#include "ledger.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace h5ckpt::workload {

void Ledger::record(int64_t step, int dp_rank, const std::vector<loader::Piece>& pieces) {
  for (const auto& p : pieces) rows_.insert(rows_.end(), {step, dp_rank, p.id.source, p.id.record, p.begin, p.end});
}

Status Ledger::flush(MPI_Comm world, const std::string& path) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  int n = static_cast<int>(rows_.size());
  std::vector<int> counts(static_cast<size_t>(size)), displs(static_cast<size_t>(size));
  MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, world);
  int total = 0;
  for (int r = 0; r < size; ++r) {
    displs[static_cast<size_t>(r)] = total;
    total += counts[static_cast<size_t>(r)];
  }
  std::vector<int64_t> all(rank == 0 ? static_cast<size_t>(total) : 0);
  MPI_Gatherv(rows_.data(), n, MPI_INT64_T, all.data(), counts.data(), displs.data(), MPI_INT64_T, 0, world);
  rows_.clear();
  int ok = 1;
  if (rank == 0) {
    std::vector<size_t> order(all.size() / 6);
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return std::make_pair(all[a * 6], all[a * 6 + 1]) < std::make_pair(all[b * 6], all[b * 6 + 1]);
    });
    std::FILE* f = std::fopen(path.c_str(), "a");
    if (!f) {
      ok = 0;
    } else {
      for (size_t i : order) {
        const int64_t* r = &all[i * 6];
        std::fprintf(f, "%lld %lld %lld %lld %lld %lld\n", (long long)r[0], (long long)r[1], (long long)r[2],
                     (long long)r[3], (long long)r[4], (long long)r[5]);
      }
      ok = std::fclose(f) == 0;
    }
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, world);
  if (!ok) return Status(ErrorCode::kIo, "cannot append to ledger '" + path + "'");
  return Status::Ok();
}

Status mark_resume(const std::string& path, int64_t step) {
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) return Status(ErrorCode::kIo, "cannot append to ledger '" + path + "'");
  std::fprintf(f, "%s%lld\n", kResumedAt, static_cast<long long>(step));
  if (std::fclose(f) != 0) return Status(ErrorCode::kIo, "cannot append to ledger '" + path + "'");
  return Status::Ok();
}

Result<std::vector<LedgerEntry>> read_ledger(const std::string& path, int64_t max_step) {
  std::ifstream in(path);
  if (!in) return Status(ErrorCode::kNotFound, "cannot open ledger '" + path + "'");
  std::vector<LedgerEntry> out;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.rfind(kResumedAt, 0) == 0) {  // a resume from an older checkpoint: later steps re-run
      const int64_t at = std::atoll(line.c_str() + std::strlen(kResumedAt));
      out.erase(std::remove_if(out.begin(), out.end(), [at](const LedgerEntry& e) { return e.step > at; }), out.end());
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::istringstream is(line);
    LedgerEntry e;
    int64_t src = 0;
    if (!(is >> e.step >> e.dp >> src >> e.piece.id.record >> e.piece.begin >> e.piece.end))
      return Status(ErrorCode::kCorrupt, path + ":" + std::to_string(lineno) + ": malformed ledger line");
    e.piece.id.source = static_cast<int32_t>(src);
    if (max_step >= 0 && e.step > max_step) continue;
    out.push_back(e);
  }
  return out;
}

}  // namespace h5ckpt::workload
