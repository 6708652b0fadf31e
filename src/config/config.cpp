// TOML config files and H5CKPT_* environment variables -> Config (docs/configuration.md).
// One table of keys drives the file parser, the environment and the error messages, so a key
// cannot be documented in one place and missing in another.
#include "h5ckpt/config.h"

#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <toml++/toml.h>
#include <variant>

#include "logging/log.h"
#include "storage/mpi_hints.h"

extern char** environ;

namespace h5ckpt {

namespace {

enum class Kind {
  kBool,
  kSize,
  kPositiveSize,
  kThreads,
  kCount,
  kString,
  kLogLevel,
  kSeconds,
  kStrictness,
  kAggregateWrites
};

using Value = std::variant<bool, uint64_t, std::string, double>;

// LoadOptions::strictness by its configuration name (lower case), or nullopt.
std::optional<LoadStrictness> strictness_from(const std::string& name) {
  if (name == "ignore_unexpected") return LoadStrictness::kIgnoreUnexpected;
  if (name == "raise_all") return LoadStrictness::kRaiseAll;
  if (name == "allow_missing") return LoadStrictness::kAllowMissing;
  return std::nullopt;
}

// SaveOptions::aggregate_writes by its configuration name (lower case), or nullopt.
std::optional<AggregateWrites> aggregate_writes_from(const std::string& name) {
  if (name == "auto") return AggregateWrites::kAuto;
  if (name == "on") return AggregateWrites::kOn;
  if (name == "off") return AggregateWrites::kOff;
  return std::nullopt;
}

struct KeyDef {
  const char* section;
  const char* name;
  const char* env;
  Kind kind;
  void (*set)(Config&, const Value&);
};

bool b(const Value& v) { return std::get<bool>(v); }
uint64_t u(const Value& v) { return std::get<uint64_t>(v); }
double seconds(const Value& v) { return std::get<double>(v); }
const std::string& s(const Value& v) { return std::get<std::string>(v); }

// [mpi_hints] is open-ended (any hint name) and handled apart from this table.
const KeyDef kKeys[] = {
    {"checkpointer", "async", "H5CKPT_ASYNC", Kind::kBool,
     [](Config& c, const Value& v) { c.checkpointer.async = b(v); }},
    {"checkpointer", "direct_writes", "H5CKPT_DIRECT_WRITES", Kind::kBool,
     [](Config& c, const Value& v) { c.checkpointer.direct_writes = b(v); }},
    {"checkpointer", "direct_io", "H5CKPT_DIRECT_IO", Kind::kBool,
     [](Config& c, const Value& v) { c.checkpointer.direct_io = b(v); }},
    {"checkpointer", "staging_bytes", "H5CKPT_STAGING_BYTES", Kind::kSize,
     [](Config& c, const Value& v) { c.checkpointer.staging_bytes = u(v); }},
    {"checkpointer", "memory_bytes", "H5CKPT_MEMORY_BYTES", Kind::kSize,
     [](Config& c, const Value& v) { c.checkpointer.memory_bytes = u(v); }},
    {"checkpointer", "max_piece_bytes", "H5CKPT_MAX_PIECE_BYTES", Kind::kPositiveSize,
     [](Config& c, const Value& v) { c.checkpointer.max_piece_bytes = u(v); }},
    {"checkpointer", "alignment", "H5CKPT_ALIGNMENT", Kind::kSize,
     [](Config& c, const Value& v) { c.checkpointer.alignment = u(v); }},
    {"checkpointer", "io_threads", "H5CKPT_IO_THREADS", Kind::kThreads,
     [](Config& c, const Value& v) { c.checkpointer.io_threads = static_cast<int>(u(v)); }},
    {"checkpointer", "verify_threads", "H5CKPT_VERIFY_THREADS", Kind::kCount,
     [](Config& c, const Value& v) {
       c.checkpointer.verify_threads = static_cast<int>(std::min<uint64_t>(u(v), 1024));
     }},
    {"checkpointer", "snapshot_threads", "H5CKPT_SNAPSHOT_THREADS", Kind::kCount,
     [](Config& c, const Value& v) {
       c.checkpointer.snapshot_threads = static_cast<int>(std::min<uint64_t>(u(v), 1024));
     }},
    {"checkpointer", "timeout_s", "H5CKPT_TIMEOUT_S", Kind::kSeconds,
     [](Config& c, const Value& v) { c.checkpointer.timeout_s = seconds(v); }},
    {"checkpointer", "keep_last", "H5CKPT_KEEP_LAST", Kind::kCount,
     [](Config& c, const Value& v) { c.checkpointer.keep_last = static_cast<int64_t>(u(v)); }},
    {"checkpointer", "keep_every", "H5CKPT_KEEP_EVERY", Kind::kCount,
     [](Config& c, const Value& v) { c.checkpointer.keep_every = static_cast<int64_t>(u(v)); }},
    {"checkpointer", "local_dir", "H5CKPT_LOCAL_DIR", Kind::kString,
     [](Config& c, const Value& v) { c.checkpointer.local_dir = s(v); }},
    {"checkpointer", "local_replicas", "H5CKPT_LOCAL_REPLICAS", Kind::kCount,
     [](Config& c, const Value& v) {
       c.checkpointer.local_replicas = static_cast<int>(std::min<uint64_t>(u(v), 1u << 20));
     }},
    {"checkpointer", "persist_every", "H5CKPT_PERSIST_EVERY", Kind::kCount,
     [](Config& c, const Value& v) { c.checkpointer.persist_every = static_cast<int64_t>(u(v)); }},
    {"checkpointer", "auth_key_file", "H5CKPT_AUTH_KEY_FILE", Kind::kString,
     [](Config& c, const Value& v) { c.checkpointer.auth_key_file = s(v); }},
    {"checkpointer", "local_keep", "H5CKPT_LOCAL_KEEP", Kind::kCount,
     [](Config& c, const Value& v) { c.checkpointer.local_keep = static_cast<int64_t>(u(v)); }},
    {"save", "checksums", "H5CKPT_CHECKSUMS", Kind::kBool, [](Config& c, const Value& v) { c.save.checksums = b(v); }},
    {"save", "overwrite", "H5CKPT_OVERWRITE", Kind::kBool, [](Config& c, const Value& v) { c.save.overwrite = b(v); }},
    {"save", "update_latest", "H5CKPT_UPDATE_LATEST", Kind::kBool,
     [](Config& c, const Value& v) { c.save.update_latest = b(v); }},
    {"save", "aggregate_writes", "H5CKPT_AGGREGATE_WRITES", Kind::kAggregateWrites,
     [](Config& c, const Value& v) { c.save.aggregate_writes = *aggregate_writes_from(s(v)); }},
    {"save", "write_window_bytes", "H5CKPT_WRITE_WINDOW_BYTES", Kind::kPositiveSize,
     [](Config& c, const Value& v) { c.save.write_window_bytes = u(v); }},
    {"load", "strict", "H5CKPT_LOAD_STRICT", Kind::kBool, [](Config& c, const Value& v) { c.load.strict = b(v); }},
    {"load", "strictness", "H5CKPT_LOAD_STRICTNESS", Kind::kStrictness,
     [](Config& c, const Value& v) { c.load.strictness = *strictness_from(s(v)); }},
    {"load", "convert_dtype", "H5CKPT_CONVERT_DTYPE", Kind::kBool,
     [](Config& c, const Value& v) { c.load.convert_dtype = b(v); }},
    {"load", "verify", "H5CKPT_LOAD_VERIFY", Kind::kBool, [](Config& c, const Value& v) { c.load.verify = b(v); }},
    {"load", "verify_checksums", "H5CKPT_VERIFY_CHECKSUMS", Kind::kBool,
     [](Config& c, const Value& v) { c.load.verify_checksums = b(v); }},
    {"load", "zero_redundancy", "H5CKPT_ZERO_REDUNDANCY", Kind::kBool,
     [](Config& c, const Value& v) { c.load.zero_redundancy = b(v); }},
    {"load", "aggregate_reads", "H5CKPT_AGGREGATE_READS", Kind::kBool,
     [](Config& c, const Value& v) { c.load.aggregate_reads = b(v); }},
    {"load", "read_window_bytes", "H5CKPT_READ_WINDOW_BYTES", Kind::kSize,
     [](Config& c, const Value& v) { c.load.read_window_bytes = u(v); }},
    {"logging", "level", "H5CKPT_LOG_LEVEL", Kind::kLogLevel, [](Config& c, const Value& v) { c.log_level = s(v); }},
    {"metrics", "enabled", "H5CKPT_METRICS", Kind::kBool,
     [](Config& c, const Value& v) { c.checkpointer.metrics = b(v); }},
    {"metrics", "dir", "H5CKPT_METRICS_DIR", Kind::kString,
     [](Config& c, const Value& v) { c.checkpointer.metrics_dir = s(v); }},
};

constexpr const char* kHintsSection = "mpi_hints";
constexpr const char* kHintsEnv = "H5CKPT_MPI_HINTS";
constexpr const char* kConfigEnv = "H5CKPT_CONFIG";
constexpr int kMaxIoThreads = 1024;

const char* kind_expectation(Kind k) {
  switch (k) {
    case Kind::kBool: return "a boolean (true or false)";
    case Kind::kSize: return "a byte size >= 0 (an integer, or a string such as \"512MiB\")";
    case Kind::kPositiveSize: return "a byte size > 0 (an integer, or a string such as \"256MiB\")";
    case Kind::kThreads: return "an integer from 0 to 1024";
    case Kind::kSeconds: return "a number of seconds >= 0 (0: no timeout)";
    case Kind::kCount: return "an integer >= 0";
    case Kind::kString: return "a string";
    case Kind::kLogLevel: return "one of trace, debug, info, warn, error, critical, off";
    case Kind::kStrictness: return "one of ignore_unexpected, raise_all, allow_missing";
    case Kind::kAggregateWrites: return "one of auto, on, off";
  }
  return "?";
}

std::string lower(std::string x) {
  for (auto& ch : x) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return x;
}

std::string trim(const std::string& x) {
  const auto b0 = x.find_first_not_of(" \t");
  if (b0 == std::string::npos) return "";
  const auto e0 = x.find_last_not_of(" \t");
  return x.substr(b0, e0 - b0 + 1);
}

// Log-level spellings we accept -> spdlog level; spdlog's own from_str maps typos to "off".
bool log_level_from(const std::string& name, spdlog::level::level_enum* out) {
  static const std::pair<const char*, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},       {"info", spdlog::level::info},
      {"warn", spdlog::level::warn},   {"warning", spdlog::level::warn},      {"error", spdlog::level::err},
      {"err", spdlog::level::err},     {"critical", spdlog::level::critical}, {"off", spdlog::level::off}};
  const std::string l = lower(trim(name));
  for (const auto& [n, lv] : kLevels)
    if (l == n) {
      if (out) *out = lv;
      return true;
    }
  return false;
}

