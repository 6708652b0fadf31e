// Save: validate locally -> create temp dir (its agreement also says whether the cached plan
// holds on every rank) -> plan if not -> collective HDF5 file, independent writes -> gather
// checksums -> coordinator writes metadata and commits. Each phase ends in agree().
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack (structure_signature)
#include <xxhash.h>

#include <chrono>
#include <filesystem>

#include "device/staging.h"
#include "engine/engine.h"
#include "engine/plan_codec.h"
#include "metrics/log.h"
#include "metrics/report.h"
#include "storage/commit.h"
#include "storage/direct_writer.h"
#include "storage/h5_writer.h"
#include "storage/metadata.h"
#include "util/bytes.h"

namespace h5ckpt::engine {

namespace fs = std::filesystem;
using metrics::now_s;

Status check_item_buffer(const StateItem& item) {
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
  for (const auto& it : state.items()) {
    put_u64(it.key.size());
    put(it.key.data(), it.key.size());
    put_u64(static_cast<uint64_t>(it.dtype));
    put_shape(it.global_shape);
    put_shape(it.shard.box.offset);
    put_shape(it.shard.box.shape);
    put_u64(it.shard.flat ? 1 : 0);
    if (it.shard.flat) {
      put_u64(static_cast<uint64_t>(it.shard.flat->first));
      put_u64(static_cast<uint64_t>(it.shard.flat->second));
    }
  }
  return XXH3_64bits_digest(&h);
}

namespace {

uint64_t tensor_nbytes(const planner::TensorPlan& t) {
  uint64_t n = dtype_size(t.dtype);
  for (auto d : t.shape) n *= static_cast<uint64_t>(d);
  return n;
}

Status check_local_items(const StateDict& state) {
  for (const auto& it : state.items())
    if (Status st = check_item_buffer(it); !st.ok()) return st.with_context("key '" + it.key + "'");
  return Status::Ok();
}

// Plans on the coordinator and broadcasts the outcome; every rank gets the same Status.
Result<std::vector<planner::TensorPlan>> plan_globally(const Topology::Impl& topo, const StateDict& state) {
  std::vector<planner::ItemDesc> descs;
  for (const auto& it : state.items()) descs.push_back({it.key, it.dtype, it.global_shape, it.shard});
  H5CKPT_ASSIGN_OR_RETURN(auto gathered, topo.tree_gather(encode_items(descs)));
  std::string reply;
  if (topo.world.rank() == topo.coordinator) {
    Status st;
    std::vector<std::vector<planner::ItemDesc>> all(gathered.size());
    for (size_t r = 0; r < gathered.size() && st.ok(); ++r) {
      auto d = decode_items(gathered[r]);
      if (!d.ok()) st = d.status();
      else all[r] = std::move(d).value();
    }
    std::string body;
    if (st.ok()) {
      auto plan = planner::plan_save(all);
      if (plan.ok()) body = encode_tensors(plan->tensors);
      else st = plan.status();
    }
    ByteWriter w;
    w.put<int32_t>(static_cast<int32_t>(st.code()));
    w.put_string(st.message());
    w.put_string(body);
    reply = std::move(w.str());
  }
  H5CKPT_RETURN_IF_ERROR(comm::bcast_bytes(reply, topo.coordinator, topo.world.get()));
  ByteReader r(reply);
  const auto code = static_cast<ErrorCode>(r.get<int32_t>());
  std::string msg = r.get_string();
  std::string body = r.get_string();
  if (!r.ok()) return Status(ErrorCode::kInternal, "malformed plan broadcast");
  if (code != ErrorCode::kOk) return Status(code, "planning: " + msg);
  return decode_tensors(body);
}

}  // namespace

std::vector<Piece> my_pieces(int rank, const std::vector<planner::TensorPlan>& tensors, const StateDict& state,
                             uint64_t max_bytes) {
  std::vector<Piece> out;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const uint64_t es = dtype_size(tensors[t].dtype);
    const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(max_bytes / es));
    for (size_t r = 0; r < tensors[t].regions.size(); ++r) {
      const auto& reg = tensors[t].regions[r];
      if (reg.writer != rank) continue;
      const StateItem& item = *state.find(tensors[t].key);
      const char* data = static_cast<const char*>(item.data);
      const bool dev = device::is_device_item(item);
      const int64_t n = reg.shard.numel();
      if (n <= per) {  // the common case: the region in one piece, as planned
        out.push_back(Piece{(int)t, (int)r, reg.shard, data, static_cast<uint64_t>(n) * es, true, dev});
        continue;
      }
      // Large region: consecutive flat sub-ranges of its box, each a few hyperslabs.
      const int64_t b0 = reg.shard.flat ? reg.shard.flat->first : 0;
      for (int64_t b = 0; b < n; b += per) {
        const int64_t e = std::min(n, b + per);
        out.push_back(Piece{(int)t, (int)r, ShardSpec::flat_range(reg.shard.box, b0 + b, b0 + e), data + b * es,
                            static_cast<uint64_t>(e - b) * es, e == n, dev});
      }
    }
  }
  return out;
}

