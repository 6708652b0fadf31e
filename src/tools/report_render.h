// `h5ckpt report`: reads the per-save/load metrics JSON (src/metrics/report.h) and renders a
// rank x phase heat map, a per-rank breakdown and a straggler summary. Pure functions: no MPI,
// no HDF5, so the rendering is unit-tested on its own (tests/report.cmake).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "h5ckpt/status.h"

namespace h5ckpt::report {

struct RankRow {
  int rank = 0;
  std::vector<int> coords;     ///< tp, dp, pp (empty when the file has none)
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

/// Per phase: the slowest rank against the median of all ranks.
struct PhaseSummary {
  std::string phase;
  double median_s = 0, min_s = 0, max_s = 0;
  int slowest_rank = -1;
  double ratio = 0;  ///< max / median (infinity when the median is 0 and the max is not)
  bool straggler = false;
};

struct StragglerRule {
  double ratio = 1.5;    ///< slowest >= ratio x median ...
  double min_gap_s = 0.01;  ///< ... and at least this many seconds slower (ignores noise in tiny phases)
};

/// Parses and validates one metrics document; errors name `source` and the offending field.
Result<Metrics> parse_metrics(const std::string& json_text, const std::string& source);

/// PATH is a metrics JSON file, a checkpoint directory (reads <ckpt>.save.json and/or
/// <ckpt>.load.json beside it, or in `metrics_dir` when not empty), or a directory of
/// checkpoints with a `latest` file (follows it).
Result<std::vector<Metrics>> load_metrics(const std::string& path, const std::string& metrics_dir = "");

std::vector<PhaseSummary> summarize(const Metrics& m, const StragglerRule& rule = {});

/// A self-contained HTML page (inline SVG and CSS, no scripts or external resources).
std::string render_html(const std::vector<Metrics>& all, const StragglerRule& rule = {});

/// The plain-text summary printed on stdout.
std::string render_text(const std::vector<Metrics>& all, const StragglerRule& rule = {});

/// Seconds as the report prints them ("%.3f").
std::string format_seconds(double s);

}  // namespace h5ckpt::report
