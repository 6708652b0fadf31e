// `h5ckpt report`: numbers and labels as both renderings (text and HTML) print them.
#pragma once

#include <string>

#include "tools/report_model.h"

namespace h5ckpt::report {

/// Seconds as the report prints them ("%.3f").
std::string format_seconds(double s);
/// One double through a printf format, e.g. fmt("%.2f", 1.5).
std::string fmt(const char* format, double v);
/// "3.71x", or "inf".
std::string ratio_str(double r);
/// "tp0 dp1 pp0", or "" when the rank has no coordinates.
std::string coords_str(const RankRow& r);
/// "save of DIR — 4 ranks (tp2 dp2 pp1)".
std::string title_of(const Metrics& m);

}  // namespace h5ckpt::report
