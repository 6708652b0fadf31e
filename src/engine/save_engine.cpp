// The save pipeline: prepare (checks, temporary directory, plan) -> write (file, pieces, fsync)
// -> commit (checksums, metadata, atomic publish). Each phase ends in one agreement.
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack (structure_signature)
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "comm/deadline.h"
#include "device/staging.h"
#include "engine/aggregated_write.h"
#include "engine/engine.h"
#include "engine/pieces.h"
#include "logging/log.h"
#include "metrics/report.h"
#include "storage/checkpoint_commit.h"
#include "storage/verify_blocks.h"
#include "storage/commit.h"
#include "storage/direct_writer.h"
#include "storage/h5_writer.h"
#include "storage/leftovers.h"
#include "storage/format.h"
#include "storage/posix_io.h"
#include "storage/retention.h"  // [retention]
#include "util/phase.h"

namespace h5ckpt::engine {

namespace fs = std::filesystem;
using logging::now_s;

Status check_item_buffer(const StateItem& item) {
  if (is_multi_piece(item)) return check_pieces(item);  // each piece as an item of its own
  H5CKPT_RETURN_IF_ERROR(item.shard.validate(item.global_shape));
  if (item.shard.numel() > 0 && item.data == nullptr)
    return Status(ErrorCode::kInvalidArgument, "null buffer for a non-empty shard");
  if (item.device == Device::kCuda) {
    device::Staging& s = device::staging();
    if (!s.has_device())
      return Status(ErrorCode::kUnsupported,
                    "device buffer, but no GPU runtime is available here (h5ckpt built without CUDA, or no GPU "
                    "visible)");
    if (item.data && !s.is_device_pointer(item.data))
      return Status(ErrorCode::kInvalidArgument, "declared as device memory, but the pointer is not device memory");
  }
  return Status::Ok();
}

uint64_t structure_signature(const StateDict& state) {
  // Streamed into the hash field by field: no copy of the descriptors and no allocation, as this
  // runs on every save and load (a cache hit costs little more than this).
  XXH3_state_t h;
  XXH3_64bits_reset(&h);
  auto put = [&h](const void* p, size_t n) { XXH3_64bits_update(&h, p, n); };
  auto put_u64 = [&put](uint64_t v) { put(&v, sizeof v); };
  auto put_shape = [&](const Shape& v) {
    put_u64(v.size());
    put(v.data(), v.size() * sizeof(v[0]));
  };
  auto put_shard = [&](const ShardSpec& s) {
    put_shape(s.box.offset);
    put_shape(s.box.shape);
    put_u64(s.flat ? 1 : 0);
    if (s.flat) {
      put_u64(static_cast<uint64_t>(s.flat->first));
      put_u64(static_cast<uint64_t>(s.flat->second));
    }
  };
  for (const auto& it : state.items()) {
    put_u64(it.key.size());
    put(it.key.data(), it.key.size());
    put_u64(static_cast<uint64_t>(it.dtype));
    put_shape(it.global_shape);
    put_shard(it.shard);
    // A multi-piece item: every piece's shard (the plan's regions) and where it lies in the
    // buffer (this rank's writes); a single-shard item hashes as before.
    if (!it.pieces.empty()) put_u64(UINT64_MAX - it.pieces.size());
    for (const ShardPiece& p : it.pieces) {
      put_shard(p.shard);
      put_u64(p.buffer_offset);
    }
  }
  return XXH3_64bits_digest(&h);
}

bool has_device_items(const StateDict& state) {
  return std::any_of(state.items().begin(), state.items().end(), device::is_device_item);
}

std::vector<planner::ItemDesc> describe_items(const StateDict& state) {
  std::vector<planner::ItemDesc> descs;
  descs.reserve(state.size());
  for (size_t i = 0; i < state.size(); ++i) {
    const StateItem& it = state.items()[i];
    if (it.pieces.empty()) {  // its own item, by index: earlier pieces shift description indices
      descs.push_back({it.key, it.dtype, it.global_shape, it.shard, false, static_cast<int>(i), 0});
      continue;
    }
    // One description per piece, each pointing back at this item's buffer (plan_writes then
    // writes from data + buffer_offset, synchronously or from the async snapshot).
    for (size_t p = 0; p < it.pieces.size(); ++p)
      descs.push_back({it.key, it.dtype, it.global_shape, it.pieces[p].shard, p > 0, static_cast<int>(i),
                       it.pieces[p].buffer_offset});
  }
  return descs;
}

namespace {

std::string normalized_path(const std::string& path) {
  std::string p = fs::path(path).lexically_normal().string();
  if (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

Status check_local_items(const StateDict& state) {
  for (const auto& it : state.items())
    if (Status st = check_item_buffer(it); !st.ok()) return st.with_context("key '" + it.key + "'");
  return Status::Ok();
}

// Collective: every rank's descriptors up the tree, the plan made on the coordinator, its outcome
// broadcast; every rank returns the same Status.
Result<std::vector<planner::TensorPlan>> plan_globally(const Topology::Impl& topo, const StateDict& state) {
  H5CKPT_ASSIGN_OR_RETURN(auto gathered, topo.gather(wire::encode_items(describe_items(state))));
  Result<std::string> plan_bytes = std::string();
  if (topo.world.rank() == topo.coordinator) {
    // Views of the messages, planned while `gathered` holds them.
    const Result<wire::GatheredItems> all = wire::decode_gathered_items(gathered);
    Result<planner::SavePlan> plan = all.status();
    if (all.ok()) plan = planner::plan_save(all->items);
    plan_bytes = plan.ok() ? Result<std::string>(wire::encode_tensors(plan->tensors))
                           : Result<std::string>(plan.status().with_context("planning"));
  }
  H5CKPT_ASSIGN_OR_RETURN(std::string body, bcast_outcome(plan_bytes, topo));
  return wire::decode_tensors(body);
}

// Creates the directories above `target` that do not exist yet (as `mkdir -p` would), each through
// the posix_io seam, and fsyncs the directory that gained each new entry, so a committed checkpoint
// never sits under a parent a crash can forget. An error names the directory that could not be
// made and why (EACCES, EROFS, ENOTDIR ...). Local to the coordinator.
Status make_parent_dirs(const std::string& target) {
  const fs::path parent = fs::path(target).parent_path();
  if (parent.empty()) return Status::Ok();
  std::error_code ec;
  if (fs::is_directory(parent, ec)) return Status::Ok();
  fs::path at;
  for (const fs::path& part : parent) {
    const fs::path above = at;
    at /= part;
    if (fs::is_directory(at, ec)) continue;
    if (storage::io::mkdir(at.string(), 0755) != 0 && errno != EEXIST)
      return storage::io::error("mkdir", at.string(), errno)
          .with_context("creating the parent directories of '" + target + "'");
    if (!fs::is_directory(at, ec))
      return Status(ErrorCode::kIo, "'" + at.string() + "' exists and is not a directory")
          .with_context("creating the parent directories of '" + target + "'");
    H5CKPT_RETURN_IF_ERROR(storage::fsync_path(above.empty() ? "." : above.string()));
  }
  return Status::Ok();
}

// The coordinator makes a fresh temporary directory next to the target, and the directories above
// it first when they are missing. Local to the coordinator.
Result<std::string> make_temp_dir(const std::string& target, bool overwrite) {
  const std::string nonce =
      std::to_string(::getpid()) + "-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  std::error_code ec;
  if (!overwrite && fs::exists(target, ec))
    return Status(ErrorCode::kAlreadyExists,
                  "checkpoint '" + target + "' already exists (pass overwrite to replace it)");
  std::string temp = storage::temp_dir_for(target, nonce);
  H5CKPT_RETURN_IF_ERROR(storage::make_checkpoint_dir(temp));
  return temp;
}

}  // namespace

Result<SaveJob> save_prepare(const Topology::Impl& topo, const StateDict& state, const std::string& path,
                             const SaveOptions& options, const std::map<std::string, std::string>& attributes,
                             PlanCache& cache, bool shared_dir) {
  SaveJob job;
  PhaseScope scope("save", "prepare");
  job.t0 = now_s();
  job.path = normalized_path(path);
  job.options = options;
  job.attributes = attributes;
  const MPI_Comm world = topo.world.get();
  const bool coordinator = topo.world.rank() == topo.coordinator;
  bool locked = false;  // [save-lock] this coordinator holds the directory's save lock
  auto fail = [&](const Status& st) {
    if (coordinator && !job.temp.empty()) (void)storage::remove_tree(job.temp);
    if (locked) storage::release_save_lock(job.path);  // [save-lock]
    return st.with_context("save '" + path + "'");
  };

  // Local checks and the local half of the plan-cache check: no communication.
  Status local = check_local_items(state);
  const uint64_t signature = local.ok() ? structure_signature(state) : 0;
  int cached = local.ok() && cache.tensors && cache.local_signature == signature ? 1 : 0;
  job.report.plan_s = now_s() - job.t0;  // planning is the checks and any re-plan, not the directory
  if (coordinator && local.ok() && shared_dir)
    local = make_parent_dirs(job.path);  // before the lock, which lives there
  if (coordinator && local.ok() && shared_dir) {
    local = storage::acquire_save_lock(job.path);  // [save-lock] held until save_commit ends
    locked = local.ok();
  }
  if (coordinator && local.ok() && shared_dir) {
    auto temp = make_temp_dir(job.path, options.overwrite);
    if (temp.ok()) job.temp = std::move(temp).value();
    else local = temp.status();
  }
  // One agreement: any failure anywhere, and whether every rank's structure is the cached one.
  if (Status a = comm::agree(local, world, &cached); !a.ok()) return fail(a);
  if (Status b = shared_dir ? topo.bcast(job.temp) : Status::Ok(); !b.ok()) return fail(b);
  job.report.plan_cached = cached != 0;
  if (!cached) {
    const double p0 = now_s();
    cache.tensors.reset();
    auto tensors = plan_globally(topo, state);
    if (!tensors.ok()) return fail(tensors.status());
    cache.tensors = std::make_shared<const std::vector<planner::TensorPlan>>(std::move(tensors).value());
    cache.local_signature = signature;
    job.report.plan_s += now_s() - p0;
  }
  job.plan = cache.tensors;
  return job;
}

Status prepare_shared_dir(const Topology::Impl& topo, SaveJob& job) {
  const bool coordinator = topo.world.rank() == topo.coordinator;
  Status local;
  bool locked = false;
  if (coordinator) {
    local = make_parent_dirs(job.path);                            // before the lock, which lives there
    if (local.ok()) local = storage::acquire_save_lock(job.path);  // [save-lock] held until save_commit ends
    locked = local.ok();
    if (local.ok()) {
      auto temp = make_temp_dir(job.path, job.options.overwrite);
      if (temp.ok()) job.temp = std::move(temp).value();
      else local = temp.status();
    }
  }
  Status st = comm::agree(local, topo.world.get());
  if (st.ok()) st = topo.bcast(job.temp);
  if (!st.ok() && coordinator) {
    if (!job.temp.empty()) (void)storage::remove_tree(job.temp);
    if (locked) storage::release_save_lock(job.path);  // [save-lock]
  }
  return st.with_context("save '" + job.path + "'");
}

Result<std::vector<planner::WriteItem>> plan_my_writes(int rank, const SaveJob& job, const StateDict& state,
                                                       uint64_t max_bytes) {
  return planner::plan_writes(rank, *job.plan, describe_items(state), max_bytes);
}

namespace {

// Writes straight from the caller's buffers; device pieces are copied into one of two halves of
// the pool first, the copy of the next device piece running while the writer writes this one.
class CallerBufferSource : public WriteSource {
 public:
  CallerBufferSource(std::vector<planner::WriteItem> writes, const StateDict& state, char* halves, uint64_t half_bytes,
                     Status status)
      : writes_(std::move(writes)), state_(state), half_{halves, halves + half_bytes}, status_(std::move(status)) {}

  std::optional<SourcedWrite> next() override {
    if (i_ == writes_.size()) return std::nullopt;
    SourcedWrite w = locate(i_++);
    if (!w.on_device || w.write->bytes == 0) {
      w.on_device = false;  // nothing to stage
      return w;
    }
    if (!started_) start(i_ - 1);  // the first device piece (later ones were prefetched)
    if (status_.ok()) status_ = staging_.wait(marker_);
    w.data = half_[slot_];
    w.on_device = false;
    started_ = false;
    // The other half held the previous device piece, whose done() came before this next().
    for (size_t j = i_; j < writes_.size(); ++j)
      if (locate(j).on_device && writes_[j].bytes) {
        slot_ ^= 1;
        start(j);
        break;
      }
    return w;
  }
  Status status() override { return status_; }
  // Host bytes are written from the caller's buffers, which stay put until save() returns.
  bool stable() const override { return half_[0] == nullptr; }

 private:
  SourcedWrite locate(size_t j) const {
    const StateItem& item = state_.items()[writes_[j].item];
    return SourcedWrite{&writes_[j], static_cast<const char*>(item.data) + writes_[j].src_offset,
                        device::is_device_item(item)};
  }
  void start(size_t j) {
    if (status_.ok()) status_ = staging_.copy_to_host(half_[slot_], locate(j).data, writes_[j].bytes);
    marker_ = staging_.record();
    started_ = true;
  }
  std::vector<planner::WriteItem> writes_;
  const StateDict& state_;
  char* half_[2];
  device::Staging& staging_ = device::staging();
  size_t i_ = 0;
  int slot_ = 0;
  bool started_ = false;
  uint64_t marker_ = 0;
  Status status_;
};

void drain(WriteSource& source) {
  while (auto w = source.next()) source.done(*w);
}

// Writes whose runs average below this go to the aggregators under AggregateWrites::kAuto: on a
// network file system a call costs a round trip, which a run this short does not amortize.
constexpr uint64_t kAggregateRunBytes = 256u << 10;
constexpr uint64_t kWindowUnit = 64;  // windows are agreed in these units (an int per rank)

// The window buffers of aggregated writes, kept across saves so their pages stay touched
// (first-touch faults on this kind of VM cost more than the writes; async saves run on a new
// thread each time), unless a memory budget is set: then they live only while leased. One set
// per process; a save that finds it in use (another Checkpointer saving at the same moment)
// takes buffers of its own for the call.
class WindowSlots {
 public:
  char* get(uint64_t bytes) {
    if (size_ < bytes) {
      buf_.reset(static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096)));
      size_ = buf_ ? bytes : 0;
      if (buf_) std::memset(buf_.get(), 0, size_);
    }
    return buf_.get();
  }
  void free() {
    buf_.reset();
    size_ = 0;
  }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> buf_;
  uint64_t size_ = 0;
};

std::mutex& shared_slots_mutex() {
  static std::mutex mu;
  return mu;
}

WindowSlots& shared_slots() {
  static WindowSlots slots;
  return slots;
}

// This rank's side of the aggregation decision, folded into the create agreement: whether it
// can aggregate at all, and the window it can afford (its buffers are leased from here).
struct AggregationOffer {
  int possible = 0;
  int window_units = 0;
  MemoryBudget::Lease lease;
};

AggregationOffer offer_aggregation(const SaveOptions& options, const CheckpointerOptions& copts,
                                   const WriteSource& source, MemoryBudget* budget) {
  AggregationOffer o;
  if (options.aggregate_writes == AggregateWrites::kOff || !copts.direct_writes || !source.stable()) return o;
  uint64_t window = std::clamp<uint64_t>(options.write_window_bytes, kWindowUnit, 1ull << 30);
  if (budget && budget->bounded()) window = std::min<uint64_t>(window, budget->available() / kWriteWindowBuffers);
  window = window / kWindowUnit * kWindowUnit;
  if (window == 0) return o;
  if (budget) {
    auto lease = budget->lease(kWriteWindowBuffers * window, "aggregated write windows");
    if (!lease.ok()) return o;
    o.lease = std::move(lease).value();
  }
  o.possible = 1;
  o.window_units = static_cast<int>(window / kWindowUnit);
  return o;
}

// The runs of one write as pieces for the aggregators, or nothing when the write should go out
// as it is (kAuto and long runs).
bool aggregate_runs(AggregateWrites mode, const planner::TensorPlan& t, int64_t dataset_offset,
                    const planner::WriteItem& w, const char* data, std::vector<WritePiece>& pieces) {
  std::vector<WritePiece> runs;
  storage::for_each_file_run(dataset_offset, t.shape, t.dtype, w.box, [&](uint64_t at, uint64_t off, uint64_t len) {
    runs.push_back({off, len, data + at});
  });
  if (runs.empty()) return true;
  if (mode == AggregateWrites::kAuto && w.bytes / runs.size() >= kAggregateRunBytes) return false;
  pieces.insert(pieces.end(), runs.begin(), runs.end());
  return true;
}

}  // namespace

std::unique_ptr<WriteSource> caller_buffer_source(Result<std::vector<planner::WriteItem>> writes,
                                                  const StateDict& state, StagingPool& pool, uint64_t half_bytes) {
  Status staged = writes.status();  // a planning bug fails this rank's write phase, so every rank's
  if (staged.ok() && half_bytes) {
    pool.reserve(2 * half_bytes);
    if (pool.capacity() < 2 * half_bytes)
      staged = Status(ErrorCode::kIo, "could not allocate " + std::to_string(2 * half_bytes) +
                                          " bytes of host staging for device buffers");
  }
  if (!writes.ok()) writes = std::vector<planner::WriteItem>{};
  return std::make_unique<CallerBufferSource>(std::move(writes).value(), state, half_bytes ? pool.base() : nullptr,
                                              half_bytes, std::move(staged));
}

namespace {

// The write phase of one save, in steps: check_room (agreed), create_file (collective HDF5
// create, agreed, with the aggregation decision), write_pieces (every piece of the source, straight
// to the file or gathered for the aggregators), write_aggregated (collective), sync_and_close, and
// one final agreement. A failed agreement drains the source and removes the temporary directory.
struct SaveWrite {
  SaveWrite(const Topology::Impl& comms, SaveJob& j, const CheckpointerOptions& c, WriteSource& s, MemoryBudget* b)
      : job(j),
        copts(c),
        source(s),
        budget(b),
        world(comms.world.get()),
        coordinator(comms.world.rank() == comms.coordinator),
        tensors(*j.plan),
        data_file((fs::path(j.temp) / storage::kDataFileName).string()) {}

