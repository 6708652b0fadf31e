#include "h5ckpt/checkpointer.h"

#include <filesystem>
#include <mutex>
#include <optional>

#include "api/handle_access.h"
#include "comm/deadline.h"
#include "comm/topology_impl.h"
#include "device/staging.h"
#include "engine/async_saver.h"
#include "engine/engine.h"
#include "engine/local_level.h"
#include "engine/memory_budget.h"
#include "storage/auth.h"
#include "storage/local_store.h"
#include "metrics/log.h"

namespace h5ckpt {

struct Checkpointer::Impl {
  Impl(const Topology& t, const CheckpointerOptions& o)
      : topology(&t), options(o), budget(o.memory_bytes), async(detail::TopologyAccess::of(t), o, pool) {
    pool.set_budget(&budget);
  }
  Topology::Impl& comms() const { return detail::TopologyAccess::of(*topology); }
  const Topology* topology;
  CheckpointerOptions options;
  engine::PlanCache plan_cache;
  engine::LoadPlanCache load_cache;
  std::map<std::string, std::string> attributes;
  Status auth;  // loading auth_key_file, agreed at each save and load
  engine::MemoryBudget budget;  // before `pool`, whose capacity is leased from it
  engine::StagingPool pool;  // declared before `async`, which uses it until it is destroyed
  engine::DeviceLink device_link;
  engine::AsyncSaver async;
  // Multi-level checkpoints (local_dir).
  std::shared_ptr<const engine::local::NodeMap> nodes;  // made by the first local save or load
  int64_t local_saves = 0;
  std::string resolved_for;  // the path of `resolved`, until the next save
  std::optional<engine::local::Resolution> resolved;

