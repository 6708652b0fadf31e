// Load: the coordinator resolves and validates the metadata and every rank gets the same view;
// identical requests are grouped so one rank reads them and sends them to the others
// (zero-redundancy loading); each reader reads exactly the boxes it wants at recorded offsets.
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <filesystem>

#include "comm/transport.h"
#include "device/staging.h"
#include "engine/aggregated_read.h"
#include "engine/engine.h"
#include "engine/plan_codec.h"
#include "metrics/log.h"
#include "planner/box_math.h"
#include "planner/load_planner.h"
#include "storage/commit.h"
#include "storage/metadata.h"
#include "storage/region_reader.h"
#include "util/bytes.h"
#include "util/checked_math.h"
#include "util/dtype_convert.h"

namespace h5ckpt::engine {

namespace fs = std::filesystem;
using metrics::now_s;

namespace {

// Coordinator: resolve `latest`, read the metadata text (validated by every rank after).
Result<std::pair<std::string, std::string>> read_metadata_text(const std::string& path) {
  H5CKPT_ASSIGN_OR_RETURN(std::string dir, storage::resolve_checkpoint_dir(path));
  H5CKPT_ASSIGN_OR_RETURN(std::string json,
                          storage::read_whole_file((fs::path(dir) / storage::kMetadataFileName).string()));
  return std::make_pair(dir, json);
}

// Checks one item against the metadata; sets *skip for a missing key in a non-strict load.
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
  if (t->shape != item.global_shape && (!item.allow_shape_mismatch || t->shape.size() != item.global_shape.size()))
    return Status(ErrorCode::kShapeMismatch, "checkpoint has global shape " + to_string_shape(t->shape) +
                                                 ", the state wants " + to_string_shape(item.global_shape));
  return Status::Ok();
}

// The parts of tensor t an item's shard reads. Padded vocabularies: the common part is read,
// the rest of the buffer zeroed (`zero` gets the buffer to clear), the surplus dropped.
std::vector<Box> wanted_regions(const TensorInfo& t, const StateItem& item, void* zero) {
  Box readable{Shape(t.shape.size(), 0), t.shape};
  if (t.shape != item.global_shape) {
    for (size_t d = 0; d < t.shape.size(); ++d) readable.shape[d] = std::min(t.shape[d], item.global_shape[d]);
    std::memset(zero, 0, static_cast<size_t>(item.shard.numel()) * dtype_size(item.dtype));
  }
  std::vector<Box> parts;
  for (const Box& want : planner::shard_boxes(item.shard))
    if (auto part = planner::intersect(want, readable)) parts.push_back(*part);
  return parts;
}

// Reads one item from storage into its buffer.
Status read_item(const CheckpointInfo& info, storage::RegionReader& reader, StateItem& item) {
  const TensorInfo* t = info.find(item.key);
  const planner::Frame frame = planner::frame_of(item.shard);
  for (const Box& part : wanted_regions(*t, item, item.data))
    H5CKPT_RETURN_IF_ERROR(reader.read(*t, part, frame, item.dtype, item.data));
  return Status::Ok();
}

// Aggregated load of every item this rank reads: the file pieces each item wants go to
// aggregated_read; items stored in another dtype land in a buffer of the stored dtype first
// and are converted after.
Status read_items_aggregated(const Topology::Impl& topo, const CheckpointInfo& info, StateDict& state,
                             const std::vector<ItemRole>& roles, const std::string& data_file,
                             const LoadOptions& options, StagingPool& pool, LoadReport& report) {
  std::vector<ReadPiece> pieces;
  std::vector<std::pair<size_t, std::vector<char>>> converted;  // item, bytes in the stored dtype
  for (size_t i = 0; i < roles.size(); ++i) {
    if (roles[i].role != Role::kRead) continue;
    StateItem& it = state.items()[i];
    const TensorInfo* t = info.find(it.key);
    if (t->file_offset < 0) continue;  // empty tensor
    const uint64_t es = dtype_size(t->dtype);
    char* dst = static_cast<char*>(it.data);
    if (t->dtype != it.dtype) {
      // (the inner buffer keeps its address when `converted` grows: vectors move their storage)
      converted.emplace_back(i, std::vector<char>(static_cast<size_t>(it.shard.numel()) * es));
      dst = converted.back().second.data();
    }
    const planner::Frame src{Box{Shape(t->shape.size(), 0), t->shape}, 0};
    const planner::Frame frame = planner::frame_of(it.shard);
    for (const Box& part : wanted_regions(*t, it, it.data))
      planner::for_each_run(part, src, frame, [&](int64_t si, int64_t di, int64_t count) {
        pieces.push_back({static_cast<uint64_t>(t->file_offset) + static_cast<uint64_t>(si) * es,
                          static_cast<uint64_t>(count) * es, dst + static_cast<uint64_t>(di) * es});
      });
  }
  auto r = aggregated_read(topo.world.get(), data_file, std::move(pieces), options.read_window_bytes, pool);
  if (!r.ok()) return r.status();
  report.bytes_read += r->bytes_read;
  report.bytes_sent += r->bytes_sent;
  report.bytes_received += r->bytes_received;
  for (auto& [i, bytes] : converted) {
    StateItem& it = state.items()[i];
    if (!detail::convert_elements(bytes.data(), info.find(it.key)->dtype, it.data, it.dtype, it.shard.numel()))
      return Status(ErrorCode::kDtypeMismatch, "key '" + it.key + "': cannot convert its stored dtype");
  }
  return Status::Ok();
}

std::string encode_roles(const std::vector<ItemRole>& roles) {
  ByteWriter w;
  w.put<uint64_t>(roles.size());
  for (const auto& r : roles) {
    w.put<int32_t>(static_cast<int32_t>(r.role));
    w.put<int32_t>(r.group);
    w.put<int32_t>(r.peer);
    w.put<uint64_t>(r.targets.size());
    for (int32_t t : r.targets) w.put<int32_t>(t);
  }
  return std::move(w.str());
}

Result<std::vector<ItemRole>> decode_roles(const std::string& bytes) {
  ByteReader r(bytes);
  std::vector<ItemRole> roles(r.get<uint64_t>() & 0xffffff);
  for (auto& x : roles) {
    x.role = static_cast<Role>(r.get<int32_t>());
    x.group = r.get<int32_t>();
    x.peer = r.get<int32_t>();
    x.targets.resize(r.get<uint64_t>() & 0xffffff);
    for (auto& t : x.targets) t = r.get<int32_t>();
  }
  if (!r.ok() || !r.at_end()) return Status(ErrorCode::kInternal, "malformed load plan");
  return roles;
}

// Identical bytes <=> identical signature: key, dtypes, shapes, shard, padding flag. Where the
// buffer lives is part of it too, so a group's members are all host or all device buffers.
std::string request_signature(const StateItem& item, bool on_device) {
  std::vector<planner::ItemDesc> d{{item.key, item.dtype, item.global_shape, item.shard}};
  return encode_items(d) + (item.allow_shape_mismatch ? "P" : "-") + (on_device ? "D" : "H");
}

// Collective: makes the device transport the first time any rank has device replicas to move.
// Every rank ends with a transport or none does (then device replicas go over MPI via host
// staging, with a warning).
Status plan_device(const Topology::Impl& topo, const std::vector<char>& on_device, LoadPlanCache& cache,
                   DeviceLink& link) {
  const auto& roles = cache.roles;
  int mine[2] = {0, 0}, any[2] = {0, 0};  // {device items at all, device replicas to move}
  for (size_t i = 0; i < roles.size(); ++i)
    if (roles[i].role != Role::kSkip && on_device[i]) {
      mine[0] = 1;
      if (!roles[i].targets.empty() || roles[i].role == Role::kReceive) mine[1] = 1;
    }
  const MPI_Comm world = topo.world.get();
  H5CKPT_RETURN_IF_ERROR(comm::mpi_status(MPI_Allreduce(mine, any, 2, MPI_INT, MPI_MAX, world), "MPI_Allreduce"));
  cache.any_device = any[0] != 0;
  cache.device_transport = false;
  if (!any[1]) return Status::Ok();
  if (!link.tried) {
    link.tried = true;
    std::string why;
    link.transport = device::make_device_transport(world, device::staging(), &why);
    int have = link.transport != nullptr, all = 0;
    H5CKPT_RETURN_IF_ERROR(comm::mpi_status(MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, world), "MPI_Allreduce"));
    if (!all) {
      link.transport.reset();
      if (topo.world.rank() == topo.coordinator)
        metrics::log().warn("no device transport ({}): device replicas are exchanged over MPI through host memory",
                            why.empty() ? "another rank has none" : why);
    }
  }
  cache.device_transport = link.transport != nullptr;
  return Status::Ok();
}

