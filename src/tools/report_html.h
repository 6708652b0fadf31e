// `h5ckpt report`: the HTML page (heat map, straggler summary, per-rank breakdown).
#pragma once

#include <string>
#include <vector>

#include "tools/report_model.h"
#include "tools/report_stats.h"

namespace h5ckpt::report {

/// A self-contained HTML page (inline SVG and CSS, no scripts or external resources).
std::string render_html(const std::vector<Metrics>& all, const StragglerRule& rule = {});

}  // namespace h5ckpt::report
