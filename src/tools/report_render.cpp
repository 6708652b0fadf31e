#include "tools/report_render.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace h5ckpt::report {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

Status invalid(const std::string& source, const std::string& what) {
  return Status(ErrorCode::kCorrupt, "metrics file '" + source + "': " + what);
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string human_bytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? std::to_string(n) + " B" : fmt("%.1f ", v) + units[u];
}

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string coords_str(const RankRow& r) {
  if (r.coords.size() != 3) return "";
  return "tp" + std::to_string(r.coords[0]) + " dp" + std::to_string(r.coords[1]) + " pp" + std::to_string(r.coords[2]);
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  if (n == 0) return 0;
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Light yellow -> orange -> dark red as t goes 0 -> 1.
std::string heat_color(double t) {
  t = std::clamp(std::isfinite(t) ? t : 0.0, 0.0, 1.0);
  const double stops[3][3] = {{255, 255, 204}, {253, 141, 60}, {189, 0, 38}};
  const int i = t < 0.5 ? 0 : 1;
  const double f = t < 0.5 ? t / 0.5 : (t - 0.5) / 0.5;
  char buf[16];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", static_cast<int>(stops[i][0] + f * (stops[i + 1][0] - stops[i][0])),
                static_cast<int>(stops[i][1] + f * (stops[i + 1][1] - stops[i][1])),
                static_cast<int>(stops[i][2] + f * (stops[i + 1][2] - stops[i][2])));
  return buf;
}

std::string ratio_str(double r) { return std::isfinite(r) ? fmt("%.2f", r) + "x" : "inf"; }

std::string title_of(const Metrics& m) {
  std::string t = m.op + " of " + m.checkpoint + " — " + std::to_string(m.world) + (m.world == 1 ? " rank" : " ranks");
  if (m.tp > 0) t += " (tp" + std::to_string(m.tp) + " dp" + std::to_string(m.dp) + " pp" + std::to_string(m.pp) + ")";
  return t;
}

// The rank x phase heat map as one well-formed <svg> element (parsable as XML).
std::string heat_map_svg(const Metrics& m, const std::vector<PhaseSummary>& sum) {
  const int label_w = 170, cell_w = 96, cell_h = 24, head_h = 28, legend_h = 44;
  const int np = static_cast<int>(m.phases.size()), nr = static_cast<int>(m.ranks.size());
  const int w = label_w + np * cell_w + 10, h = head_h + nr * cell_h + legend_h;
  double vmax = 0;
  for (const auto& r : m.ranks)
    for (double v : r.phase_s)
      if (std::isfinite(v)) vmax = std::max(vmax, v);
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"heatmap\" width=\"" << w << "\" height=\"" << h
    << "\" viewBox=\"0 0 " << w << " " << h << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  for (int p = 0; p < np; ++p)
    o << "<text class=\"phase-label\" x=\"" << label_w + p * cell_w + cell_w / 2 << "\" y=\"" << head_h - 9
      << "\" text-anchor=\"middle\" font-weight=\"bold\">" << esc(m.phases[p]) << "</text>\n";
  for (int i = 0; i < nr; ++i) {
    const RankRow& r = m.ranks[i];
    const int y = head_h + i * cell_h;
    std::string label = "rank " + std::to_string(r.rank);
    if (!r.coords.empty()) label += " (" + coords_str(r) + ")";
    o << "<text class=\"rank-label\" x=\"" << label_w - 6 << "\" y=\"" << y + cell_h / 2 + 4
      << "\" text-anchor=\"end\">" << esc(label) << "</text>\n";
    for (int p = 0; p < np; ++p) {
      const double v = r.phase_s[p];
      const bool have = std::isfinite(v);
      const bool slow = have && sum[p].straggler && sum[p].slowest_rank == r.rank;
      const double t = vmax > 0 && have ? v / vmax : 0;
      const int x = label_w + p * cell_w;
      o << "<rect class=\"cell" << (slow ? " straggler" : "") << "\" data-rank=\"" << r.rank << "\" data-phase=\""
        << esc(m.phases[p]) << "\" data-seconds=\"" << (have ? fmt("%.9g", v) : "") << "\" x=\"" << x + 1
        << "\" y=\"" << y + 1 << "\" width=\"" << cell_w - 2 << "\" height=\"" << cell_h - 2 << "\" fill=\""
        << (have ? heat_color(t) : "#eeeeee") << "\""
        << (slow ? " stroke=\"#0000ff\" stroke-width=\"3\"" : " stroke=\"#ffffff\" stroke-width=\"1\"") << ">"
        << "<title>rank " << r.rank << ", " << esc(m.phases[p]) << ": " << (have ? format_seconds(v) + " s" : "no data")
        << (slow ? " (straggler: " + ratio_str(sum[p].ratio) + " the median)" : "") << "</title></rect>\n";
      o << "<text class=\"cell-label\" x=\"" << x + cell_w / 2 << "\" y=\"" << y + cell_h / 2 + 4
        << "\" text-anchor=\"middle\" fill=\"" << (t > 0.55 ? "#ffffff" : "#000000") << "\""
        << (slow ? " font-weight=\"bold\"" : "") << ">" << (have ? format_seconds(v) : "–") << "</text>\n";
    }
  }
  // Legend: the color scale from 0 to the largest cell.
  const int ly = head_h + nr * cell_h + 12, lw = std::max(120, np * cell_w - 80);
  o << "<defs><linearGradient id=\"scale-" << esc(m.op) << "\">";
  for (int k = 0; k <= 4; ++k) o << "<stop offset=\"" << k * 25 << "%\" stop-color=\"" << heat_color(k / 4.0) << "\"/>";
  o << "</linearGradient></defs>\n";
  o << "<text x=\"" << label_w - 6 << "\" y=\"" << ly + 12 << "\" text-anchor=\"end\">seconds</text>\n";
  o << "<rect class=\"legend\" x=\"" << label_w << "\" y=\"" << ly << "\" width=\"" << lw
    << "\" height=\"14\" fill=\"url(#scale-" << esc(m.op) << ")\"/>\n";
  o << "<text x=\"" << label_w << "\" y=\"" << ly + 28 << "\">0</text>\n";
  o << "<text x=\"" << label_w + lw << "\" y=\"" << ly + 28 << "\" text-anchor=\"end\">" << format_seconds(vmax)
    << "</text>\n";
  o << "</svg>\n";
  return o.str();
}

