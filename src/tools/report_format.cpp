#include "tools/report_format.h"

#include <cmath>
#include <cstdio>

namespace h5ckpt::report {

std::string format_seconds(double s) { return fmt("%.3f", s); }

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string ratio_str(double r) { return std::isfinite(r) ? fmt("%.2f", r) + "x" : "inf"; }

std::string coords_str(const RankRow& r) {
  if (r.coords.size() != 3) return "";
  return "tp" + std::to_string(r.coords[0]) + " dp" + std::to_string(r.coords[1]) + " pp" + std::to_string(r.coords[2]);
}

std::string title_of(const Metrics& m) {
  std::string t = m.op + " of " + m.checkpoint + " — " + std::to_string(m.world) + (m.world == 1 ? " rank" : " ranks");
  if (m.tp > 0) t += " (tp" + std::to_string(m.tp) + " dp" + std::to_string(m.dp) + " pp" + std::to_string(m.pp) + ")";
  return t;
}

}  // namespace h5ckpt::report
