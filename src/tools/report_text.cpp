#include "tools/report_text.h"

#include <cstdio>
#include <sstream>

#include "tools/report_format.h"

namespace h5ckpt::report {

std::string render_text(const std::vector<Metrics>& all, const StragglerRule& rule) {
  std::ostringstream o;
  for (const auto& m : all) {
    const auto sum = summarize(m, rule);
    o << title_of(m) << "\n  metrics: " << m.source << "\n";
    char line[256];
    std::snprintf(line, sizeof line, "  %-12s %10s %10s %10s  %-28s %9s\n", "phase", "min s", "median s", "max s",
                  "slowest rank", "x median");
    o << line;
    std::vector<std::string> flagged;
    for (const auto& s : sum) {
      const RankRow* r = nullptr;
      for (const auto& row : m.ranks)
        if (row.rank == s.slowest_rank) r = &row;
      std::string who = s.slowest_rank < 0 ? "-" : std::to_string(s.slowest_rank);
      if (r && !r->coords.empty()) who += " (" + coords_str(*r) + ")";
      std::snprintf(line, sizeof line, "  %-12s %10s %10s %10s  %-28s %9s%s\n", s.phase.c_str(),
                    format_seconds(s.min_s).c_str(), format_seconds(s.median_s).c_str(),
                    format_seconds(s.max_s).c_str(), who.c_str(), ratio_str(s.ratio).c_str(),
                    s.straggler ? "  STRAGGLER" : "");
      o << line;
      if (s.straggler)
        flagged.push_back("rank " + std::to_string(s.slowest_rank) + " in " + s.phase + " (" + format_seconds(s.max_s) +
                          " s vs median " + format_seconds(s.median_s) + " s, " + ratio_str(s.ratio) + ")");
    }
    const RankRow* slowest = nullptr;
    for (const auto& r : m.ranks)
      if (!slowest || r.total_s() > slowest->total_s()) slowest = &r;
    if (slowest)
      o << "  slowest rank overall: " << slowest->rank << " (" << format_seconds(slowest->total_s())
        << " s over all phases)\n";
    if (flagged.empty())
      o << "  stragglers: none (rule: slowest >= " << fmt("%.2f", rule.ratio)
        << "x median and >= " << format_seconds(rule.min_gap_s) << " s slower)\n";
    for (const auto& f : flagged) o << "  straggler: " << f << "\n";
    o << "\n";
  }
  return o.str();
}

}  // namespace h5ckpt::report
