// `h5ckpt export PATH --format safetensors OUT`: consolidated global tensors in one file that
// the Hugging Face ecosystem reads, streamed in bounded chunks.
//
// safetensors layout: u64 little-endian N, N bytes of JSON header (padded with spaces to a
// multiple of 8 so the data starts aligned), then the tensors' raw little-endian bytes, each
// at [data_offsets[0], data_offsets[1]) relative to the end of the header, back to back.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <iostream>
#include <memory>

#include "h5ckpt/config.h"  // parse_byte_size
#include "tools/cli_common.h"

namespace h5ckpt::cli {

namespace {

using nlohmann::json;

struct ExportArgs {
  std::string path, out, format = "safetensors", prefix;
  bool strip_prefix = false;
  bool overwrite = false;
  uint64_t chunk_bytes = kDefaultChunkBytes;
  std::string max_shard_size;  ///< non-empty: the Hugging Face sharded layout in directory OUT
  std::string rename_map;      ///< with max_shard_size: a JSON object {"key or name": "new name"}
};

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF64: return "F64";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kF8E5M2: return "F8_E5M2";
    case DType::kI8: return "I8";
    case DType::kI16: return "I16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU8: return "U8";
    case DType::kBool: return "BOOL";
  }
  return "?";
}

// Closes and removes a partial output unless released.
struct OutFile {
  std::FILE* f = nullptr;
  std::string path;
  bool keep = false;
  ~OutFile() {
    if (f) std::fclose(f);
    if (!keep && !path.empty()) std::remove(path.c_str());
  }
};

Status write_all(std::FILE* f, const void* p, size_t n, const std::string& path) {
  if (n && std::fwrite(p, 1, n, f) != n)
    return Status(ErrorCode::kIo, "writing '" + path + "' failed: " + std::strerror(errno));
  return Status::Ok();
}

// ---- The Hugging Face sharded layout (--max-shard-size) ------------------------------------
// OUT is a directory holding model-0000k-of-0000N.safetensors files of at most SIZE bytes of tensor
// data each (a larger tensor gets a file of its own), in name order, and model.safetensors.index.json
// {"metadata": {"total_size": bytes}, "weight_map": {name: file}}: what transformers, vLLM and
// SGLang load. Each file is written to a temporary sibling, fsynced and renamed; the index is
// written last, so a directory with an index names only complete files.

struct NamedTensor {
  std::string name;
  const TensorInfo* tensor;
};

// Writes `tensors` as one safetensors file at `path` (temporary sibling, fsync, rename).
Status write_safetensors_file(CheckpointReader& reader, const CheckpointInfo& info, const ExportArgs& a,
                              const std::vector<NamedTensor>& tensors, const std::string& path) {
  json header = json::object();
  uint64_t offset = 0;
  for (const NamedTensor& nt : tensors) {
    header[nt.name] = {{"dtype", safetensors_dtype(nt.tensor->dtype)},
                       {"shape", nt.tensor->shape},
                       {"data_offsets", {offset, offset + nt.tensor->nbytes}}};
    offset += nt.tensor->nbytes;
  }
  header["__metadata__"] = {{"format", "pt"},
                            {"h5ckpt_source", info.path},
                            {"h5ckpt_step", std::to_string(info.step)},
                            {"h5ckpt_library_version", info.library_version},
                            {"h5ckpt_prefix", a.prefix}};
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  uint8_t len_le[8];
  for (int i = 0; i < 8; ++i) len_le[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  OutFile out;
  out.path = path + ".tmp-" + std::to_string(::getpid());
  out.f = std::fopen(out.path.c_str(), "wb");
  if (!out.f) {
    const std::string tmp = out.path;
    out.path.clear();
    return Status(ErrorCode::kIo, "cannot create '" + tmp + "': " + std::strerror(errno));
  }
  Status st = write_all(out.f, len_le, 8, out.path);
  if (st.ok()) st = write_all(out.f, text.data(), text.size(), out.path);
  std::vector<char> buf;
  for (const NamedTensor& nt : tensors) {
    const TensorInfo& t = *nt.tensor;
    const int64_t n = numel_of(t.shape), per = chunk_elements(t.dtype, a.chunk_bytes);
    buf.resize(static_cast<size_t>(std::max<int64_t>(0, std::min(n, per))) * dtype_size(t.dtype));
    for (int64_t b = 0; b < n && st.ok(); b += per) {
      const int64_t cnt = std::min(per, n - b);
      st = read_flat(reader, t, b, b + cnt, t.dtype, buf.data());
      if (!st.ok()) st = st.with_context("reading '" + t.key + "'");
      else st = write_all(out.f, buf.data(), static_cast<size_t>(cnt) * dtype_size(t.dtype), out.path);
    }
    if (!st.ok()) break;
  }
  if (st.ok() && (std::fflush(out.f) != 0 || ::fsync(::fileno(out.f)) != 0))
    st = Status(ErrorCode::kIo, "flushing '" + out.path + "' failed: " + std::strerror(errno));
  if (!st.ok()) return st;
  std::fclose(out.f);
  out.f = nullptr;
  if (std::rename(out.path.c_str(), path.c_str()) != 0)
    return Status(ErrorCode::kIo, "cannot rename '" + out.path + "' to '" + path + "': " + std::strerror(errno));
  out.keep = true;
  return Status::Ok();
}

// The rename map: a JSON object whose keys are checkpoint keys or exported names (after
// --strip-prefix) and whose values are the names to write.
Result<std::map<std::string, std::string>> read_rename_map(const std::string& path) {
  std::map<std::string, std::string> map;
  if (path.empty()) return map;
  std::ifstream in(path);
  if (!in) return Status(ErrorCode::kNotFound, "cannot open the rename map '" + path + "'");
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status(ErrorCode::kInvalidArgument, "rename map '" + path + "' is not a JSON object of strings");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_string())
      return Status(ErrorCode::kInvalidArgument,
                    "rename map '" + path + "': the value of '" + it.key() + "' is not a string");
    map[it.key()] = it.value().get<std::string>();
  }
  return map;
}

