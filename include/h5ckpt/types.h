// Value types describing tensors and the part of a tensor a rank holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "h5ckpt/export.h"
#include "h5ckpt/status.h"

namespace h5ckpt {

/// Element types a checkpoint can hold. bf16 and fp8 e5m2 are stored as HDF5 custom floats
/// (h5dump prints their values); fp8 e4m3fn and bool as uint8 with a dtype attribute.
enum class DType : uint8_t {
  kF32,
  kF64,
  kF16,
  kBF16,
  kF8E4M3,
  kF8E5M2,
  kI8,
  kI16,
  kI32,
  kI64,
  kU8,
  kBool,
};

/// Bytes per element.
H5CKPT_API size_t dtype_size(DType t);
/// Canonical name used in metadata and the CLI: "f32", "bf16", "f8e4m3", ...
H5CKPT_API const char* dtype_name(DType t);
/// Inverse of dtype_name; also accepts common aliases ("float32", "bfloat16").
H5CKPT_API Result<DType> dtype_from_name(const std::string& name);
/// True for the floating-point types (conversion between them is allowed on load).
H5CKPT_API bool dtype_is_float(DType t);

using Shape = std::vector<int64_t>;

/// An n-D box: origin and extent per dimension (a hyperslab with unit stride).
struct H5CKPT_API Box {
  Shape offset;
  Shape shape;

  size_t ndim() const { return shape.size(); }
  /// Number of elements (product of the extents).
  int64_t volume() const;
  bool operator==(const Box&) const = default;
};

/// What part of a tensor's global shape one rank holds.
///
/// The rank's buffer is always contiguous: for a box, the box's elements in row-major order;
/// for a flat range, elements [flat_begin, flat_end) of the row-major flattening of `box`
/// (ZeRO / distributed-optimizer shards, FSDP flat parameters).
struct H5CKPT_API ShardSpec {
  Box box;
  std::optional<std::pair<int64_t, int64_t>> flat;  ///< [begin, end) within box's flattening

  /// The whole tensor (a replicated item).
  static ShardSpec whole(const Shape& global_shape);
  /// An explicit box.
  static ShardSpec box_of(Shape offset, Shape shape);
  /// Split dimension `dim` of `global_shape` into `parts` near-equal parts and take part
  /// `index` (the first `n % parts` parts get one extra element, so uneven splits work).
  static ShardSpec split(const Shape& global_shape, int dim, int parts, int index);
  /// Elements [begin, end) of the row-major flattening of `box`.
  static ShardSpec flat_range(Box box, int64_t begin, int64_t end);

  /// Element count of this rank's buffer.
  int64_t numel() const;
  /// Checks the spec against a global shape; the message names what is wrong.
  Status validate(const Shape& global_shape) const;
  bool operator==(const ShardSpec&) const = default;
};

/// Where a buffer lives. Device memory goes through the staging seam.
enum class Device : uint8_t { kHost, kCuda };

}  // namespace h5ckpt
