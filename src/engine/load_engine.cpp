// The load pipeline: resolve_metadata -> plan_reads -> [verify_regions] -> execute_reads. The
// coordinator resolves the metadata and every rank gets the same view; identical requests are
// grouped so one rank reads them and sends them to the others (zero-redundancy loading); each
// reader reads exactly the boxes it wants at recorded offsets. Each phase ends in one agreement.
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack (request_hash)
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "comm/transport.h"
#include "device/staging.h"
#include "engine/aggregated_read.h"
#include "engine/engine.h"
#include "metrics/log.h"
#include "metrics/report.h"
#include "planner/box_math.h"
#include "storage/commit.h"
#include "storage/metadata.h"
#include "storage/region_reader.h"
#include "storage/verify_blocks.h"
#include "util/checked_math.h"
#include "util/dtype_convert.h"
#include "util/phase.h"

namespace h5ckpt::engine {

namespace fs = std::filesystem;
using metrics::now_s;
using planner::ReadItem;
using planner::Role;

namespace {

// MPI tags are at most 32767 everywhere: groups past that share tags, and then only the order of
// messages between two ranks tells them apart (both sides walk groups in ascending order).
constexpr int kTagSpace = 0x8000;
int tag_of(int group) { return group % kTagSpace; }

// Device items are staged at this alignment in the pool.
constexpr uint64_t kStagingAlign = 64;
uint64_t align_up(uint64_t n) { return (n + kStagingAlign - 1) / kStagingAlign * kStagingAlign; }

// One load from the metadata to the final agreement; each phase fills in its part.
struct LoadRun {
  LoadRun(const Topology::Impl& t, StateDict& s, const LoadOptions& o, const CheckpointerOptions& c, LoadPlanCache& lc,
          StagingPool& p, DeviceLink& l)
      : topo(t), state(s), options(o), copts(c), cache(lc), pool(p), link(l), t0(now_s()) {}
  const Topology::Impl& topo;
  StateDict& state;
  const LoadOptions& options;
  const CheckpointerOptions& copts;
  LoadPlanCache& cache;
  StagingPool& pool;
  DeviceLink& link;
  LoadReport report;
  double t0 = 0;
  std::string where;  // "load '<checkpoint dir>'", the context of every error
  std::string data_file;
  std::optional<storage::RegionReader> reader;
  std::vector<planner::LoadWant> wants;

