// The two storage levels behind engine/level.h: thin adapters over the phases in save_engine.cpp,
// load_engine.cpp and local_level.cpp, so that the façade has one path per operation.
#include <algorithm>
#include <filesystem>

#include "device/staging.h"
#include "engine/level.h"
#include "engine/replica_stream.h"
#include "logging/log.h"
#include "storage/commit.h"
#include "storage/local_store.h"

namespace h5ckpt::engine {

std::unique_ptr<WriteSource> caller_source(const Topology::Impl& topo, const SaveJob& job, const StateDict& state,
                                           const SaveOptions& options, const CheckpointerOptions& copts,
                                           StagingPool& pool, uint64_t beside) {
  const bool any_device = has_device_items(state);
  // Device pieces are bounded by half the pool (or kDeviceHalfBytes when the pool is unbounded).
  constexpr uint64_t kDeviceHalfBytes = 64ull << 20;
  uint64_t bound = copts.staging_bytes ? copts.staging_bytes / 2 : kDeviceHalfBytes;
  if (copts.memory_bytes) {  // both halves fit the budget, beside the level's own buffers
    const uint64_t for_pool = copts.memory_bytes - std::min(beside, copts.memory_bytes);
    bound = std::min<uint64_t>(bound, for_pool / 2);
    if (beside) pool.shrink_to(for_pool);  // a pool a load grew would leave the level no room
  }
  const uint64_t half = any_device ? std::max<uint64_t>(1, std::min<uint64_t>(copts.max_piece_bytes, bound)) : 0;
  auto writes = plan_my_writes(topo.world.rank(), job, state, half ? half : copts.max_piece_bytes);
  // The snapshot must see the state as it is once the trainer's queued device work is done.
  if (Status ordered = any_device ? device::staging().order_after(options.device_stream) : Status::Ok(); !ordered.ok())
    writes = ordered.with_context("waiting for the device before the snapshot");
  return caller_buffer_source(std::move(writes), state, pool, half);
}

namespace {

// The shared file system: one HDF5 file per checkpoint, committed by rename under the save lock.
class SharedLevel final : public Level {
 public:
  explicit SharedLevel(const LevelContext& ctx) : ctx_(ctx) {}
  const char* name() const override { return "shared"; }

  Result<SaveJob> prepare_save(const StateDict& state, const std::string& path, const SaveOptions& options,
                               const std::map<std::string, std::string>& attributes, PlanCache& cache) override {
    return save_prepare(ctx_.comms, state, path, options, attributes, cache, true);
  }

  Result<SaveReport> save(const Topology::Impl& io, SaveJob& job, WriteSource& source) override {
    H5CKPT_RETURN_IF_ERROR(save_write(io, job, ctx_.options, source, ctx_.pool.budget()));
    if (job.before_commit) job.before_commit(job.report);
    return save_commit(io, job, ctx_.options);
  }

  void abandon(const Topology::Impl& io, SaveJob& job) override {
    if (io.world.rank() != io.coordinator) return;
    (void)storage::remove_tree(job.temp);
    storage::release_save_lock(job.path);  // held since save_prepare
  }

  Result<local::Resolution> resolve(const std::string& path, bool with_info) override {
    local::Resolution res;
    res.load_path = path;  // the load selects within it again, with its fail-closed fallback
    res.requested = path;
    res.info.path = path;
    res.reason = "shared checkpoint '" + path + "' (no local level configured)";
    if (!with_info) return res;
    auto info = read_checkpoint_info(path);
    // Every rank reads; they agree so that every rank returns the same outcome.
    H5CKPT_RETURN_IF_ERROR(comm::agree(info.status(), ctx_.comms.world.get()).with_context("resolve '" + path + "'"));
    res.info = std::move(info).value();
    res.reason = "shared checkpoint '" + res.info.path + "' (no local level configured)";
    return res;
  }

  Result<LoadReport> load(StateDict& state, const local::Resolution& res, const LoadOptions& options) override {
    return engine::load(ctx_.comms, state, res.load_path, options, ctx_.options, ctx_.load_cache, ctx_.pool,
                        ctx_.device_link);
  }

 private:
  LevelContext ctx_;
};

// Node-local storage with partner copies, persisted to the shared level every persist_every-th
// save; loads read whichever level holds the newest servable checkpoint.
class LocalLevel final : public Level {
 public:
  explicit LocalLevel(const LevelContext& ctx) : ctx_(ctx), shared_(ctx) {}
  const char* name() const override { return "local"; }

