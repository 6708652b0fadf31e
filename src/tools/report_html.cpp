#include "tools/report_html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "tools/report_format.h"

namespace h5ckpt::report {

namespace {

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
        << esc(m.phases[p]) << "\" data-seconds=\"" << (have ? fmt("%.9g", v) : "") << "\" x=\"" << x + 1 << "\" y=\""
        << y + 1 << "\" width=\"" << cell_w - 2 << "\" height=\"" << cell_h - 2 << "\" fill=\""
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
    o << "<section class=\"op-" << esc(m.op) << "\">\n<h2>" << esc(title_of(m))
      << "</h2>\n<p class=\"note\">metrics: " << esc(m.source) << "</p>\n";
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
