#include "metrics/report.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "storage/commit.h"

namespace h5ckpt::metrics {

namespace fs = std::filesystem;
using nlohmann::json;

RankMetrics from_report(const SaveReport& r) {
  RankMetrics m;
  m.phases = {{"plan", r.plan_s}, {"snapshot", r.snapshot_s}, {"write", r.write_s}, {"commit", r.commit_s}};
  m.bytes = {{"written", r.bytes_written}, {"blocked", r.blocked_bytes}};
  return m;
}

RankMetrics from_report(const LoadReport& r) {
  RankMetrics m;
  m.phases = {{"plan", r.plan_s}, {"read", r.read_s}, {"exchange", r.exchange_s}};
  m.bytes = {{"read", r.bytes_read}, {"sent", r.bytes_sent}, {"received", r.bytes_received}};
  return m;
}

std::string metrics_path(const std::string& ckpt_dir, const std::string& op, const std::string& dir) {
  fs::path p = fs::path(ckpt_dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  const std::string name = p.filename().string() + "." + op + ".json";
  return (dir.empty() ? p.parent_path() / name : fs::path(dir) / name).string();
}

Status write_metrics(const Topology::Impl& comms, const std::string& op, const std::string& ckpt_dir,
                     const std::string& out_path, const RankMetrics& mine) {
  json j;
  for (const auto& [k, v] : mine.phases) j["phases"][k] = v;
  for (const auto& [k, v] : mine.bytes) j["bytes"][k] = v;
  H5CKPT_ASSIGN_OR_RETURN(auto all, comms.tree_gather(j.dump()));
  if (comms.world.rank() != comms.coordinator) return Status::Ok();
  json doc;
  doc["op"] = op;
  doc["checkpoint"] = ckpt_dir;
  doc["world"] = comms.world.size();
  doc["topology"] = {{"tp", comms.sizes.tp}, {"dp", comms.sizes.dp}, {"pp", comms.sizes.pp}};
  doc["phase_order"] = json::array();
  for (const auto& [k, v] : mine.phases) doc["phase_order"].push_back(k);
  json ranks = json::array();
  for (size_t r = 0; r < all.size(); ++r) {
    json e = json::parse(all[r], nullptr, false);
    if (e.is_discarded()) e = json::object();
    e["rank"] = r;
    const auto& c = comms.all_coords[r];
    e["coords"] = {c.tp, c.dp, c.pp};
    ranks.push_back(std::move(e));
  }
  doc["ranks"] = std::move(ranks);
  std::error_code ec;
  fs::create_directories(fs::path(out_path).parent_path(), ec);
  return storage::write_file_atomic(out_path, doc.dump(1));
}

}  // namespace h5ckpt::metrics
