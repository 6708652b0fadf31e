// `h5ckpt report`, the data: the metrics files a save/load wrote (h5ckpt/metrics_schema.h),
// parsed and validated. Pure functions: no MPI, no HDF5 (unit-tested in tests/report.cmake).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "h5ckpt/status.h"

namespace h5ckpt::report {

struct RankRow {
  int rank = 0;
  std::vector<int> coords;      ///< tp, dp, pp (empty when the file has none)
  std::vector<double> phase_s;  ///< seconds per phase of Metrics::phases; NaN when missing
  std::vector<std::pair<std::string, uint64_t>> bytes;
  double total_s() const;  ///< sum of the present phases
};

/// One metrics file: one save or load over all ranks.
struct Metrics {
  std::string source;  ///< file it was read from
  std::string op;      ///< "save" / "load"
  std::string checkpoint;
  int world = 0;
  int tp = 0, dp = 0, pp = 0;
  std::vector<std::string> phases;  ///< display order (the file's phase_order)
  std::vector<RankRow> ranks;       ///< sorted by rank
};

/// Parses and validates one metrics document; errors name `source` and the offending field.
Result<Metrics> parse_metrics(const std::string& json_text, const std::string& source);

/// PATH is a metrics JSON file, a checkpoint directory (reads <ckpt>.save.json and/or
/// <ckpt>.load.json beside it, or in `metrics_dir` when not empty), or a directory of
/// checkpoints with a `latest` file (follows it).
Result<std::vector<Metrics>> load_metrics(const std::string& path, const std::string& metrics_dir = "");

}  // namespace h5ckpt::report
