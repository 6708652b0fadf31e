#include "engine/async_saver.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "api/handle_access.h"
#include "device/staging.h"
#include "logging/log.h"
#include "storage/commit.h"
#include "util/phase.h"
#include "util/stream_copy.h"
#include "util/work_pool.h"

namespace h5ckpt::engine {

using logging::now_s;

namespace {

// A snapshot slice smaller than this is not worth a thread's hand-off.
constexpr uint64_t kMinSliceBytes = 1ull << 20;

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

// What this rank snapshots, and whether into the pool.
struct SnapshotPlan {
  std::shared_ptr<const std::vector<planner::WriteItem>> writes;
  Status planned;               // a planning bug: it fails the write phase everywhere
  uint64_t wanted = 0;          // pool bytes asked for
  bool staged = false;          // pieces are copied into the pool (else the writer takes the caller's buffers)
  bool after_snapshot = false;  // the pool holds the whole snapshot: the writer starts after it
};

// Sizes the pool for this rank's pieces and plans them to fit it.
SnapshotPlan plan_snapshot(int rank, const SaveJob& job, const StateDict& state, const CheckpointerOptions& options,
                           StagingPool& pool, uint64_t beside) {
  SnapshotPlan p;
  auto writes = plan_my_writes(rank, job, state, options.max_piece_bytes);
  uint64_t mine = 0, element = 1;
  for (const auto& w : writes.ok() ? *writes : std::vector<planner::WriteItem>{}) {
    mine += w.bytes;
    element = std::max<uint64_t>(element, dtype_size((*job.plan)[w.tensor].dtype));
  }
  // A piece is at least one element: a bound below that would leave the snapshot waiting for
  // space that can never exist, so the pool holds at least one element of the widest dtype.
  p.wanted = std::max(options.staging_bytes ? options.staging_bytes : mine, element);
  // Under a memory budget the pool is the whole of an async save's memory: at most the budget
  // (kMinMemoryBytes holds an element of every dtype), and the snapshot streams through it. The
  // level's own buffers (`beside`: the local level's partner-copy window) take their share first.
  if (options.memory_bytes) {
    const uint64_t for_pool = options.memory_bytes - std::min(beside, options.memory_bytes);
    p.wanted = std::max(element, std::min<uint64_t>(p.wanted, for_pool));
    if (beside) pool.shrink_to(p.wanted);  // a pool a load grew would leave the level no room
  }
  pool.reserve(p.wanted);
  // Without its pool (allocation failed) this rank does not snapshot: it hands the writer its
  // buffers and returns once they are written, which is correct, only not asynchronous.
  p.staged = mine == 0 || pool.capacity() > 0;
  if (writes.ok() && p.staged && mine && pool.capacity() < options.max_piece_bytes)  // a piece must fit the pool
    writes = plan_my_writes(rank, job, state, pool.capacity());
  p.planned = writes.status();
  p.writes = std::make_shared<const std::vector<planner::WriteItem>>(writes.ok() ? std::move(writes).value()
                                                                                 : std::vector<planner::WriteItem>{});
  // When the pool holds the whole snapshot, the writer starts after it: its collectives (MPI
  // progress polls) and writes would otherwise take CPU from the copy the trainer waits for.
  p.after_snapshot = p.staged && pool.capacity() >= mine;
  return p;
}

// The I/O thread: once every rank is ready, the level saves the job with the snapshot as its
// source; the outcome goes into `st`.
void write_in_background(const std::shared_ptr<SaveHandle::State>& st, const std::shared_ptr<StagedSource>& source,
                         const std::shared_ptr<SaveJob>& job, const Topology::Impl& io, bool after_snapshot,
                         Level* lvl) {
  if (after_snapshot) source->wait_closed();
  // Ranks whose snapshot is done wait here for the others without taking their CPU.
  PhaseScope scope("save_async", "start");
  Status ready = comm::idle_barrier(io.world.get());
  Result<SaveReport> result = ready;
  if (!ready.ok()) {
    while (auto w = source->next()) source->done(*w);  // the snapshot must not wait for a writer
    lvl->abandon(io, *job);
  } else {
    // The snapshot's figures go into the report before a commit records it (the source is
    // drained by then).
    job->before_commit = [st](SaveReport& r) {
      std::lock_guard<std::mutex> lock(st->mu);
      r.snapshot_s = st->snapshot_s;
      r.blocked_bytes = st->blocked_bytes;
    };
    result = lvl->save(io, *job, *source);
    std::lock_guard<std::mutex> lock(st->mu);  // the level drained the source: the snapshot is done
    if (result.ok()) {
      result->snapshot_s = st->snapshot_s;
      result->blocked_bytes = st->blocked_bytes;
      result->async = true;
    }
  }
  std::lock_guard<std::mutex> lock(st->mu);
  st->result = std::move(result);
  st->done = true;
  st->cv.notify_all();
}

// The blocking part of save_async: this rank's pieces copied into the pool (waiting only if it is
// full). Host pieces are copied by several threads (slices of whole pieces, several pieces at
// once) and device pieces by queued D2H copies with one wait for all of them. Either way a piece
// reaches the writer only once its bytes are in the pool, and pieces reach it in acquire order
// (the pool releases blocks in that order): `pending` holds them until the copies are done.
class SnapshotCopy {
 public:
  SnapshotCopy(StagedSource& source, StagingPool& pool, bool staged, int copiers, detail::WorkPool* copy_pool)
      : source_(source),
        pool_(pool),
        staged_(staged),
        copiers_(copiers),
        copy_pool_(copy_pool),
        dev_(device::staging()) {}

