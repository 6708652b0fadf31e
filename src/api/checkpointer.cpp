#include "h5ckpt/checkpointer.h"

#include <mutex>

#include "api/handle_access.h"
#include "comm/deadline.h"
#include "comm/topology_impl.h"
#include "engine/async_saver.h"
#include "engine/engine.h"
#include "engine/memory_budget.h"
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
  engine::MemoryBudget budget;  // before `pool`, whose capacity is leased from it
  engine::StagingPool pool;  // declared before `async`, which uses it until it is destroyed
  engine::DeviceLink device_link;
  engine::AsyncSaver async;
};

Checkpointer::Checkpointer(const Topology& topology, const CheckpointerOptions& options)
    : impl_(std::make_unique<Impl>(topology, options)) {
  comm::set_timeout(options.timeout_s);  // process-wide: the byte collectives read it (comm/deadline.h)
}
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
  wait_pending();
  return engine::save(impl_->comms(), state, path, options, impl_->attributes, impl_->plan_cache, impl_->options,
                      impl_->pool);
}

Result<SaveHandle> Checkpointer::save_async(const StateDict& state, const std::string& path,
                                            const SaveOptions& options) {
  H5CKPT_RETURN_IF_ERROR(
      engine::check_memory_bytes(impl_->options.memory_bytes).with_context("save_async '" + path + "'"));
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
  return impl_->async.start(state, path, options, impl_->attributes, impl_->plan_cache);
}

Result<LoadReport> Checkpointer::load(StateDict& state, const std::string& path, const LoadOptions& options) {
  H5CKPT_RETURN_IF_ERROR(engine::check_memory_bytes(impl_->options.memory_bytes).with_context("load '" + path + "'"));
  wait_pending();
  return engine::load(impl_->comms(), state, path, options, impl_->options, impl_->load_cache, impl_->pool,
                      impl_->device_link);
}

void Checkpointer::set_attribute(const std::string& name, const std::string& value) { impl_->attributes[name] = value; }

const char* version() { return H5CKPT_VERSION; }

}  // namespace h5ckpt