  SaveJob& job;
  const CheckpointerOptions& copts;
  WriteSource& source;
  MemoryBudget* budget;
  const MPI_Comm world;
  const bool coordinator;
  const std::vector<planner::TensorPlan>& tensors;
  const std::string data_file;
  std::optional<storage::ParallelWriter> h5writer;
  std::optional<storage::DirectWriter> direct;
  AggregationOffer offer;
  bool aggregate = false;
  uint64_t window = 0;
  Status local;
  std::optional<storage::BlockHasher> hasher;  // of the region whose pieces are streaming by
  uint64_t hasher_block_bytes = 0;             // its verification block size
  std::vector<WritePiece> pieces;              // runs for the aggregators

  Status fail(const Status& s) {
    drain(source);
    if (coordinator) (void)storage::remove_tree(job.temp);
    if (coordinator) storage::release_save_lock(job.path);  // [save-lock]
    return s.with_context("save '" + job.path + "'");
  }

  // A save that cannot fit fails here, before HDF5 writes anything (see check_free_space): the
  // tensors, the padding before the aligned ones, and room for HDF5's headers and the index.
  Status check_room() {
    Status room;
    if (coordinator) {
      uint64_t need = 1u << 20;
      for (const auto& t : tensors)
        need += t.nbytes() + (copts.alignment > 1 && t.nbytes() >= copts.alignment ? copts.alignment : 0) + 4096;
      room = storage::check_free_space(job.temp, need);
    }
    if (Status a = comm::agree(room, world); !a.ok()) return fail(a);
    return Status::Ok();
  }

