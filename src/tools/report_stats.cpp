#include "tools/report_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace h5ckpt::report {

namespace {

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  if (n == 0) return 0;
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::vector<PhaseSummary> summarize(const Metrics& m, const StragglerRule& rule) {
  std::vector<PhaseSummary> out;
  for (size_t p = 0; p < m.phases.size(); ++p) {
    PhaseSummary s;
    s.phase = m.phases[p];
    std::vector<double> vals;
    for (const auto& r : m.ranks) {
      const double v = r.phase_s[p];
      if (!std::isfinite(v)) continue;
      vals.push_back(v);
      if (s.slowest_rank < 0 || v > s.max_s) {  // first (lowest) rank wins ties
        s.max_s = v;
        s.slowest_rank = r.rank;
      }
    }
    if (!vals.empty()) {
      s.min_s = *std::min_element(vals.begin(), vals.end());
      s.median_s = median_of(vals);
      s.ratio = s.median_s > 0 ? s.max_s / s.median_s : (s.max_s > 0 ? std::numeric_limits<double>::infinity() : 1.0);
      s.straggler = vals.size() > 1 && s.ratio >= rule.ratio && s.max_s - s.median_s >= rule.min_gap_s;
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace h5ckpt::report
