// CheckpointReader (h5ckpt/reader.h): the public face of RegionReader over a validated checkpoint.
#include <cstring>
#include <utility>

#include "h5ckpt/reader.h"
#include "storage/region_reader.h"
#include "util/dtype_convert.h"

namespace h5ckpt {

struct CheckpointReader::Impl {
  explicit Impl(storage::OpenedCheckpoint opened)
      : info(std::move(opened.info)), file(std::move(opened.reader)), lookup(info) {
    file.set_lookup(&lookup);
  }
  CheckpointInfo info;
  storage::RegionReader file;
  storage::RegionLookup lookup;  // over `info`, which never changes: the regions each read touches
};

namespace {

// The tensor a read names, once the request is checked against it (before any byte is read).
Result<const TensorInfo*> checked_tensor(const CheckpointInfo& info, const std::string& key, const ShardSpec& shard,
                                         DType dst_dtype, const void* dst) {
  const TensorInfo* t = info.find(key);
  if (!t) return Status(ErrorCode::kNotFound, "checkpoint '" + info.path + "' has no tensor '" + key + "'");
  H5CKPT_RETURN_IF_ERROR(shard.validate(t->shape).with_context("key '" + key + "'"));
  if (t->dtype != dst_dtype && !(dtype_is_float(t->dtype) && dtype_is_float(dst_dtype)))
    return Status(ErrorCode::kDtypeMismatch, "key '" + key + "': cannot convert the stored " + dtype_name(t->dtype) +
                                                 " to " + dtype_name(dst_dtype));
  if (shard.numel() > 0 && dst == nullptr)
    return Status(ErrorCode::kInvalidArgument, "key '" + key + "': null destination buffer");
  return t;
}

}  // namespace

CheckpointReader::CheckpointReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointReader::CheckpointReader(CheckpointReader&& other) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&& other) noexcept = default;
CheckpointReader::~CheckpointReader() = default;

Result<CheckpointReader> CheckpointReader::open(const std::string& path) {
  H5CKPT_ASSIGN_OR_RETURN(storage::OpenedCheckpoint opened, storage::open_checkpoint(path));
  return CheckpointReader(std::make_unique<Impl>(std::move(opened)));
}

const CheckpointInfo& CheckpointReader::info() const { return impl_->info; }

std::vector<std::string> CheckpointReader::keys() const {
  std::vector<std::string> out;
  out.reserve(impl_->info.tensors.size());
  for (const auto& t : impl_->info.tensors) out.push_back(t.key);
  return out;
}

const TensorInfo* CheckpointReader::find(const std::string& key) const { return impl_->info.find(key); }

uint64_t CheckpointReader::bytes_read() const { return impl_->file.bytes_read(); }

Status CheckpointReader::read(const std::string& key, const Box& box, DType dst_dtype, void* dst) {
  return read_shard(key, ShardSpec::box_of(box.offset, box.shape), dst_dtype, dst);
}

Status CheckpointReader::read_shard(const std::string& key, const ShardSpec& shard, DType dst_dtype, void* dst) {
  H5CKPT_ASSIGN_OR_RETURN(const TensorInfo* t, checked_tensor(impl_->info, key, shard, dst_dtype, dst));
  return impl_->file.read_shard(*t, shard, dst_dtype, dst);
}

Status convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  if (n > 0 && (src == nullptr || dst == nullptr))
    return Status(ErrorCode::kInvalidArgument, "convert_elements: null buffer");
  if (src_dtype == dst_dtype) {
    if (n > 0) std::memmove(dst, src, n * dtype_size(src_dtype));
    return Status::Ok();
  }
  if (!detail::convert_elements(src, src_dtype, dst, dst_dtype, n))
    return Status(ErrorCode::kDtypeMismatch, std::string("cannot convert ") + dtype_name(src_dtype) + " to " +
                                                 dtype_name(dst_dtype) + " (float types only)");
  return Status::Ok();
}

}  // namespace h5ckpt
