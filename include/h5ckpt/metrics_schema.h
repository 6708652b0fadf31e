// The per-operation metrics file a Checkpointer writes (CheckpointerOptions::metrics): its name
// and its JSON keys. The library's writer and readers such as `h5ckpt report` share this one
// definition. Header-only: names and keys, no code to link.
//
//   {"op": "save", "checkpoint": DIR, "world": N, "topology": {"tp", "dp", "pp"},
//    "phase_order": [NAME, ...],
//    "ranks": [{"rank": R, "coords": [tp, dp, pp], "phases": {NAME: seconds}, "bytes": {NAME: n}}]}
#pragma once

#include <filesystem>
#include <string>

namespace h5ckpt::metrics_schema {

// Document keys.
inline constexpr const char* kOp = "op";                  ///< kOpSave or kOpLoad
inline constexpr const char* kCheckpoint = "checkpoint";  ///< checkpoint directory
inline constexpr const char* kWorld = "world";            ///< number of ranks
inline constexpr const char* kTopology = "topology";      ///< object of kTp, kDp, kPp
inline constexpr const char* kTp = "tp";
inline constexpr const char* kDp = "dp";
inline constexpr const char* kPp = "pp";
inline constexpr const char* kPhaseOrder = "phase_order";  ///< phase names in display order
inline constexpr const char* kRanks = "ranks";             ///< one object per rank

// Keys of one rank's object.
inline constexpr const char* kRank = "rank";
inline constexpr const char* kCoords = "coords";  ///< [tp, dp, pp]
inline constexpr const char* kPhases = "phases";  ///< phase name -> seconds
inline constexpr const char* kBytes = "bytes";    ///< counter name -> bytes

// Values of kOp.
inline constexpr const char* kOpSave = "save";
inline constexpr const char* kOpLoad = "load";

/// File name of the metrics of `op` on checkpoint directory `ckpt_dir`: "<checkpoint>.<op>.json".
inline std::string metrics_file_name(const std::string& ckpt_dir, const std::string& op) {
  std::filesystem::path p = std::filesystem::path(ckpt_dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "dir/step-10/"
  return p.filename().string() + "." + op + ".json";
}

/// Where those metrics are: in `dir` when it is not empty (CheckpointerOptions::metrics_dir),
/// else beside the checkpoint directory.
inline std::string metrics_path(const std::string& ckpt_dir, const std::string& op, const std::string& dir) {
  std::filesystem::path p = std::filesystem::path(ckpt_dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  const std::string name = metrics_file_name(ckpt_dir, op);
  return (dir.empty() ? p.parent_path() / name : std::filesystem::path(dir) / name).string();
}

}  // namespace h5ckpt::metrics_schema
