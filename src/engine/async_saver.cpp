#include "engine/async_saver.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "api/handle_access.h"
#include "device/staging.h"
#include "metrics/log.h"
#include "storage/commit.h"
#include "util/phase.h"
#include "util/stream_copy.h"

namespace h5ckpt::engine {

using metrics::now_s;

namespace {

// Pieces handed over from the snapshot (producer) to the writer (consumer).
class StagedSource : public WriteSource {
 public:
  /// `staged`: pieces live in the pool (false: in the caller's buffers, nothing to release).
  /// `stable`: the pool holds the whole snapshot, so nothing overwrites a piece before the save
  /// ends (the next save waits for this one).
  StagedSource(StagingPool& pool, bool staged, bool stable) : pool_(pool), staged_(staged), stable_(stable) {}
  bool stable() const override { return stable_; }
  void fail(const Status& st) {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_.ok()) status_ = st;
  }
  Status status() override {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }
  /// Blocks until the writer has finished with every piece (for pieces that were not copied).
  void wait_drained() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return closed_ && queue_.empty() && in_use_ == 0; });
  }
  void push(const SourcedWrite& p) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(p);
    }
    cv_.notify_all();
  }
  void close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }
  /// Blocks until the snapshot has pushed its last piece.
  void wait_closed() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return closed_; });
  }
  std::optional<SourcedWrite> next() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !queue_.empty() || closed_; });
    if (queue_.empty()) return std::nullopt;
    SourcedWrite p = queue_.front();
    queue_.pop_front();
    ++in_use_;
    return p;
  }
  void done(const SourcedWrite& p) override {
    if (p.write->bytes && staged_) pool_.release();
    {
      std::lock_guard<std::mutex> lock(mu_);
      --in_use_;
    }
    cv_.notify_all();
  }

 private:
  StagingPool& pool_;
  const bool staged_;
  const bool stable_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<SourcedWrite> queue_;
  int in_use_ = 0;
  bool closed_ = false;
  Status status_;
};

}  // namespace

AsyncSaver::AsyncSaver(const Topology::Impl& topo, const CheckpointerOptions& options, StagingPool& pool)
    : topo_(topo), options_(options), pool_(pool) {}

AsyncSaver::~AsyncSaver() { finish_pending(); }

Status AsyncSaver::ensure_io_comms() {
  if (io_comms_) return Status::Ok();
  auto c = std::make_unique<Topology::Impl>();
  H5CKPT_ASSIGN_OR_RETURN(c->world, comm::Comm::duplicate(topo_.world.get()));
  H5CKPT_ASSIGN_OR_RETURN(c->tp, comm::Comm::duplicate(topo_.tp.get()));
  H5CKPT_ASSIGN_OR_RETURN(c->dp, comm::Comm::duplicate(topo_.dp.get()));
  H5CKPT_ASSIGN_OR_RETURN(c->pp, comm::Comm::duplicate(topo_.pp.get()));
  c->sizes = topo_.sizes;
  c->coords = topo_.coords;
  c->all_coords = topo_.all_coords;
  c->coordinator = topo_.coordinator;
  H5CKPT_RETURN_IF_ERROR(c->duplicate_nodes_of(topo_));
  io_comms_ = std::move(c);
  return Status::Ok();
}

std::shared_ptr<SaveHandle::State> AsyncSaver::finish_pending() {
  if (worker_.joinable()) worker_.join();
  return std::exchange(pending_, nullptr);
}