  /// Copies every write, then hands the last pieces to the writer. Returns the bytes copied only
  /// after waiting for room in the pool.
  uint64_t copy_all(const StateDict& state, const std::vector<planner::WriteItem>& writes) {
    for (const planner::WriteItem& w : writes) {
      pending_.push_back(copy_one(state.items()[w.item], w));
      if (!copies_ && !device_copies_) flush();  // nothing in flight: the writer may take it now
    }
    flush();
    return blocked_;
  }

 private:
  // Hands the writer every piece whose copy is done (all of them, after waiting).
  void flush() {
    if (copies_) {
      copy_pool_->seal(copies_);
      (void)copy_pool_->wait(copies_);  // a copy cannot fail
      copies_.reset();
    }
    if (device_copies_) {
      if (Status done = dev_.synchronize(); !done.ok()) source_.fail(done.with_context("staging device pieces"));
      device_copies_ = false;
    }
    for (const SourcedWrite& p : pending_) source_.push(p);
    pending_.clear();
  }

  // Starts the copy of one piece into the pool; returns the piece as the writer will see it.
  SourcedWrite copy_one(const StateItem& item, const planner::WriteItem& w) {
    const char* from = static_cast<const char*>(item.data) + w.src_offset;
    const bool on_device = device::is_device_item(item);
    SourcedWrite out{&w, from, false};
    if (w.bytes && staged_) {
      bool waited = false;
      char* dst = pool_.try_acquire(w.bytes);
      if (!dst) {  // the pool is full: hand the writer what is copied, then wait for room
        flush();
        dst = pool_.acquire(w.bytes, &waited);
      }
      if (on_device) {  // device to pinned pool; the writer may only see it once the copy is done
        Status copied = dev_.copy_to_host(dst, from, w.bytes);
        if (!copied.ok()) source_.fail(copied.with_context("staging a device piece"));
        device_copies_ = device_copies_ || copied.ok();
      } else if (copiers_ > 1) {
        if (!copies_) copies_ = copy_pool_->group();
        // Slices of at least kMinSliceBytes, about one per copier for a large piece.
        const uint64_t slice = std::max<uint64_t>(kMinSliceBytes, (w.bytes / copiers_ + 4095) / 4096 * 4096);
        for (uint64_t at = 0; at < w.bytes; at += slice) {
          const uint64_t n = std::min(slice, w.bytes - at);
          copy_pool_->submit(copies_, [d = dst + at, f = from + at, n] {
            detail::stream_copy(d, f, n);
            return Status::Ok();
          });
        }
      } else {
        detail::stream_copy(dst, from, w.bytes);
      }
      if (waited) blocked_ += w.bytes;
      out.data = dst;
    } else if (on_device && w.bytes) {
      source_.fail(Status(ErrorCode::kIo, "no host staging memory for device buffers"));
    }
    return out;
  }