// Validates a value already converted to the key's C++ type; returns the problem or "".
std::string check_range(Kind k, const Value& v) {
  if (k == Kind::kPositiveSize && u(v) == 0) return "must be greater than 0";
  if (k == Kind::kThreads && u(v) > static_cast<uint64_t>(kMaxIoThreads))
    return "must be from 0 to " + std::to_string(kMaxIoThreads) + ", got " + std::to_string(u(v));
  if (k == Kind::kSeconds && !(seconds(v) >= 0 && seconds(v) <= 1e9))  // also refuses NaN
    return std::string("expected ") + kind_expectation(k);
  if (k == Kind::kStrictness && !strictness_from(s(v)))
    return "unknown strictness \"" + s(v) + "\" (expected " + kind_expectation(k) + ")";
  if (k == Kind::kAggregateWrites && !aggregate_writes_from(s(v)))
    return "unknown mode \"" + s(v) + "\" (expected " + kind_expectation(k) + ")";
  if (k == Kind::kLogLevel && !log_level_from(s(v), nullptr))
    return "unknown log level \"" + s(v) + "\" (expected " + kind_expectation(k) + ")";
  return "";
}

// Environment text -> Value of kind k; on failure returns the problem.
std::string value_from_text(Kind k, const std::string& text, Value* out) {
  const std::string t = trim(text);
  switch (k) {
    case Kind::kBool: {
      const std::string l = lower(t);
      if (l == "1" || l == "true" || l == "yes" || l == "on") *out = true;
      else if (l == "0" || l == "false" || l == "no" || l == "off") *out = false;
      else return "expected a boolean (1/0, true/false, yes/no, on/off)";
      return "";
    }
    case Kind::kSize:
    case Kind::kPositiveSize: {
      auto r = parse_byte_size(t);
      if (!r.ok()) return r.status().message();
      *out = *r;
      return check_range(k, *out);
    }
    case Kind::kThreads:
    case Kind::kCount: {
      if (t.empty() || t.find_first_not_of("0123456789") != std::string::npos)
        return std::string("expected ") + kind_expectation(k);
      if (t.size() > 9) return std::string("expected ") + kind_expectation(k);
      *out = static_cast<uint64_t>(std::stoull(t));
      return check_range(k, *out);
    }
    case Kind::kSeconds: {
      char* end = nullptr;
      const double x = t.empty() ? -1 : std::strtod(t.c_str(), &end);
      if (t.empty() || *end != '\0') return std::string("expected ") + kind_expectation(k);
      *out = x;
      return check_range(k, *out);
    }
    case Kind::kString:
      *out = text;  // untrimmed: a path may legitimately contain spaces
      return "";
    case Kind::kLogLevel:
    case Kind::kAggregateWrites:
    case Kind::kStrictness: *out = lower(t); return check_range(k, *out);
  }
  return "internal: unhandled kind";
}

