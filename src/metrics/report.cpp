#include "metrics/report.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "h5ckpt/metrics_schema.h"
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
  return metrics_schema::metrics_path(ckpt_dir, op, dir);
}

Status write_metrics(const Topology::Impl& comms, const std::string& op, const std::string& ckpt_dir,
                     const std::string& out_path, const RankMetrics& mine) {
  namespace key = metrics_schema;
  json j;
  for (const auto& [k, v] : mine.phases) j[key::kPhases][k] = v;
  for (const auto& [k, v] : mine.bytes) j[key::kBytes][k] = v;
  H5CKPT_ASSIGN_OR_RETURN(auto all, comms.gather(j.dump()));
  if (comms.world.rank() != comms.coordinator) return Status::Ok();
  json doc;
  doc[key::kOp] = op;
  doc[key::kCheckpoint] = ckpt_dir;
  doc[key::kWorld] = comms.world.size();
  doc[key::kTopology] = {{key::kTp, comms.sizes.tp}, {key::kDp, comms.sizes.dp}, {key::kPp, comms.sizes.pp}};
  doc[key::kPhaseOrder] = json::array();
  for (const auto& [k, v] : mine.phases) doc[key::kPhaseOrder].push_back(k);
  json ranks = json::array();
  for (size_t r = 0; r < all.size(); ++r) {
    json e = json::parse(all[r], nullptr, false);
    if (e.is_discarded()) e = json::object();
    e[key::kRank] = r;
    const auto& c = comms.all_coords[r];
    e[key::kCoords] = {c.tp, c.dp, c.pp};
    ranks.push_back(std::move(e));
  }
  doc[key::kRanks] = std::move(ranks);
  std::error_code ec;
  fs::create_directories(fs::path(out_path).parent_path(), ec);
  return storage::write_file_atomic(out_path, doc.dump(1));
}

}  // namespace h5ckpt::metrics