int run_export_sharded(const ExportArgs& a) {
  namespace fs = std::filesystem;
  auto max = parse_byte_size(a.max_shard_size);
  if (!max.ok() || *max == 0) {
    std::cerr << "h5ckpt: export: --max-shard-size '" << a.max_shard_size
              << "' is not a positive size (e.g. 5GB, 500MiB)\n";
    return kExitError;
  }
  auto renames = read_rename_map(a.rename_map);
  if (!renames.ok()) return print_error("export", renames.status()), exit_for(renames.status());
  auto reader = CheckpointReader::open(a.path);
  if (!reader.ok()) return print_error("cannot read '" + a.path + "'", reader.status()), exit_for(reader.status());
  const CheckpointInfo& info = reader->info();
  std::vector<NamedTensor> selected;
  std::map<std::string, std::string> taken;  // name -> key
  for (const auto& t : info.tensors) {
    if (t.key.rfind(a.prefix, 0) != 0) continue;
    std::string name = a.strip_prefix ? t.key.substr(a.prefix.size()) : t.key;
    if (auto r = renames->find(t.key); r != renames->end()) name = r->second;
    else if (auto r2 = renames->find(name); r2 != renames->end()) name = r2->second;
    if (name.empty() || name == "__metadata__") {
      std::cerr << "h5ckpt: export: key '" << t.key << "' gives the invalid tensor name '" << name << "'\n";
      return kExitError;
    }
    if (auto [it, fresh] = taken.emplace(name, t.key); !fresh) {
      std::cerr << "h5ckpt: export: keys '" << it->second << "' and '" << t.key << "' both become '" << name << "'\n";
      return kExitError;
    }
    selected.push_back({name, &t});
  }
  if (selected.empty()) {
    std::cerr << "h5ckpt: export: no tensor key starts with '" << a.prefix << "' in '" << info.path << "'\n";
    return kExitError;
  }
  std::sort(selected.begin(), selected.end(),
            [](const NamedTensor& x, const NamedTensor& y) { return x.name < y.name; });
  // Files in name order, each filled up to the bound (a tensor above it alone).
  std::vector<std::vector<NamedTensor>> shards;
  uint64_t fill = 0, total = 0;
  for (const NamedTensor& nt : selected) {
    if (shards.empty() || (fill > 0 && fill + nt.tensor->nbytes > *max)) {
      shards.emplace_back();
      fill = 0;
    }
    shards.back().push_back(nt);
    fill += nt.tensor->nbytes;
    total += nt.tensor->nbytes;
  }
  const std::string index_name = "model.safetensors.index.json";
  std::error_code ec;
  fs::create_directories(a.out, ec);
  if (!fs::is_directory(a.out, ec)) {
    std::cerr << "h5ckpt: export: cannot create the directory '" << a.out << "'\n";
    return kExitError;
  }
  if (fs::exists(fs::path(a.out) / index_name, ec) && !a.overwrite) {
    std::cerr << "h5ckpt: export: '" << (fs::path(a.out) / index_name).string()
              << "' exists (pass --overwrite to replace it)\n";
    return kExitError;
  }
  auto file_name = [&](size_t k) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    return std::string(buf);
  };
  json weight_map = json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string file = file_name(k);
    Status st = write_safetensors_file(*reader, info, a, shards[k], (fs::path(a.out) / file).string());
    if (!st.ok()) return print_error("export", st), exit_for(st);
    for (const NamedTensor& nt : shards[k]) weight_map[nt.name] = file;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  const std::string index_path = (fs::path(a.out) / index_name).string();
  OutFile out;
  out.path = index_path + ".tmp-" + std::to_string(::getpid());
  out.f = std::fopen(out.path.c_str(), "wb");
  const std::string text = out.f ? index.dump(2) + "\n" : std::string();
  Status st = out.f ? write_all(out.f, text.data(), text.size(), out.path)
                    : Status(ErrorCode::kIo, "cannot create '" + out.path + "': " + std::strerror(errno));
  if (!out.f) out.path.clear();
  if (st.ok() && (std::fflush(out.f) != 0 || ::fsync(::fileno(out.f)) != 0))
    st = Status(ErrorCode::kIo, "flushing '" + out.path + "' failed: " + std::strerror(errno));
  if (st.ok()) {
    std::fclose(out.f);
    out.f = nullptr;
    if (std::rename(out.path.c_str(), index_path.c_str()) != 0)
      st = Status(ErrorCode::kIo, "cannot rename '" + out.path + "' to '" + index_path + "'");
    else out.keep = true;
  }
  if (!st.ok()) return print_error("export", st), exit_for(st);
  std::cout << "exported " << selected.size() << " tensors (" << human_bytes(total) << ") from " << info.path << " to "
            << shards.size() << " file(s) and " << index_path << "\n";
  return kExitOk;
}