std::vector<std::string> byte_columns(const Metrics& m) {
  std::vector<std::string> cols;
  for (const auto& r : m.ranks)
    for (const auto& [k, v] : r.bytes)
      if (std::find(cols.begin(), cols.end(), k) == cols.end()) cols.push_back(k);
  return cols;
}

}  // namespace

std::string format_seconds(double s) { return fmt("%.3f", s); }

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
  m.op = str("op");
  m.checkpoint = str("checkpoint");
  if (m.op.empty()) return invalid(source, "missing \"op\" (save or load)");
  if (doc.contains("topology") && doc["topology"].is_object()) {
    const json& t = doc["topology"];
    for (auto [k, dst] : {std::pair<const char*, int*>{"tp", &m.tp}, {"dp", &m.dp}, {"pp", &m.pp}})
      if (t.contains(k) && t[k].is_number_integer()) *dst = t[k].get<int>();
  }
  if (!doc.contains("ranks") || !doc["ranks"].is_array() || doc["ranks"].empty())
    return invalid(source, "\"ranks\" must be a non-empty array");
  if (doc.contains("phase_order")) {
    if (!doc["phase_order"].is_array()) return invalid(source, "\"phase_order\" must be an array of names");
    for (const auto& p : doc["phase_order"]) {
      if (!p.is_string()) return invalid(source, "\"phase_order\" must be an array of names");
      m.phases.push_back(p.get<std::string>());
    }
  }
  // Phases not in phase_order (or all of them, when it is absent) follow in the files' order.
  for (const auto& e : doc["ranks"])
    if (e.is_object() && e.contains("phases") && e["phases"].is_object())
      for (const auto& [k, v] : e["phases"].items())
        if (std::find(m.phases.begin(), m.phases.end(), k) == m.phases.end()) m.phases.push_back(k);
  std::set<int> seen;
  for (size_t i = 0; i < doc["ranks"].size(); ++i) {
    const json& e = doc["ranks"][i];
    const std::string at = "ranks[" + std::to_string(i) + "]";
    if (!e.is_object()) return invalid(source, at + " is not an object");
    RankRow r;
    if (!e.contains("rank") || !e["rank"].is_number_integer() || e["rank"].get<int64_t>() < 0)
      return invalid(source, at + ": \"rank\" must be a non-negative integer");
    r.rank = e["rank"].get<int>();
    if (!seen.insert(r.rank).second) return invalid(source, at + ": rank " + std::to_string(r.rank) + " appears twice");
    if (e.contains("coords") && e["coords"].is_array())
      for (const auto& c : e["coords"])
        if (c.is_number_integer()) r.coords.push_back(c.get<int>());
    r.phase_s.assign(m.phases.size(), std::numeric_limits<double>::quiet_NaN());
    if (e.contains("phases")) {
      if (!e["phases"].is_object()) return invalid(source, at + ": \"phases\" must be an object");
      for (const auto& [k, v] : e["phases"].items()) {
        if (!v.is_number() || v.get<double>() < 0 || !std::isfinite(v.get<double>()))
          return invalid(source, "rank " + std::to_string(r.rank) + " phase \"" + k + "\": expected seconds >= 0");
        const auto pos = std::find(m.phases.begin(), m.phases.end(), k) - m.phases.begin();
        r.phase_s[pos] = v.get<double>();
      }
    }
    if (e.contains("bytes")) {
      if (!e["bytes"].is_object()) return invalid(source, at + ": \"bytes\" must be an object");
      for (const auto& [k, v] : e["bytes"].items()) {
        if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
          return invalid(source, "rank " + std::to_string(r.rank) + " bytes \"" + k + "\": expected an integer >= 0");
        r.bytes.emplace_back(k, v.get<uint64_t>());
      }
    }
    m.ranks.push_back(std::move(r));
  }
  std::sort(m.ranks.begin(), m.ranks.end(), [](const RankRow& a, const RankRow& b) { return a.rank < b.rank; });
  m.world = doc.contains("world") && doc["world"].is_number_integer() ? doc["world"].get<int>()
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
  if (fs::is_regular_file(ckpt / "latest", ec)) {  // a directory of checkpoints
    std::ifstream in(ckpt / "latest");
    std::string name;
    std::getline(in, name);
    if (name.empty()) return Status(ErrorCode::kCorrupt, "'" + (ckpt / "latest").string() + "' is empty");
    ckpt /= name;
  }
  std::vector<Metrics> out;
  std::string tried;
  for (const char* op : {"save", "load"}) {
    const std::string name = ckpt.filename().string() + "." + op + ".json";
    const fs::path file = metrics_dir.empty() ? ckpt.parent_path() / name : fs::path(metrics_dir) / name;
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

std::vector<PhaseSummary> summarize(const Metrics& m, const StragglerRule& rule) {
  std::vector<PhaseSummary> out;
  for (size_t p = 0; p < m.phases.size(); ++p) {
    PhaseSummary s;
    s.phase = m.phases[p];
    std::vector<double> vals;
    for (const auto& r : m.ranks) {
      const double v = r.phase_s[p];
      if (!std::isfinite(v)) continue;
      vals.push_back(v);
      if (s.slowest_rank < 0 || v > s.max_s) {  // first (lowest) rank wins ties
        s.max_s = v;
        s.slowest_rank = r.rank;
      }
    }
    if (!vals.empty()) {
      s.min_s = *std::min_element(vals.begin(), vals.end());
      s.median_s = median_of(vals);
      s.ratio = s.median_s > 0 ? s.max_s / s.median_s : (s.max_s > 0 ? std::numeric_limits<double>::infinity() : 1.0);
      s.straggler = vals.size() > 1 && s.ratio >= rule.ratio && s.max_s - s.median_s >= rule.min_gap_s;
    }
    out.push_back(s);
  }
  return out;
}

std::string render_text(const std::vector<Metrics>& all, const StragglerRule& rule) {
  std::ostringstream o;
  for (const auto& m : all) {
    const auto sum = summarize(m, rule);
    o << title_of(m) << "\n  metrics: " << m.source << "\n";
    char line[256];
    std::snprintf(line, sizeof line, "  %-12s %10s %10s %10s  %-28s %9s\n", "phase", "min s", "median s", "max s",
                  "slowest rank", "x median");
    o << line;
    std::vector<std::string> flagged;
    for (const auto& s : sum) {
      const RankRow* r = nullptr;
      for (const auto& row : m.ranks)
        if (row.rank == s.slowest_rank) r = &row;
      std::string who = s.slowest_rank < 0 ? "-" : std::to_string(s.slowest_rank);
      if (r && !r->coords.empty()) who += " (" + coords_str(*r) + ")";
      std::snprintf(line, sizeof line, "  %-12s %10s %10s %10s  %-28s %9s%s\n", s.phase.c_str(),
                    format_seconds(s.min_s).c_str(), format_seconds(s.median_s).c_str(),
                    format_seconds(s.max_s).c_str(), who.c_str(), ratio_str(s.ratio).c_str(),
                    s.straggler ? "  STRAGGLER" : "");
      o << line;
      if (s.straggler)
        flagged.push_back("rank " + std::to_string(s.slowest_rank) + " in " + s.phase + " (" +
                          format_seconds(s.max_s) + " s vs median " + format_seconds(s.median_s) + " s, " +
                          ratio_str(s.ratio) + ")");
    }
    const RankRow* slowest = nullptr;
    for (const auto& r : m.ranks)
      if (!slowest || r.total_s() > slowest->total_s()) slowest = &r;
    if (slowest)
      o << "  slowest rank overall: " << slowest->rank << " (" << format_seconds(slowest->total_s())
        << " s over all phases)\n";
    if (flagged.empty()) o << "  stragglers: none (rule: slowest >= " << fmt("%.2f", rule.ratio) << "x median and >= "
                           << format_seconds(rule.min_gap_s) << " s slower)\n";
    for (const auto& f : flagged) o << "  straggler: " << f << "\n";
    o << "\n";
  }
  return o.str();
}

std::string render_html(const std::vector<Metrics>& all, const StragglerRule& rule) {
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>h5ckpt report</title>\n"
       "<style>body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}"
       "th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}"
       "td.l,th.l{text-align:left}tr.straggler td{background:#fde0dd;font-weight:bold}"
       ".note{color:#666;font-size:90%}section{margin-bottom:2.5em}</style></head><body>\n"
       "<h1>h5ckpt report</h1>\n<p class=\"note\">Per-rank phase timings of each save/load. A phase's slowest "
       "rank is a <b>straggler</b> when it took at least "
    << fmt("%.2f", rule.ratio) << "&times; the median of all ranks and at least " << format_seconds(rule.min_gap_s)
    << " s more; its heat-map cell has a blue border.</p>\n";
  for (const auto& m : all) {
    const auto sum = summarize(m, rule);
    o << "<section class=\"op-" << esc(m.op) << "\">\n<h2>" << esc(title_of(m)) << "</h2>\n<p class=\"note\">metrics: "
      << esc(m.source) << "</p>\n";
    // Straggler summary first: the answer to "who is slow?".
    std::vector<std::string> flagged;
    for (const auto& s : sum)
      if (s.straggler)
        flagged.push_back("<li class=\"straggler\">rank " + std::to_string(s.slowest_rank) + " in <b>" + esc(s.phase) +
                          "</b>: " + format_seconds(s.max_s) + " s vs median " + format_seconds(s.median_s) + " s (" +
                          ratio_str(s.ratio) + ")</li>");
    o << "<h3>Stragglers</h3>\n";
    if (flagged.empty()) o << "<p>none</p>\n";
    else {
      o << "<ul>";
      for (const auto& f : flagged) o << f;
      o << "</ul>\n";
    }
    o << "<table class=\"summary\"><tr><th class=\"l\">phase</th><th>min s</th><th>median s</th><th>max s</th>"
         "<th>slowest rank</th><th>&times; median</th></tr>\n";
    for (const auto& s : sum)
      o << "<tr" << (s.straggler ? " class=\"straggler\"" : "") << "><td class=\"l\">" << esc(s.phase) << "</td><td>"
        << format_seconds(s.min_s) << "</td><td>" << format_seconds(s.median_s) << "</td><td>"
        << format_seconds(s.max_s) << "</td><td>" << s.slowest_rank << "</td><td>" << ratio_str(s.ratio)
        << "</td></tr>\n";
    o << "</table>\n<h3>Heat map: rank &times; phase (seconds)</h3>\n" << heat_map_svg(m, sum);
    // Per-rank breakdown.
    const auto bcols = byte_columns(m);
    o << "<h3>Per-rank breakdown</h3>\n<table class=\"ranks\"><tr><th>rank</th><th class=\"l\">coords</th>";
    for (const auto& p : m.phases) o << "<th>" << esc(p) << " s</th>";
    o << "<th>total s</th>";
    for (const auto& b : bcols) o << "<th>bytes " << esc(b) << "</th>";
    o << "</tr>\n";
    for (const auto& r : m.ranks) {
      o << "<tr><td>" << r.rank << "</td><td class=\"l\">" << esc(coords_str(r)) << "</td>";
      for (size_t p = 0; p < m.phases.size(); ++p) {
        const bool slow = sum[p].straggler && sum[p].slowest_rank == r.rank;
        o << "<td" << (slow ? " style=\"background:#fde0dd;font-weight:bold\"" : "") << ">"
          << (std::isfinite(r.phase_s[p]) ? format_seconds(r.phase_s[p]) : "–") << "</td>";
      }
      o << "<td>" << format_seconds(r.total_s()) << "</td>";
      for (const auto& b : bcols) {
        auto it = std::find_if(r.bytes.begin(), r.bytes.end(), [&](const auto& kv) { return kv.first == b; });
        if (it == r.bytes.end()) o << "<td>–</td>";
        else o << "<td title=\"" << it->second << " bytes\">" << human_bytes(it->second) << "</td>";
      }
      o << "</tr>\n";
    }
    o << "</table>\n</section>\n";
  }
  o << "</body></html>\n";
  return o.str();
}

}  // namespace h5ckpt::report