namespace {

// The local half of the plan cache check: this rank's own checks and whether its structure is
// the one the cache was planned for. No communication.
struct CacheCheck {
  Status local;
  uint64_t signature = 0;
  int hit = 0;
};
CacheCheck check_cache(const StateDict& state, const PlanCache& cache) {
  CacheCheck c;
  c.local = check_local_items(state);
  c.signature = c.local.ok() ? structure_signature(state) : 0;
  c.hit = c.local.ok() && cache.tensors && cache.local_signature == c.signature ? 1 : 0;
  return c;
}

// Collective: plans from scratch into the cache.
Status replan(const Topology::Impl& topo, const StateDict& state, PlanCache& cache, uint64_t signature) {
  cache.tensors.reset();
  H5CKPT_ASSIGN_OR_RETURN(auto tensors, plan_globally(topo, state));
  cache.tensors = std::make_shared<const std::vector<planner::TensorPlan>>(std::move(tensors));
  cache.local_signature = signature;
  return Status::Ok();
}

}  // namespace

Result<TensorPlans> prepare_save(const Topology::Impl& topo, const StateDict& state, PlanCache& cache,
                                 SaveReport& report) {
  const double t0 = now_s();
  const MPI_Comm world = topo.world.get();
  // One allreduce answers both "did any rank fail its local checks" (-1) and "is every rank's
  // structure unchanged" (1).
  const CacheCheck c = check_cache(state, cache);
  int mine = !c.local.ok() ? -1 : c.hit, all = 0;
  H5CKPT_RETURN_IF_ERROR(comm::mpi_status(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, world), "MPI_Allreduce"));
  if (all < 0) return comm::agree(c.local, world);  // every rank joins; the failing one explains
  if (!all) H5CKPT_RETURN_IF_ERROR(replan(topo, state, cache, c.signature));
  report.plan_cached = all != 0;
  report.plan_s = now_s() - t0;
  return cache.tensors;
}

namespace {

// Pieces straight from the caller's buffers.
class DirectSource : public PieceSource {
 public:
  explicit DirectSource(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}
  std::optional<Piece> next() override {
    if (i_ == pieces_.size()) return std::nullopt;
    return pieces_[i_++];
  }

 private:
  std::vector<Piece> pieces_;
  size_t i_ = 0;
};

// Pieces from the caller's buffers where device pieces are copied into one of two halves of
// the pool first: the copy of the next device piece runs while the writer writes this one.
class DeviceStagedSource : public PieceSource {
 public:
  DeviceStagedSource(std::vector<Piece> pieces, char* halves, uint64_t half_bytes, Status status)
      : pieces_(std::move(pieces)), half_{halves, halves + half_bytes}, status_(std::move(status)) {}
  std::optional<Piece> next() override {
    if (i_ == pieces_.size()) return std::nullopt;
    Piece p = pieces_[i_++];
    if (!p.on_device || p.bytes == 0) {
      p.on_device = false;  // nothing to stage
      return p;
    }
    if (!started_) start(i_ - 1);  // the first device piece (later ones were prefetched)
    if (status_.ok()) status_ = staging_.wait(marker_);
    p.data = half_[slot_];
    p.on_device = false;
    started_ = false;
    // The other half held the previous device piece, whose done() came before this next().
    for (size_t j = i_; j < pieces_.size(); ++j)
      if (pieces_[j].on_device && pieces_[j].bytes) {
        slot_ ^= 1;
        start(j);
        break;
      }
    return p;
  }
  Status status() override { return status_; }

