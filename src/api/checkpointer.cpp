#include "h5ckpt/checkpointer.h"

#include <algorithm>
#include <filesystem>
#include <mutex>

#include "engine/async_saver.h"
#include "engine/engine.h"
#include "metrics/log.h"
#include "storage/commit.h"
#include "storage/metadata.h"
#include "storage/region_reader.h"
#include "planner/box_math.h"
#include "util/checked_math.h"

namespace h5ckpt {

struct Checkpointer::Impl {
  Impl(const Topology& t, const CheckpointerOptions& o) : topology(&t), options(o), async(t.impl(), o, pool) {}
  const Topology* topology;
  CheckpointerOptions options;
  engine::PlanCache plan_cache;
  engine::LoadPlanCache load_cache;
  std::map<std::string, std::string> attributes;
  engine::StagingPool pool;  // declared before `async`, which uses it until it is destroyed
  engine::DeviceLink device_link;
  engine::AsyncSaver async;
};

Checkpointer::Checkpointer(const Topology& topology, const CheckpointerOptions& options)
    : impl_(std::make_unique<Impl>(topology, options)) {}
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

Result<SaveReport> Checkpointer::save(const StateDict& state, const std::string& path, const SaveOptions& options) {
  wait_pending();
  return engine::save(impl_->topology->impl(), state, path, options, impl_->attributes, impl_->plan_cache,
                      impl_->options, impl_->pool);
}

Result<SaveHandle> Checkpointer::save_async(const StateDict& state, const std::string& path,
                                            const SaveOptions& options) {
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
    return SaveHandle(done);
  }
  return impl_->async.start(state, path, options, impl_->attributes, impl_->plan_cache);
}

Result<LoadReport> Checkpointer::load(StateDict& state, const std::string& path, const LoadOptions& options) {
  wait_pending();
  auto r = engine::load(impl_->topology->impl(), state, path, options, impl_->options, impl_->load_cache,
                        impl_->pool, impl_->device_link);
  if (r.ok()) engine::record_metrics(impl_->topology->impl(), impl_->options, *r);
  return r;
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
