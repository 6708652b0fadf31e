#include "tools/cli_common.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

namespace h5ckpt::cli {

int exit_for(const Status& st) {
  if (st.ok()) return kExitOk;
  return st.code() == ErrorCode::kCorrupt ? kExitFailed : kExitError;
}

void print_error(const std::string& what, const Status& st) {
  std::cerr << "h5ckpt: " << safe_text(what, true) << ": " << safe_text(st.to_string(), true) << "\n";
}

namespace {
// Length of the valid UTF-8 sequence at s[i] (overlongs, surrogates and > U+10FFFF refused), or 0.
size_t utf8_sequence(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  if ((c == 0xE0 && b(i + 1) < 0xA0) || (c == 0xED && b(i + 1) > 0x9F) || (c == 0xF0 && b(i + 1) < 0x90) ||
      (c == 0xF4 && b(i + 1) > 0x8F))
    return 0;
  return n;
}
}  // namespace

std::string safe_text(std::string_view s, bool terminal) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = utf8_sequence(s, i);
    const bool control = c < 0x20 || c == 0x7F;
    if (n == 0 || (terminal && control)) {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
      ++i;
      continue;
    }
    out.append(s.substr(i, n));
    i += n;
  }
  return out;
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

// ---- MPI -------------------------------------------------------------------------------------

bool launched_by_mpi_launcher() {
  // Open MPI's mpirun, PMIx launchers (srun --mpi=pmix), MPICH hydra / PMI-1/2.
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

MpiSession::MpiSession(bool force) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized && (force || launched_by_mpi_launcher())) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    we_initialized_ = true;
    initialized = 1;
  }
  if (initialized) {
    active_ = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
}

MpiSession::~MpiSession() {
  if (we_initialized_) MPI_Finalize();
}

int MpiSession::agree_exit(int code) const {
  if (!active_) return code;
  int worst = code;
  MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

uint64_t MpiSession::sum(uint64_t v) const {
  if (!active_) return v;
  uint64_t total = 0;
  MPI_Allreduce(&v, &total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

std::vector<std::string> MpiSession::gather_to_root(const std::string& s) const {
  if (!active_ || size_ == 1) return {s};
  int len = static_cast<int>(s.size());
  std::vector<int> lens(rank_ == 0 ? size_ : 0), displs;
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string all;
  if (rank_ == 0) {
    int off = 0;
    for (int l : lens) {
      displs.push_back(off);
      off += l;
    }
    all.resize(static_cast<size_t>(off));
  }
  MPI_Gatherv(s.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  std::vector<std::string> out;
  if (rank_ == 0)
    for (int r = 0; r < size_; ++r)
      out.push_back(all.substr(static_cast<size_t>(displs[r]), static_cast<size_t>(lens[r])));
  return out;
}

int run_on_rank0(const std::function<int()>& fn) {
  MpiSession mpi(/*force=*/false);
  int rc = kExitOk;
  if (mpi.rank() == 0) {
    try {
      rc = fn();
    } catch (const std::exception& e) {
      std::cerr << "h5ckpt: " << e.what() << "\n";
      rc = kExitError;
    }
  }
  if (mpi.active()) MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return rc;
}

// ---- chunked reads ---------------------------------------------------------------------------

int64_t numel_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated metadata: no overflow
  return n;
}

int64_t chunk_elements(DType as, uint64_t chunk_bytes) {
  return std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes / dtype_size(as)));
}

Status read_flat(CheckpointReader& reader, const TensorInfo& t, int64_t begin, int64_t end, DType as, void* dst) {
  // The buffer is the flattening [begin, end) of the whole tensor: a flat-range shard of it.
  return reader.read_shard(t.key, ShardSpec::flat_range(ShardSpec::whole(t.shape).box, begin, end), as, dst);
}

// ---- output ----------------------------------------------------------------------------------

std::string human_bytes(uint64_t n) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%" PRIu64 " B", n);
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}
std::string spec_str(const ShardSpec& s) { return region_to_string(s); }

Table::Table(std::vector<std::string> header, std::vector<bool> right_align)
    : header_(std::move(header)), right_(std::move(right_align)) {
  right_.resize(header_.size(), false);
}