 private:
  void start(size_t j) {
    if (status_.ok()) status_ = staging_.copy_to_host(half_[slot_], pieces_[j].data, pieces_[j].bytes);
    marker_ = staging_.record();
    started_ = true;
  }
  std::vector<Piece> pieces_;
  char* half_[2];
  device::Staging& staging_ = device::staging();
  size_t i_ = 0;
  int slot_ = 0;
  bool started_ = false;
  uint64_t marker_ = 0;
  Status status_;
};

void drain(PieceSource& source) {
  while (auto p = source.next()) source.done(*p);
}

std::string normalized_path(const std::string& path) {
  std::string p = fs::path(path).lexically_normal().string();
  if (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

}  // namespace

Result<std::string> make_temp_dir(const Topology::Impl& comms, const std::string& path, const SaveOptions& options,
                                  const Status& local, int* flag) {
  const MPI_Comm world = comms.world.get();
  const bool coordinator = comms.world.rank() == comms.coordinator;
  const std::string target = normalized_path(path);
  std::string temp;
  Status st = local;
  if (coordinator && st.ok()) {
    const std::string nonce = std::to_string(::getpid()) + "-" +
                              std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
    temp = storage::temp_dir_for(target, nonce);
    std::error_code ec;
    if (!options.overwrite && fs::exists(target, ec))
      st = Status(ErrorCode::kAlreadyExists, "checkpoint '" + target + "' already exists (pass overwrite to replace it)");
    else
      st = storage::make_dir(temp);
    if (!st.ok()) temp.clear();
  }
  if (Status a = comm::agree(st, world, flag); !a.ok()) {
    if (!temp.empty()) (void)storage::remove_tree(temp);
    return a;
  }
  H5CKPT_RETURN_IF_ERROR(comm::bcast_bytes(temp, comms.coordinator, world));
  return temp;
}

Result<SaveReport> write_and_commit(const Topology::Impl& comms, const std::vector<planner::TensorPlan>& tensors,
                                    const std::string& path, const std::string& temp, const SaveOptions& options,
                                    const CheckpointerOptions& copts,
                                    const std::map<std::string, std::string>& attributes, PieceSource& source,
                                    SaveReport report) {
  const double t0 = now_s();
  const MPI_Comm world = comms.world.get();
  const bool coordinator = comms.world.rank() == comms.coordinator;
  report.path = normalized_path(path);
  auto fail = [&](const Status& s, const std::string& dir) -> Status {
    drain(source);
    if (coordinator && !dir.empty()) (void)storage::remove_tree(dir);
    return s.with_context("save '" + path + "'");
  };

  // Phase 3: datasets created collectively; each rank then writes its pieces independently
  // (no per-tensor collective), checksumming each region as its pieces stream by.
  const std::string data_file = (fs::path(temp) / storage::kDataFileName).string();
  std::vector<std::tuple<int, int, uint64_t>> sums;  // (tensor, region, xxh3)
  std::vector<int64_t> offsets;
  std::optional<storage::ParallelWriter> h5writer;
  std::optional<storage::DirectWriter> direct;
  {
    std::lock_guard<std::mutex> lock(storage::hdf5_lock());
    auto writer = storage::ParallelWriter::create(data_file, world, tensors, copts.alignment, copts.mpi_hints);
    if (Status a = comm::agree(writer.status(), world); !a.ok()) return fail(a, temp);
    offsets = writer->offsets();
    h5writer.emplace(std::move(writer).value());
    if (copts.direct_writes) {  // the file structure is complete: close it before raw writes
      Status closed = h5writer->close();
      h5writer.reset();
      if (closed.ok() && coordinator) closed = storage::preallocate_file(data_file);
      if (Status a = comm::agree(closed, world); !a.ok()) return fail(a, temp);
    }
  }
  const double t_created = now_s();
  Status local;
  if (copts.direct_writes) {
    auto d = storage::DirectWriter::open(data_file, copts.direct_io);
    if (d.ok()) direct.emplace(std::move(d).value());
    else local = d.status();
  }
  XXH3_state_t* hs = XXH3_createState();
  bool region_open = false;
  while (auto piece = source.next()) {
    if (local.ok()) local = source.status();  // a failed staging copy: its bytes are not there
    if (local.ok()) {
      if (options.checksums) {
        if (!region_open) XXH3_64bits_reset(hs);
        XXH3_64bits_update(hs, piece->data, piece->bytes);
        region_open = !piece->region_end;
      }
      const auto& t = tensors[piece->tensor];
      if (direct) {
        local = direct->write(offsets[piece->tensor], t.shape, t.dtype, piece->shard, piece->data);
      } else {
        std::lock_guard<std::mutex> lock(storage::hdf5_lock());
        local = h5writer->write(piece->tensor, &piece->shard, piece->data);
      }
      local = local.with_context("key '" + t.key + "'");
      report.bytes_written += piece->bytes;
      if (piece->region_end)
        sums.emplace_back(piece->tensor, piece->region, options.checksums ? XXH3_64bits_digest(hs) : 0);
    }
    source.done(*piece);
  }
  XXH3_freeState(hs);
  const double t_pieces = now_s();
  if (direct) {
    report.bytes_direct = direct->direct_bytes();
    Status synced = direct->sync_and_close();
    if (local.ok()) local = synced;
  } else if (h5writer) {
    std::lock_guard<std::mutex> lock(storage::hdf5_lock());
    Status closed = h5writer->close();  // collective: flush (MPI_File_sync) and close
    if (local.ok()) local = closed;
  }
  const double t_synced = now_s();
  if (Status a = comm::agree(local, world); !a.ok()) return fail(a, temp);
  const double t_write = now_s();
  metrics::log().debug("write phase: create {:.3f}s, pieces {:.3f}s, fsync/close {:.3f}s, agreement {:.3f}s",
                       t_created - t0, t_pieces - t_created, t_synced - t_pieces, t_write - t_synced);
  report.write_s = t_write - t0;
  for (const auto& t : tensors) report.bytes_total += tensor_nbytes(t);

  // Phase 4: checksums to the coordinator, which writes the metadata and commits.
  ByteWriter w;
  for (const auto& [t, r, sum] : sums) {
    w.put<int32_t>(t);
    w.put<int32_t>(r);
    w.put<uint64_t>(sum);
  }
  auto gathered = comm::gather_bytes(w.str(), comms.coordinator, world);
  Status st = gathered.status();
  if (coordinator && st.ok()) {
    CheckpointInfo info;
    info.library_version = H5CKPT_VERSION;
    info.step = options.step;
    info.saved_sizes = comms.sizes;
    info.saved_coords = comms.all_coords;
    info.attributes = attributes;
    for (size_t t = 0; t < tensors.size(); ++t) {
      TensorInfo ti;
      ti.key = tensors[t].key;
      ti.dtype = tensors[t].dtype;
      ti.shape = tensors[t].shape;
      ti.nbytes = tensor_nbytes(tensors[t]);
      ti.file_offset = offsets[t];
      for (const auto& reg : tensors[t].regions) ti.regions.push_back(SavedRegion{reg.shard, reg.writer, 0});
      info.tensors.push_back(std::move(ti));
    }
    for (const auto& part : *gathered) {
      ByteReader r(part);
      while (st.ok() && !r.at_end()) {
        const int32_t t = r.get<int32_t>(), reg = r.get<int32_t>();
        const uint64_t sum = r.get<uint64_t>();
        if (!r.ok() || t < 0 || t >= (int)info.tensors.size() || reg < 0 || reg >= (int)info.tensors[t].regions.size())
          st = Status(ErrorCode::kInternal, "malformed checksum message");
        else
          info.tensors[t].regions[reg].checksum = sum;
      }
    }
    const std::string json = st.ok() ? storage::metadata_to_json(info) : std::string();
    if (st.ok()) {
      std::lock_guard<std::mutex> lock(storage::hdf5_lock());
      st = storage::write_meta_group(data_file, json, storage::kFormatVersion, H5CKPT_VERSION);
    }
    if (st.ok()) st = storage::fsync_path(data_file);
    if (st.ok()) st = storage::write_file_atomic((fs::path(temp) / storage::kMetadataFileName).string(), json);
    if (st.ok()) st = storage::fsync_path(temp);
    if (st.ok()) st = storage::publish_dir(temp, report.path, options.overwrite);
    if (st.ok() && options.update_latest) st = storage::update_latest(report.path);
    if (!st.ok()) (void)storage::remove_tree(temp);
  }
  H5CKPT_RETURN_IF_ERROR(comm::agree(st, world).with_context("committing '" + path + "'"));
  report.commit_s = now_s() - t_write;
  return report;
}

Result<SaveReport> write_and_commit(const Topology::Impl& comms, const std::vector<planner::TensorPlan>& tensors,
                                    const std::string& path, const SaveOptions& options,
                                    const CheckpointerOptions& copts,
                                    const std::map<std::string, std::string>& attributes, PieceSource& source,
                                    SaveReport report) {
  auto temp = make_temp_dir(comms, path, options, Status::Ok(), nullptr);
  if (!temp.ok()) {
    drain(source);
    return temp.status().with_context("save '" + path + "'");
  }
  return write_and_commit(comms, tensors, path, *temp, options, copts, attributes, source, std::move(report));
}

Result<SaveReport> save(const Topology::Impl& topo, const StateDict& state, const std::string& path,
                        const SaveOptions& options, const std::map<std::string, std::string>& attributes,
                        PlanCache& cache, const CheckpointerOptions& copts, StagingPool& pool) {
  const double t0 = now_s();
  SaveReport report;
  // The cache check needs no collective of its own: whether every rank's structure is unchanged
  // travels in the agreement that creates the temporary directory, which every save has.
  const CacheCheck c = check_cache(state, cache);
  report.plan_s = now_s() - t0;
  int all_hit = c.hit;
  auto temp = make_temp_dir(topo, path, options, c.local, &all_hit);
  if (!temp.ok()) return temp.status().with_context("save '" + path + "'");
  report.plan_cached = all_hit != 0;
  if (!all_hit) {
    const double p0 = now_s();
    if (Status st = replan(topo, state, cache, c.signature); !st.ok()) {
      if (topo.world.rank() == topo.coordinator) (void)storage::remove_tree(*temp);
      return st.with_context("save '" + path + "'");
    }
    report.plan_s += now_s() - p0;
  }
  const std::vector<planner::TensorPlan>& plan = *cache.tensors;
  bool any_device = false;
  for (const auto& it : state.items()) any_device = any_device || device::is_device_item(it);
  std::unique_ptr<PieceSource> source;
  if (!any_device) {
    source = std::make_unique<DirectSource>(my_pieces(topo.world.rank(), plan, state, copts.max_piece_bytes));
  } else {
    // Device pieces are bounded by half the pool (or 64 MiB when the pool is unbounded).
    const uint64_t half = std::max<uint64_t>(
        1, std::min<uint64_t>(copts.max_piece_bytes, copts.staging_bytes ? copts.staging_bytes / 2 : 64ull << 20));
    pool.reserve(2 * half);
    Status staged = pool.capacity() >= 2 * half ? Status::Ok()
                                                : Status(ErrorCode::kIo, "could not allocate " + std::to_string(2 * half) +
                                                                             " bytes of host staging for device buffers");
    source = std::make_unique<DeviceStagedSource>(my_pieces(topo.world.rank(), plan, state, half), pool.base(),
                                                  half, std::move(staged));
  }
  H5CKPT_ASSIGN_OR_RETURN(report, write_and_commit(topo, plan, path, *temp, options, copts, attributes, *source, report));
  report.total_s = now_s() - t0;
  record_metrics(topo, copts, report);
  metrics::log().info("saved '{}': {} bytes written here ({} with O_DIRECT), plan {:.3f}s{} write {:.3f}s commit {:.3f}s",
                      report.path, report.bytes_written, report.bytes_direct, report.plan_s,
                      report.plan_cached ? " (cached)" : "", report.write_s, report.commit_s);
  return report;
}

void record_metrics(const Topology::Impl& comms, const CheckpointerOptions& copts, const SaveReport& r) {
  if (!copts.metrics) return;
  const Status st = metrics::write_metrics(comms, "save", r.path, metrics::metrics_path(r.path, "save", copts.metrics_dir),
                                           metrics::from_report(r));
  if (!st.ok()) metrics::log().warn("could not write save metrics: {}", st.to_string());
}

void record_metrics(const Topology::Impl& comms, const CheckpointerOptions& copts, const LoadReport& r) {
  if (!copts.metrics) return;
  const Status st = metrics::write_metrics(comms, "load", r.path, metrics::metrics_path(r.path, "load", copts.metrics_dir),
                                           metrics::from_report(r));
  if (!st.ok()) metrics::log().warn("could not write load metrics: {}", st.to_string());
}

}  // namespace h5ckpt::engine