  MPI_Comm world() const { return topo.world.get(); }
  bool coordinator() const { return topo.world.rank() == topo.coordinator; }
};

std::vector<planner::LoadWant> describe_wants(const StateDict& state) {
  std::vector<planner::LoadWant> wants;
  wants.reserve(state.size());
  for (const auto& it : state.items())
    wants.push_back(
        {{it.key, it.dtype, it.global_shape, it.shard}, device::is_device_item(it), it.allow_shape_mismatch, false});
  return wants;
}

// Everything that changes validation or the plan: every request (key, dtype, shapes, shard, where
// the buffer lives, padding) and the load options.
uint64_t request_hash(const std::vector<planner::LoadWant>& wants, const LoadOptions& options) {
  XXH3_state_t h;
  XXH3_64bits_reset(&h);
  for (const auto& w : wants) {
    const std::string sig = planner::make_request(w).signature;
    const uint64_t n = sig.size();
    XXH3_64bits_update(&h, &n, sizeof n);
    XXH3_64bits_update(&h, sig.data(), sig.size());
  }
  const uint8_t flags[4] = {options.strict, options.convert_dtype, options.zero_redundancy, options.aggregate_reads};
  XXH3_64bits_update(&h, flags, sizeof flags);
  return XXH3_64bits_digest(&h);
}

// Checks one item against the metadata; a missing key in a non-strict load is skipped.
Status check_item(const CheckpointInfo& info, const StateItem& item, const LoadOptions& options, bool* skip) {
  *skip = false;
  H5CKPT_RETURN_IF_ERROR(check_item_buffer(item));
  const TensorInfo* t = info.find(item.key);
  if (!t) {
    if (!options.strict) {
      *skip = true;
      return Status::Ok();
    }
    return Status(ErrorCode::kNotFound, "not in the checkpoint");
  }
  if (t->dtype != item.dtype && !(options.convert_dtype && dtype_is_float(t->dtype) && dtype_is_float(item.dtype)))
    return Status(ErrorCode::kDtypeMismatch, std::string("checkpoint holds ") + dtype_name(t->dtype) +
                                                 ", the state wants " + dtype_name(item.dtype));
  if (t->shape != item.global_shape) {
    // allow_shape_mismatch is for padded vocabularies: only the size of dimension 0 may differ,
    // and the checkpoint must hold rows at all (not a transposed or emptied tensor).
    bool padded = item.allow_shape_mismatch && t->shape.size() == item.global_shape.size() && !t->shape.empty() &&
                  t->shape[0] > 0 && item.global_shape[0] > 0;
    for (size_t d = 1; padded && d < t->shape.size(); ++d) padded = t->shape[d] == item.global_shape[d];
    if (!padded)
      return Status(
          ErrorCode::kShapeMismatch,
          "checkpoint has global shape " + to_string_shape(t->shape) + ", the state wants " +
              to_string_shape(item.global_shape) +
              (item.allow_shape_mismatch ? " (allow_shape_mismatch lets only a non-empty dimension 0 differ)" : ""));
  }
  return Status::Ok();
}

planner::StoredTensor stored_of(const CheckpointInfo& info, const std::string& key) {
  const TensorInfo* t = info.find(key);
  return t ? planner::StoredTensor{t->dtype, t->shape, t->file_offset} : planner::StoredTensor{};
}

// ---- Phase 1: metadata --------------------------------------------------------------------

// The coordinator resolves `latest` and reads the metadata; every rank receives the same bytes
// and opens the data file. Unless every rank has this exact metadata and request set planned
// already, each parses and validates the metadata and checks its items against it. One
// agreement ends the phase; `*replan` says whether the plan must be made again.
Status resolve_metadata(LoadRun& run, const std::string& path, bool* replan, bool* host_only) {
  PhaseScope scope("load", "metadata");
  Result<std::string> text = std::string();
  if (run.coordinator()) {
    auto dir = storage::resolve_checkpoint_dir(path);
    auto json = dir.ok() ? storage::read_whole_file((fs::path(*dir) / storage::kMetadataFileName).string())
                         : Result<std::string>(dir.status());
    text = json.ok() ? Result<std::string>(wire::encode_pair(*dir, *json)) : Result<std::string>(json.status());
  }
  auto msg = bcast_outcome(text, run.topo);
  if (!msg.ok()) return msg.status().with_context("load '" + path + "'");
  H5CKPT_ASSIGN_OR_RETURN(auto dir_json, wire::decode_pair(*msg));
  const std::string& json = dir_json.second;
  run.report.path = dir_json.first;
  run.where = "load '" + run.report.path + "'";
  run.data_file = (fs::path(run.report.path) / storage::kDataFileName).string();

  Status local;
  auto r = storage::RegionReader::open(run.data_file);
  if (r.ok()) {
    run.reader.emplace(std::move(r).value());
    run.reader->set_verify(run.options.verify);
  } else {
    local = r.status();
  }
  run.wants = describe_wants(run.state);
  const uint64_t meta_hash = XXH3_64bits(json.data(), json.size());
  const uint64_t req_hash = request_hash(run.wants, run.options);
  LoadPlanCache& cache = run.cache;
  int flags[2] = {0, 1};  // {every rank planned this already, no device buffer anywhere}
  flags[0] = local.ok() && cache.info && cache.meta_hash == meta_hash && cache.request_hash == req_hash &&
             cache.data_size == run.reader->file_size();
  flags[1] = std::none_of(run.wants.begin(), run.wants.end(), [](const auto& w) { return w.on_device; });
  if (!flags[0]) {
    cache = LoadPlanCache{};
    if (local.ok()) {
      auto parsed = storage::metadata_from_json(json, run.reader->file_size());
      if (parsed.ok()) cache.info = std::make_shared<const CheckpointInfo>(std::move(parsed).value());
      else local = parsed.status();
    }
    // Every item is checked before any transfer, so no rank waits for bytes that never come.
    for (size_t i = 0; i < run.wants.size() && local.ok(); ++i) {
      bool skip = false;
      local = check_item(*cache.info, run.state.items()[i], run.options, &skip);
      if (!local.ok()) local = local.with_context("key '" + run.state.items()[i].key + "'");
      run.wants[i].skip = skip;
    }
    if (local.ok()) {
      cache.meta_hash = meta_hash;
      cache.request_hash = req_hash;
      cache.data_size = run.reader->file_size();
    }
  }
  H5CKPT_RETURN_IF_ERROR(comm::agree(local, run.world(), flags, 2).with_context(run.where));
  *replan = flags[0] == 0;
  *host_only = flags[1] != 0;
  return Status::Ok();
}

// ---- Phase 2: the plan --------------------------------------------------------------------

// The coordinator gathers every rank's requests up the tree, plans, and scatters each rank its
// roles and whether any rank has device items or device replicas to move. One agreement.
Result<std::vector<planner::ItemRole>> plan_roles(LoadRun& run, int device_flags[2]) {
  std::vector<wire::LoadRequestEntry> mine(run.wants.size());
  for (size_t i = 0; i < run.wants.size(); ++i) {
    mine[i].skip = run.wants[i].skip;
    mine[i].on_device = run.wants[i].on_device;
    if (!mine[i].skip) mine[i].request = planner::make_request(run.wants[i]);
  }
  H5CKPT_ASSIGN_OR_RETURN(auto gathered, run.topo.gather(wire::encode_requests(mine)));
  std::vector<std::string> parts;
  if (run.coordinator()) {
    const size_t world = gathered.size();
    std::vector<std::vector<planner::LoadRequest>> reqs(world);
    std::vector<std::vector<int>> item_of(world);  // request -> item index
    std::vector<std::vector<char>> on_device(world);
    std::vector<size_t> items(world, 0);
    bool decoded = true;
    for (size_t r = 0; r < world && decoded; ++r) {
      auto entries = wire::decode_requests(gathered[r]);
      if (!entries.ok()) {
        decoded = false;
        break;
      }
      items[r] = entries->size();
      for (size_t i = 0; i < entries->size(); ++i) {
        on_device[r].push_back((*entries)[i].on_device);
        if ((*entries)[i].skip) continue;
        reqs[r].push_back(std::move((*entries)[i].request));
        item_of[r].push_back(static_cast<int>(i));
      }
    }
    std::vector<std::vector<planner::ItemRole>> roles(world);
    int flags[2] = {0, 0};
    if (decoded) {
      const planner::LoadPlan plan = planner::plan_load(reqs, run.options.zero_redundancy);
      roles = planner::assign_roles(plan, item_of, items);
      for (size_t r = 0; r < world; ++r)
        for (size_t i = 0; i < roles[r].size(); ++i)
          if (roles[r][i].role != Role::kSkip && on_device[r][i]) {
            flags[0] = 1;
            if (!roles[r][i].targets.empty() || roles[r][i].role == Role::kReceive) flags[1] = 1;
          }
    }
    for (size_t r = 0; r < world; ++r) {
      // A rank whose requests did not decode gets no roles: its own check below fails the load.
      std::string part = decoded ? wire::encode_roles(roles[r]) : std::string();
      part.push_back(static_cast<char>(flags[0]));
      part.push_back(static_cast<char>(flags[1]));
      parts.push_back(std::move(part));
    }
  }
  H5CKPT_ASSIGN_OR_RETURN(std::string down, run.topo.scatter(parts));
  Result<std::vector<planner::ItemRole>> roles = Status(ErrorCode::kInternal, "malformed load plan message");
  if (down.size() >= 2) {
    device_flags[0] = down[down.size() - 2];
    device_flags[1] = down[down.size() - 1];
    down.resize(down.size() - 2);
    roles = wire::decode_roles(down);
  }
  Status ok = !roles.ok()                         ? roles.status()
              : roles->size() != run.wants.size() ? Status(ErrorCode::kInternal, "load plan does not match the state")
                                                  : Status::Ok();
  H5CKPT_RETURN_IF_ERROR(comm::agree(ok, run.world()).with_context(run.where));  // no rank leaves alone
  return roles;
}

// Collective, the first time any rank has device replicas to move: makes the device transport.
// Every rank ends with one or none does (device replicas then go over MPI via host staging).
Status link_devices(LoadRun& run) {
  DeviceLink& link = run.link;
  if (!link.tried) {
    link.tried = true;
    std::string why;
    link.transport = device::make_device_transport(run.world(), device::staging(), &why);
    int have = link.transport != nullptr;
    H5CKPT_RETURN_IF_ERROR(comm::agree(Status::Ok(), run.world(), &have));
    if (!have) {
      link.transport.reset();
      if (run.coordinator())
        metrics::log().warn("no device transport ({}): device replicas are exchanged over MPI through host memory",
                            why.empty() ? "another rank has none" : why);
    }
  }
  run.cache.device_transport = link.transport != nullptr;
  return Status::Ok();
}

// The plan of this rank: roles from the coordinator, or, for two-phase reads, every wanted item
// read by this rank (the aggregation reads each byte once).
Status plan_reads(LoadRun& run, bool host_only) {
  PhaseScope scope("load", "plan");
  LoadPlanCache& cache = run.cache;
  const CheckpointInfo& info = *cache.info;
  std::vector<planner::StoredTensor> stored(run.wants.size());
  for (size_t i = 0; i < run.wants.size(); ++i)
    if (!run.wants[i].skip) stored[i] = stored_of(info, run.wants[i].desc.key);
  cache.aggregated = run.options.aggregate_reads && host_only && run.topo.world.size() > 1;
  std::vector<planner::ItemRole> roles(run.wants.size());
  if (cache.aggregated) {
    for (size_t i = 0; i < roles.size(); ++i)
      if (!run.wants[i].skip) roles[i].role = Role::kRead;
  } else {
    int device_flags[2] = {0, 0};  // {device items anywhere, device replicas to move anywhere}
    H5CKPT_ASSIGN_OR_RETURN(roles, plan_roles(run, device_flags));
    cache.any_device = device_flags[0] != 0;
    if (device_flags[1]) H5CKPT_RETURN_IF_ERROR(link_devices(run));
  }
  // File order needs tags that tell the groups apart; a device transport matches by order only.
  int groups = 0;
  for (const auto& r : roles) groups = std::max(groups, r.group + 1);
  const bool file_order = groups <= kTagSpace && !cache.device_transport;
  cache.plan = planner::plan_rank_load(roles, run.wants, stored, file_order);
  return Status::Ok();
}

// ---- Phase 3 (optional): re-read and check every saved region's checksum -------------------

Status verify_regions(LoadRun& run) {
  PhaseScope scope("load", "verify");
  CheckpointInfo located = *run.cache.info;
  located.data_file = run.data_file;
  Status local = verify_checkpoint(located, run.topo.world.rank(), run.topo.world.size());
  return comm::agree(local, run.world()).with_context(run.where);
}

// ---- Phase 4: execute -----------------------------------------------------------------------

uint64_t item_bytes(const StateItem& it) { return static_cast<uint64_t>(it.shard.numel()) * dtype_size(it.dtype); }

// Reads one kRead item's boxes into `dst` (laid out as the item's shard, in its dtype).
Status read_boxes(const CheckpointInfo& info, storage::RegionReader& reader, const StateItem& item, const ReadItem& r,
                  void* dst) {
  const TensorInfo* t = info.find(item.key);
  if (r.zero_fill) std::memset(dst, 0, item_bytes(item));
  const planner::Frame frame = planner::frame_of(item.shard);
  for (const Box& box : r.boxes) H5CKPT_RETURN_IF_ERROR(reader.read(*t, box, frame, item.dtype, dst));
  return Status::Ok();
}

// Two-phase reads of every item: the file pieces each item wants go to aggregated_read; items
// stored in another dtype land in a buffer of the stored dtype first and are converted after.
Status execute_aggregated(LoadRun& run) {
  PhaseScope scope("load", "read");
  const CheckpointInfo& info = *run.cache.info;
  std::vector<ReadPiece> pieces;
  std::vector<std::pair<int, std::vector<char>>> converted;  // item, bytes in the stored dtype
  struct Checked {
    int item;
    const TensorInfo* tensor;
    storage::CheckedSpan span;
    Box want;
    std::vector<char> bytes;  // the span's whole blocks, stored dtype
  };
  std::vector<Checked> checked;
  Status prep;
  for (const ReadItem& r : run.cache.plan.items) {
    StateItem& it = run.state.items()[r.item];
    if (r.stored.file_offset < 0) continue;  // empty tensor
    const uint64_t es = dtype_size(r.stored.dtype);
    char* dst = static_cast<char*>(it.data);
    if (r.stored.dtype != it.dtype) {
      // (the inner buffer keeps its address when `converted` grows: vectors move their storage)
      converted.emplace_back(r.item, std::vector<char>(static_cast<size_t>(it.shard.numel()) * es));
      dst = converted.back().second.data();
    } else if (r.zero_fill) {
      std::memset(dst, 0, item_bytes(it));
    }
    const planner::Frame src{Box{Shape(r.stored.shape.size(), 0), r.stored.shape}, 0};
    const planner::Frame frame = planner::frame_of(it.shard);
    auto want_pieces = [&](const Box& box, const planner::Frame& to, char* base) {
      planner::for_each_run(box, src, to, [&](int64_t si, int64_t di, int64_t count) {
        pieces.push_back({static_cast<uint64_t>(r.stored.file_offset) + static_cast<uint64_t>(si) * es,
                          static_cast<uint64_t>(count) * es, base + static_cast<uint64_t>(di) * es});
      });
    };
    const TensorInfo* t = info.find(it.key);
    for (const Box& box : r.boxes) {
      if (!run.options.verify) {
        want_pieces(box, frame, dst);
        continue;
      }
      // Verified: whole blocks land in a buffer of their own, checked and copied out after.
      auto spans = storage::checked_spans(*t, box);
      if (!spans.ok()) {  // still take part in the collective read below
        if (prep.ok()) prep = spans.status().with_context("key '" + it.key + "'");
        continue;
      }
      for (const auto& span : *spans) {
        if (!span.verified) {
          for (const Box& piece : storage::span_boxes(*t, span))
            if (auto p = planner::intersect(piece, box)) want_pieces(*p, frame, dst);
          continue;
        }
        checked.push_back({r.item, t, span, box, std::vector<char>(static_cast<size_t>(span.end - span.begin) * es)});
        const planner::Frame to = storage::span_frame(*t, span);
        for (const Box& piece : storage::span_boxes(*t, span)) want_pieces(piece, to, checked.back().bytes.data());
      }
    }
  }
  Status local = prep;
  auto done = aggregated_read(run.world(), run.data_file, std::move(pieces), run.options.read_window_bytes, run.pool);
  if (done.ok() && local.ok()) {
    run.report.bytes_read += done->bytes_read;
    run.report.bytes_sent += done->bytes_sent;
    run.report.bytes_received += done->bytes_received;
    for (auto& [i, bytes] : converted) {
      StateItem& it = run.state.items()[i];
      if (!detail::convert_elements(bytes.data(), info.find(it.key)->dtype, it.data, it.dtype, it.shard.numel())) {
        local = Status(ErrorCode::kDtypeMismatch, "key '" + it.key + "': cannot convert its stored dtype");
        break;
      }
    }
    for (const Checked& c : checked) {  // after the conversions, which rewrite whole items
      if (!local.ok()) break;
      local = storage::check_span(*c.tensor, c.span, c.bytes.data()).with_context("key '" + c.tensor->key + "'");
      StateItem& it = run.state.items()[c.item];
      if (local.ok())
        storage::copy_span_out(*c.tensor, c.span, c.bytes.data(), c.want, planner::frame_of(it.shard), it.dtype,
                               it.data);
    }
  } else if (local.ok()) {
    local = done.status();
  }
  run.report.read_s = now_s() - run.t0 - run.report.plan_s;
  return comm::agree(local, run.world()).with_context(run.where);
}

// Per-item reads: post every receive, then read (reader threads, in the plan's read order) and
// send each item to its receivers as soon as it is read, so transfers overlap the next reads.
// Device items land in host staging from the pool and go to the device while later items are
// read; over a device transport, replicas are received straight into device memory.
Status execute_per_item(LoadRun& run) {
  PhaseScope scope("load", "read");
  const LoadPlanCache& cache = run.cache;
  const CheckpointInfo& info = *cache.info;
  const std::vector<ReadItem>& plan = cache.plan.items;
  auto mpi = comm::make_mpi_transport(run.world());
  comm::Transport* dev_transport = cache.device_transport ? run.link.transport.get() : nullptr;
  run.report.transport = dev_transport ? std::string(mpi->name()) + "+" + dev_transport->name() : mpi->name();
  auto item_of = [&](const ReadItem& r) -> StateItem& { return run.state.items()[r.item]; };
  auto over_device = [&](const ReadItem& r) { return r.on_device && dev_transport != nullptr; };

  // Where each plan entry's bytes land here: the caller's buffer, or host staging for a device
  // item that is read or received over MPI.
  std::vector<char*> landing(plan.size());
  Status local;
  uint64_t staged_bytes = 0;
  for (size_t k = 0; k < plan.size(); ++k) {
    landing[k] = static_cast<char*>(item_of(plan[k]).data);
    if (plan[k].on_device && !(plan[k].role == Role::kReceive && dev_transport))
      staged_bytes += align_up(plan[k].bytes);
  }
  if (cache.any_device) {  // same on every rank: the staging outcome is agreed before any transfer
    if (staged_bytes) {
      run.pool.reserve(staged_bytes);
      if (run.pool.capacity() < staged_bytes)
        local = Status(ErrorCode::kIo, "could not allocate " + std::to_string(staged_bytes) +
                                           " bytes of host staging for device buffers");
    }
    H5CKPT_RETURN_IF_ERROR(comm::agree(local, run.world()).with_context(run.where));
    uint64_t off = 0;
    for (size_t k = 0; k < plan.size(); ++k)
      if (plan[k].on_device && !(plan[k].role == Role::kReceive && dev_transport)) {
        landing[k] = run.pool.base() + off;
        off += align_up(plan[k].bytes);
      }
  }
  auto via = [&](const ReadItem& r) -> comm::Transport& { return over_device(r) ? *dev_transport : *mpi; };
  for (size_t k = 0; k < plan.size(); ++k) {
    if (plan[k].role != Role::kReceive) continue;
    Status s = via(plan[k]).post_recv(plan[k].reader, landing[k], plan[k].bytes, tag_of(plan[k].group));
    if (local.ok() && !s.ok()) local = s;
    run.report.bytes_received += plan[k].bytes;
  }

  // Reader threads (own file handles) read ahead in the plan's read order; this thread posts each
  // item's sends as soon as it is complete.
  const std::vector<size_t>& reads = cache.plan.read_order;
  std::vector<Status> read_status(reads.size());
  std::vector<char> read_done(reads.size(), 0);
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> extra_bytes{0};
  auto worker = [&](storage::RegionReader* rdr) {
    PhaseScope scope("load", "read");  // a stuck read names its phase in the deadline report
    std::optional<storage::RegionReader> own;
    Status open_st;
    if (!rdr) {
      auto o = storage::RegionReader::open(run.data_file);
      if (o.ok()) {
        own.emplace(std::move(o).value());
        own->set_verify(run.options.verify);
      } else {
        open_st = o.status();
      }
      rdr = own ? &*own : nullptr;
    }
    for (size_t n; (n = next.fetch_add(1)) < reads.size();) {
      const ReadItem& r = plan[reads[n]];
      Status s = rdr ? read_boxes(info, *rdr, item_of(r), r, landing[reads[n]]) : open_st;
      std::lock_guard<std::mutex> lock(mu);
      read_status[n] = s.ok() ? s : s.with_context("key '" + item_of(r).key + "'");
      read_done[n] = 1;
      cv.notify_all();
    }
    if (own) extra_bytes += own->bytes_read();
  };
  std::vector<std::thread> helpers;
  std::thread main_reader;
  if (local.ok()) {
    const int threads = std::max(1, std::min<int>(run.copts.io_threads, static_cast<int>(reads.size())));
    for (int t = 1; t < threads; ++t) helpers.emplace_back(worker, nullptr);
    main_reader = std::thread(worker, &*run.reader);
  }
  device::Staging& staging = device::staging();
  const double t_plan = run.t0 + run.report.plan_s;
  for (size_t n = 0; n < reads.size(); ++n) {
    const size_t k = reads[n];
    const ReadItem& r = plan[k];
    if (main_reader.joinable()) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return read_done[n] != 0; });
      if (local.ok() && !read_status[n].ok()) local = read_status[n];
    }
    void* device_ptr = item_of(r).data;
    if (r.on_device && local.ok() && r.bytes > 0) {  // to the device while the next items are read
      Status s = staging.copy_to_device(device_ptr, landing[k], r.bytes);
      if (!s.ok()) local = s.with_context("key '" + item_of(r).key + "'");
    }
    // Send even after a failure, so the receivers are not left waiting; the agreement below fails
    // the whole load anyway. A device transport sends from device memory, after the copy above.
    const void* from = over_device(r) ? device_ptr : landing[k];
    for (int peer : r.receivers) {
      Status s = via(r).post_send(peer, from, r.bytes, tag_of(r.group));
      if (local.ok() && !s.ok()) local = s;
      run.report.bytes_sent += r.bytes;
    }
    (void)mpi->progress();
  }
  if (main_reader.joinable()) main_reader.join();
  for (auto& h : helpers) h.join();
  run.report.read_s = now_s() - t_plan;
  Status done = mpi->wait_all();
  if (local.ok()) local = done;
  if (dev_transport) {
    done = dev_transport->wait_all();
    if (local.ok()) local = done;
  }
  if (cache.any_device) {  // received device items staged in host memory go up now
    for (size_t k = 0; k < plan.size() && local.ok(); ++k)
      if (plan[k].on_device && plan[k].role == Role::kReceive && !dev_transport && plan[k].bytes > 0)
        local = staging.copy_to_device(item_of(plan[k]).data, landing[k], plan[k].bytes);
    done = staging.synchronize();
    if (local.ok()) local = done;
  }
  run.report.bytes_read = (run.reader ? run.reader->bytes_read() : 0) + extra_bytes.load();
  return comm::agree(local, run.world()).with_context(run.where);
}

