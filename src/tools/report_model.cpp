#include "tools/report_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "h5ckpt/checkpoint_info.h"
#include "h5ckpt/metrics_schema.h"

namespace h5ckpt::report {

namespace {

namespace fs = std::filesystem;
namespace key = metrics_schema;
using nlohmann::json;

Status invalid(const std::string& source, const std::string& what) {
  return Status(ErrorCode::kCorrupt, "metrics file '" + source + "': " + what);
}

// A key as the error messages quote it: "ranks".
std::string quoted(const char* k) { return std::string("\"") + k + "\""; }

}  // namespace

double RankRow::total_s() const {
  double t = 0;
  for (double v : phase_s)
    if (std::isfinite(v)) t += v;
  return t;
}

Result<Metrics> parse_metrics(const std::string& json_text, const std::string& source) {
  const json doc = json::parse(json_text, nullptr, false);
  if (doc.is_discarded()) return invalid(source, "not valid JSON");
  if (!doc.is_object()) return invalid(source, "expected a JSON object");
  Metrics m;
  m.source = source;
  auto str = [&](const char* k) { return doc.contains(k) && doc[k].is_string() ? doc[k].get<std::string>() : ""; };
  m.op = str(key::kOp);
  m.checkpoint = str(key::kCheckpoint);
  if (m.op.empty()) return invalid(source, "missing " + quoted(key::kOp) + " (save or load)");
  if (doc.contains(key::kTopology) && doc[key::kTopology].is_object()) {
    const json& t = doc[key::kTopology];
    for (auto [k, dst] : {std::pair<const char*, int*>{key::kTp, &m.tp}, {key::kDp, &m.dp}, {key::kPp, &m.pp}})
      if (t.contains(k) && t[k].is_number_integer()) *dst = t[k].get<int>();
  }
  if (!doc.contains(key::kRanks) || !doc[key::kRanks].is_array() || doc[key::kRanks].empty())
    return invalid(source, quoted(key::kRanks) + " must be a non-empty array");
  if (doc.contains(key::kPhaseOrder)) {
    const std::string not_names = quoted(key::kPhaseOrder) + " must be an array of names";
    if (!doc[key::kPhaseOrder].is_array()) return invalid(source, not_names);
    for (const auto& p : doc[key::kPhaseOrder]) {
      if (!p.is_string()) return invalid(source, not_names);
      m.phases.push_back(p.get<std::string>());
    }
  }
  // Phases not in phase_order (or all of them, when it is absent) follow in the files' order.
  const json& ranks = doc[key::kRanks];
  for (const auto& e : ranks)
    if (e.is_object() && e.contains(key::kPhases) && e[key::kPhases].is_object())
      for (const auto& [k, v] : e[key::kPhases].items())
        if (std::find(m.phases.begin(), m.phases.end(), k) == m.phases.end()) m.phases.push_back(k);
  std::set<int> seen;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const json& e = ranks[i];
    const std::string at = std::string(key::kRanks) + "[" + std::to_string(i) + "]";
    if (!e.is_object()) return invalid(source, at + " is not an object");
    RankRow r;
    if (!e.contains(key::kRank) || !e[key::kRank].is_number_integer() || e[key::kRank].get<int64_t>() < 0)
      return invalid(source, at + ": " + quoted(key::kRank) + " must be a non-negative integer");
    r.rank = e[key::kRank].get<int>();
    if (!seen.insert(r.rank).second) return invalid(source, at + ": rank " + std::to_string(r.rank) + " appears twice");
    if (e.contains(key::kCoords) && e[key::kCoords].is_array())
      for (const auto& c : e[key::kCoords])
        if (c.is_number_integer()) r.coords.push_back(c.get<int>());
    r.phase_s.assign(m.phases.size(), std::numeric_limits<double>::quiet_NaN());
    if (e.contains(key::kPhases)) {
      if (!e[key::kPhases].is_object()) return invalid(source, at + ": " + quoted(key::kPhases) + " must be an object");
      for (const auto& [k, v] : e[key::kPhases].items()) {
        if (!v.is_number() || v.get<double>() < 0 || !std::isfinite(v.get<double>()))
          return invalid(source, "rank " + std::to_string(r.rank) + " phase \"" + k + "\": expected seconds >= 0");
        const auto pos = std::find(m.phases.begin(), m.phases.end(), k) - m.phases.begin();
        r.phase_s[pos] = v.get<double>();
      }
    }
    if (e.contains(key::kBytes)) {
      if (!e[key::kBytes].is_object()) return invalid(source, at + ": " + quoted(key::kBytes) + " must be an object");
      for (const auto& [k, v] : e[key::kBytes].items()) {
        if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
          return invalid(source, "rank " + std::to_string(r.rank) + " bytes \"" + k + "\": expected an integer >= 0");
        r.bytes.emplace_back(k, v.get<uint64_t>());
      }
    }
    m.ranks.push_back(std::move(r));
  }
  std::sort(m.ranks.begin(), m.ranks.end(), [](const RankRow& a, const RankRow& b) { return a.rank < b.rank; });
  m.world = doc.contains(key::kWorld) && doc[key::kWorld].is_number_integer() ? doc[key::kWorld].get<int>()
                                                                              : static_cast<int>(m.ranks.size());
  return m;
}

Result<std::vector<Metrics>> load_metrics(const std::string& path, const std::string& metrics_dir) {
  auto read_one = [](const std::string& file) -> Result<Metrics> {
    std::ifstream in(file, std::ios::binary);
    if (!in) return Status(ErrorCode::kNotFound, "cannot open metrics file '" + file + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    return parse_metrics(ss.str(), file);
  };
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status(ErrorCode::kNotFound, "'" + path + "' does not exist");
  if (!fs::is_directory(path, ec)) {
    auto m = read_one(path);
    if (!m.ok()) return m.status();
    return std::vector<Metrics>{std::move(m).value()};
  }
  fs::path ckpt = fs::path(path).lexically_normal();
  if (ckpt.filename().empty()) ckpt = ckpt.parent_path();
  if (const fs::path latest = ckpt / kLatestFileName; fs::is_regular_file(latest, ec)) {  // a directory of checkpoints
    std::ifstream in(latest);
    std::string name;
    std::getline(in, name);
    if (name.empty()) return Status(ErrorCode::kCorrupt, "'" + latest.string() + "' is empty");
    ckpt /= name;
  }
  std::vector<Metrics> out;
  std::string tried;
  for (const char* op : {key::kOpSave, key::kOpLoad}) {
    // The writer's own naming rule, so the two cannot drift apart.
    const fs::path file = key::metrics_path(ckpt.string(), op, metrics_dir);
    tried += (tried.empty() ? "" : ", ") + file.string();
    if (!fs::exists(file, ec)) continue;
    auto m = read_one(file.string());
    if (!m.ok()) return m.status();
    out.push_back(std::move(m).value());
  }
  if (out.empty())
    return Status(ErrorCode::kNotFound, "no metrics for checkpoint '" + ckpt.string() + "' (looked for " + tried +
                                            "; metrics are written when CheckpointerOptions::metrics is on; "
                                            "pass --metrics-dir if they went elsewhere)");
  return out;
}

}  // namespace h5ckpt::report
