// `h5ckpt inspect PATH`: one checkpoint's metadata, or the checkpoints of a directory.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <iostream>
#include <memory>

#include "tools/cli_common.h"

namespace h5ckpt::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct InspectArgs {
  std::string path;
  bool json = false;
  bool regions = false;
  bool latest = false;
};

bool is_aux_key(const std::string& key) { return key.rfind("loader/", 0) == 0 || key.rfind("extra/", 0) == 0; }

// "step-9" before "step-10": digit runs compare by value.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      std::string na = a.substr(i, ie - i), nb = b.substr(j, je - j);
      na.erase(0, std::min(na.find_first_not_of('0'), na.size()));
      nb.erase(0, std::min(nb.find_first_not_of('0'), nb.size()));
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

uint64_t file_size_or_zero(const std::string& p) {
  std::error_code ec;
  auto n = fs::file_size(p, ec);
  return ec ? 0 : n;
}

int inspect_checkpoint(const InspectArgs& a, const std::string& path) {
  auto info = read_checkpoint_info(path);
  if (!info.ok()) {
    print_error("cannot inspect '" + path + "'", info.status());
    return exit_for(info.status());
  }
  const uint64_t file_bytes = file_size_or_zero(info->data_file);
  if (a.json) {
    json j = info_to_json(*info, /*with_regions=*/true);
    j["data_file_bytes"] = file_bytes;
    std::cout << dump_json(j) << "\n";
    return kExitOk;
  }
  const auto& s = info->saved_sizes;
  std::cout << "checkpoint       " << info->path << "\n"
            << "format version   " << info->format_version << " (written by h5ckpt " << info->library_version << ")\n"
            << "step             " << (info->step >= 0 ? std::to_string(info->step) : std::string("-")) << "\n"
            << "saved topology   tp=" << s.tp << (s.cp != 1 ? " cp=" + std::to_string(s.cp) : std::string())
            << " dp=" << s.dp << " pp=" << s.pp << (s.ep != 1 ? " ep=" + std::to_string(s.ep) : std::string())
            << " (world " << info->saved_coords.size() << ")\n"
            << "data file        " << info->data_file << " (" << human_bytes(file_bytes) << ")\n";
  for (const auto& [k, v] : info->attributes)
    std::cout << "attribute        " << safe_text(k, true) << " = " << safe_text(v, true) << "\n";

  Table tensors({"key", "dtype", "shape", "bytes", "regions"}, {false, false, false, true, true});
  Table aux({"key", "dtype", "shape", "bytes", "regions"}, {false, false, false, true, true});
  uint64_t tensor_bytes = 0, aux_bytes = 0;
  size_t n_tensors = 0;
  for (const auto& t : info->tensors) {
    Table& tab = is_aux_key(t.key) ? aux : tensors;
    (is_aux_key(t.key) ? aux_bytes : tensor_bytes) += t.nbytes;
    n_tensors += is_aux_key(t.key) ? 0 : 1;
    tab.add({t.key, dtype_name(t.dtype), shape_str(t.shape), human_bytes(t.nbytes), std::to_string(t.regions.size())});
  }
  std::cout << "\ntensors (" << n_tensors << ", " << human_bytes(tensor_bytes) << "):\n";
  tensors.print(std::cout);
  if (!aux.empty()) {
    std::cout << "\nloader/extra items (" << human_bytes(aux_bytes) << "):\n";
    aux.print(std::cout);
  }
  if (a.regions) {
    std::cout << "\nsaved regions:\n";
    // "blocks": verification block checksums; "xxh3": a format-v1 whole-region checksum.
    Table regs({"key", "region", "box / flat range", "writer", "blocks", "xxh3"},
               {false, true, false, true, true, false});
    for (const auto& t : info->tensors)
      for (size_t r = 0; r < t.regions.size(); ++r) {
        const SavedRegion& reg = t.regions[r];
        char hex[17] = "-";
        if (reg.checksum) std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(reg.checksum));
        const std::string blocks = reg.block_checksums.empty() ? "-" : std::to_string(reg.block_checksums.size());
        regs.add({t.key, std::to_string(r), spec_str(reg.shard), std::to_string(reg.writer_rank), blocks, hex});
      }
    regs.print(std::cout);
  }
  std::cout << "\ntotal            " << info->tensors.size() << " items, " << human_bytes(info->total_bytes())
            << " of tensor data (" << info->total_bytes() << " bytes)\n";
  return kExitOk;
}