  // Datasets are created collectively; each rank then writes its pieces independently (no
  // per-tensor collective). Whether the save aggregates, and with which window, is agreed here
  // too: all or no ranks.
  Status create_file() {
    std::lock_guard<std::mutex> lock(storage::hdf5_lock());
    // Collectives inside parallel HDF5 cannot be polled: a watchdog bounds them instead.
    std::optional<comm::BlockingGuard> guard(std::in_place, "parallel HDF5 file creation", world);
    auto writer = storage::ParallelWriter::create(data_file, world, tensors, copts.alignment, copts.mpi_hints);
    guard.reset();
    int agreed[2] = {offer.possible, offer.window_units};
    if (Status a = comm::agree(writer.status(), world, agreed, 2); !a.ok()) return fail(a);
    aggregate = agreed[0] == 1 && agreed[1] > 0;
    window = static_cast<uint64_t>(agreed[1]) * kWindowUnit;
    job.offsets = writer->offsets();
    h5writer.emplace(std::move(writer).value());
    if (copts.direct_writes) {  // the file structure is complete: close it before raw writes
      guard.emplace("parallel HDF5 close", world);
      Status closed = h5writer->close();
      h5writer.reset();
      guard.reset();
      if (closed.ok() && coordinator) closed = storage::preallocate_file(data_file);
      if (Status a = comm::agree(closed, world); !a.ok()) return fail(a);
      return Status::Ok();
    }
    // Through HDF5 too, a full disk must fail here: an ENOSPC inside H5Dwrite on some ranks
    // leaves their metadata caches dirty and the collective close then runs mismatched
    // collectives (a hang). The file is open, so its final size comes from the datasets.
    uint64_t end = 0;
    for (size_t t = 0; t < tensors.size(); ++t) {
      if (job.offsets[t] >= 0)
        end = std::max<uint64_t>(end, static_cast<uint64_t>(job.offsets[t]) + tensors[t].nbytes());
    }
    Status allocated = coordinator ? storage::preallocate_file(data_file, end) : Status::Ok();
    if (Status a = comm::agree(allocated, world); !a.ok()) {
      guard.emplace("parallel HDF5 close", world);
      (void)h5writer->close();  // collective, and nothing was written: the caches agree
      h5writer.reset();
      guard.reset();
      return fail(a);
    }
    return Status::Ok();
  }

