// `h5ckpt report` parsing, statistics and rendering (src/tools/report_*.cpp) on tests/report/metrics.json: 4 ranks,
// phases plan/snapshot/write/commit, rank 2 deliberately slow in `write` (3.75 s vs ~1 s).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "tools/report_html.h"
#include "tools/report_model.h"
#include "tools/report_stats.h"
#include "tools/report_text.h"

namespace h5ckpt::report {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = hay.find(needle); pos != std::string::npos; pos = hay.find(needle, pos + 1)) ++n;
  return n;
}

// The fixture's values, written out again here (not read through the code under test).
const char* kPhases[] = {"plan", "snapshot", "write", "commit"};
const double kSeconds[4][4] = {
    {0.011, 0.204, 1.02, 0.052}, {0.013, 0.198, 0.98, 0.049}, {0.012, 0.201, 3.75, 0.05}, {0.012, 0.207, 1.0, 0.051}};
const uint64_t kWritten[4] = {268435456, 268435456, 134217728, 134217728};

std::string f3(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", v);
  return b;
}

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = load_metrics(H5CKPT_REPORT_FIXTURE);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    all_ = *m;
  }
  std::vector<Metrics> all_;
};

TEST_F(ReportTest, ParsesTheFixture) {
  ASSERT_EQ(all_.size(), 1u);
  const Metrics& m = all_[0];
  EXPECT_EQ(m.op, "save");
  EXPECT_EQ(m.world, 4);
  EXPECT_EQ(m.tp, 2);
  EXPECT_EQ(m.dp, 2);
  EXPECT_EQ(m.pp, 1);
  ASSERT_EQ(m.phases, std::vector<std::string>(std::begin(kPhases), std::end(kPhases)));
  ASSERT_EQ(m.ranks.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(m.ranks[r].rank, r);
    for (int p = 0; p < 4; ++p) EXPECT_DOUBLE_EQ(m.ranks[r].phase_s[p], kSeconds[r][p]);
  }
  EXPECT_EQ(m.ranks[2].coords, (std::vector<int>{0, 1, 0}));
}

TEST_F(ReportTest, StragglerIsRank2InWriteOnly) {
  const auto sum = summarize(all_[0]);
  ASSERT_EQ(sum.size(), 4u);
  for (int p = 0; p < 4; ++p) {
    SCOPED_TRACE(kPhases[p]);
    std::vector<double> v;
    for (int r = 0; r < 4; ++r) v.push_back(kSeconds[r][p]);
    std::sort(v.begin(), v.end());
    const double median = (v[1] + v[2]) / 2;  // 4 ranks: mean of the middle two
    EXPECT_NEAR(sum[p].median_s, median, 1e-12);
    EXPECT_DOUBLE_EQ(sum[p].max_s, v[3]);
    EXPECT_DOUBLE_EQ(sum[p].min_s, v[0]);
    EXPECT_EQ(sum[p].straggler, p == 2);  // plan differs by 2 ms only: below the gap, not flagged
  }
  EXPECT_EQ(sum[2].slowest_rank, 2);
  EXPECT_NEAR(sum[2].ratio, 3.75 / 1.01, 1e-12);
  EXPECT_EQ(sum[0].slowest_rank, 1);  // plan: 0.013 on rank 1
  // A stricter rule can flag nothing or, with no gap, the 18 % slower plan phase.
  EXPECT_FALSE(summarize(all_[0], {4.0, 0.01})[2].straggler);
  EXPECT_TRUE(summarize(all_[0], {1.05, 0.0})[0].straggler);
}