std::string toml_type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a floating-point number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date:
    case toml::node_type::time:
    case toml::node_type::date_time: return "a date/time";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "nothing";
  }
}

// TOML node -> Value of kind k; on failure returns the problem.
std::string value_from_toml(Kind k, const toml::node& n, Value* out) {
  const std::string got = ", got " + toml_type_name(n);
  switch (k) {
    case Kind::kBool:
      if (!n.is_boolean()) return std::string("expected ") + kind_expectation(k) + got;
      *out = n.as_boolean()->get();
      return "";
    case Kind::kSize:
    case Kind::kPositiveSize:
    case Kind::kThreads:
    case Kind::kCount:
      if (n.is_integer()) {
        const int64_t i = n.as_integer()->get();
        if (i < 0)
          return (k == Kind::kThreads ? "must be from 0 to 1024, got "
                  : k == Kind::kCount ? "must be >= 0, got "
                                      : "negative size ") +
                 std::to_string(i);
        *out = static_cast<uint64_t>(i);
        return check_range(k, *out);
      }
      if (n.is_string() && k != Kind::kThreads && k != Kind::kCount)
        return value_from_text(k, n.as_string()->get(), out);
      return std::string("expected ") + kind_expectation(k) + got;
    case Kind::kSeconds:
      if (n.is_integer()) *out = static_cast<double>(n.as_integer()->get());
      else if (n.is_floating_point()) *out = n.as_floating_point()->get();
      else return std::string("expected ") + kind_expectation(k) + got;
      return check_range(k, *out);
    case Kind::kString:
      if (!n.is_string()) return std::string("expected ") + kind_expectation(k) + got;
      *out = n.as_string()->get();
      return "";
    case Kind::kLogLevel:
    case Kind::kAggregateWrites:
    case Kind::kStrictness:
      if (!n.is_string()) return std::string("expected ") + kind_expectation(k) + got;
      *out = lower(trim(n.as_string()->get()));
      return check_range(k, *out);
  }
  return "internal: unhandled kind";
}