  bool local() const { return !options.local_dir.empty(); }
  Status ensure_nodes() {
    if (nodes) return Status::Ok();
    H5CKPT_ASSIGN_OR_RETURN(nodes, engine::local::make_node_map(comms()));
    return Status::Ok();
  }
  /// The local part of a save of `state` once its job is prepared.
  engine::local::LocalSave local_save(const engine::SaveJob& job, const StateDict& state, bool persist) {
    engine::local::LocalSave l;
    l.nodes = nodes;
    l.dir = storage::expand_local_dir(options.local_dir, nodes->my_node);
    l.name = std::filesystem::path(job.path).filename().string();
    l.persist = persist;
    l.check_private = true;  // every save: two agreements, and a disk mounted late is caught too
    auto w = engine::plan_my_writes(comms().world.rank(), job, state, engine::local::kPersistPiece);
    if (w.ok()) {  // a failure shows in the local write first
      for (const auto& x : *w) l.my_bytes += x.bytes;
      if (persist) l.persist_writes = std::move(w).value();
    }
    return l;
  }
};

Checkpointer::Checkpointer(const Topology& topology, const CheckpointerOptions& options)
    : impl_(std::make_unique<Impl>(topology, options)) {
  comm::set_timeout(options.timeout_s);  // process-wide: the byte collectives read it (comm/deadline.h)
  if (!options.auth_key_file.empty()) impl_->auth = storage::auth::configure(options.auth_key_file);
}

namespace {
// With a key file: every rank loaded one, and the same (a rank signing with another key would
// write blocks no reader accepts). Collective; without a key file nothing is exchanged.
Status agree_on_key(const CheckpointerOptions& options, const Status& loaded, MPI_Comm world) {
  if (options.auth_key_file.empty()) return Status::Ok();
  Status local = loaded.ok() && !storage::auth::enabled()
                     ? Status(ErrorCode::kInvalidArgument, "the key was turned off after this Checkpointer set it")
                     : loaded;
  const std::string id = storage::auth::key_id();
  int flags[2] = {0, 0};
  if (local.ok() && id.size() >= 7) {
    flags[0] = static_cast<int>(std::stoul(id.substr(0, 7), nullptr, 16));
    flags[1] = -flags[0];
  }
  H5CKPT_RETURN_IF_ERROR(comm::agree(local, world, flags, 2));
  if (flags[0] != -flags[1])
    return Status(ErrorCode::kInvalidArgument, "auth_key_file '" + options.auth_key_file +
                                                   "' holds different keys on different ranks");
  return Status::Ok();
}
}  // namespace
Checkpointer::~Checkpointer() = default;

void Checkpointer::wait_pending() {
  // Keep the finished save's state reachable from its handle; only the thread is joined here.
  if (auto st = impl_->async.finish_pending()) {
    std::unique_lock<std::mutex> lock(st->mu);
    st->cv.wait(lock, [&] { return st->done; });
  }
}

void Checkpointer::touch_staging() {
  wait_pending();
  impl_->pool.touch();
}

uint64_t Checkpointer::memory_peak_bytes() const { return impl_->budget.peak(); }

void Checkpointer::reset_memory_peak() {
  wait_pending();
  impl_->budget.reset_peak();
}

Result<SaveReport> Checkpointer::save(const StateDict& state, const std::string& path, const SaveOptions& options) {
  // The same check, before any communication, on every rank: a budget too small fails at once.
  H5CKPT_RETURN_IF_ERROR(engine::check_memory_bytes(impl_->options.memory_bytes).with_context("save '" + path + "'"));
  H5CKPT_RETURN_IF_ERROR(agree_on_key(impl_->options, impl_->auth, impl_->comms().world.get()).with_context("save '" + path + "'"));
  wait_pending();
  impl_->resolved.reset();
  if (impl_->local()) {
    H5CKPT_RETURN_IF_ERROR(impl_->ensure_nodes());
    const bool persist = engine::local::should_persist(options, impl_->options, ++impl_->local_saves);
    H5CKPT_ASSIGN_OR_RETURN(engine::SaveJob job, engine::save_prepare(impl_->comms(), state, path, options,
                                                                      impl_->attributes, impl_->plan_cache, false));
    engine::local::LocalSave l = impl_->local_save(job, state, persist);
    // Device pieces go through two halves of the pool, as in a shared save.
    const uint64_t half =
        engine::has_device_items(state) ? std::min<uint64_t>(impl_->options.max_piece_bytes, 64ull << 20) : 0;
    auto writes =
        engine::plan_my_writes(impl_->comms().world.rank(), job, state, half ? half : impl_->options.max_piece_bytes);
    if (Status ordered = half ? device::staging().order_after(options.device_stream) : Status::Ok(); !ordered.ok())
      writes = ordered.with_context("waiting for the device before the snapshot");
    auto source = engine::caller_buffer_source(std::move(writes), state, impl_->pool, half);
    return engine::local::save_local(impl_->comms(), job, impl_->options, l, *source);
  }
  return engine::save(impl_->comms(), state, path, options, impl_->attributes, impl_->plan_cache, impl_->options,
                      impl_->pool);
}

Result<SaveHandle> Checkpointer::save_async(const StateDict& state, const std::string& path,
                                            const SaveOptions& options) {
  H5CKPT_RETURN_IF_ERROR(
      engine::check_memory_bytes(impl_->options.memory_bytes).with_context("save_async '" + path + "'"));
  H5CKPT_RETURN_IF_ERROR(
      agree_on_key(impl_->options, impl_->auth, impl_->comms().world.get()).with_context("save_async '" + path + "'"));
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE && impl_->options.async) {
    static std::once_flag warned;
    std::call_once(warned, [] {
      metrics::log().warn("MPI was not initialized with MPI_THREAD_MULTIPLE: save_async runs synchronously");
    });
  }
  if (!impl_->options.async || level < MPI_THREAD_MULTIPLE) {  // same call, synchronous
    auto done = std::make_shared<SaveHandle::State>();
    done->result = save(state, path, options);
    done->done = true;
    done->observed = true;
    return detail::SaveHandleAccess::make(done);
  }
  impl_->resolved.reset();
  if (impl_->local()) {
    wait_pending();  // the node map is made collectively on this thread, never beside the I/O thread
    H5CKPT_RETURN_IF_ERROR(impl_->ensure_nodes());
    const bool persist = engine::local::should_persist(options, impl_->options, ++impl_->local_saves);
    Impl* impl = impl_.get();
    auto make = [impl, &state, persist](const engine::SaveJob& job) -> engine::AsyncSaver::Backend {
      auto l = std::make_shared<engine::local::LocalSave>(impl->local_save(job, state, persist));
      const CheckpointerOptions copts = impl->options;
      return [l, copts](const Topology::Impl& io, engine::SaveJob& j, engine::WriteSource& source) {
        return engine::local::save_local(io, j, copts, *l, source);
      };
    };
    return impl_->async.start(state, path, options, impl_->attributes, impl_->plan_cache, make, false);
  }
  return impl_->async.start(state, path, options, impl_->attributes, impl_->plan_cache);
}

