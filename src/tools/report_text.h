// `h5ckpt report`: the plain-text summary printed on stdout.
#pragma once

#include <string>
#include <vector>

#include "tools/report_model.h"
#include "tools/report_stats.h"

namespace h5ckpt::report {

std::string render_text(const std::vector<Metrics>& all, const StragglerRule& rule = {});

}  // namespace h5ckpt::report
