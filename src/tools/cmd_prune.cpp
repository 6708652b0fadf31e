// `h5ckpt prune DIR --keep-last N [--keep-every K] [--dry-run]`: retention by hand, the same rule
// a Checkpointer applies after each save with keep_last / keep_every.
#include <iostream>
#include <memory>

#include "tools/cli_common.h"

namespace h5ckpt::cli {

namespace {

using nlohmann::json;

struct PruneArgs {
  std::string dir;
  PruneOptions options;
  bool json = false;
};

int run_prune(const PruneArgs& a) {
  auto r = prune_checkpoints(a.dir, a.options);
  if (!r.ok()) {
    print_error("prune '" + a.dir + "'", r.status());
    // A refused rule, a save in progress or a missing directory is "could not run".
    return kExitError;
  }
  const char* verb = a.options.dry_run ? "would delete" : "deleted";
  if (a.json) {
    const json j{{"dir", a.dir}, {"dry_run", a.options.dry_run}, {"deleted", r->deleted}, {"kept", r->kept}};
    std::cout << dump_json(j) << "\n";
    return kExitOk;
  }
  for (const auto& name : r->deleted) std::cout << verb << " " << name << "\n";
  std::cout << a.dir << ": " << verb << " " << r->deleted.size() << " checkpoint(s), "
            << (a.options.dry_run ? "would keep " : "kept ") << r->kept.size();
  if (!r->kept.empty()) {
    std::cout << " (";
    for (size_t i = 0; i < r->kept.size(); ++i) std::cout << (i ? ", " : "") << r->kept[i];
    std::cout << ")";
  }
  std::cout << "\n";
  return kExitOk;
}

}  // namespace

void register_prune(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<PruneArgs>();
  CLI::App* sub = app.add_subcommand(
      "prune",
      "Delete old committed checkpoints of a directory: keep the N newest (by recorded step, then name) and "
      "every K-th step. Never deletes what 'latest' names, what a load would select, in-progress saves or "
      "checkpoints whose metadata cannot be read. Refused while a job is saving into DIR.");
  sub->add_option("DIR", args->dir, "directory of checkpoints (the parent of step-* directories)")->required();
  sub->add_option("--keep-last", args->options.keep_last, "keep the N newest committed checkpoints (N >= 1)")
      ->required()
      ->check(CLI::PositiveNumber);
  sub->add_option("--keep-every", args->options.keep_every,
                  "also keep every checkpoint whose step is a multiple of K (0: none)")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--dry-run", args->options.dry_run, "only print what would be deleted");
  sub->add_flag("--json", args->json, "machine-readable result on stdout");
  sub->callback([args, exit_code] {
    try {
      *exit_code = run_prune(*args);
    } catch (const std::exception& e) {
      std::cerr << "h5ckpt: prune: " << e.what() << "\n";
      *exit_code = kExitError;
    }
  });
}

}  // namespace h5ckpt::cli
