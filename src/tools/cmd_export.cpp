// `h5ckpt export PATH --format safetensors OUT`: consolidated global tensors in one file that
// the Hugging Face ecosystem reads, streamed in bounded chunks.
//
// safetensors layout: u64 little-endian N, N bytes of JSON header (padded with spaces to a
// multiple of 8 so the data starts aligned), then the tensors' raw little-endian bytes, each
// at [data_offsets[0], data_offsets[1]) relative to the end of the header, back to back.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>

#include "tools/cli_common.h"

namespace h5ckpt::cli {

namespace {

using nlohmann::json;

struct ExportArgs {
  std::string path, out, format = "safetensors", prefix;
  bool strip_prefix = false;
  bool overwrite = false;
  uint64_t chunk_bytes = kDefaultChunkBytes;
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

int run_export(const ExportArgs& a) {
  namespace fs = std::filesystem;
  if (a.format != "safetensors") {
    std::cerr << "h5ckpt: export: unsupported format '" << a.format << "' (supported: safetensors)\n";
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

  // Header first: names, dtypes, shapes and offsets are known from the metadata alone.
  std::vector<const TensorInfo*> selected;
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& t : info->tensors) {
    if (t.key.rfind(a.prefix, 0) != 0) continue;
    std::string name = a.strip_prefix ? t.key.substr(a.prefix.size()) : t.key;
    if (name.empty() || name == "__metadata__") {
      std::cerr << "h5ckpt: export: key '" << t.key << "' gives the invalid tensor name '" << name << "'\n";
      return kExitError;
    }
    header[name] = {
        {"dtype", safetensors_dtype(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
    selected.push_back(&t);
  }
  if (selected.empty()) {
    std::cerr << "h5ckpt: export: no tensor key starts with '" << a.prefix << "' in '" << info->path << "'\n";
    return kExitError;
  }
  // __metadata__ values must be strings. "format": "pt" is what transformers expects.
  header["__metadata__"] = {{"format", "pt"},
                            {"h5ckpt_source", info->path},
                            {"h5ckpt_step", std::to_string(info->step)},
                            {"h5ckpt_library_version", info->library_version},
                            {"h5ckpt_prefix", a.prefix}};
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  uint8_t len_le[8];
  for (int i = 0; i < 8; ++i) len_le[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

  // Written to a temporary sibling and renamed, so OUT is either complete or absent.
  OutFile out;
  out.path = a.out + ".tmp-" + std::to_string(::getpid());
  out.f = std::fopen(out.path.c_str(), "wb");
  if (!out.f) {
    std::cerr << "h5ckpt: export: cannot create '" << out.path << "': " << std::strerror(errno) << "\n";
    out.path.clear();
    return kExitError;
  }
  Status st = write_all(out.f, len_le, 8, out.path);
  if (st.ok()) st = write_all(out.f, text.data(), text.size(), out.path);
  std::vector<char> buf;
  for (const TensorInfo* t : selected) {
    if (!st.ok()) break;
    const int64_t n = numel_of(t->shape), per = chunk_elements(t->dtype, a.chunk_bytes);
    buf.resize(static_cast<size_t>(std::min(n, per)) * dtype_size(t->dtype));
    for (int64_t b = 0; b < n && st.ok(); b += per) {
      const int64_t cnt = std::min(per, n - b);
      st = read_flat(*reader, *t, b, b + cnt, t->dtype, buf.data());
      if (!st.ok()) st = st.with_context("reading '" + t->key + "'");
      else st = write_all(out.f, buf.data(), static_cast<size_t>(cnt) * dtype_size(t->dtype), out.path);
    }
  }
  if (st.ok() && (std::fflush(out.f) != 0 || ::fsync(::fileno(out.f)) != 0))
    st = Status(ErrorCode::kIo, "flushing '" + out.path + "' failed: " + std::strerror(errno));
  if (st.ok()) {
    std::fclose(out.f);
    out.f = nullptr;
    if (std::rename(out.path.c_str(), a.out.c_str()) != 0)
      st = Status(ErrorCode::kIo, "cannot rename '" + out.path + "' to '" + a.out + "': " + std::strerror(errno));
    else out.keep = true;
  }
  if (!st.ok()) return print_error("export", st), exit_for(st);
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
  sub->callback([args, exit_code] { *exit_code = run_on_rank0([&] { return run_export(*args); }); });
}

}  // namespace h5ckpt::cli