  StagedSource& source_;
  StagingPool& pool_;
  const bool staged_;
  const int copiers_;
  detail::WorkPool* copy_pool_;
  device::Staging& dev_;
  std::vector<SourcedWrite> pending_;
  std::shared_ptr<detail::WorkPool::Group> copies_;  // host copies in flight
  bool device_copies_ = false;                       // D2H copies in flight
  uint64_t blocked_ = 0;
};

}  // namespace

AsyncSaver::AsyncSaver(const Topology::Impl& topo, const CheckpointerOptions& options, StagingPool& pool)
    : topo_(topo), options_(options), pool_(pool) {}

AsyncSaver::~AsyncSaver() { finish_pending(); }

int AsyncSaver::snapshot_threads() const {
  // Automatic: the node's hardware threads shared by its ranks, at most kMaxAutoCopiers (a few
  // threads saturate a socket's memory bandwidth; more only contend).
  constexpr int kMaxAutoCopiers = 8;
  const int n = detail::default_threads(options_.snapshot_threads, topo_.node.size());
  return options_.snapshot_threads > 0 ? n : std::min(n, kMaxAutoCopiers);
}

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
                                     Level& level) {
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
  H5CKPT_ASSIGN_OR_RETURN(SaveJob prepared, level.prepare_save(state, path, options, attributes, cache));
  auto job = std::make_shared<SaveJob>(std::move(prepared));
  job->report.async = true;

  const SnapshotPlan plan = plan_snapshot(topo_.world.rank(), *job, state, options_, pool_, level.save_buffer_bytes());
  auto st = std::make_shared<SaveHandle::State>();
  auto source = std::make_shared<StagedSource>(pool_, plan.staged, plan.after_snapshot);
  if (!plan.planned.ok()) source->fail(plan.planned);  // a planning bug fails the write phase everywhere
  const Topology::Impl& io = *io_comms_;
  Level* lvl = &level;  // outlives the thread: the Checkpointer joins it before destroying its level
  worker_ = std::thread([st, source, job, &io, after = plan.after_snapshot, lvl, writes = plan.writes] {
    (void)writes;  // held until the save ends: the pieces point into them
    write_in_background(st, source, job, io, after, lvl);
  });
  pending_ = st;

  // The blocking part: copy this rank's pieces into the pool (waiting only if it is full).
  PhaseScope snapshot_scope("save_async", "snapshot");
  // The snapshot must see the state as it is once the trainer's queued device work is done.
  if (has_device_items(state))
    if (Status ordered = device::staging().order_after(options.device_stream); !ordered.ok())
      source->fail(ordered.with_context("waiting for the device before the snapshot"));
  const double t_snap = now_s();
  const int copiers = plan.staged ? snapshot_threads() : 1;
  if (copiers > 1 && (!copy_pool_ || copy_pool_->threads() != copiers))
    copy_pool_ = std::make_unique<detail::WorkPool>(copiers, 4 * copiers);
  SnapshotCopy snapshot(*source, pool_, plan.staged, copiers, copy_pool_.get());
  const uint64_t blocked = snapshot.copy_all(state, *plan.writes);
  {
    std::lock_guard<std::mutex> lock(st->mu);  // before close(): the writer cannot finish earlier
    st->snapshot_s = now_s() - t_snap;
    st->blocked_bytes = blocked;
  }
  source->close();
  if (!plan.staged) {
    logging::log().warn("could not allocate {} bytes of staging: this rank's part of the save ran synchronously",
                        plan.wanted);
    source->wait_drained();
  }
  if (blocked)
    logging::log().warn(
        "staging pool of {} bytes could not hold this save: {} bytes were snapshotted only after "
        "waiting for the writer",
        pool_.capacity(), blocked);
  logging::log().info("save_async '{}': snapshot {:.3f}s after {:.3f}s of planning", path, now_s() - t_snap,
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