  // One piece of the source: checksummed as it streams by, then written (or kept for the
  // aggregators); a region's last piece records the region's checksums.
  void write_piece(const SourcedWrite& sourced) {
    const planner::WriteItem& w = *sourced.write;
    const auto& t = tensors[w.tensor];
    if (job.options.checksums) {
      if (!hasher) {
        const ShardSpec region = t.shard(static_cast<size_t>(w.region));
        const uint64_t region_bytes = static_cast<uint64_t>(region.numel()) * dtype_size(t.dtype);
        hasher_block_bytes = storage::choose_block_bytes(region, t.dtype);
        hasher.emplace(storage::region_identity(t.key, t.dtype, t.shape, region), hasher_block_bytes, region_bytes);
      }
      hasher->update(sourced.data, w.bytes);
    }
    if (aggregate && aggregate_runs(job.options.aggregate_writes, t, job.offsets[w.tensor], w, sourced.data, pieces)) {
      // sent to the aggregators after the loop (the source is stable)
    } else if (direct) {
      local = direct->write(job.offsets[w.tensor], t.shape, t.dtype, w.box, sourced.data);
    } else {
      std::lock_guard<std::mutex> lock(storage::hdf5_lock());
      local = h5writer->write(w.tensor, &w.box, sourced.data);
    }
    local = local.with_context("key '" + t.key + "'");
    job.report.bytes_written += w.bytes;
    if (w.region_end) {
      wire::RegionChecksum sum{w.tensor, w.region, 0, {}};
      if (hasher) {
        sum.block_bytes = hasher_block_bytes;
        sum.blocks = hasher->finish();
        hasher.reset();
      }
      job.checksums.push_back(std::move(sum));
    }
  }

