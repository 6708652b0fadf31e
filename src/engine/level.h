// The storage level a Checkpointer saves to and loads from: the seam between the façade and the
// engine. Two exist, and no registry: the shared file system (save_prepare -> save_write ->
// save_commit, engine::load) and the node-local level with partner copies and persists
// (engine/local_level.h), which falls back to the shared level for loads it cannot serve.
//
// The façade picks one level when it is constructed; every save (synchronous or asynchronous),
// resolve and load then takes the same path through it:
//   save:  prepare_save (caller's thread, collective) -> a WriteSource -> save (caller's or the
//          async thread, collective over the communicators it is given)
//   load:  resolve -> load
// A new level (an object store, an in-memory partner level) implements these five calls.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "engine/local_level.h"

namespace h5ckpt::engine {

/// What a Checkpointer owns and every level uses. References: the Checkpointer outlives its level.
struct LevelContext {
  const Topology::Impl& comms;
  const CheckpointerOptions& options;
  StagingPool& pool;
  LoadPlanCache& load_cache;
  DeviceLink& device_link;
};

class Level {
 public:
  virtual ~Level() = default;

  /// "shared" or "local".
  virtual const char* name() const = 0;

  /// Phase 1 of a save, on the caller's thread (collective over the caller's communicators):
  /// save_prepare, plus whatever the level captures from the state while the caller still holds
  /// it (kept in the job).
  virtual Result<SaveJob> prepare_save(const StateDict& state, const std::string& path, const SaveOptions& options,
                                       const std::map<std::string, std::string>& attributes, PlanCache& cache) = 0;

  /// Bytes of the budget the level's save leases beside the staging pool (known after a
  /// prepare_save; 0 without memory_bytes): the pool is sized to leave them.
  virtual uint64_t save_buffer_bytes() const { return 0; }

  /// Everything after the prepare: the job's bytes from `source` (drained in every case) to the
  /// commit. Collective over `io` (the caller's communicators, or the async thread's duplicates).
  virtual Result<SaveReport> save(const Topology::Impl& io, SaveJob& job, WriteSource& source) = 0;

  /// Undoes a prepared job whose save never ran (the async start found a rank failed). Only the
  /// coordinator of `io` acts.
  virtual void abandon(const Topology::Impl& io, SaveJob& job) = 0;

  /// Which checkpoint a load of `path` reads (collective). With `with_info`, every rank also
  /// holds its metadata (for the caller's ResolvedCheckpoint).
  virtual Result<local::Resolution> resolve(const std::string& path, bool with_info) = 0;

  /// Loads `state` from a resolution this level made (collective).
  virtual Result<LoadReport> load(StateDict& state, const local::Resolution& res, const LoadOptions& options) = 0;
};

/// The level `ctx.options` asks for: node-local when local_dir is set, else shared.
std::unique_ptr<Level> make_level(const LevelContext& ctx);

/// The caller's buffers as a save's source: device pieces go through two halves of the pool
/// (bounded by staging_bytes and memory_bytes), after the trainer's queued device work on
/// `options.device_stream`. The same for every level and for synchronous saves. Under memory_bytes
/// the pool leaves `beside` bytes of the budget to the level (Level::save_buffer_bytes).
std::unique_ptr<WriteSource> caller_source(const Topology::Impl& topo, const SaveJob& job, const StateDict& state,
                                           const SaveOptions& options, const CheckpointerOptions& copts,
                                           StagingPool& pool, uint64_t beside = 0);

}  // namespace h5ckpt::engine