Result<ResolvedCheckpoint> Checkpointer::resolve(const std::string& path) {
  wait_pending();
  ResolvedCheckpoint out;
  if (!impl_->local()) {
    auto info = read_checkpoint_info(path);
    // Every rank reads; they agree so that every rank returns the same outcome.
    H5CKPT_RETURN_IF_ERROR(comm::agree(info.status(), impl_->comms().world.get()).with_context("resolve '" + path + "'"));
    out.info = std::move(info).value();
    out.level = "shared";
    out.reason = "shared checkpoint '" + out.info.path + "' (no local level configured)";
    return out;
  }
  H5CKPT_RETURN_IF_ERROR(impl_->ensure_nodes());
  H5CKPT_ASSIGN_OR_RETURN(auto res, engine::local::resolve(impl_->comms(), path, impl_->options, *impl_->nodes, true));
  out.info = res.info;
  out.level = res.local ? "local" : "shared";
  out.reason = res.reason;
  impl_->resolved = std::move(res);
  impl_->resolved_for = path;
  return out;
}

Result<LoadReport> Checkpointer::load(StateDict& state, const std::string& path, const LoadOptions& options) {
  H5CKPT_RETURN_IF_ERROR(engine::check_memory_bytes(impl_->options.memory_bytes).with_context("load '" + path + "'"));
  H5CKPT_RETURN_IF_ERROR(agree_on_key(impl_->options, impl_->auth, impl_->comms().world.get()).with_context("load '" + path + "'"));
  wait_pending();
  if (impl_->local()) {
    // The answer of a resolve() of this path right before, else a fresh one; used once, so a later
    // load sees the nodes' storage as it is then. Every rank has the same (resolve is collective).
    if (!impl_->resolved || impl_->resolved_for != path) {
      H5CKPT_RETURN_IF_ERROR(impl_->ensure_nodes());
      H5CKPT_ASSIGN_OR_RETURN(auto fresh,
                              engine::local::resolve(impl_->comms(), path, impl_->options, *impl_->nodes, false));
      impl_->resolved = std::move(fresh);
    }
    const engine::local::Resolution res = std::move(*impl_->resolved);
    impl_->resolved.reset();
    // The same answer on every rank (resolve is collective), so is this refusal.
    if (res.local && options.check_only)
      return Status(ErrorCode::kInvalidArgument, "check_only checks loads from the shared level only; this load "
                                                 "would read the node-local checkpoint '" + res.dir + "'")
          .with_context("load '" + path + "'");
    if (res.local) return engine::local::load_local(impl_->comms(), state, res, options);
    return engine::load(impl_->comms(), state, res.info.path, options, impl_->options, impl_->load_cache, impl_->pool,
                        impl_->device_link);
  }
  return engine::load(impl_->comms(), state, path, options, impl_->options, impl_->load_cache, impl_->pool,
                      impl_->device_link);
}

void Checkpointer::set_attribute(const std::string& name, const std::string& value) { impl_->attributes[name] = value; }

const char* version() { return H5CKPT_VERSION; }

}  // namespace h5ckpt