struct Entry {
  std::string name, status, error;
  bool latest = false;
  int64_t step = -1;
  size_t tensors = 0;
  uint64_t bytes = 0;
};

int inspect_directory(const InspectArgs& a, const std::string& dir) {
  auto listing = list_checkpoints(dir);
  if (!listing.ok()) {
    print_error("inspect", listing.status());
    return kExitError;
  }
  const std::string& latest = listing->latest;
  std::vector<Entry> entries;
  for (const CheckpointDirEntry& d : listing->checkpoints) {
    Entry e;
    e.name = d.name;
    e.latest = d.latest;
    if (d.in_progress) {
      e.status = "uncommitted";
      e.error = "in-progress save that never committed";
    } else {
      auto info = read_checkpoint_info(d.path);
      if (info.ok()) {
        e.status = "committed";
        e.step = info->step;
        e.tensors = info->tensors.size();
        e.bytes = info->total_bytes();
      } else {
        e.status = info.status().code() == ErrorCode::kNotCommitted ? "uncommitted" : "broken";
        e.error = info.status().to_string();
      }
    }
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& x, const Entry& y) { return natural_less(x.name, y.name); });
  const bool latest_found =
      latest.empty() || std::any_of(entries.begin(), entries.end(), [](const Entry& e) { return e.latest; });

  if (a.json) {
    json j;
    j["kind"] = "directory";
    j["path"] = safe_text(dir, false);
    j["latest"] = latest.empty() ? json(nullptr) : json(safe_text(latest, false));
    j["latest_missing"] = !latest_found;
    json list = json::array();
    for (const auto& e : entries) {
      json je{{"name", safe_text(e.name, false)}, {"status", e.status}, {"latest", e.latest}};
      if (e.status == "committed") {
        je["step"] = e.step;
        je["tensors"] = e.tensors;
        je["total_bytes"] = e.bytes;
      } else {
        je["error"] = safe_text(e.error, false);
      }
      list.push_back(std::move(je));
    }
    j["checkpoints"] = std::move(list);
    std::cout << dump_json(j) << "\n";
    return kExitOk;
  }
  std::cout << "directory " << safe_text(dir, true) << ": " << entries.size() << " checkpoint director"
            << (entries.size() == 1 ? "y" : "ies");
  if (!latest.empty()) std::cout << ", latest -> " << safe_text(latest, true) << (latest_found ? "" : " (MISSING)");
  std::cout << "\n";
  Table t({"", "name", "status", "step", "tensors", "size", "note"}, {false, false, false, true, true, true, false});
  for (const auto& e : entries) {
    const bool ok = e.status == "committed";
    t.add({e.latest ? "*" : "", safe_text(e.name, true), e.status, ok && e.step >= 0 ? std::to_string(e.step) : "-",
           ok ? std::to_string(e.tensors) : "-", ok ? human_bytes(e.bytes) : "-",
           std::string(e.latest ? "latest" : "") + (e.latest && !ok ? ": " : "") + safe_text(e.error, true)});
  }
  if (!t.empty()) t.print(std::cout);
  return kExitOk;
}

int run_inspect(const InspectArgs& a) {
  std::error_code ec;
  if (!fs::exists(a.path, ec)) {
    print_error("inspect", Status(ErrorCode::kNotFound, "'" + a.path + "' does not exist"));
    return kExitError;
  }
  if (is_checkpoint_dir(a.path) || a.latest || !fs::is_directory(a.path, ec)) return inspect_checkpoint(a, a.path);
  return inspect_directory(a, a.path);
}

}  // namespace

void register_inspect(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* sub = app.add_subcommand(
      "inspect",
      "Show a checkpoint's metadata (format, step, saving topology, tensors, loader/extra items, size), "
      "or list the checkpoints of a directory (committed, uncommitted, broken; '*' marks latest).");
  sub->add_option("PATH", args->path, "checkpoint directory, or a directory of checkpoints")->required();
  sub->add_flag("--json", args->json, "machine-readable output (includes every region and file offsets)");
  sub->add_flag("--regions", args->regions, "also list every saved region (table output)");
  sub->add_flag("--latest", args->latest, "inspect the checkpoint that PATH/latest names instead of listing PATH");
  sub->callback([args, exit_code] { *exit_code = run_on_rank0([&] { return run_inspect(*args); }); });
}

}  // namespace h5ckpt::cli