void Table::add(std::vector<std::string> row) {
  row.resize(header_.size());
  rows_.push_back(std::move(row));
}

void Table::print(std::ostream& os, const std::string& indent) const {
  std::vector<size_t> w(header_.size());
  for (size_t c = 0; c < header_.size(); ++c) {
    w[c] = header_[c].size();
    for (const auto& r : rows_) w[c] = std::max(w[c], r[c].size());
  }
  auto line = [&](const std::vector<std::string>& r) {
    std::string s = indent;
    for (size_t c = 0; c < r.size(); ++c) {
      const std::string pad(w[c] - r[c].size(), ' ');
      s += right_[c] ? pad + r[c] : r[c] + (c + 1 < r.size() ? pad : "");
      if (c + 1 < r.size()) s += "  ";
    }
    os << s << "\n";
  };
  line(header_);
  for (const auto& r : rows_) line(r);
}

nlohmann::json info_to_json(const CheckpointInfo& info, bool with_regions) {
  using nlohmann::json;
  json j;
  j["kind"] = "checkpoint";
  j["path"] = info.path;
  j["data_file"] = info.data_file;
  j["format_version"] = info.format_version;
  j["library_version"] = info.library_version;
  j["step"] = info.step;
  j["topology"] = {{"tp", info.saved_sizes.tp},
                   {"dp", info.saved_sizes.dp},
                   {"pp", info.saved_sizes.pp},
                   {"world", info.saved_coords.size()}};
  if (info.saved_sizes.cp != 1) j["topology"]["cp"] = info.saved_sizes.cp;
  if (info.saved_sizes.ep != 1) j["topology"]["ep"] = info.saved_sizes.ep;
  nlohmann::json attributes = nlohmann::json::object();
  for (const auto& [k, v] : info.attributes) attributes[safe_text(k, false)] = safe_text(v, false);
  j["attributes"] = std::move(attributes);
  json tensors = json::array();
  for (const auto& t : info.tensors) {
    json jt;
    jt["key"] = t.key;
    jt["dtype"] = dtype_name(t.dtype);
    jt["shape"] = t.shape;
    jt["nbytes"] = t.nbytes;
    jt["file_offset"] = t.file_offset;
    jt["num_regions"] = t.regions.size();
    if (with_regions) {
      json regions = json::array();
      for (const auto& r : t.regions) {
        json jr;
        jr["offset"] = r.shard.box.offset;
        jr["shape"] = r.shard.box.shape;
        jr["flat"] = r.shard.flat ? json::array({r.shard.flat->first, r.shard.flat->second}) : json(nullptr);
        jr["writer"] = r.writer_rank;
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016" PRIx64, r.checksum);
        jr["xxh3"] = r.checksum ? json(hex) : json(nullptr);
        jr["verify_blocks"] = r.block_checksums.size();
        jr["block_bytes"] = r.block_bytes;
        regions.push_back(std::move(jr));
      }
      jt["regions"] = std::move(regions);
    }
    tensors.push_back(std::move(jt));
  }
  j["tensors"] = std::move(tensors);
  j["total_bytes"] = info.total_bytes();
  return j;
}

bool stderr_is_tty() { return ::isatty(STDERR_FILENO) == 1; }

Progress::Progress(bool enabled, uint64_t total, std::string label)
    : enabled_(enabled), total_(total), label_(std::move(label)) {}

void Progress::update(uint64_t done, const std::string& item) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && now - last_ < std::chrono::milliseconds(100) && done < total_) return;  // no flicker
  last_ = now;
  drawn_ = true;
  const double frac = total_ ? std::min(1.0, static_cast<double>(done) / static_cast<double>(total_)) : 1.0;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, ' ');
  std::string name = item.size() > 40 ? "..." + item.substr(item.size() - 37) : item;
  std::fprintf(stderr, "\r%s [%s] %3d%% %-40s", label_.c_str(), bar.c_str(), static_cast<int>(frac * 100),
               name.c_str());
  std::fflush(stderr);
}

void Progress::finish() {
  if (!enabled_ || !drawn_) return;
  std::fprintf(stderr, "\r%*s\r", static_cast<int>(label_.size()) + 80, "");
  std::fflush(stderr);
}

}  // namespace h5ckpt::cli
