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
#include "engine/level.h"
#include "engine/memory_budget.h"
#include "storage/auth.h"
#include "logging/log.h"

namespace h5ckpt {

struct Checkpointer::Impl {
  Impl(const Topology& t, const CheckpointerOptions& o)
      : topology(&t),
        options(o),
        budget(o.memory_bytes),
        async(detail::TopologyAccess::of(t), o, pool),
        level(engine::make_level({comms(), options, pool, load_cache, device_link})) {
    pool.set_budget(&budget);
  }
  ~Impl() { async.finish_pending(); }  // the I/O thread uses `level`, destroyed first
  Topology::Impl& comms() const { return detail::TopologyAccess::of(*topology); }
  const Topology* topology;
  CheckpointerOptions options;
  engine::PlanCache plan_cache;
  engine::LoadPlanCache load_cache;
  std::map<std::string, std::string> attributes;
  Status auth;                  // loading auth_key_file, agreed at each save and load
  engine::MemoryBudget budget;  // before `pool`, whose capacity is leased from it
  engine::StagingPool pool;     // declared before `async`, which uses it until it is destroyed
  engine::DeviceLink device_link;
  engine::AsyncSaver async;
  std::unique_ptr<engine::Level> level;  // chosen once: shared, or node-local (local_dir)
  // The answer of a resolve(), used by the load of the same path right after it.
  std::string resolved_for;
  std::optional<engine::local::Resolution> resolved;
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
    return Status(ErrorCode::kInvalidArgument,
                  "auth_key_file '" + options.auth_key_file + "' holds different keys on different ranks");
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
  H5CKPT_RETURN_IF_ERROR(
      agree_on_key(impl_->options, impl_->auth, impl_->comms().world.get()).with_context("save '" + path + "'"));
  wait_pending();
  impl_->resolved.reset();
  H5CKPT_ASSIGN_OR_RETURN(engine::SaveJob job,
                          impl_->level->prepare_save(state, path, options, impl_->attributes, impl_->plan_cache));
  auto source = engine::caller_source(impl_->comms(), job, state, options, impl_->options, impl_->pool,
                                      impl_->level->save_buffer_bytes());
  return impl_->level->save(impl_->comms(), job, *source);
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
      logging::log().warn("MPI was not initialized with MPI_THREAD_MULTIPLE: save_async runs synchronously");
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
  return impl_->async.start(state, path, options, impl_->attributes, impl_->plan_cache, *impl_->level);
}

Result<ResolvedCheckpoint> Checkpointer::resolve(const std::string& path) {
  wait_pending();
  H5CKPT_ASSIGN_OR_RETURN(auto res, impl_->level->resolve(path, true));
  ResolvedCheckpoint out;
  out.info = res.info;
  out.level = res.local ? "local" : "shared";
  out.reason = res.reason;
  impl_->resolved = std::move(res);
  impl_->resolved_for = path;
  return out;
}

Result<LoadReport> Checkpointer::load(StateDict& state, const std::string& path, const LoadOptions& options) {
  H5CKPT_RETURN_IF_ERROR(engine::check_memory_bytes(impl_->options.memory_bytes).with_context("load '" + path + "'"));
  H5CKPT_RETURN_IF_ERROR(
      agree_on_key(impl_->options, impl_->auth, impl_->comms().world.get()).with_context("load '" + path + "'"));
  wait_pending();
  // The answer of a resolve() of this path right before, else a fresh one; used once, so a later
  // load sees the storage as it is then. Every rank has the same (resolve is collective).
  if (!impl_->resolved || impl_->resolved_for != path) {
    H5CKPT_ASSIGN_OR_RETURN(auto fresh, impl_->level->resolve(path, false));
    impl_->resolved = std::move(fresh);
  }
  const engine::local::Resolution res = std::move(*impl_->resolved);
  impl_->resolved.reset();
  return impl_->level->load(state, res, options);
}

void Checkpointer::set_attribute(const std::string& name, const std::string& value) { impl_->attributes[name] = value; }

const char* version() { return H5CKPT_VERSION; }

}  // namespace h5ckpt
