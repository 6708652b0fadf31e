#include "storage/local_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "logging/log.h"
#include "storage/commit.h"
#include "storage/posix_io.h"
#include "storage/signed_json.h"

namespace h5ckpt::storage {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kMagic[] = "h5ckpt-local 1\n";
constexpr size_t kMagicLen = sizeof(kMagic) - 1;
constexpr const char* kPartialSuffix = ".partial";

Status corrupt(const std::string& what) { return Status(ErrorCode::kCorrupt, "local manifest: " + what); }

bool is_partial_name(const std::string& name) {
  return name.size() > std::strlen(kPartialSuffix) + 1 && name[0] == '.' &&
         name.compare(name.size() - std::strlen(kPartialSuffix), std::string::npos, kPartialSuffix) == 0;
}

// A file entry: [bytes, block_bytes, "<16 hex digits per block>"], or an older manifest's
// [bytes, "<xxh3 of the whole file>"].
Result<LocalRankFile> decode_file_entry(const json& f) {
  LocalRankFile rf;
  if (!f.is_array() || (f.size() != 2 && f.size() != 3) || !json_int(f[0], &rf.bytes))
    return corrupt("files must be [bytes, block_bytes, block sums] (or older [bytes, xxh3])");
  if (f.size() == 2) {
    if (!parse_hex64(f[1], &rf.xxh3)) return corrupt("files: a whole-file xxh3 that is not 16 hex digits");
    return rf;
  }
  if (!json_int(f[1], &rf.block_bytes) || rf.block_bytes == 0 || rf.block_bytes > (1ull << 30) || !f[2].is_string())
    return corrupt("files: block_bytes must be in 1..2^30, followed by a string of block sums");
  const std::string& sums = f[2].get_ref<const std::string&>();
  const uint64_t blocks = rf.bytes / rf.block_bytes + (rf.bytes % rf.block_bytes != 0 ? 1 : 0);
  if (sums.size() != 16 * blocks)
    return corrupt("files: " + std::to_string(rf.bytes) + " bytes in blocks of " + std::to_string(rf.block_bytes) +
                   " need " + std::to_string(blocks) + " block sums, the entry holds " + std::to_string(sums.size()) +
                   " hex digits");
  rf.blocks.resize(blocks);
  for (uint64_t b = 0; b < blocks; ++b)
    if (!parse_hex64(json(sums.substr(16 * b, 16)), &rf.blocks[b])) return corrupt("files: a block sum is not hex");
  return rf;
}

}  // namespace

std::string local_rank_file(int rank) { return "rank-" + std::to_string(rank) + ".bin"; }

std::string local_partial_dir(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / ("." + name + kPartialSuffix)).string();
}

std::string expand_local_dir(const std::string& pattern, int node) {
  std::string out = pattern;
  const std::string key = "{node}", value = std::to_string(node);
  for (size_t at = out.find(key); at != std::string::npos; at = out.find(key, at + value.size()))
    out.replace(at, key.size(), value);
  return out;
}