Result<SaveHandle> AsyncSaver::start(const StateDict& state, const std::string& path, const SaveOptions& options,
                                     const std::map<std::string, std::string>& attributes, PlanCache& cache,
                                     const MakeBackend& make_backend, bool shared_dir) {
  // At most one save in flight: the previous one must commit before this one snapshots into
  // the same pool. Its failure, if nobody saw it, is this call's answer.
  if (auto prev = finish_pending()) {
    std::lock_guard<std::mutex> lock(prev->mu);
    if (!prev->result.ok() && !prev->observed) {
      prev->observed = true;
      return prev->result.status().with_context("previous asynchronous save failed");
    }
  }
  // Comm duplication is collective and happens once, on the first save_async of every rank.
  if (!io_comms_) H5CKPT_RETURN_IF_ERROR(comm::agree(ensure_io_comms(), topo_.world.get()));
  // The same first phase as a synchronous save, on the caller's thread: its errors (an existing
  // checkpoint, a bad shard) are this call's answer, not wait()'s.
  H5CKPT_ASSIGN_OR_RETURN(SaveJob prepared, save_prepare(topo_, state, path, options, attributes, cache, shared_dir));
  auto job = std::make_shared<SaveJob>(std::move(prepared));
  Backend backend = make_backend ? make_backend(*job) : Backend{};
  job->report.async = true;

  const int rank = topo_.world.rank();
  auto writes = plan_my_writes(rank, *job, state, options_.max_piece_bytes);
  uint64_t mine = 0, element = 1;
  for (const auto& w : writes.ok() ? *writes : std::vector<planner::WriteItem>{}) {
    mine += w.bytes;
    element = std::max<uint64_t>(element, dtype_size((*job->plan)[w.tensor].dtype));
  }
  // A piece is at least one element: a bound below that would leave the snapshot waiting for
  // space that can never exist, so the pool holds at least one element of the widest dtype.
  uint64_t wanted = std::max(options_.staging_bytes ? options_.staging_bytes : mine, element);
  // Under a memory budget the pool is the whole of an async save's memory: at most the budget
  // (kMinMemoryBytes holds an element of every dtype), and the snapshot streams through it.
  if (options_.memory_bytes) wanted = std::max(element, std::min<uint64_t>(wanted, options_.memory_bytes));
  pool_.reserve(wanted);
  // Without its pool (allocation failed) this rank does not snapshot: it hands the writer its
  // buffers and returns once they are written, which is correct, only not asynchronous.
  const bool staged = mine == 0 || pool_.capacity() > 0;
  if (writes.ok() && staged && mine && pool_.capacity() < options_.max_piece_bytes)  // a piece must fit the pool
    writes = plan_my_writes(rank, *job, state, pool_.capacity());
  auto my_writes = std::make_shared<const std::vector<planner::WriteItem>>(
      writes.ok() ? std::move(writes).value() : std::vector<planner::WriteItem>{});

  auto st = std::make_shared<SaveHandle::State>();
  // When the pool holds the whole snapshot, the writer starts after it: its collectives (MPI
  // progress polls) and writes would otherwise take CPU from the copy the trainer waits for.
  const bool after_snapshot = staged && pool_.capacity() >= mine;
  auto source = std::make_shared<StagedSource>(pool_, staged, after_snapshot);
  if (!writes.ok()) source->fail(writes.status());  // a planning bug fails the write phase everywhere
  const Topology::Impl& io = *io_comms_;
  const CheckpointerOptions copts = options_;
  MemoryBudget* budget = pool_.budget();
  worker_ = std::thread([st, source, job, my_writes, copts, &io, after_snapshot, backend, shared_dir, budget] {
    if (after_snapshot) source->wait_closed();
    // Ranks whose snapshot is done wait here for the others without taking their CPU.
    PhaseScope scope("save_async", "start");
    Status ready = comm::idle_barrier(io.world.get());
    Result<SaveReport> result = ready;
    if (!ready.ok()) {
      while (auto w = source->next()) source->done(*w);  // the snapshot must not wait for a writer
      if (io.world.rank() == io.coordinator && shared_dir) {
        (void)storage::remove_tree(job->temp);
        storage::release_save_lock(job->path);  // held since save_prepare
      }
    } else if (backend) {
      result = backend(io, *job, *source);
      std::lock_guard<std::mutex> lock(st->mu);  // the backend drained the source: the snapshot is done
      if (result.ok()) {
        result->snapshot_s = st->snapshot_s;
        result->blocked_bytes = st->blocked_bytes;
        result->async = true;
      }
    } else if (Status written = save_write(io, *job, copts, *source, budget); !written.ok()) {
      result = written;
    } else {
      {
        std::lock_guard<std::mutex> lock(st->mu);  // the snapshot is done: the source was drained
        job->report.snapshot_s = st->snapshot_s;
        job->report.blocked_bytes = st->blocked_bytes;
      }
      result = save_commit(io, *job, copts);
    }
    std::lock_guard<std::mutex> lock(st->mu);
    st->result = std::move(result);
    st->done = true;
    st->cv.notify_all();
  });
  pending_ = st;

  // The blocking part: copy this rank's pieces into the pool (waiting only if it is full).
  PhaseScope snapshot_scope("save_async", "snapshot");
  // The snapshot must see the state as it is once the trainer's queued device work is done.
  if (has_device_items(state))
    if (Status ordered = device::staging().order_after(options.device_stream); !ordered.ok())
      source->fail(ordered.with_context("waiting for the device before the snapshot"));
  const double t_snap = now_s();
  uint64_t blocked = 0;
  device::Staging& dev = device::staging();
  for (const planner::WriteItem& w : *my_writes) {
    const StateItem& item = state.items()[w.item];
    const char* from = static_cast<const char*>(item.data) + w.src_offset;
    const bool on_device = device::is_device_item(item);
    SourcedWrite out{&w, from, false};
    if (w.bytes && staged) {
      bool waited = false;
      char* dst = pool_.acquire(w.bytes, &waited);
      if (!on_device) {
        detail::stream_copy(dst, from, w.bytes);
      } else {  // device to pinned pool; the writer may only see it once the copy is done
        Status copied = dev.copy_to_host(dst, from, w.bytes);
        if (copied.ok()) copied = dev.synchronize();
        if (!copied.ok()) source->fail(copied.with_context("staging a device piece"));
      }
      if (waited) blocked += w.bytes;
      out.data = dst;
    } else if (on_device && w.bytes) {
      source->fail(Status(ErrorCode::kIo, "no host staging memory for device buffers"));
    }
    source->push(out);
  }
  {
    std::lock_guard<std::mutex> lock(st->mu);  // before close(): the writer cannot finish earlier
    st->snapshot_s = now_s() - t_snap;
    st->blocked_bytes = blocked;
  }
  source->close();
  if (!staged) {
    metrics::log().warn("could not allocate {} bytes of staging: this rank's part of the save ran synchronously",
                        wanted);
    source->wait_drained();
  }
  if (blocked)
    metrics::log().warn(
        "staging pool of {} bytes could not hold this save: {} bytes were snapshotted only after "
        "waiting for the writer",
        pool_.capacity(), blocked);
  metrics::log().info("save_async '{}': snapshot {:.3f}s after {:.3f}s of planning", path, now_s() - t_snap,
                      t_snap - job->t0);
  return detail::SaveHandleAccess::make(st);
}

}  // namespace h5ckpt::engine

namespace h5ckpt {

bool SaveHandle::test() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

Result<SaveReport> SaveHandle::wait() {
  if (!state_) return Status(ErrorCode::kInvalidArgument, "wait() on an empty SaveHandle");
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  state_->observed = true;
  return state_->result;
}

}  // namespace h5ckpt