// Times the end of a load (after its final agreement), records its metrics and logs it.
LoadReport finish(LoadRun& run) {
  LoadReport& report = run.report;
  const double t_end = now_s();
  report.exchange_s = t_end - run.t0 - report.plan_s - report.read_s;
  report.total_s = t_end - run.t0;
  if (run.copts.metrics) {
    const Status st = metrics::write_metrics(run.topo, "load", report.path,
                                             metrics::metrics_path(report.path, "load", run.copts.metrics_dir),
                                             metrics::from_report(report));
    if (!st.ok()) metrics::log().warn("could not write load metrics: {}", st.to_string());
  }
  metrics::log().info("loaded '{}': read {} bytes, sent {}, received {}: plan {:.3f}s{} read {:.3f}s exchange {:.3f}s",
                      report.path, report.bytes_read, report.bytes_sent, report.bytes_received, report.plan_s,
                      report.plan_cached ? " (cached)" : "", report.read_s, report.exchange_s);
  return std::move(report);
}

}  // namespace

Result<LoadReport> load(const Topology::Impl& topo, StateDict& state, const std::string& path,
                        const LoadOptions& options, const CheckpointerOptions& copts, LoadPlanCache& cache,
                        StagingPool& pool, DeviceLink& link) {
  LoadRun run(topo, state, options, copts, cache, pool, link);
  bool replan = true, host_only = true;
  H5CKPT_RETURN_IF_ERROR(resolve_metadata(run, path, &replan, &host_only));
  if (replan) H5CKPT_RETURN_IF_ERROR(plan_reads(run, host_only));
  run.report.plan_cached = !replan;
  for (int i : cache.plan.skipped) run.report.missing_keys.push_back(state.items()[i].key);
  if (options.verify_checksums) H5CKPT_RETURN_IF_ERROR(verify_regions(run));
  run.report.plan_s = now_s() - run.t0;
  if (cache.aggregated) {
    run.report.transport = "mpi-aggregated";
    H5CKPT_RETURN_IF_ERROR(execute_aggregated(run));
  } else {
    H5CKPT_RETURN_IF_ERROR(execute_per_item(run));
  }
  return finish(run);
}

}  // namespace h5ckpt::engine
