// `h5ckpt report PATH [--out FILE.html]`: heat map, per-rank breakdown and stragglers of the
// metrics a save/load wrote (report_model: parsing, report_stats: stragglers, report_text and
// report_html: the two renderings).
#include "tools/cmd_report.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "tools/cli_common.h"
#include "tools/report_html.h"
#include "tools/report_model.h"
#include "tools/report_stats.h"
#include "tools/report_text.h"

namespace h5ckpt::cli {

namespace {

struct ReportArgs {
  std::string path;
  std::string out;
  std::string metrics_dir;
  double ratio = 1.5;
  double min_gap_s = 0.01;
  bool fail_on_straggler = false;
};

int run_report(const ReportArgs& a) {
  auto all = report::load_metrics(a.path, a.metrics_dir);
  if (!all.ok()) {
    print_error("report", all.status());
    return kExitError;
  }
  const report::StragglerRule rule{a.ratio, a.min_gap_s};
  std::cout << report::render_text(*all, rule);
  // Default: beside the first metrics file, <checkpoint>.report.html.
  std::string out = a.out;
  if (out.empty()) {
    std::filesystem::path src(all->front().source);
    std::string stem = src.filename().string();
    for (const char* suffix : {".save.json", ".load.json", ".json"})
      if (stem.size() > std::string(suffix).size() && stem.ends_with(suffix)) {
        stem.resize(stem.size() - std::string(suffix).size());
        break;
      }
    out = (src.parent_path() / (stem + ".report.html")).string();
  }
  std::ofstream f(out, std::ios::binary | std::ios::trunc);
  f << report::render_html(*all, rule);
  f.close();
  if (!f) {
    print_error("report", Status(ErrorCode::kIo, "cannot write '" + out + "'"));
    return kExitError;
  }
  std::cout << "report: " << out << "\n";
  if (a.fail_on_straggler)
    for (const auto& m : *all)
      for (const auto& s : report::summarize(m, rule))
        if (s.straggler) return kExitFailed;
  return kExitOk;
}

}  // namespace

void register_report(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* sub = app.add_subcommand(
      "report",
      "Render the per-rank phase timings of a save/load (the <checkpoint>.save.json / .load.json metrics) as a "
      "self-contained HTML page: a rank x phase heat map, a per-rank breakdown and the stragglers (a phase's "
      "slowest rank when >= --ratio x the median and >= --min-gap seconds slower). Prints a text summary.");
  sub->add_option("PATH", args->path,
                  "a metrics JSON file, a checkpoint directory, or a directory of checkpoints (follows latest)")
      ->required();
  sub->add_option("--out,-o", args->out, "HTML file to write (default: <checkpoint>.report.html beside the metrics)");
  sub->add_option("--metrics-dir", args->metrics_dir, "where the metrics files are (CheckpointerOptions::metrics_dir)");
  sub->add_option("--ratio", args->ratio, "straggler threshold: slowest / median (default 1.5)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--min-gap", args->min_gap_s, "straggler threshold: seconds above the median (default 0.01)")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--fail-on-straggler", args->fail_on_straggler, "exit status 1 when any straggler is found");
  sub->callback([args, exit_code] { *exit_code = run_on_rank0([&] { return run_report(*args); }); });
}

}  // namespace h5ckpt::cli