// Gathers every rank's requests, plans on the coordinator, scatters each rank its roles.
Result<std::vector<ItemRole>> plan_roles(const Topology::Impl& topo, const StateDict& state,
                                         const std::vector<char>& on_device,
                                         const std::vector<bool>& skip, bool dedup) {
  ByteWriter w;
  w.put<uint64_t>(state.items().size());
  for (size_t i = 0; i < state.items().size(); ++i) {
    const StateItem& it = state.items()[i];
    w.put<uint8_t>(skip[i] ? 1 : 0);
    w.put_string(skip[i] ? std::string() : request_signature(it, on_device[i]));
    w.put<uint64_t>(static_cast<uint64_t>(it.shard.numel()) * dtype_size(it.dtype));
  }
  H5CKPT_ASSIGN_OR_RETURN(auto gathered, topo.tree_gather(w.str()));
  std::vector<std::string> parts;
  if (topo.world.rank() == topo.coordinator) {
    const size_t world = gathered.size();
    std::vector<std::vector<planner::LoadRequest>> reqs(world);
    std::vector<std::vector<int>> index(world);  // request -> item index
    std::vector<std::vector<ItemRole>> roles(world);
    for (size_t r = 0; r < world; ++r) {
      ByteReader rd(gathered[r]);
      const uint64_t items = rd.get<uint64_t>() & 0xffffff;
      roles[r].resize(items);
      for (uint64_t i = 0; i < items && rd.ok(); ++i) {
        const bool sk = rd.get<uint8_t>() != 0;
        std::string sig = rd.get_string();
        const uint64_t bytes = rd.get<uint64_t>();
        if (sk) continue;
        reqs[r].push_back({std::move(sig), bytes});
        index[r].push_back(static_cast<int>(i));
      }
      if (!rd.ok()) roles[r].clear();  // decode_roles on that rank then reports the mismatch
    }
    const planner::LoadPlan plan = planner::plan_load(reqs, dedup);
    for (size_t g = 0; g < plan.groups.size(); ++g) {
      const auto& grp = plan.groups[g];
      for (const auto& m : grp.members) {
        ItemRole& role = roles[m.rank][index[m.rank][m.item]];
        role.group = static_cast<int32_t>(g);
        if (m.rank == grp.reader) {
          role.role = Role::kRead;
          for (const auto& o : grp.members)
            if (o.rank != grp.reader) role.targets.push_back(o.rank);
        } else {
          role.role = Role::kReceive;
          role.peer = grp.reader;
        }
      }
    }
    for (auto& r : roles) parts.push_back(encode_roles(r));
  }
  H5CKPT_ASSIGN_OR_RETURN(std::string mine, comm::scatter_bytes(parts, topo.coordinator, topo.world.get()));
  auto roles = decode_roles(mine);
  Status ok = !roles.ok() ? roles.status()
              : roles->size() != state.items().size()
                  ? Status(ErrorCode::kInternal, "load plan does not match the state")
                  : Status::Ok();
  H5CKPT_RETURN_IF_ERROR(comm::agree(ok, topo.world.get()));  // no rank leaves alone
  return roles;
}

