// DType names/sizes and ShardSpec factories and validation.
#include "h5ckpt/types.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "util/checked_math.h"
#include "util/shard_bounds.h"

namespace h5ckpt {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF64:
    case DType::kI64: return 8;
    case DType::kF32:
    case DType::kI32: return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16: return 2;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kI8:
    case DType::kU8:
    case DType::kBool: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kF8E4M3: return "f8e4m3";
    case DType::kF8E5M2: return "f8e5m2";
    case DType::kI8: return "i8";
    case DType::kI16: return "i16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
    case DType::kBool: return "bool";
  }
  return "?";
}

Result<DType> dtype_from_name(const std::string& name) {
  static const std::map<std::string, DType> kNames = {{"f32", DType::kF32},       {"float32", DType::kF32},
                                                      {"f64", DType::kF64},       {"float64", DType::kF64},
                                                      {"f16", DType::kF16},       {"float16", DType::kF16},
                                                      {"bf16", DType::kBF16},     {"bfloat16", DType::kBF16},
                                                      {"f8e4m3", DType::kF8E4M3}, {"float8_e4m3fn", DType::kF8E4M3},
                                                      {"f8e5m2", DType::kF8E5M2}, {"float8_e5m2", DType::kF8E5M2},
                                                      {"i8", DType::kI8},         {"int8", DType::kI8},
                                                      {"i16", DType::kI16},       {"int16", DType::kI16},
                                                      {"i32", DType::kI32},       {"int32", DType::kI32},
                                                      {"i64", DType::kI64},       {"int64", DType::kI64},
                                                      {"u8", DType::kU8},         {"uint8", DType::kU8},
                                                      {"bool", DType::kBool}};
  auto it = kNames.find(name);
  if (it == kNames.end()) return Status(ErrorCode::kInvalidArgument, "unknown dtype '" + name + "'");
  return it->second;
}

bool dtype_is_float(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF64:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8E4M3:
    case DType::kF8E5M2: return true;
    default: return false;
  }
}

int64_t Box::volume() const {
  int64_t v = 1;
  for (int64_t s : shape) v *= s;
  return v;
}

ShardSpec ShardSpec::whole(const Shape& global_shape) {
  return ShardSpec{Box{Shape(global_shape.size(), 0), global_shape}, std::nullopt};
}

ShardSpec ShardSpec::box_of(Shape offset, Shape shape) {
  return ShardSpec{Box{std::move(offset), std::move(shape)}, std::nullopt};
}

ShardSpec ShardSpec::split(const Shape& global_shape, int dim, int parts, int index) {
  ShardSpec s = whole(global_shape);
  // Invalid arguments give an invalid spec that validate() reports, rather than UB here.
  if (dim < 0 || dim >= static_cast<int>(global_shape.size()) || parts <= 0 || index < 0 || index >= parts) {
    s.box.shape.assign(global_shape.size(), -1);
    return s;
  }
  const int64_t n = global_shape[dim];
  const int64_t base = n / parts, extra = n % parts;
  s.box.offset[dim] = index * base + std::min<int64_t>(index, extra);
  s.box.shape[dim] = base + (index < extra ? 1 : 0);
  return s;
}

ShardSpec ShardSpec::flat_range(Box box, int64_t begin, int64_t end) {
  return ShardSpec{std::move(box), std::make_pair(begin, end)};
}

int64_t ShardSpec::numel() const {
  if (flat) return flat->second - flat->first;
  return box.volume();
}

std::string shard_problem(std::span<const int64_t> global_shape, std::span<const int64_t> offset,
                          std::span<const int64_t> shape, const std::pair<int64_t, int64_t>* flat) {
  if (global_shape.empty()) return "tensors need at least one dimension";
  if (global_shape.size() > kMaxDims) return "more than 32 dimensions";
  if (offset.size() != global_shape.size() || shape.size() != global_shape.size())
    return "box rank differs from tensor rank";
  int64_t vol = 1;
  for (size_t d = 0; d < global_shape.size(); ++d) {
    if (global_shape[d] < 0) return "negative global extent";
    if (offset[d] < 0 || shape[d] < 0) return "negative box offset or extent";
    if (offset[d] > global_shape[d] || shape[d] > global_shape[d] - offset[d])
      return "box outside the global shape in dimension " + std::to_string(d);
    if (!checked_mul(vol, shape[d], &vol)) return "element count overflows";
  }
  if (flat && (flat->first < 0 || flat->second < flat->first || flat->second > vol))
    return "flat range outside the box's " + std::to_string(vol) + " elements";
  return {};
}

Status ShardSpec::validate(const Shape& global_shape) const {
  const std::string why = shard_problem(global_shape, box.offset, box.shape, flat ? &*flat : nullptr);
  if (why.empty()) return Status::Ok();
  std::ostringstream os;
  os << "shard " << to_string_spec(*this) << " of global shape " << to_string_shape(global_shape) << ": " << why;
  return Status(ErrorCode::kInvalidArgument, os.str());
}

}  // namespace h5ckpt