  // Every piece of the source, to its end (also after a failure: the source is drained).
  void write_pieces() {
    if (copts.direct_writes) {
      auto d = storage::DirectWriter::open(data_file, copts.direct_io);
      if (d.ok()) direct.emplace(std::move(d).value());
      else local = d.status();
    }
    job.checksums.clear();
    while (auto sourced = source.next()) {
      if (local.ok()) local = source.status();  // a failed staging copy: its bytes are not there
      if (local.ok()) write_piece(*sourced);
      source.done(*sourced);
    }
  }

  // Every rank takes part, whatever failed here: the others' sends and receives wait for it.
  void write_aggregated() {
    if (!aggregate) return;
    std::unique_lock<std::mutex> shared(shared_slots_mutex(), std::try_to_lock);
    WindowSlots own;
    WindowSlots& buffers = shared.owns_lock() ? shared_slots() : own;
    char* slots = buffers.get(kWriteWindowBuffers * window);
    if (!slots && local.ok()) local = Status(ErrorCode::kIo, "could not allocate the aggregated write windows");
    auto written =
        aggregated_write(world, std::move(pieces), window, slots, [&](const char* p, uint64_t len, uint64_t off) {
          return direct ? direct->write_bytes(p, len, off) : Status(ErrorCode::kIo, "data file not open");
        });
    if (written.ok()) job.report.bytes_aggregated = written->bytes_written;
    else if (local.ok()) local = written.status().with_context("aggregated writes");
    if (budget && budget->bounded()) buffers.free();
  }