// toml++ quotes the offending text verbatim, newline included; keep the message on one line.
std::string one_line(std::string_view text) {
  std::string out;
  for (char ch : text) out += ch == '\n' ? std::string("\\n") : std::string(1, ch);
  return out;
}

std::string where(const std::string& source, const toml::source_region& r) {
  std::string w = source;
  if (r.begin.line > 0) w += ":" + std::to_string(r.begin.line) + ":" + std::to_string(r.begin.column);
  return w;
}

Status bad(const std::string& source, const toml::source_region& r, const std::string& key, const std::string& what) {
  return Status(ErrorCode::kInvalidArgument, "config " + where(source, r) + ": " + key + ": " + what);
}

std::string known_keys(const std::string& section) {
  std::string out;
  for (const auto& k : kKeys)
    if (section == k.section) out += (out.empty() ? "" : ", ") + std::string(k.name);
  return out;
}

std::string known_sections() {
  std::string out;
  for (const auto& k : kKeys)
    if (out.find(k.section) == std::string::npos) out += (out.empty() ? "[" : ", [") + std::string(k.section) + "]";
  return out + ", [" + kHintsSection + "]";
}

// MPI hint values are strings to MPI; integers and booleans are accepted for convenience.
std::string hint_value(const toml::node& n, std::string* out) {
  if (n.is_string()) *out = n.as_string()->get();
  else if (n.is_integer()) *out = std::to_string(n.as_integer()->get());
  else if (n.is_boolean()) *out = n.as_boolean()->get() ? "true" : "false";
  else return "expected a string, integer or boolean hint value, got " + toml_type_name(n);
  return "";
}