std::string canonical_path(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(fs::path(path), ec);
  if (ec) p = fs::path(path);
  std::string s = p.lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

std::string LocalManifest::parent() const { return fs::path(shared_path).parent_path().string(); }

std::string encode_local_manifest(const LocalManifest& m) {
  json h;
  h["name"] = m.name;
  h["shared_path"] = m.shared_path;
  h["step"] = m.step;
  h["library_version"] = m.library_version;
  h["sizes"] = {m.sizes.tp, m.sizes.dp, m.sizes.pp, m.sizes.cp, m.sizes.ep};
  json coords = json::array(), files = json::array();
  for (const auto& c : m.coords) coords.push_back({c.tp, c.dp, c.pp, c.cp, c.ep, c.edp});
  for (const auto& f : m.files) {
    if (f.block_bytes == 0) {  // as older versions wrote it (tests of their manifests)
      files.push_back({f.bytes, hex64(f.xxh3)});
      continue;
    }
    std::string sums;
    sums.reserve(16 * f.blocks.size());
    for (uint64_t b : f.blocks) sums += hex64(b);
    files.push_back({f.bytes, f.block_bytes, std::move(sums)});
  }
  h["coords"] = std::move(coords);
  h["node_of_rank"] = m.node_of_rank;
  h["files"] = std::move(files);
  h["attributes"] = m.attributes;
  h["plan_bytes"] = m.plan.size();
  std::string header = h.dump();
  std::string out;
  out.reserve(kMagicLen + 8 + header.size() + m.plan.size() + 8);
  out.append(kMagic, kMagicLen);
  const uint64_t n = header.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += header;
  out += m.plan;
  const uint64_t sum = XXH3_64bits(out.data(), out.size());
  out.append(reinterpret_cast<const char*>(&sum), 8);
  return out;
}

Result<LocalManifest> decode_local_manifest(const std::string& bytes) {
  if (bytes.size() < kMagicLen + 16 || bytes.compare(0, kMagicLen, kMagic) != 0)
    return corrupt("not an h5ckpt local manifest (" + std::to_string(bytes.size()) + " bytes)");
  uint64_t sum = 0, n = 0;
  std::memcpy(&sum, bytes.data() + bytes.size() - 8, 8);
  if (XXH3_64bits(bytes.data(), bytes.size() - 8) != sum) return corrupt("checksum mismatch (truncated or damaged)");
  std::memcpy(&n, bytes.data() + kMagicLen, 8);
  const uint64_t body = bytes.size() - kMagicLen - 16;
  if (n > body) return corrupt("header length " + std::to_string(n) + " exceeds the file");
  LocalManifest m;
  try {
    const json h = json::parse(bytes.substr(kMagicLen + 8, n));
    m.name = h.at("name").get<std::string>();
    m.shared_path = h.at("shared_path").get<std::string>();
    m.library_version = h.at("library_version").get<std::string>();
    if (!json_int(h.at("step"), &m.step)) return corrupt("step is not an integer");
    const json& s = h.at("sizes");
    if (!s.is_array() || s.size() != 5 || !json_int(s[0], &m.sizes.tp) || !json_int(s[1], &m.sizes.dp) ||
        !json_int(s[2], &m.sizes.pp) || !json_int(s[3], &m.sizes.cp) || !json_int(s[4], &m.sizes.ep) ||
        m.sizes.tp < 1 || m.sizes.dp < 1 || m.sizes.pp < 1 || m.sizes.cp < 1 || m.sizes.ep < 1)
      return corrupt("sizes must be [tp, dp, pp, cp, ep], each at least 1");
    for (const auto& c : h.at("coords")) {
      RankCoords rc;
      if (!c.is_array() || c.size() != 6 || !json_int(c[0], &rc.tp) || !json_int(c[1], &rc.dp) ||
          !json_int(c[2], &rc.pp) || !json_int(c[3], &rc.cp) || !json_int(c[4], &rc.ep) || !json_int(c[5], &rc.edp))
        return corrupt("coords must be [tp, dp, pp, cp, ep, edp]");
      m.coords.push_back(rc);
    }
    for (const auto& v : h.at("node_of_rank")) {
      int x = 0;
      if (!json_int(v, &x) || x < 0) return corrupt("node_of_rank holds a bad node index");
      m.node_of_rank.push_back(x);
    }
    for (const auto& f : h.at("files")) {
      auto rf = decode_file_entry(f);
      if (!rf.ok()) return rf.status();
      m.files.push_back(std::move(rf).value());
    }
    m.attributes = h.at("attributes").get<std::map<std::string, std::string>>();
    uint64_t plan_bytes = 0;
    if (!json_int(h.at("plan_bytes"), &plan_bytes) || plan_bytes != body - n)
      return corrupt("plan_bytes does not match the file");
  } catch (const std::exception& e) {
    return corrupt(std::string("malformed header: ") + e.what());
  }
  const size_t world = m.files.size();
  if (world == 0 || m.coords.size() != world || m.node_of_rank.size() != world ||
      static_cast<int64_t>(world) != static_cast<int64_t>(m.sizes.tp) * m.sizes.dp * m.sizes.pp * m.sizes.cp)
    return corrupt("files, coords, node_of_rank and tp*cp*dp*pp disagree on the number of ranks");
  m.plan = bytes.substr(kMagicLen + 8 + n, bytes.size() - kMagicLen - 16 - n);
  return m;
}

std::vector<LocalEntry> list_local_checkpoints(const std::string& dir, const std::string& path) {
  std::vector<LocalEntry> out;
  const std::string want = path.empty() ? "" : canonical_path(path);
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name[0] == '.') continue;  // partial saves and hidden files
    std::error_code dir_ec;
    if (!it->is_directory(dir_ec)) continue;  // other files the user keeps there
    const std::string cdir = it->path().string();
    auto bytes = read_whole_file((fs::path(cdir) / kLocalManifestName).string(), 1ull << 34);
    if (!bytes.ok()) {
      if (bytes.status().code() != ErrorCode::kNotFound)
        logging::log().warn("local checkpoint '{}' skipped: {}", cdir, bytes.status().to_string());
      continue;
    }
    auto m = decode_local_manifest(*bytes);
    if (!m.ok()) {
      logging::log().warn("local checkpoint '{}' skipped: {}", cdir, m.status().to_string());
      continue;
    }
    if (!want.empty() && m->shared_path != want && m->parent() != want) continue;
    LocalEntry e{name, cdir, XXH3_64bits(bytes->data(), bytes->size()), m->step, {}, m->files.size(), m->node_of_rank};
    for (size_t r = 0; r < m->files.size(); ++r) {
      struct stat sb {};
      const std::string f = (fs::path(cdir) / local_rank_file(static_cast<int>(r))).string();
      if (::stat(f.c_str(), &sb) == 0 && S_ISREG(sb.st_mode) && static_cast<uint64_t>(sb.st_size) == m->files[r].bytes)
        e.ranks.push_back(static_cast<int>(r));
    }
    out.push_back(std::move(e));
  }
  return out;
}

