// Runs save and load plans: the orchestration between planner, comm and storage.
//
// Every operation is a short sequence of named phases, each ending in exactly one agreement
// (comm::agree), so every rank follows the same sequence of collectives and returns the same
// Status:
//   save = save_prepare -> (a WriteSource: the caller's buffers, or the async snapshot)
//          -> save_write -> save_commit
//   load = resolve_metadata -> plan_reads -> [verify_regions] -> execute_reads
// Synchronous and asynchronous saves share every phase; async only runs write and commit on a
// background thread with its own communicators.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/topology_impl.h"
#include "comm/transport.h"
#include "engine/memory_budget.h"
#include "engine/staging_pool.h"
#include "engine/wire.h"
#include "h5ckpt/options.h"
#include "h5ckpt/state.h"
#include "h5ckpt/topology.h"
#include "planner/load_contract.h"
#include "planner/load_planner.h"
#include "planner/save_planner.h"

namespace h5ckpt::engine {

using TensorPlans = std::shared_ptr<const std::vector<planner::TensorPlan>>;

/// The global save plan of the last save, reused while no rank's state structure changed.
struct PlanCache {
  uint64_t local_signature = 0;
  TensorPlans tensors;  ///< null: nothing cached
};

/// Checks one item's shard against its shape and that its buffer is usable (non-null; device
/// memory only where a device runtime is present); a multi-piece item's pieces each so, and
/// disjoint in the tensor and in the buffer (engine/pieces.h).
Status check_item_buffer(const StateItem& item);

/// Hash of this rank's state structure (keys, dtypes, shapes, shards; not the data).
uint64_t structure_signature(const StateDict& state);

/// True when some item's buffer is device memory (a pointer query per item).
bool has_device_items(const StateDict& state);

/// The planner's view of a rank's items: one description per item, or per piece of a multi-piece
/// item (later pieces marked `continues`, each pointing back at the item and its buffer offset).
std::vector<planner::ItemDesc> describe_items(const StateDict& state);

// ---------------------------------------------------------------------------------------------
// Save

/// A planned write whose bytes are ready: in the caller's buffer, or a staging copy.
struct SourcedWrite {
  const planner::WriteItem* write = nullptr;
  const char* data = nullptr;
  bool on_device = false;  ///< `data` is device memory (never handed to the writer)
};

/// Where the write phase gets its bytes, in plan order.
class WriteSource {
 public:
  virtual ~WriteSource() = default;
  /// The next write, or nullopt when there are no more. May block (async: snapshot in progress).
  virtual std::optional<SourcedWrite> next() = 0;
  /// Called once the write's bytes are no longer needed.
  virtual void done(const SourcedWrite&) {}
  /// A failure of the source itself (a device copy); the writer fails the save with it.
  virtual Status status() { return Status::Ok(); }
  /// Every write's bytes stay where next() put them, unchanged, until the write phase ends (not
  /// only until done()): the condition for sending them to an aggregating rank later.
  virtual bool stable() const { return false; }
};

/// One save from prepare to commit: fixed by save_prepare, filled in by the later phases.
struct SaveJob {
  TensorPlans plan;
  std::string path;  ///< the checkpoint directory to commit (normalized)
  std::string temp;  ///< its temporary sibling, made by the coordinator
  SaveOptions options;
  std::map<std::string, std::string> attributes;
  SaveReport report;
  double t0 = 0;  ///< when the save was called (total_s is wall time from here to the commit)
  // Written by save_write, read by save_commit.
  std::vector<int64_t> offsets;                 ///< file offset of every dataset
  std::vector<wire::RegionChecksum> checksums;  ///< of the regions this rank wrote
  std::shared_ptr<void> level_state;            ///< what the level (engine/level.h) captured at prepare
  /// Called by the level once `source` is drained, before the commit records the report (an
  /// async save adds its snapshot's figures).
  std::function<void(SaveReport&)> before_commit;
};

/// Phase 1, collective: local checks; the coordinator makes the temporary directory (refusing an
/// existing checkpoint without overwrite) in an agreement that also tells whether every rank's
/// structure is the cached one; if not, the global plan is made again (gather, plan, broadcast).
/// With `shared_dir` false (a node-local save) no directory is made and no lock taken.
Result<SaveJob> save_prepare(const Topology::Impl& topo, const StateDict& state, const std::string& path,
                             const SaveOptions& options, const std::map<std::string, std::string>& attributes,
                             PlanCache& cache, bool shared_dir = true);

/// The shared-level half of save_prepare for a job planned without it (a persist of a local
/// save): the coordinator takes the save lock and makes the temporary directory. Collective.
Status prepare_shared_dir(const Topology::Impl& topo, SaveJob& job);

/// This rank's writes in `job`, each at most `max_bytes`.
Result<std::vector<planner::WriteItem>> plan_my_writes(int rank, const SaveJob& job, const StateDict& state,
                                                       uint64_t max_bytes);

/// The writes straight from the caller's buffers; with `half_bytes`, device pieces are copied
/// into two halves of `pool` (the copy of the next one runs while this one is written). A failed
/// `writes` fails the write phase it feeds. The source owns the writes.
std::unique_ptr<WriteSource> caller_buffer_source(Result<std::vector<planner::WriteItem>> writes,
                                                  const StateDict& state, StagingPool& pool, uint64_t half_bytes);

/// Phase 2, collective over comms.world: the HDF5 file and its datasets, every write from
/// `source` (checksummed as it streams), fsync. Short runs go through aggregated writes
/// (SaveOptions::aggregate_writes) when every rank's source is stable and its two windows fit
/// `budget` (leased there while in use; null: no budget). Always drains `source`; on failure
/// removes the temporary directory.
Status save_write(const Topology::Impl& comms, SaveJob& job, const CheckpointerOptions& copts, WriteSource& source,
                  MemoryBudget* budget = nullptr);

/// wire::bcast_outcome from the coordinator through the node leaders. Collective.
inline Result<std::string> bcast_outcome(const Result<std::string>& on_root, const Topology::Impl& topo) {
  std::string msg;
  if (topo.world.rank() == topo.coordinator) msg = wire::encode_outcome(on_root);
  H5CKPT_RETURN_IF_ERROR(topo.bcast(msg));
  return wire::decode_outcome(msg);
}

/// Phase 3, collective over comms.world: checksums to the coordinator, which assembles the
/// metadata and commits it in one storage call; the report is recorded and returned.
Result<SaveReport> save_commit(const Topology::Impl& comms, SaveJob& job, const CheckpointerOptions& copts);

// ---------------------------------------------------------------------------------------------
// Load

/// Device links that outlive one load: the device transport (NCCL), created collectively the
/// first time a load moves device bytes between ranks, and reused.
struct DeviceLink {
  std::unique_ptr<comm::Transport> transport;
  bool tried = false;  ///< creation was attempted (same on every rank)
};

/// The metadata of the tensors this rank loads (format v2; all of them with verify_checksums or
/// for format v1) and this rank's load plan of the last load, reused while the bytes of
/// metadata.json (a v2 summary holds its tables' checksums), the data file size, every rank's
/// requests and the options are unchanged.
struct LoadPlanCache {
  uint64_t meta_hash = 0;
  uint64_t request_hash = 0;
  uint64_t data_identity = 0;                  ///< RegionReader::identity() of the data file
  std::shared_ptr<const CheckpointInfo> info;  ///< null: nothing cached
  planner::RankLoadPlan plan;
  bool any_device = false;        ///< some rank loads into device memory
  bool device_transport = false;  ///< device replicas move over DeviceLink::transport
  bool aggregated = false;        ///< two-phase reads (LoadOptions::aggregate_reads) on every rank
  // The load contract (planner/load_contract.h) of the cached request.
  planner::LoadContract contract;       ///< merged over the ranks: the same on every rank
  planner::LoadContract contract_mine;  ///< this rank's problems (sent again when another rank replans)
  std::shared_ptr<const std::vector<std::string>> ckpt_keys;  ///< every key of the checkpoint, sorted
  std::vector<unsigned char> requested;                       ///< bitmap over ckpt_keys: the keys this rank loads
  std::vector<char> skips;                                    ///< per item: not in the checkpoint
};

/// Collective load over topo.world (see Checkpointer::load). Device items are read (or
/// received) into host staging from `pool`, then copied to the device while later items are read;
/// replicas of device items move over the device transport when every rank has one.
Result<LoadReport> load(const Topology::Impl& topo, StateDict& state, const std::string& path,
                        const LoadOptions& options, const CheckpointerOptions& copts, LoadPlanCache& cache,
                        StagingPool& pool, DeviceLink& link);

/// Writes the metrics file of a committed save when enabled (collective; never fails the save).
/// Called by save_commit only; a load records its own at its end.
void record_metrics(const Topology::Impl& comms, const CheckpointerOptions& copts, const SaveReport& r);

}  // namespace h5ckpt::engine
