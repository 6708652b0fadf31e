// Load: the coordinator resolves and validates the metadata, every rank gets the same view,
// then each rank reads exactly the boxes it wants at their recorded file offsets.
#include <cstring>
#include <filesystem>

#include "engine/engine.h"
#include "metrics/log.h"
#include "planner/box_math.h"
#include "storage/commit.h"
#include "storage/metadata.h"
#include "storage/region_reader.h"
#include "util/bytes.h"
#include "util/checked_math.h"

namespace h5ckpt::engine {

namespace fs = std::filesystem;
using metrics::now_s;

namespace {

// Coordinator: resolve `latest`, read and validate; returns (dir, json) for broadcasting.
Result<std::pair<std::string, std::string>> read_metadata_text(const std::string& path) {
  H5CKPT_ASSIGN_OR_RETURN(std::string dir, storage::resolve_checkpoint_dir(path));
  H5CKPT_ASSIGN_OR_RETURN(std::string json,
                          storage::read_whole_file((fs::path(dir) / storage::kMetadataFileName).string()));
  return std::make_pair(dir, json);
}

// Loads one item on this rank.
Status load_item(const CheckpointInfo& info, storage::RegionReader& reader, StateItem& item,
                 const LoadOptions& options, std::vector<std::string>& missing) {
  H5CKPT_RETURN_IF_ERROR(item.shard.validate(item.global_shape));
  if (item.shard.numel() > 0 && item.data == nullptr)
    return Status(ErrorCode::kInvalidArgument, "null buffer for a non-empty shard");
  if (item.device != Device::kHost)
    return Status(ErrorCode::kUnsupported, "device buffers need the CUDA staging build");
  const TensorInfo* t = info.find(item.key);
  if (!t) {
    if (!options.strict) {
      missing.push_back(item.key);
      return Status::Ok();
    }
    return Status(ErrorCode::kNotFound, "not in the checkpoint");
  }
  if (t->dtype != item.dtype &&
      !(options.convert_dtype && dtype_is_float(t->dtype) && dtype_is_float(item.dtype)))
    return Status(ErrorCode::kDtypeMismatch, std::string("checkpoint holds ") + dtype_name(t->dtype) +
                                                 ", the state wants " + dtype_name(item.dtype));
  Box readable{Shape(t->shape.size(), 0), t->shape};
  if (t->shape != item.global_shape) {
    if (!item.allow_shape_mismatch || t->shape.size() != item.global_shape.size())
      return Status(ErrorCode::kShapeMismatch, "checkpoint has global shape " + to_string_shape(t->shape) +
                                                   ", the state wants " + to_string_shape(item.global_shape));
    // Padded vocabularies: copy the common part, zero the rest, drop the surplus.
    for (size_t d = 0; d < t->shape.size(); ++d) readable.shape[d] = std::min(t->shape[d], item.global_shape[d]);
    std::memset(item.data, 0, static_cast<size_t>(item.shard.numel()) * dtype_size(item.dtype));
  }
  const planner::Frame frame = planner::frame_of(item.shard);
  for (const Box& want : planner::shard_boxes(item.shard)) {
    auto part = planner::intersect(want, readable);
    if (!part) continue;
    H5CKPT_RETURN_IF_ERROR(reader.read(*t, *part, frame, item.dtype, item.data));
  }
  return Status::Ok();
}

}  // namespace

Result<LoadReport> load(const Topology::Impl& topo, StateDict& state, const std::string& path,
                        const LoadOptions& options) {
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

  // Phase 2: every rank opens the data file and validates the metadata against its size.
  Status local;
  std::optional<storage::RegionReader> reader;
  CheckpointInfo info;
  {
    auto r = storage::RegionReader::open((fs::path(report.path) / storage::kDataFileName).string());
    if (!r.ok()) {
      local = r.status();
    } else {
      reader.emplace(std::move(r).value());
      auto parsed = storage::metadata_from_json(json, reader->file_size());
      if (parsed.ok()) info = std::move(parsed).value();
      else local = parsed.status();
    }
  }
  H5CKPT_RETURN_IF_ERROR(comm::agree(local, world).with_context("load '" + report.path + "'"));
  const double t_plan = now_s();
  report.plan_s = t_plan - t0;

  if (options.verify_checksums) {
    info.data_file = (fs::path(report.path) / storage::kDataFileName).string();
    local = verify_checkpoint(info, topo.world.rank(), topo.world.size());
    H5CKPT_RETURN_IF_ERROR(comm::agree(local, world).with_context("load '" + report.path + "'"));
  }

  // Phase 3: each rank reads what it wants; errors name the key.
  for (auto& item : state.items()) {
    local = load_item(info, *reader, item, options, report.missing_keys);
    if (!local.ok()) {
      local = local.with_context("key '" + item.key + "'");
      break;
    }
  }
  report.bytes_read = reader->bytes_read();
  H5CKPT_RETURN_IF_ERROR(comm::agree(local, world).with_context("load '" + report.path + "'"));
  const double t_end = now_s();
  report.read_s = t_end - t_plan;
  report.total_s = t_end - t0;
  metrics::log().info("loaded '{}': {} bytes read here in {:.3f}s", report.path, report.bytes_read, report.read_s);
  return report;
}

}  // namespace h5ckpt::engine