  void sync_and_close() {
    if (direct) {
      job.report.bytes_direct = direct->direct_bytes();
      job.report.write_calls = direct->write_calls();
      Status synced = direct->sync_and_close();
      if (local.ok()) local = synced;
    } else if (h5writer) {
      std::lock_guard<std::mutex> lock(storage::hdf5_lock());
      const comm::BlockingGuard guard("parallel HDF5 flush and close", world);
      Status closed = h5writer->close();  // collective: flush (MPI_File_sync) and close
      if (local.ok()) local = closed;
    }
  }
};

}  // namespace

Status save_write(const Topology::Impl& comms, SaveJob& job, const CheckpointerOptions& copts, WriteSource& source,
                  MemoryBudget* budget) {
  PhaseScope scope("save", "write");
  const double t0 = now_s();
  SaveWrite w(comms, job, copts, source, budget);
  w.offer = offer_aggregation(job.options, copts, source, budget);
  H5CKPT_RETURN_IF_ERROR(w.check_room());
  H5CKPT_RETURN_IF_ERROR(w.create_file());
  const double t_created = now_s();
  w.write_pieces();
  const double t_pieces = now_s();
  w.write_aggregated();
  w.offer.lease.reset();
  const double t_aggregated = now_s();
  w.sync_and_close();
  const double t_synced = now_s();
  if (Status a = comm::agree(w.local, w.world); !a.ok()) return w.fail(a);
  const double t_write = now_s();
  logging::log().debug(
      "write phase: create {:.3f}s, pieces {:.3f}s, aggregated {:.3f}s, fsync/close {:.3f}s, agreement {:.3f}s, "
      "{} write calls",
      t_created - t0, t_pieces - t_created, t_aggregated - t_pieces, t_synced - t_aggregated, t_write - t_synced,
      job.report.write_calls);
  job.report.write_s = t_write - t0;
  return Status::Ok();
}

Result<SaveReport> save_commit(const Topology::Impl& comms, SaveJob& job, const CheckpointerOptions& copts) {
  PhaseScope scope("save", "commit");
  const double t0 = now_s();
  const MPI_Comm world = comms.world.get();
  const std::vector<planner::TensorPlan>& tensors = *job.plan;
  SaveReport& report = job.report;
  report.path = job.path;
  report.bytes_total = 0;
  for (const auto& t : tensors) report.bytes_total += t.nbytes();

  auto gathered = comms.gather(wire::encode_checksums(job.checksums));
  Status st = gathered.status();
  if (comms.world.rank() == comms.coordinator) {
    if (st.ok()) {
      storage::SavedCheckpoint saved{&tensors,         job.offsets,   {}, job.options.step, comms.sizes,
                                     comms.all_coords, job.attributes};
      saved.blocks.resize(tensors.size());
      for (size_t t = 0; t < tensors.size(); ++t) saved.blocks[t].resize(tensors[t].regions.size());
      for (size_t r = 0; r < gathered->size() && st.ok(); ++r) {
        auto sums = wire::decode_checksums((*gathered)[r]);
        if (!sums.ok()) st = sums.status().with_context("from rank " + std::to_string(r));
        for (auto& s : sums.ok() ? *sums : std::vector<wire::RegionChecksum>{}) {
          if (s.tensor < 0 || s.tensor >= (int)tensors.size() || s.region < 0 ||
              s.region >= (int)tensors[s.tensor].regions.size()) {
            st = Status(ErrorCode::kInternal, "checksum of an unknown region from rank " + std::to_string(r));
            break;
          }
          saved.blocks[s.tensor][s.region] = {s.block_bytes, std::move(s.blocks)};
        }
      }
      if (st.ok())
        st = storage::commit_checkpoint(job.temp, job.path, saved, job.options.overwrite, job.options.update_latest);
    }
    if (!st.ok()) (void)storage::remove_tree(job.temp);
    if (st.ok()) (void)storage::remove_leftover_temps(job.path);  // of earlier failed or crashed saves
    // [retention] only now that the new checkpoint is durable and `latest` names it
    if (st.ok()) storage::retain_after_save(job.path, copts.keep_last, copts.keep_every);
    storage::release_save_lock(job.path);  // [save-lock]
  }
  H5CKPT_RETURN_IF_ERROR(comm::agree(st, world).with_context("committing '" + job.path + "'"));
  const double t_end = now_s();
  report.commit_s = t_end - t0;
  report.total_s = t_end - job.t0;
  record_metrics(comms, copts, report);
  logging::log().info(
      "saved '{}': {} bytes written here ({} with O_DIRECT), plan {:.3f}s{} write {:.3f}s commit {:.3f}s", report.path,
      report.bytes_written, report.bytes_direct, report.plan_s, report.plan_cached ? " (cached)" : "", report.write_s,
      report.commit_s);
  return report;
}

void record_metrics(const Topology::Impl& comms, const CheckpointerOptions& copts, const SaveReport& r) {
  if (!copts.metrics) return;
  const Status st = metrics::write_metrics(
      comms, "save", r.path, metrics::metrics_path(r.path, "save", copts.metrics_dir), metrics::from_report(r));
  if (!st.ok()) logging::log().warn("could not write save metrics: {}", st.to_string());
}

}  // namespace h5ckpt::engine