Status apply_table(Config& c, const toml::table& root, const std::string& source) {
  for (auto&& [sec_key, sec_node] : root) {
    const std::string sec(sec_key.str());
    const toml::table* tbl = sec_node.as_table();
    if (sec == kHintsSection) {
      if (!tbl) return bad(source, sec_key.source(), sec, "expected a table [mpi_hints] of hint = value");
      for (auto&& [hk, hv] : *tbl) {
        std::string v;
        std::string err = hint_value(hv, &v);
        if (err.empty()) err = storage::check_mpi_hint(std::string(hk.str()), v);  // cb_nodes = 0 crashes MPI
        if (!err.empty()) return bad(source, hv.source(), sec + "." + std::string(hk.str()), err);
        c.checkpointer.mpi_hints[std::string(hk.str())] = v;
      }
      continue;
    }
    if (known_keys(sec).empty())
      return bad(source, sec_key.source(), sec,
                 std::string(tbl ? "unknown section" : "unknown top-level key") +
                     " (known sections: " + known_sections() + ")");
    if (!tbl)
      return bad(source, sec_key.source(), sec, "expected a table [" + sec + "], got " + toml_type_name(sec_node));
    for (auto&& [k, n] : *tbl) {
      const std::string name(k.str());
      const KeyDef* def = nullptr;
      for (const auto& d : kKeys)
        if (sec == d.section && name == d.name) def = &d;
      if (!def)
        return bad(source, k.source(), sec + "." + name,
                   "unknown key (known keys in [" + sec + "]: " + known_keys(sec) + ")");
      Value v;
      const std::string err = value_from_toml(def->kind, n, &v);
      if (!err.empty()) return bad(source, n.source(), sec + "." + name, err);
      def->set(c, v);
    }
  }
  return Status::Ok();
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

bool is_rank0() {
  int inited = 0, rank = 0;
  MPI_Initialized(&inited);
  if (inited) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank == 0;
}

}  // namespace

Result<uint64_t> parse_byte_size(const std::string& text) {
  const std::string t = trim(text);
  auto fail = [&](const std::string& why) {
    return Status(ErrorCode::kInvalidArgument, "bad size \"" + text + "\": " + why);
  };
  if (t.empty()) return fail("empty");
  if (t[0] == '-') return fail("negative size");
  size_t i = 0;
  unsigned __int128 whole = 0, frac = 0, frac_scale = 1;
  const size_t digits0 = i;
  while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) {
    whole = whole * 10 + static_cast<unsigned>(t[i] - '0');
    if (whole > UINT64_MAX) return fail("too large");
    ++i;
  }
  const bool had_whole = i > digits0;
  bool had_frac = false;
  if (i < t.size() && t[i] == '.') {
    ++i;
    while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) {
      if (frac_scale < static_cast<unsigned __int128>(1000000000000000000ull)) {  // 18 digits are plenty
        frac = frac * 10 + static_cast<unsigned>(t[i] - '0');
        frac_scale *= 10;
      }
      had_frac = true;
      ++i;
    }
  }
  if (!had_whole && !had_frac)
    return fail("expected a number, optionally followed by a unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  const std::string unit = lower(trim(t.substr(i)));
  static const std::pair<const char*, uint64_t> kUnits[] = {{"", 1},
                                                            {"b", 1},
                                                            {"k", 1ull << 10},
                                                            {"kib", 1ull << 10},
                                                            {"kb", 1000ull},
                                                            {"m", 1ull << 20},
                                                            {"mib", 1ull << 20},
                                                            {"mb", 1000000ull},
                                                            {"g", 1ull << 30},
                                                            {"gib", 1ull << 30},
                                                            {"gb", 1000000000ull},
                                                            {"t", 1ull << 40},
                                                            {"tib", 1ull << 40},
                                                            {"tb", 1000000000000ull}};
  uint64_t mult = 0;
  for (const auto& [n, m] : kUnits)
    if (unit == n) mult = m;
  if (!mult)
    return fail("unknown unit \"" + t.substr(i) +
                "\" (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB; K/M/G/T mean KiB/MiB/GiB/TiB)");
  const unsigned __int128 frac_bytes = frac * mult;
  if (frac_bytes % frac_scale != 0) return fail("not a whole number of bytes");
  const unsigned __int128 total = whole * mult + frac_bytes / frac_scale;
  if (total > UINT64_MAX) return fail("too large");
  return static_cast<uint64_t>(total);
}