TEST_F(ReportTest, HtmlHasOneLabelledCellPerRankAndPhase) {
  const std::string html = render_html(all_);
  EXPECT_EQ(count(html, "<rect class=\"cell"), 16u);
  EXPECT_EQ(count(html, "<rect class=\"cell straggler\""), 1u);
  for (int r = 0; r < 4; ++r)
    for (int p = 0; p < 4; ++p) {
      SCOPED_TRACE(std::to_string(r) + " " + kPhases[p]);
      // The cell, its seconds, and its visible label (the next <text> after the rect).
      const std::string cell = "data-rank=\"" + std::to_string(r) + "\" data-phase=\"" + kPhases[p] + "\"";
      const size_t at = html.find(cell);
      ASSERT_NE(at, std::string::npos);
      const size_t label = html.find("<text class=\"cell-label\"", at);
      ASSERT_NE(label, std::string::npos);
      const size_t gt = html.find('>', label), end = html.find("</text>", label);
      EXPECT_EQ(html.substr(gt + 1, end - gt - 1), f3(kSeconds[r][p]));
      std::smatch sm;
      const std::string tail = html.substr(at, 200);
      ASSERT_TRUE(std::regex_search(tail, sm, std::regex("data-seconds=\"([0-9.]+)\"")));
      EXPECT_DOUBLE_EQ(std::stod(sm[1]), kSeconds[r][p]);
      if (r == 2 && p == 2) EXPECT_NE(html.rfind("<rect class=\"cell straggler\"", at), std::string::npos);
    }
  // The straggler is named in the summary; bytes appear exactly in the breakdown's titles.
  EXPECT_NE(html.find("rank 2 in <b>write</b>: 3.750 s vs median 1.010 s (3.71x)"), std::string::npos);
  for (uint64_t b : kWritten) EXPECT_NE(html.find("title=\"" + std::to_string(b) + " bytes\""), std::string::npos);
  EXPECT_NE(html.find("title=\"4096 bytes\">4.0 KiB<"), std::string::npos);
  // Self-contained: no scripts, no external resources (the SVG namespace URI is not a fetch).
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href="), std::string::npos);
  EXPECT_EQ(count(html, "http"), count(html, "xmlns=\"http://www.w3.org/2000/svg\""));
}

TEST_F(ReportTest, TextSummaryNamesTheStraggler) {
  const std::string text = render_text(all_);
  EXPECT_NE(text.find("straggler: rank 2 in write (3.750 s vs median 1.010 s, 3.71x)"), std::string::npos) << text;
  EXPECT_EQ(count(text, "STRAGGLER"), 1u) << text;
  EXPECT_NE(text.find("slowest rank overall: 2"), std::string::npos) << text;
}

TEST_F(ReportTest, CheckpointDirectoryFindsSaveAndLoadBesideIt) {
  const fs::path root = fs::temp_directory_path() / ("h5ckpt_test_report_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "step-00000010");
  std::ofstream(root / "latest") << "step-00000010";
  fs::copy_file(H5CKPT_REPORT_FIXTURE, root / "step-00000010.save.json");
  std::ofstream(root / "step-00000010.load.json")
      << R"({"op":"load","checkpoint":"x","world":2,"phase_order":["plan","read","exchange"],"ranks":[)"
         R"({"rank":1,"phases":{"plan":0.5,"read":2.0,"exchange":0.1},"bytes":{"read":10}},)"
         R"({"rank":0,"phases":{"plan":0.5,"read":2.5,"exchange":0.2},"bytes":{"read":20}}]})";
  for (const fs::path& p : {root, root / "step-00000010"}) {
    auto m = load_metrics(p.string());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    ASSERT_EQ(m->size(), 2u);
    EXPECT_EQ((*m)[0].op, "save");
    EXPECT_EQ((*m)[1].op, "load");
    EXPECT_EQ((*m)[1].ranks[0].rank, 0);  // sorted by rank
    EXPECT_DOUBLE_EQ((*m)[1].ranks[0].phase_s[1], 2.5);
    const std::string html = render_html(*m);
    EXPECT_EQ(count(html, "<rect class=\"cell"), 16u + 6u);
  }
  auto none = load_metrics(root.string(), (root / "elsewhere").string());
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("elsewhere/step-00000010.save.json"), std::string::npos);
  fs::remove_all(root);
}

TEST(ReportParse, ErrorsNameTheFileAndField) {
  const std::pair<const char*, const char*> cases[] = {
      {"{", "not valid JSON"},
      {R"({"op":"save","ranks":[]})", "non-empty array"},
      {R"({"ranks":[{"rank":0}]})", "missing \"op\""},
      {R"({"op":"save","ranks":[{"rank":0,"phases":{"write":-1}}]})", "rank 0 phase \"write\""},
      {R"({"op":"save","ranks":[{"rank":0,"phases":{"write":"slow"}}]})", "rank 0 phase \"write\""},
      {R"({"op":"save","ranks":[{"rank":3},{"rank":3}]})", "rank 3 appears twice"},
      {R"({"op":"save","ranks":[{"rank":0,"bytes":{"read":-5}}]})", "rank 0 bytes \"read\""},
  };
  for (const auto& [text, why] : cases) {
    auto r = parse_metrics(text, "m.json");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find("m.json"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace h5ckpt::report
