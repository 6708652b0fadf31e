// Save: validate locally -> plan (cached) -> create temp dir -> collective HDF5 writes ->
// gather checksums -> coordinator writes metadata and commits. Each phase ends in agree().
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <filesystem>

#include "engine/engine.h"
#include "engine/plan_codec.h"
#include "metrics/log.h"
#include "storage/commit.h"
#include "storage/h5_writer.h"
#include "storage/metadata.h"
#include "util/bytes.h"

namespace h5ckpt::engine {

namespace fs = std::filesystem;
using metrics::now_s;

uint64_t structure_signature(const StateDict& state) {
  std::vector<planner::ItemDesc> descs;
  for (const auto& it : state.items()) descs.push_back({it.key, it.dtype, it.global_shape, it.shard});
  const std::string bytes = encode_items(descs);
  return XXH3_64bits(bytes.data(), bytes.size());
}

namespace {

Status check_local_items(const StateDict& state) {
  for (const auto& it : state.items()) {
    if (auto st = it.shard.validate(it.global_shape); !st.ok()) return st.with_context("key '" + it.key + "'");
    if (it.shard.numel() > 0 && it.data == nullptr)
      return Status(ErrorCode::kInvalidArgument, "key '" + it.key + "': null buffer for a non-empty shard");
    if (it.device != Device::kHost)
      return Status(ErrorCode::kUnsupported, "key '" + it.key + "': device buffers need the CUDA staging build");
  }
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

Result<SaveReport> save(const Topology::Impl& topo, const StateDict& state, const std::string& path,
                        const SaveOptions& options, const std::map<std::string, std::string>& attributes,
                        PlanCache& cache) {
  const double t0 = now_s();
  const MPI_Comm world = topo.world.get();
  const bool coordinator = topo.world.rank() == topo.coordinator;
  SaveReport report;
  report.path = fs::path(path).lexically_normal().string();
  if (!report.path.empty() && report.path.back() == '/') report.path.pop_back();

  // Phase 1: local checks, then plan (reused when no rank's structure changed).
  H5CKPT_RETURN_IF_ERROR(comm::agree(check_local_items(state), world).with_context("save '" + path + "'"));
  const uint64_t sig = structure_signature(state);
  int same = cache.valid && cache.local_signature == sig ? 1 : 0, all_same = 0;
  H5CKPT_RETURN_IF_ERROR(comm::mpi_status(MPI_Allreduce(&same, &all_same, 1, MPI_INT, MPI_MIN, world), "MPI_Allreduce"));
  if (!all_same) {
    cache.valid = false;
    H5CKPT_ASSIGN_OR_RETURN(cache.tensors, plan_globally(topo, state));
    cache.local_signature = sig;
    cache.valid = true;
  }
  report.plan_cached = all_same != 0;
  const auto& tensors = cache.tensors;
  const double t_plan = now_s();
  report.plan_s = t_plan - t0;

  // Phase 2: the coordinator makes a fresh temporary directory; everyone learns its name.
  std::string temp;
  Status st;
  if (coordinator) {
    const std::string nonce = std::to_string(::getpid()) + "-" +
                              std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
    temp = storage::temp_dir_for(report.path, nonce);
    std::error_code ec;
    if (!options.overwrite && fs::exists(report.path, ec))
      st = Status(ErrorCode::kAlreadyExists, "checkpoint '" + report.path + "' already exists (pass overwrite to replace it)");
    else
      st = storage::make_dir(temp);
  }
  H5CKPT_RETURN_IF_ERROR(comm::agree(st, world).with_context("save '" + path + "'"));
  H5CKPT_RETURN_IF_ERROR(comm::bcast_bytes(temp, topo.coordinator, world));
  auto cleanup_on_error = [&](const Status& s) {
    if (!s.ok() && coordinator) (void)storage::remove_tree(temp);
    return s;
  };

  // Phase 3: collective HDF5 writes of the assigned regions, checksums on the way.
  const int me = topo.world.rank();
  std::vector<std::pair<int, int>> mine;  // (tensor, region) this rank wrote
  std::vector<uint64_t> sums;
  std::vector<int64_t> offsets;
  {
    std::lock_guard<std::mutex> lock(storage::hdf5_lock());
    auto writer = storage::ParallelWriter::create((fs::path(temp) / storage::kDataFileName).string(), world, tensors);
    Status created = comm::agree(writer.status(), world);
    if (!created.ok()) return cleanup_on_error(created.with_context("save '" + path + "'"));
    Status local;
    for (size_t t = 0; t < tensors.size(); ++t) {
      const ShardSpec* shard = nullptr;
      const void* data = nullptr;
      for (size_t r = 0; r < tensors[t].regions.size(); ++r) {
        if (tensors[t].regions[r].writer != me) continue;
        const StateItem* item = state.find(tensors[t].key);
        shard = &tensors[t].regions[r].shard;
        data = item->data;
        mine.emplace_back(static_cast<int>(t), static_cast<int>(r));
        const uint64_t bytes = static_cast<uint64_t>(shard->numel()) * dtype_size(tensors[t].dtype);
        sums.push_back(options.checksums ? storage::checksum_bytes(data, bytes) : 0);
        report.bytes_written += bytes;
      }
      // Keep joining the collective writes after a local failure, so no rank is left waiting.
      Status w = writer->write(t, local.ok() ? shard : nullptr, data);
      if (local.ok() && !w.ok()) local = w.with_context("key '" + tensors[t].key + "'");
    }
    Status closed = writer->close();
    if (local.ok()) local = closed;
    offsets = writer->offsets();
    Status written = comm::agree(local, world);
    if (!written.ok()) return cleanup_on_error(written.with_context("save '" + path + "'"));
  }
  const double t_write = now_s();
  report.write_s = t_write - t_plan;
  for (const auto& t : tensors) report.bytes_total += [&] {
    uint64_t n = dtype_size(t.dtype);
    for (auto s : t.shape) n *= static_cast<uint64_t>(s);
    return n;
  }();

  // Phase 4: checksums to the coordinator, which writes the metadata and commits.
  ByteWriter w;
  for (size_t i = 0; i < mine.size(); ++i) {
    w.put<int32_t>(mine[i].first);
    w.put<int32_t>(mine[i].second);
    w.put<uint64_t>(sums[i]);
  }
  auto gathered = comm::gather_bytes(w.str(), topo.coordinator, world);
  st = gathered.status();
  if (coordinator && st.ok()) {
    CheckpointInfo info;
    info.library_version = H5CKPT_VERSION;
    info.step = options.step;
    info.saved_sizes = topo.sizes;
    info.saved_coords = topo.all_coords;
    info.attributes = attributes;
    for (size_t t = 0; t < tensors.size(); ++t) {
      TensorInfo ti;
      ti.key = tensors[t].key;
      ti.dtype = tensors[t].dtype;
      ti.shape = tensors[t].shape;
      ti.nbytes = dtype_size(ti.dtype);
      for (auto s : ti.shape) ti.nbytes *= static_cast<uint64_t>(s);
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
    const std::string data_file = (fs::path(temp) / storage::kDataFileName).string();
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
  const double t_end = now_s();
  report.commit_s = t_end - t_write;
  report.total_s = t_end - t0;
  metrics::log().info("saved '{}': {} bytes written here, plan {:.3f}s{} write {:.3f}s commit {:.3f}s",
                      report.path, report.bytes_written, report.plan_s, report.plan_cached ? " (cached)" : "",
                      report.write_s, report.commit_s);
  return report;
}

}  // namespace h5ckpt::engine