Result<uint64_t> file_xxh3(const std::string& path, uint64_t bytes) {
  const int fd = io::open(path, O_RDONLY);
  if (fd < 0) return io::error("open", path, errno, errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo);
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<char> buf(std::min<uint64_t>(bytes, 4ull << 20) + 1);
  uint64_t done = 0;
  Status failed;
  while (failed.ok()) {
    const ssize_t n = io::pread(fd, buf.data(), buf.size(), static_cast<off_t>(done));
    if (n < 0) failed = io::error("pread", path, errno);
    if (n <= 0) break;
    XXH3_64bits_update(st, buf.data(), static_cast<size_t>(n));
    done += static_cast<uint64_t>(n);
  }
  const uint64_t sum = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  io::close(fd);
  if (!failed.ok()) return failed;
  if (done != bytes)
    return Status(ErrorCode::kCorrupt, "'" + path + "' holds " + std::to_string(done) + " bytes, the manifest says " +
                                           std::to_string(bytes));
  return sum;
}

void retain_local(const std::string& dir, int64_t keep, const std::string& keep_name) {
  std::vector<LocalEntry> all = list_local_checkpoints(dir, "");
  std::sort(all.begin(), all.end(), [](const LocalEntry& a, const LocalEntry& b) {
    return a.step != b.step ? a.step > b.step : a.name > b.name;
  });
  int64_t kept = 0;
  bool spared = false;
  const std::string spare = (fs::path(dir) / kLocalSpareName).string();
  for (const auto& e : all) {
    if (e.name == keep_name || kept < keep) {
      ++kept;
      continue;
    }
    // The newest dropped one: out of the listing first (no manifest), then renamed.
    if (!spared && remove_tree(spare).ok() && io::unlink((fs::path(e.dir) / kLocalManifestName).string()) == 0 &&
        io::rename(e.dir, spare) == 0) {
      spared = true;
      logging::log().info("local retention: '{}' (step {}) kept as the spare for the next save", e.dir, e.step);
      continue;
    }
    if (Status st = remove_tree(e.dir); !st.ok())
      logging::log().warn("local retention: could not delete '{}': {}", e.dir, st.to_string());
    else logging::log().info("local retention: deleted '{}' (step {})", e.dir, e.step);
  }
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (is_partial_name(name) && it->path().string() != local_partial_dir(dir, keep_name))
      (void)remove_tree(it->path().string());  // a save that crashed before its commit
  }
}

Status make_partial_dir(const std::string& dir, const std::string& partial, const std::vector<std::string>& reuse) {
  const std::string spare = (fs::path(dir) / kLocalSpareName).string();
  std::error_code ec;
  if (!fs::is_directory(spare, ec) || io::rename(spare, partial) != 0) return make_dir(partial);
  // Whatever this save will not overwrite whole goes (other ranks' files, quarantined ones).
  std::vector<std::string> drop;
  for (fs::directory_iterator it(partial, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code file_ec;
    if (std::find(reuse.begin(), reuse.end(), name) == reuse.end() || !it->is_regular_file(file_ec))
      drop.push_back(it->path().string());
  }
  if (ec) return Status(ErrorCode::kIo, "cannot list '" + partial + "': " + ec.message());
  for (const std::string& path : drop) H5CKPT_RETURN_IF_ERROR(remove_tree(path));
  return Status::Ok();
}

CheckpointInfo local_info(const LocalManifest& m, const std::vector<planner::TensorPlan>& tensors,
                          const std::string& dir) {
  CheckpointInfo info;
  info.path = dir;
  info.format_version = 0;  // not a shared-level checkpoint: no data file
  info.library_version = m.library_version;
  info.step = m.step;
  info.saved_sizes = m.sizes;
  info.saved_coords = m.coords;
  info.attributes = m.attributes;
  for (const auto& t : tensors) {
    TensorInfo ti;
    ti.key = t.key;
    ti.dtype = t.dtype;
    ti.shape = t.shape;
    ti.nbytes = t.nbytes();
    for (size_t r = 0; r < t.regions.size(); ++r)
      ti.regions.push_back(SavedRegion{t.shard(r), t.regions[r].writer, 0, 0, {}});
    info.tensors.push_back(std::move(ti));
  }
  return info;
}

}  // namespace h5ckpt::storage
