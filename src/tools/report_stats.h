// `h5ckpt report`, the statistics: per phase, the slowest rank against the median, and the
// rule that calls it a straggler.
#pragma once

#include <string>
#include <vector>

#include "tools/report_model.h"

namespace h5ckpt::report {

/// Per phase: the slowest rank against the median of all ranks.
struct PhaseSummary {
  std::string phase;
  double median_s = 0, min_s = 0, max_s = 0;
  int slowest_rank = -1;
  double ratio = 0;  ///< max / median (infinity when the median is 0 and the max is not)
  bool straggler = false;
};

struct StragglerRule {
  double ratio = 1.5;       ///< slowest >= ratio x median ...
  double min_gap_s = 0.01;  ///< ... and at least this many seconds slower (ignores noise in tiny phases)
};

std::vector<PhaseSummary> summarize(const Metrics& m, const StragglerRule& rule = {});

}  // namespace h5ckpt::report
