// Per-rank phase timings and byte counts of one save or load, gathered into one JSON file.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/topology_impl.h"
#include "h5ckpt/options.h"
#include "h5ckpt/state.h"
#include "h5ckpt/topology.h"

namespace h5ckpt::metrics {

/// Phase timings (seconds) and byte counts of this rank, in display order.
struct RankMetrics {
  std::vector<std::pair<std::string, double>> phases;
  std::vector<std::pair<std::string, uint64_t>> bytes;
};

RankMetrics from_report(const SaveReport& r);
RankMetrics from_report(const LoadReport& r);

/// Where the metrics of `op` ("save"/"load") on checkpoint `ckpt_dir` go: `dir`/<name>.<op>.json,
/// or beside the checkpoint when `dir` is empty (h5ckpt/metrics_schema.h, shared with readers).
std::string metrics_path(const std::string& ckpt_dir, const std::string& op, const std::string& dir);

/// Gathers every rank's metrics to the coordinator, which writes one JSON document with the keys
/// of h5ckpt/metrics_schema.h: {"op", "checkpoint", "world", "topology", "phase_order",
/// "ranks": [{"rank", "coords", "phases", "bytes"}]}.
/// Collective over comms.world; a failure to write is returned but must not fail the save/load.
Status write_metrics(const Topology::Impl& comms, const std::string& op, const std::string& ckpt_dir,
                     const std::string& out_path, const RankMetrics& mine);

}  // namespace h5ckpt::metrics
