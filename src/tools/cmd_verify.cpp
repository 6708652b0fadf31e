// `h5ckpt verify PATH`: metadata validation plus a checksum check of every saved region,
// split over the ranks when run under mpirun.
#include <iostream>
#include <memory>

#include "tools/cli_common.h"

namespace h5ckpt::cli {

namespace {

using nlohmann::json;

struct VerifyArgs {
  std::string path;
  bool json = false;
  bool no_progress = false;
};

int run_verify(const VerifyArgs& a) {
  MpiSession mpi(/*force=*/false);
  // Every rank validates the metadata itself (cheap), so all agree without communication.
  auto info = read_checkpoint_info(a.path);
  int rc = info.ok() ? kExitOk : exit_for(info.status());
  if (const int worst = mpi.agree_exit(rc); worst != kExitOk) {
    if (mpi.rank() == 0) {
      if (a.json) {
        std::cout << dump_json(json{{"ok", false},
                                    {"path", safe_text(a.path, false)},
                                    {"errors", {safe_text(info.status().to_string(), false)}}})
                  << "\n";
      }
      print_error("verify '" + a.path + "'",
                  info.ok() ? Status(ErrorCode::kRemote, "another rank failed") : info.status());
    }
    return worst;
  }

  // A region is checked through its verification blocks (or, format v1, its whole-region sum).
  auto has_sums = [](const SavedRegion& r) {
    return r.checksum != 0 || r.block_bytes != 0 || !r.block_checksums.empty();
  };
  // Region i (over all tensors, in key order) is checked by rank i % size. One tensor at a time
  // goes to verify_checkpoint so that a bad tensor does not hide the others and the progress bar
  // moves; regions of other ranks lose their checksums, which verify_checkpoint skips, so the region
  // numbers in its messages stay those of the metadata.
  uint64_t my_total = 0, index = 0;
  for (const auto& t : info->tensors)
    for (const auto& r : t.regions)
      if (index++ % static_cast<uint64_t>(mpi.size()) == static_cast<uint64_t>(mpi.rank()) && has_sums(r))
        my_total += static_cast<uint64_t>(r.shard.numel()) * dtype_size(t.dtype);

  Progress progress(mpi.rank() == 0 && !a.no_progress && stderr_is_tty(), my_total, "verify");
  uint64_t checked = 0, checked_bytes = 0, unchecked = 0;
  std::string errors;  // one per line
  index = 0;
  for (const auto& t : info->tensors) {
    CheckpointInfo one;
    one.data_file = info->data_file;
    one.tensors.push_back(t);
    bool any = false;
    for (auto& r : one.tensors[0].regions) {
      const bool mine = index++ % static_cast<uint64_t>(mpi.size()) == static_cast<uint64_t>(mpi.rank());
      if (mine && !has_sums(r)) ++unchecked;
      if (!mine) {
        r.checksum = 0;
        r.block_bytes = 0;
        r.block_checksums.clear();
      }
      if (mine && has_sums(r)) {
        any = true;
        ++checked;
        checked_bytes += static_cast<uint64_t>(r.shard.numel()) * dtype_size(t.dtype);
      }
    }
    if (!any) continue;
    progress.update(checked_bytes, t.key);
    Status st = verify_checkpoint(one, 0, 1);
    if (!st.ok()) {
      std::string msg = st.to_string();
      for (char& c : msg)
        if (c == '\n') c = ' ';
      errors += msg + "\n";
      if (exit_for(st) > rc) rc = exit_for(st);
      else if (rc == kExitOk) rc = kExitFailed;
    }
  }
  progress.finish();

  rc = mpi.agree_exit(rc);
  const uint64_t all_checked = mpi.sum(checked), all_bytes = mpi.sum(checked_bytes), all_unchecked = mpi.sum(unchecked);
  const std::vector<std::string> per_rank = mpi.gather_to_root(errors);
  if (mpi.rank() != 0) return rc;

  std::vector<std::string> lines;
  for (const auto& e : per_rank) {
    size_t start = 0;
    while (start < e.size()) {
      size_t nl = e.find('\n', start);
      lines.push_back(e.substr(start, nl - start));
      start = nl + 1;
    }
  }
  if (a.json) {
    json j{{"ok", rc == kExitOk},
           {"path", info->path},
           {"tensors", info->tensors.size()},
           {"regions_checked", all_checked},
           {"regions_without_checksum", all_unchecked},
           {"bytes_checked", all_bytes},
           {"ranks", mpi.size()},
           {"errors", lines}};
    std::cout << dump_json(j) << "\n";
  } else {
    for (const auto& l : lines) std::cerr << "h5ckpt: verify: " << l << "\n";
    std::cout << (rc == kExitOk ? "OK" : "FAILED") << ": " << info->path << ": metadata valid, " << all_checked
              << " regions (" << human_bytes(all_bytes) << ") of " << info->tensors.size() << " tensors checked"
              << (mpi.size() > 1 ? " by " + std::to_string(mpi.size()) + " ranks" : std::string());
    if (all_unchecked) std::cout << ", " << all_unchecked << " regions saved without checksum (not checked)";
    if (!lines.empty()) std::cout << ", " << lines.size() << " tensor(s) with a mismatch";
    std::cout << "\n";
  }
  return rc;
}

}  // namespace

void register_verify(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<VerifyArgs>();
  CLI::App* sub = app.add_subcommand(
      "verify",
      "Validate a checkpoint's metadata and re-read every saved region, checking its xxh3 checksum. "
      "Exit status 1 names each bad tensor and region. Under mpirun the regions are split over the ranks.");
  sub->add_option("PATH", args->path, "checkpoint directory (or a directory whose 'latest' names one)")->required();
  sub->add_flag("--json", args->json, "machine-readable summary on stdout");
  sub->add_flag("--no-progress", args->no_progress, "no progress bar (drawn only when stderr is a terminal)");
  sub->callback([args, exit_code] {
    try {
      *exit_code = run_verify(*args);
    } catch (const std::exception& e) {
      std::cerr << "h5ckpt: verify: " << e.what() << "\n";
      *exit_code = kExitError;
    }
  });
}

}  // namespace h5ckpt::cli