int run_export(const ExportArgs& a) {
  namespace fs = std::filesystem;
  if (a.format != "safetensors") {
    std::cerr << "h5ckpt: export: unsupported format '" << a.format << "' (supported: safetensors)\n";
    return kExitError;
  }
  if (!a.max_shard_size.empty()) return run_export_sharded(a);
  if (!a.rename_map.empty()) {
    std::cerr << "h5ckpt: export: --rename-map needs --max-shard-size (the sharded layout)\n";
    return kExitError;
  }
  std::error_code ec;
  if (fs::exists(a.out, ec) && !a.overwrite) {
    std::cerr << "h5ckpt: export: '" << a.out << "' exists (pass --overwrite to replace it)\n";
    return kExitError;
  }
  auto reader = CheckpointReader::open(a.path);
  if (!reader.ok()) return print_error("cannot read '" + a.path + "'", reader.status()), exit_for(reader.status());
  const CheckpointInfo* info = &reader->info();

  // Names first (known from the metadata alone), then one file through the sharded path's writer:
  // a temporary sibling renamed at the end, so OUT is either complete or absent.
  std::vector<NamedTensor> selected;
  uint64_t offset = 0;
  for (const auto& t : info->tensors) {
    if (t.key.rfind(a.prefix, 0) != 0) continue;
    std::string name = a.strip_prefix ? t.key.substr(a.prefix.size()) : t.key;
    if (name.empty() || name == "__metadata__") {
      std::cerr << "h5ckpt: export: key '" << t.key << "' gives the invalid tensor name '" << name << "'\n";
      return kExitError;
    }
    offset += t.nbytes;
    selected.push_back({std::move(name), &t});
  }
  if (selected.empty()) {
    std::cerr << "h5ckpt: export: no tensor key starts with '" << a.prefix << "' in '" << info->path << "'\n";
    return kExitError;
  }
  if (Status st = write_safetensors_file(*reader, *info, a, selected, a.out); !st.ok())
    return print_error("export", st), exit_for(st);
  std::cout << "exported " << selected.size() << " tensors (" << human_bytes(offset) << ") from " << info->path
            << " to " << a.out << "\n";
  return kExitOk;
}

}  // namespace

void register_export(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* sub = app.add_subcommand(
      "export",
      "Write the checkpoint's global tensors (all, or those whose key starts with --prefix) to one safetensors "
      "file, streamed in bounded chunks. Tensor names are the keys, without the prefix if --strip-prefix.");
  sub->add_option("PATH", args->path, "checkpoint directory")->required();
  sub->add_option("OUT", args->out, "output file")->required();
  sub->add_option("--format", args->format, "output format (only 'safetensors')")->required();
  sub->add_option("--prefix", args->prefix, "export only keys starting with this, e.g. 'model/'");
  sub->add_flag("--strip-prefix", args->strip_prefix, "name tensors without the --prefix");
  sub->add_flag("--overwrite", args->overwrite, "replace OUT if it exists");
  sub->add_option("--chunk-bytes", args->chunk_bytes, "copy in chunks of at most this many bytes (default 64 MiB)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  sub->add_option("--max-shard-size", args->max_shard_size,
                  "write the Hugging Face sharded layout into directory OUT: model-0000k-of-0000N.safetensors "
                  "files of at most SIZE bytes (e.g. 5GB) and model.safetensors.index.json");
  sub->add_option("--rename-map", args->rename_map,
                  "with --max-shard-size: a JSON file {\"key or name\": \"new name\"} renaming tensors");
  sub->callback([args, exit_code] { *exit_code = run_on_rank0([&] { return run_export(*args); }); });
}

}  // namespace h5ckpt::cli
