#include "h5ckpt/checkpointer.h"

#include <algorithm>
#include <filesystem>

#include "engine/engine.h"
#include "storage/commit.h"
#include "storage/metadata.h"
#include "storage/region_reader.h"
#include "util/checked_math.h"

namespace h5ckpt {

struct Checkpointer::Impl {
  const Topology* topology;
  engine::PlanCache plan_cache;
  std::map<std::string, std::string> attributes;
};

Checkpointer::Checkpointer(const Topology& topology) : impl_(std::make_unique<Impl>()) {
  impl_->topology = &topology;
}
Checkpointer::~Checkpointer() = default;

Result<SaveReport> Checkpointer::save(const StateDict& state, const std::string& path, const SaveOptions& options) {
  return engine::save(impl_->topology->impl(), state, path, options, impl_->attributes, impl_->plan_cache);
}

Result<LoadReport> Checkpointer::load(StateDict& state, const std::string& path, const LoadOptions& options) {
  return engine::load(impl_->topology->impl(), state, path, options);
}

void Checkpointer::set_attribute(const std::string& name, const std::string& value) {
  impl_->attributes[name] = value;
}

const TensorInfo* CheckpointInfo::find(const std::string& key) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), key,
                             [](const TensorInfo& t, const std::string& k) { return t.key < k; });
  return it != tensors.end() && it->key == key ? &*it : nullptr;
}

uint64_t CheckpointInfo::total_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors) n += t.nbytes;
  return n;
}

Result<CheckpointInfo> read_checkpoint_info(const std::string& path) {
  namespace fs = std::filesystem;
  H5CKPT_ASSIGN_OR_RETURN(std::string dir, storage::resolve_checkpoint_dir(path));
  H5CKPT_ASSIGN_OR_RETURN(std::string json,
                          storage::read_whole_file((fs::path(dir) / storage::kMetadataFileName).string()));
  const std::string data = (fs::path(dir) / storage::kDataFileName).string();
  H5CKPT_ASSIGN_OR_RETURN(auto reader, storage::RegionReader::open(data));
  H5CKPT_ASSIGN_OR_RETURN(CheckpointInfo info, storage::metadata_from_json(json, reader.file_size()));
  info.path = dir;
  info.data_file = fs::absolute(data).string();
  return info;
}

Status verify_checkpoint(const CheckpointInfo& info, int part, int nparts) {
  H5CKPT_ASSIGN_OR_RETURN(auto reader, storage::RegionReader::open(info.data_file));
  std::vector<char> buf;
  int64_t index = 0;
  for (const auto& t : info.tensors) {
    for (size_t r = 0; r < t.regions.size(); ++r, ++index) {
      const SavedRegion& reg = t.regions[r];
      if (index % nparts != part || reg.checksum == 0) continue;
      buf.resize(static_cast<size_t>(reg.shard.numel()) * dtype_size(t.dtype));
      const planner::Frame frame = planner::frame_of(reg.shard);
      for (const Box& b : planner::shard_boxes(reg.shard))
        H5CKPT_RETURN_IF_ERROR(reader.read(t, b, frame, t.dtype, buf.data()));
      if (storage::checksum_bytes(buf.data(), buf.size()) != reg.checksum)
        return Status(ErrorCode::kCorrupt, "checksum mismatch in tensor '" + t.key + "' region " + std::to_string(r) +
                                               " (" + to_string_spec(reg.shard) + ", written by rank " +
                                               std::to_string(reg.writer_rank) + ")");
    }
  }
  return Status::Ok();
}

const char* version() { return H5CKPT_VERSION; }

}  // namespace h5ckpt