// Times the end of a load (after its final agreement) and logs it.
LoadReport finish_report(LoadReport& report, double t0, double t_read) {
  const double t_end = now_s();
  report.exchange_s = t_end - t_read;
  report.total_s = t_end - t0;
  metrics::log().info("loaded '{}': read {} bytes, sent {}, received {}: plan {:.3f}s{} read {:.3f}s exchange {:.3f}s",
                      report.path, report.bytes_read, report.bytes_sent, report.bytes_received, report.plan_s,
                      report.plan_cached ? " (cached)" : "", report.read_s, report.exchange_s);
  return std::move(report);
}

}  // namespace

Result<LoadReport> load(const Topology::Impl& topo, StateDict& state, const std::string& path,
                        const LoadOptions& options, const CheckpointerOptions& copts, LoadPlanCache& cache,
                        StagingPool& pool, DeviceLink& link) {
  const double t0 = now_s();
  const MPI_Comm world = topo.world.get();
  LoadReport report;

  // Phase 1: one rank touches the metadata; all ranks receive the same bytes and outcome.
  std::string msg;
  if (topo.world.rank() == topo.coordinator) {
    auto text = read_metadata_text(path);
    ByteWriter w;
    w.put<int32_t>(static_cast<int32_t>(text.status().code()));
    w.put_string(text.ok() ? text->first : text.status().message());
    w.put_string(text.ok() ? text->second : std::string());
    msg = std::move(w.str());
  }
  H5CKPT_RETURN_IF_ERROR(comm::bcast_bytes(msg, topo.coordinator, world));
  ByteReader rd(msg);
  const auto code = static_cast<ErrorCode>(rd.get<int32_t>());
  std::string dir_or_error = rd.get_string();
  std::string json = rd.get_string();
  if (!rd.ok()) return Status(ErrorCode::kInternal, "malformed metadata broadcast");
  if (code != ErrorCode::kOk) return Status(code, "load '" + path + "': " + dir_or_error);
  report.path = dir_or_error;
  const std::string where = "load '" + report.path + "'";

  // Phase 2: open the data file; parse and validate the metadata unless this exact metadata and
  // state structure were planned before on every rank.
  Status local;
  std::optional<storage::RegionReader> reader;
  auto r = storage::RegionReader::open((fs::path(report.path) / storage::kDataFileName).string());
  if (r.ok()) reader.emplace(std::move(r).value());
  else local = r.status();
  const uint64_t meta_hash = XXH3_64bits(json.data(), json.size());
  // Everything that changes validation or roles is part of the key: structure, per-item padding
  // flags and the options.
  std::string sig_bytes = std::to_string(structure_signature(state));
  // Where each buffer lives, found once per load (a CUDA pointer query per item).
  std::vector<char> on_device(state.items().size());
  for (size_t i = 0; i < on_device.size(); ++i) {  // padding flags, and where each buffer lives
    on_device[i] = device::is_device_item(state.items()[i]);
    sig_bytes += state.items()[i].allow_shape_mismatch ? 'P' : '-';
    sig_bytes += on_device[i] ? 'D' : 'H';
  }
  sig_bytes += options.strict ? 'S' : 's';
  sig_bytes += options.convert_dtype ? 'C' : 'c';
  sig_bytes += options.zero_redundancy ? 'Z' : 'z';
  sig_bytes += options.aggregate_reads ? 'A' : 'a';
  const uint64_t sig = XXH3_64bits(sig_bytes.data(), sig_bytes.size());
  int same = local.ok() && cache.info && cache.meta_hash == meta_hash && cache.local_signature == sig &&
                     cache.data_size == reader->file_size()
                 ? 1
                 : 0;
  int all_same = 0;
  H5CKPT_RETURN_IF_ERROR(comm::mpi_status(MPI_Allreduce(&same, &all_same, 1, MPI_INT, MPI_MIN, world), "MPI_Allreduce"));
  report.plan_cached = all_same != 0;
  std::vector<bool> skip(state.items().size(), false);
  if (!all_same) {
    cache = LoadPlanCache{};
    if (local.ok()) {
      auto parsed = storage::metadata_from_json(json, reader->file_size());
      if (parsed.ok()) cache.info = std::make_shared<const CheckpointInfo>(std::move(parsed).value());
      else local = parsed.status();
    }
    // Every item is checked before any transfer, so no rank waits for bytes that never come.
    for (size_t i = 0; i < state.items().size() && local.ok(); ++i) {
      bool sk = false;
      local = check_item(*cache.info, state.items()[i], options, &sk);
      if (!local.ok()) local = local.with_context("key '" + state.items()[i].key + "'");
      skip[i] = sk;
    }
    // Aggregated reads serve host buffers only: any device buffer anywhere keeps per-item reads.
    int host_only = std::none_of(on_device.begin(), on_device.end(), [](char d) { return d != 0; });
    H5CKPT_RETURN_IF_ERROR(comm::agree(local, world, &host_only).with_context(where));
    cache.aggregated = options.aggregate_reads && host_only && topo.world.size() > 1;
    if (cache.aggregated) {  // every rank reads what it wants; the aggregation reads each byte once
      cache.roles.assign(state.items().size(), ItemRole{});
      for (size_t i = 0; i < skip.size(); ++i)
        if (!skip[i]) cache.roles[i].role = Role::kRead;
    } else {
      H5CKPT_ASSIGN_OR_RETURN(cache.roles, plan_roles(topo, state, on_device, skip, options.zero_redundancy));
      H5CKPT_RETURN_IF_ERROR(plan_device(topo, on_device, cache, link));
    }
    cache.meta_hash = meta_hash;
    cache.local_signature = sig;
    cache.data_size = reader->file_size();
  }
  const CheckpointInfo& info = *cache.info;
  const auto& roles = cache.roles;
  for (size_t i = 0; i < roles.size(); ++i)
    if (roles[i].role == Role::kSkip) report.missing_keys.push_back(state.items()[i].key);

  if (options.verify_checksums) {
    CheckpointInfo located = info;
    located.data_file = (fs::path(report.path) / storage::kDataFileName).string();
    local = verify_checkpoint(located, topo.world.rank(), topo.world.size());
    H5CKPT_RETURN_IF_ERROR(comm::agree(local, world).with_context(where));
  }
  const double t_plan = now_s();
  report.plan_s = t_plan - t0;

  const std::string data_file = (fs::path(report.path) / storage::kDataFileName).string();
  if (cache.aggregated) {
    report.transport = "mpi-aggregated";
    local = read_items_aggregated(topo, info, state, roles, data_file, options, pool, report);
    const double t_read = now_s();
    report.read_s = t_read - t_plan;
    H5CKPT_RETURN_IF_ERROR(comm::agree(local, world).with_context(where));
    return finish_report(report, t0, t_read);
  }

  // Phase 3: post every receive, then read in group order, sending each item to its replicas
  // as soon as it is read (the transfers overlap the next reads).
  auto mpi = comm::make_mpi_transport(world);
  comm::Transport* dev_transport = cache.device_transport ? link.transport.get() : nullptr;
  report.transport = dev_transport ? std::string(mpi->name()) + "+" + dev_transport->name() : mpi->name();
  std::vector<size_t> order(roles.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return roles[a].group < roles[b].group; });
  auto bytes_of = [&](const StateItem& it) { return static_cast<uint64_t>(it.shard.numel()) * dtype_size(it.dtype); };

  // Device items: their bytes land in host staging from the pool (reads, MPI receives) and go
  // to the device while later items are read; over a device transport, replicas receive
  // straight into device memory. dev[i] keeps the caller's pointer; the item points at its
  // staging until the guard restores it.
  device::Staging& staging = device::staging();
  std::vector<void*> dev(roles.size(), nullptr);
  struct Restore {
    StateDict& s;
    std::vector<void*>& dev;
    ~Restore() {
      for (size_t i = 0; i < dev.size(); ++i)
        if (dev[i]) s.items()[i].data = dev[i];
    }
  } restore{state, dev};
  if (cache.any_device) {  // same on every rank: the staging outcome is agreed
    std::vector<size_t> staged;
    uint64_t staged_bytes = 0;
    for (size_t i = 0; i < roles.size(); ++i) {
      const StateItem& it = state.items()[i];
      if (roles[i].role == Role::kSkip || !on_device[i]) continue;
      if (!(roles[i].role == Role::kReceive && dev_transport)) {
        staged.push_back(i);
        staged_bytes += (bytes_of(it) + 63) / 64 * 64;
      }
      dev[i] = it.data;
    }
    Status st;
    if (staged_bytes) {
      pool.reserve(staged_bytes);
      if (pool.capacity() < staged_bytes)
        st = Status(ErrorCode::kIo, "could not allocate " + std::to_string(staged_bytes) +
                                        " bytes of host staging for device buffers");
    }
    H5CKPT_RETURN_IF_ERROR(comm::agree(st, world).with_context(where));
    uint64_t off = 0;
    for (size_t i : staged) {
      state.items()[i].data = pool.base() + off;
      off += (bytes_of(state.items()[i]) + 63) / 64 * 64;
    }
  }
  auto via = [&](size_t i) -> comm::Transport& { return dev[i] && dev_transport ? *dev_transport : *mpi; };
  for (size_t i : order) {
    if (roles[i].role != Role::kReceive) continue;
    StateItem& it = state.items()[i];
    Status s = via(i).post_recv(roles[i].peer, it.data, bytes_of(it), roles[i].group & 0x7fff);
    if (local.ok() && !s.ok()) local = s;
    report.bytes_received += bytes_of(it);
  }
  // Reader threads (own file handles) read ahead; this thread posts each item's sends as soon as
  // it is complete, so transfers overlap the remaining reads. Reads go in file order (the kernel's
  // read-ahead then sees one forward stream) while MPI tags tell the groups apart; a device
  // transport matches messages by order only, and tags wrap past 32768 groups: then group order.
  std::vector<size_t> reads;
  for (size_t i : order)
    if (roles[i].role == Role::kRead) reads.push_back(i);
  const bool tags_unique = roles.empty() || roles[order.back()].group < 0x8000;
  if (tags_unique && !dev_transport) {
    auto file_offset = [&](size_t i) {
      const TensorInfo* t = info.find(state.items()[i].key);
      return t ? t->file_offset : int64_t{-1};
    };
    std::stable_sort(reads.begin(), reads.end(), [&](size_t a, size_t b) { return file_offset(a) < file_offset(b); });
  }
  std::vector<Status> read_status(reads.size());
  std::vector<char> read_done(reads.size(), 0);
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> extra_bytes{0};
  auto worker = [&](storage::RegionReader* rdr) {
    std::optional<storage::RegionReader> own;
    Status open_st;
    if (!rdr) {
      auto o = storage::RegionReader::open(data_file);
      if (o.ok()) own.emplace(std::move(o).value());
      else open_st = o.status();
      rdr = own ? &*own : nullptr;
    }
    for (size_t k; (k = next.fetch_add(1)) < reads.size();) {
      StateItem& it = state.items()[reads[k]];
      Status s = rdr ? read_item(info, *rdr, it) : open_st;
      std::lock_guard<std::mutex> lock(mu);
      read_status[k] = s.ok() ? s : s.with_context("key '" + it.key + "'");
      read_done[k] = 1;
      cv.notify_all();
    }
    if (own) extra_bytes += own->bytes_read();
  };
  std::vector<std::thread> helpers;
  if (local.ok()) {
    const int threads = std::max(1, std::min<int>(copts.io_threads, static_cast<int>(reads.size())));
    for (int t = 1; t < threads; ++t) helpers.emplace_back(worker, nullptr);
  }
  std::thread main_reader;
  if (local.ok()) main_reader = std::thread(worker, &*reader);
  for (size_t k = 0; k < reads.size(); ++k) {
    const size_t i = reads[k];
    StateItem& it = state.items()[i];
    if (main_reader.joinable()) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return read_done[k] != 0; });
      if (local.ok() && !read_status[k].ok()) local = read_status[k];
    }
    if (dev[i] && local.ok() && bytes_of(it) > 0) {  // to the device while the next items are read
      Status s = staging.copy_to_device(dev[i], it.data, bytes_of(it));
      if (!s.ok()) local = s.with_context("key '" + it.key + "'");
    }
    // Send even after a failure, so the receivers are not left waiting; the agreement below
    // fails the whole load anyway. A device transport sends from device memory, ordered after
    // the copy above.
    const void* from = dev[i] && dev_transport ? dev[i] : it.data;
    for (int32_t peer : roles[i].targets) {
      Status s = via(i).post_send(peer, from, bytes_of(it), roles[i].group & 0x7fff);
      if (local.ok() && !s.ok()) local = s;
      report.bytes_sent += bytes_of(it);
    }
    (void)mpi->progress();
  }
  if (main_reader.joinable()) main_reader.join();
  for (auto& h : helpers) h.join();
  const double t_read = now_s();
  report.read_s = t_read - t_plan;
  Status done = mpi->wait_all();
  if (local.ok()) local = done;
  if (dev_transport) {
    done = dev_transport->wait_all();
    if (local.ok()) local = done;
  }
  if (cache.any_device) {  // received device items staged in host memory go up now
    for (size_t i = 0; i < roles.size() && local.ok(); ++i)
      if (dev[i] && roles[i].role == Role::kReceive && !dev_transport && bytes_of(state.items()[i]) > 0)
        local = staging.copy_to_device(dev[i], state.items()[i].data, bytes_of(state.items()[i]));
    done = staging.synchronize();
    if (local.ok()) local = done;
  }
  report.bytes_read = (reader ? reader->bytes_read() : 0) + extra_bytes.load();
  H5CKPT_RETURN_IF_ERROR(comm::agree(local, world).with_context(where));
  return finish_report(report, t0, t_read);
}

}  // namespace h5ckpt::engine
