// Runs save and load plans: the orchestration between planner, comm and storage.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/topology_impl.h"
#include "comm/transport.h"
#include "engine/staging_pool.h"
#include "h5ckpt/checkpointer.h"
#include "planner/save_planner.h"

namespace h5ckpt::engine {

using TensorPlans = std::shared_ptr<const std::vector<planner::TensorPlan>>;

/// The global save plan of the last save, reused while no rank's state structure changed.
struct PlanCache {
  uint64_t local_signature = 0;
  TensorPlans tensors;  ///< null: nothing cached
};

/// Checks one item's shard against its shape and that its buffer is usable (non-null; device
/// memory only where a device runtime is present).
Status check_item_buffer(const StateItem& item);

/// Hash of this rank's state structure (keys, dtypes, shapes, shards; not the data).
uint64_t structure_signature(const StateDict& state);

/// Part of a region this rank writes: a flat sub-range of the region's box, contiguous in
/// `data`. Pieces come in plan order (tensor, region, offset).
struct Piece {
  int tensor = -1;
  int region = -1;
  ShardSpec shard;
  const char* data = nullptr;
  uint64_t bytes = 0;
  bool region_end = false;  ///< last piece of its region (its checksum is complete)
  bool on_device = false;   ///< `data` is device memory: it must be staged before writing
};

/// This rank's pieces, pointing into the caller's buffers, each at most max_bytes.
std::vector<Piece> my_pieces(int rank, const std::vector<planner::TensorPlan>& tensors, const StateDict& state,
                             uint64_t max_bytes);

/// Where the writer gets its pieces: from the caller's buffers (sync) or the staging pool (async).
class PieceSource {
 public:
  virtual ~PieceSource() = default;
  /// The next piece, or nullopt when there are no more. May block (async: snapshot in progress).
  virtual std::optional<Piece> next() = 0;
  /// Called once the piece's bytes are no longer needed.
  virtual void done(const Piece&) {}
  /// A failure of the source itself (a device copy); the writer fails the save with it.
  virtual Status status() { return Status::Ok(); }
};

/// Device links that outlive one load: the device transport (NCCL), created collectively the
/// first time a load moves device bytes between ranks, and reused.
struct DeviceLink {
  std::unique_ptr<comm::Transport> transport;
  bool tried = false;  ///< creation was attempted (same on every rank)
};

/// Phase 1, collective over topo.world: local checks, then the global plan (from `cache` when
/// no rank's structure changed). Fills report.plan_s / plan_cached.
Result<TensorPlans> prepare_save(const Topology::Impl& topo, const StateDict& state, PlanCache& cache,
                                 SaveReport& report);

/// Phase 2, collective over comms.world: the coordinator makes a fresh temporary directory
/// next to `path` and every rank learns its name. `local` is this rank's outcome so far (a
/// failure anywhere fails every rank, and nothing is left behind); `flag`, when given, is
/// folded into the same agreement (minimum over the ranks).
Result<std::string> make_temp_dir(const Topology::Impl& comms, const std::string& path, const SaveOptions& options,
                                  const Status& local, int* flag);

/// Phases 3-4, collective over comms.world: HDF5 file and datasets in `temp`, the writes of
/// every piece from `source`, metadata and the atomic commit. Always drains `source`, even
/// after a failure. Every rank returns the same Status.
Result<SaveReport> write_and_commit(const Topology::Impl& comms, const std::vector<planner::TensorPlan>& tensors,
                                    const std::string& path, const std::string& temp, const SaveOptions& options,
                                    const CheckpointerOptions& copts,
                                    const std::map<std::string, std::string>& attributes, PieceSource& source,
                                    SaveReport report);

/// Phases 2-4: make_temp_dir, then write_and_commit.
Result<SaveReport> write_and_commit(const Topology::Impl& comms, const std::vector<planner::TensorPlan>& tensors,
                                    const std::string& path, const SaveOptions& options,
                                    const CheckpointerOptions& copts,
                                    const std::map<std::string, std::string>& attributes, PieceSource& source,
                                    SaveReport report);

/// Synchronous save: local cache check, make_temp_dir (its agreement also tells whether every
/// rank's structure is unchanged; if not, a collective re-plan), then write_and_commit straight
/// from the caller's host buffers; device buffers are staged through `pool` in two halves
/// (copy k+1 while writing k).
Result<SaveReport> save(const Topology::Impl& topo, const StateDict& state, const std::string& path,
                        const SaveOptions& options, const std::map<std::string, std::string>& attributes,
                        PlanCache& cache, const CheckpointerOptions& copts, StagingPool& pool);

/// What one rank does for one of its items in a load.
enum class Role : int32_t { kSkip = 0, kRead = 1, kReceive = 2 };
struct ItemRole {
  Role role = Role::kSkip;
  int32_t group = 0;             ///< orders messages; both sides walk groups in ascending order
  int32_t peer = -1;             ///< kReceive: the reader
  std::vector<int32_t> targets;  ///< kRead: ranks to send the bytes to
};

/// The validated metadata and this rank's load roles of the last load, reused while the
/// metadata bytes, the data file size and every rank's state structure are unchanged.
struct LoadPlanCache {
  uint64_t meta_hash = 0;
  uint64_t local_signature = 0;
  uint64_t data_size = 0;
  std::shared_ptr<const CheckpointInfo> info;  ///< null: nothing cached
  std::vector<ItemRole> roles;
  bool any_device = false;        ///< some rank loads into device memory
  bool device_transport = false;  ///< device replicas move over DeviceLink::transport
  bool aggregated = false;        ///< two-phase reads (LoadOptions::aggregate_reads) on every rank
};

/// Collective load over topo.world (see Checkpointer::load). Device items are read (or
/// received) into host staging from `pool`, then copied to the device while later items are read;
/// replicas of device items move over the device transport when every rank has one.
Result<LoadReport> load(const Topology::Impl& topo, StateDict& state, const std::string& path,
                        const LoadOptions& options, const CheckpointerOptions& copts, LoadPlanCache& cache,
                        StagingPool& pool, DeviceLink& link);

/// Writes the metrics file of a finished save/load when enabled (collective; never fails the op).
void record_metrics(const Topology::Impl& comms, const CheckpointerOptions& copts, const SaveReport& r);
void record_metrics(const Topology::Impl& comms, const CheckpointerOptions& copts, const LoadReport& r);

}  // namespace h5ckpt::engine