  Result<SaveJob> prepare_save(const StateDict& state, const std::string& path, const SaveOptions& options,
                               const std::map<std::string, std::string>& attributes, PlanCache& cache) override {
    H5CKPT_RETURN_IF_ERROR(ensure_nodes());
    const bool persist = local::should_persist(options, ctx_.options, ++saves_);
    H5CKPT_ASSIGN_OR_RETURN(SaveJob job, save_prepare(ctx_.comms, state, path, options, attributes, cache, false));
    auto l = std::make_shared<local::LocalSave>();
    l->nodes = nodes_;
    l->dir = storage::expand_local_dir(ctx_.options.local_dir, nodes_->my_node);
    l->name = std::filesystem::path(job.path).filename().string();
    l->persist = persist;
    l->check_private = true;  // every save: two agreements, and a disk mounted late is caught too
    l->window = &window_;
    l->budget = ctx_.pool.budget();
    if (ctx_.options.memory_bytes) {  // the pool is then sized to leave the window its share
      const int me = ctx_.comms.world.rank(), k = ctx_.options.local_replicas;
      const uint64_t most = local::replica_chunk_bytes(*nodes_, k, ctx_.options.memory_bytes);
      window_bytes_ = local::ReplicaWindow::bytes_for(
          most, std::vector<uint64_t>(local::replica_origins(*nodes_, me, k).size(), most));
    }
    auto w = plan_my_writes(ctx_.comms.world.rank(), job, state, local::kPersistPiece);
    if (w.ok()) {  // a failure shows in the local write first
      for (const auto& x : *w) l->my_bytes += x.bytes;
      if (persist) l->persist_writes = std::move(w).value();
    }
    job.level_state = std::move(l);
    return job;
  }

  uint64_t save_buffer_bytes() const override { return window_bytes_; }

  Result<SaveReport> save(const Topology::Impl& io, SaveJob& job, WriteSource& source) override {
    auto* l = static_cast<local::LocalSave*>(job.level_state.get());
    if (!l) return Status(ErrorCode::kInternal, "a local save without its prepared state");
    auto report = local::save_local(io, job, ctx_.options, *l, source);
    // Under a budget the window goes back after each save, for the loads; without one it stays
    // allocated and touched (a fresh one costs its page faults on every save).
    if (ctx_.options.memory_bytes) window_.release();
    return report;
  }

  void abandon(const Topology::Impl&, SaveJob&) override {}  // nothing made before the local write

  Result<local::Resolution> resolve(const std::string& path, bool with_info) override {
    H5CKPT_RETURN_IF_ERROR(ensure_nodes());
    H5CKPT_ASSIGN_OR_RETURN(local::Resolution res, local::resolve(ctx_.comms, path, ctx_.options, *nodes_, with_info));
    res.requested = path;
    return res;
  }

  Result<LoadReport> load(StateDict& state, const local::Resolution& res, const LoadOptions& options) override {
    if (!res.local) return shared_.load(state, res, options);
    // The same on every rank (the resolution is collective), so is this refusal.
    if (options.check_only)
      return Status(ErrorCode::kInvalidArgument,
                    "check_only checks loads from the shared level only; this load "
                    "would read the node-local checkpoint '" +
                        res.dir + "'")
          .with_context("load '" + res.requested + "'");
    // A file that fails a block check while it is served is moved aside on every rank's word;
    // resolving again then serves it from another copy, or reads another level.
    bool retry = false;
    auto rep = local::load_local(ctx_.comms, state, res, options, ctx_.pool, &retry);
    for (int again = 0; !rep.ok() && retry && again < kCorruptRetries; ++again) {
      logging::log().warn("load of '{}': {}; resolving again", res.requested, rep.status().to_string());
      auto next = resolve(res.requested, false);
      if (!next.ok()) return next.status();
      if (!next->local) return shared_.load(state, *next, options);
      rep = local::load_local(ctx_.comms, state, *next, options, ctx_.pool, &retry);
    }
    return rep;
  }

 private:
  Status ensure_nodes() {  // collective, on the caller's thread only (never beside the async thread)
    if (nodes_) return Status::Ok();
    H5CKPT_ASSIGN_OR_RETURN(nodes_, local::make_node_map(ctx_.comms));
    return Status::Ok();
  }
  static constexpr int kCorruptRetries = 3;
  LevelContext ctx_;
  SharedLevel shared_;  // loads of shared checkpoints, and persists' commits go through save_commit
  std::shared_ptr<const local::NodeMap> nodes_;  // made by the first local save or load
  int64_t saves_ = 0;                            // for persist_every
  local::ReplicaWindow window_;                  // the partner copies' buffers (engine/replica_stream.h)
  uint64_t window_bytes_ = 0;                    // its share of memory_bytes (0 when unbounded)
};

}  // namespace

std::unique_ptr<Level> make_level(const LevelContext& ctx) {
  if (ctx.options.local_dir.empty()) return std::make_unique<SharedLevel>(ctx);
  return std::make_unique<LocalLevel>(ctx);
}

}  // namespace h5ckpt::engine
