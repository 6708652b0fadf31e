// Pure save planning: from what every rank holds to who writes what (no MPI, no HDF5).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "h5ckpt/status.h"
#include "h5ckpt/types.h"

namespace h5ckpt::planner {

/// One item as a rank describes it for planning.
struct ItemDesc {
  std::string key;
  DType dtype = DType::kF32;
  Shape global_shape;
  ShardSpec shard;
  /// Another piece of the previous description's item (StateItem::pieces): the same key again
  /// on this rank, which is otherwise an error.
  bool continues = false;
  /// Local only (not sent to the coordinator): the rank's item whose buffer holds the bytes
  /// (-1: the description's own index) and where the shard's first element is in that buffer.
  int source = -1;
  uint64_t buffer_offset = 0;
};

/// One item's description as the coordinator plans it: its key viewed in a message
/// (wire::decode_gathered_items) or an ItemDesc, and its extents in a buffer of the caller's, which
/// must outlive the planning. 40 bytes and no heap memory of its own, where an ItemDesc has four
/// blocks: decoding the 3.5 million items of a 405B save at 8,960 ranks into ItemDescs cost 14
/// million allocations, and on a VM every fresh page costs a trap to the host.
struct ItemView {
  std::string_view key;
  /// The global shape, the box's offset and extents, then (when `flat`) the flat range's begin
  /// and end. A replica's view may share the extents of the item it copies.
  const int64_t* dims = nullptr;
  uint16_t global_ndim = 0, offset_ndim = 0, shape_ndim = 0;
  DType dtype = DType::kF32;
  bool flat = false;
  bool continues = false;

  /// The most extents one view counts (a larger count is refused, not truncated).
  static constexpr size_t kMaxCount = UINT16_MAX;

  std::span<const int64_t> global_shape() const { return {dims, global_ndim}; }
  std::span<const int64_t> offset() const { return {dims + global_ndim, offset_ndim}; }
  std::span<const int64_t> shape() const { return {dims + global_ndim + offset_ndim, shape_ndim}; }
  int64_t flat_begin() const { return flat ? dims[global_ndim + offset_ndim + shape_ndim] : 0; }
  int64_t flat_end() const { return flat ? dims[global_ndim + offset_ndim + shape_ndim + 1] : 0; }
  /// How many int64 `dims` holds.
  size_t extents() const { return size_t{global_ndim} + offset_ndim + shape_ndim + (flat ? 2 : 0); }
  /// Same global shape, box and flat range; views sharing their extents are told so by pointer.
  bool same_extents(const ItemView& o) const {
    if (global_ndim != o.global_ndim || offset_ndim != o.offset_ndim || shape_ndim != o.shape_ndim || flat != o.flat)
      return false;
    return dims == o.dims || std::equal(dims, dims + extents(), o.dims);
  }

  /// A view of `d` whose extents are appended to `dims`, which must not reallocate while the view
  /// is used (reserve the sum of the items' extents()); kInvalidArgument when a count is above
  /// kMaxCount.
  static Result<ItemView> of(const ItemDesc& d, std::vector<int64_t>& dims);
  /// Copies (for messages and the rare paths that need a ShardSpec or a description).
  ShardSpec shard() const;
  ItemDesc desc() const;
};

/// A unique saved region of a tensor and the rank chosen to write it: elements [begin, end) of
/// the row-major order of one of the tensor's distinct boxes (TensorPlan::boxes; all of them,
/// begin 0 and end its volume, when the shard has no flat range). 24 bytes and no heap memory of
/// its own: a 405B save plan holds 1.45 million regions on 120,000 distinct boxes (the TP
/// shards; ZeRO's flat ranges share them), and on a VM each fresh page costs a trap to the host.
struct PlannedRegion {
  int64_t begin = 0, end = 0;
  uint32_t box : 31 = 0;  ///< index into the tensor's boxes
  uint32_t flat : 1 = 0;  ///< the shard is a flat range of its box (ShardSpec::flat set)
  int32_t writer = -1;

  int64_t numel() const { return end - begin; }
};

/// One dataset of the checkpoint.
struct TensorPlan {
  std::string key;
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<Box> boxes;              ///< the distinct boxes of the regions
  std::vector<PlannedRegion> regions;  ///< disjoint, covering the whole tensor

  /// Bytes of the whole dataset (the planner has checked the product does not overflow).
  uint64_t nbytes() const {
    uint64_t n = dtype_size(dtype);
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
  }
  const Box& box_of(size_t region) const { return boxes[regions[region].box]; }
  /// Region `region` as a ShardSpec (a copy of its box: two allocations).
  ShardSpec shard(size_t region) const;
  /// Whether region `region` is exactly `s` (box and flat range, as ShardSpec's ==).
  bool holds(size_t region, const ShardSpec& s) const;
  /// Appends the region `s` written by `writer`, numbering its box among `boxes` by a linear
  /// search (latest first): for small plans. plan_save and the wire decoding number boxes by hash.
  void add_region(const ShardSpec& s, int writer);
};

/// One write a rank performs, as plain data: a region of the plan, or a flat sub-range of its
/// box when the region is larger than the piece limit. The dataset's file offset is known only
/// once HDF5 has created it, so the engine looks it up by `tensor`.
struct WriteItem {
  int tensor = -1;          ///< index into the plan's tensors
  int region = -1;          ///< index into that tensor's regions
  int item = -1;            ///< index into the writer's own items: the source buffer
  ShardSpec box;            ///< the elements written (in the dataset's global coordinates)
  uint64_t src_offset = 0;  ///< byte offset of the first element in the source buffer
  uint64_t bytes = 0;
  bool region_end = true;  ///< the last write of its region (the region's checksum is complete)
};

/// Each rank derives its own writes from `tensors` with plan_writes (the coordinator does not
/// list them: at 10,000 ranks that list alone would cost it more than the plan).
struct SavePlan {
  std::vector<TensorPlan> tensors;      ///< sorted by key
  std::vector<uint64_t> bytes_by_rank;  ///< bytes each rank writes
};

/// Checks a key's syntax: non-empty, letters/digits/"_.-/", no empty component, not under "meta".
Status validate_key(std::string_view key);

/// Builds the global save plan from every rank's item list (index = rank).
/// Checks: keys valid and unique per rank, shards inside their shapes, dtype and global shape
/// agree across ranks, no key is a group prefix of another, regions are identical or disjoint,
/// and they cover each tensor completely. Identical regions (replicas) are written once, each
/// by one of its holders chosen worst-fit by bytes so the write work is balanced.
Result<SavePlan> plan_save(std::span<const std::span<const ItemView>> ranks);
/// The same plan from descriptions (viewed, not copied).
Result<SavePlan> plan_save(const std::vector<std::vector<ItemDesc>>& ranks);
/// The writes of `rank` in a global plan: every region it was chosen to write, found through its
/// own `items` (O(items x log tensors + their tensors' regions), not O(every region)), in plan
/// order (tensor, region, offset), each at most `max_bytes` (regions above that become consecutive
/// flat sub-ranges). An item whose key the plan lacks, or a region chosen for this rank that
/// differs from its item, is a planning bug and reported as kInternal. (plan_save chooses writers
/// among a region's holders only, so a region of a key the rank does not hold is never its.)
Result<std::vector<WriteItem>> plan_writes(int rank, const std::vector<TensorPlan>& tensors,
                                           const std::vector<ItemDesc>& items, uint64_t max_bytes);

}  // namespace h5ckpt::planner