Result<Config> parse_config(const std::string& toml_text, const std::string& source) {
  Config c;
  try {
    const toml::table root = toml::parse(toml_text, source);
    H5CKPT_RETURN_IF_ERROR(apply_table(c, root, source));
  } catch (const toml::parse_error& e) {
    return Status(ErrorCode::kInvalidArgument,
                  "config " + where(source, e.source()) + ": TOML syntax error: " + one_line(e.description()));
  }
  return c;
}

Result<Config> load_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(ErrorCode::kNotFound, "config file '" + path + "' cannot be opened");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status(ErrorCode::kIo, "config file '" + path + "': read error");
  return parse_config(ss.str(), path);
}

Status apply_env(Config& config) {
  Config c = config;  // all or nothing
  for (const auto& d : kKeys) {
    const char* raw = std::getenv(d.env);
    if (!raw) continue;
    Value v;
    const std::string err = value_from_text(d.kind, raw, &v);
    if (!err.empty())
      return Status(ErrorCode::kInvalidArgument, std::string("environment variable ") + d.env + "=\"" + raw + "\" (" +
                                                     d.section + "." + d.name + "): " + err);
    d.set(c, v);
  }
  if (const char* raw = std::getenv(kHintsEnv)) {
    // "key=value,key=value": merged over the file's hints, key by key.
    std::stringstream ss(raw);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (trim(item).empty()) continue;
      const auto eq = item.find('=');
      const std::string k = eq == std::string::npos ? "" : trim(item.substr(0, eq));
      if (k.empty())
        return Status(ErrorCode::kInvalidArgument, std::string("environment variable ") + kHintsEnv + "=\"" + raw +
                                                       "\": item \"" + item + "\" is not key=value");
      c.checkpointer.mpi_hints[k] = trim(item.substr(eq + 1));
      if (auto why = storage::check_mpi_hint(k, c.checkpointer.mpi_hints[k]); !why.empty())
        return Status(ErrorCode::kInvalidArgument,
                      std::string("environment variable ") + kHintsEnv + ": hint '" + k + "': " + why);
    }
  }
  // Unknown H5CKPT_* names are left alone (the scripts use the prefix), but a near-miss of one of
  // ours is almost certainly a typo that would otherwise be silently ignored.
  for (char** e = environ; e && *e; ++e) {
    const std::string entry(*e);
    if (entry.rfind("H5CKPT_", 0) != 0) continue;
    const std::string name = entry.substr(0, entry.find('='));
    std::vector<std::string> ours{kHintsEnv, kConfigEnv};
    for (const auto& d : kKeys) ours.emplace_back(d.env);
    if (std::find(ours.begin(), ours.end(), name) != ours.end()) continue;
    for (const auto& o : ours)
      if (edit_distance(name, o) <= 2 && is_rank0()) {
        logging::log().warn("environment variable {} is not an h5ckpt setting (did you mean {}?); ignored", name, o);
        break;
      }
  }
  config = std::move(c);
  return Status::Ok();
}

Status set_log_level(const std::string& level) {
  spdlog::level::level_enum lv;
  if (!log_level_from(level, &lv))
    return Status(ErrorCode::kInvalidArgument,
                  "unknown log level \"" + level + "\" (expected " + kind_expectation(Kind::kLogLevel) + ")");
  logging::log().set_level(lv);
  return Status::Ok();
}

Result<Config> resolve_config(const std::string& path_or_empty) {
  std::string path = path_or_empty;
  if (path.empty())
    if (const char* p = std::getenv(kConfigEnv)) path = p;
  Config c;
  if (!path.empty()) {
    auto r = load_config(path);
    if (!r.ok()) return r.status();
    c = std::move(r).value();
  }
  H5CKPT_RETURN_IF_ERROR(apply_env(c));
  H5CKPT_RETURN_IF_ERROR(set_log_level(c.log_level));
  return c;
}

}  // namespace h5ckpt
