// Runs save and load plans: the orchestration between planner, comm and storage.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "comm/topology_impl.h"
#include "h5ckpt/checkpointer.h"
#include "planner/save_planner.h"

namespace h5ckpt::engine {

/// The global save plan of the last save, reused while no rank's state structure changed.
struct PlanCache {
  bool valid = false;
  uint64_t local_signature = 0;
  std::vector<planner::TensorPlan> tensors;
};

/// Hash of this rank's state structure (keys, dtypes, shapes, shards; not the data).
uint64_t structure_signature(const StateDict& state);

/// Collective save over topo.world (see Checkpointer::save).
Result<SaveReport> save(const Topology::Impl& topo, const StateDict& state, const std::string& path,
                        const SaveOptions& options, const std::map<std::string, std::string>& attributes,
                        PlanCache& cache);

/// Collective load over topo.world (see Checkpointer::load).
Result<LoadReport> load(const Topology::Impl& topo, StateDict& state, const std::string& path,
                        const LoadOptions& options);

}  // namespace h5ckpt::engine
