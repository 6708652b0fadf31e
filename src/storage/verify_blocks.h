// Verification blocks of a saved region (format: SavedRegion::block_bytes / block_checksums).
// A region's canonical byte stream (row-major over its box, or its flat range) is cut every
// block_bytes bytes; block_bytes is a whole number of the region's outermost slabs, so a read of
// any rows of the region widens to whole blocks by rows. Each block's xxh3 is seeded with the
// region's identity (key, dtype, global shape, region) and the block index, so bytes that are
// intact but relabelled (another dtype, another key, swapped offsets) fail the check too.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "h5ckpt/checkpoint_info.h"
#include "storage/auth.h"
#include "planner/box_math.h"

namespace h5ckpt::planner {
class RegionIndex;
}

namespace h5ckpt::storage {

/// Target block size: small enough that widening a read to blocks costs little, large enough
/// that the checksums stay a small fraction of the metadata (8 bytes per MiB).
inline constexpr uint64_t kVerifyBlockTarget = 1ull << 20;

/// Bytes of one outermost slab of a region's canonical stream: the row of the box below its
/// first dimension, or one element for a flat range (which has no rows).
uint64_t region_slab_bytes(const ShardSpec& region, DType dtype);

/// The block size a save uses for a region: whole slabs, about `target` bytes, at least one slab.
uint64_t choose_block_bytes(const ShardSpec& region, DType dtype, uint64_t target = kVerifyBlockTarget);

/// The largest block size a reader accepts: a save chooses at most max(slab, target), so anything
/// larger in an index is a lie (and could make signed element counts negative).
inline uint64_t max_block_bytes(uint64_t slab_bytes) { return slab_bytes > (1ull << 30) ? slab_bytes : 1ull << 30; }

/// Number of blocks of a region of `region_bytes` bytes: ceil(region / block), without the
/// overflow of (region + block - 1) that would let a huge block size wrap to zero blocks.
inline uint64_t block_count(uint64_t region_bytes, uint64_t block_bytes) {
  return block_bytes == 0 ? 0 : region_bytes / block_bytes + (region_bytes % block_bytes != 0 ? 1 : 0);
}

/// The seed of a region's blocks: binds the bytes to what they mean.
uint64_t region_identity(const std::string& key, DType dtype, const Shape& shape, const ShardSpec& region);

/// The seed of block `block_index` of a stream with `identity` (block_checksum's seed; a
/// BlockHasher given it as identity hashes that one block as its block 0).
inline uint64_t block_seed(uint64_t identity, uint64_t block_index) {
  return identity ^ (block_index * 0x9E3779B97F4A7C15ull);
}

/// xxh3 of one block.
uint64_t block_checksum(uint64_t identity, uint64_t block_index, const void* data, uint64_t size);

/// Hashes a region's canonical stream as it arrives in pieces, block by block.
class BlockHasher {
 public:
  BlockHasher(uint64_t identity, uint64_t block_bytes, uint64_t region_bytes);
  ~BlockHasher();
  BlockHasher(const BlockHasher&) = delete;
  BlockHasher& operator=(const BlockHasher&) = delete;
  void update(const void* data, uint64_t size);
  /// The checksums of every block; all of the region's bytes must have arrived.
  std::vector<uint64_t> finish();

 private:
  void start_block();
  uint64_t identity_, block_bytes_, region_bytes_, seen_ = 0, in_block_ = 0;
  void* state_;                     // XXH3_state_t
  std::optional<auth::Tag64> mac_;  // instead, with a key configured
  std::vector<uint64_t> sums_;
};

/// How a load checks a region: the blocks it records, or, for format v1 files, the whole region
/// as one block with its unseeded region checksum. `verified` is false for regions saved
/// without checksums.
struct RegionBlocks {
  bool verified = false;
  bool seeded = true;  ///< false: v1 whole-region checksum (seed 0)
  uint64_t identity = 0;
  uint64_t block_bytes = 0;
  const std::vector<uint64_t>* sums = nullptr;
  uint64_t v1_sum = 0;
  uint64_t expected(uint64_t block) const { return seeded ? (*sums)[block] : v1_sum; }
};
RegionBlocks region_blocks(const TensorInfo& t, const SavedRegion& r);

/// Whether a verified region's blocks fit it: a block size that is a whole number of elements, no
/// larger than a save writes, and (seeded blocks) exactly ceil(region bytes / block bytes) sums.
bool blocks_fit(const TensorInfo& t, const SavedRegion& r, const RegionBlocks& rb);

/// A part of one saved region's canonical stream, in elements [begin, end): for a verified
/// region whole blocks, which a read loads, checks and then copies the wanted part out of.
struct CheckedSpan {
  size_t region = 0;
  int64_t begin = 0, end = 0;
  bool verified = false;  ///< false: the region has no checksums (read just the wanted part)
  uint64_t widened = 0;   ///< bytes in the span that the wanted box does not need
};

/// The spans of `t`'s regions that a read of `want` (global coordinates) touches, widened to
/// whole blocks, in region order. Fails (kCorrupt) when a region's blocks do not fit it. `index`
/// (of `t`'s regions, see RegionLookup) finds the regions without testing each: a ZeRO-sharded
/// tensor of a large job has hundreds, a load tests them for every box it reads. The result is
/// the same with or without it.
Result<std::vector<CheckedSpan>> checked_spans(const TensorInfo& t, const Box& want,
                                               const planner::RegionIndex* index = nullptr);

/// The boxes (global coordinates) whose row-major concatenation is the span's bytes.
std::vector<Box> span_boxes(const TensorInfo& t, const CheckedSpan& span);

/// The layout of a buffer holding the span's bytes.
planner::Frame span_frame(const TensorInfo& t, const CheckedSpan& span);

/// Checks every block of `span` held in `bytes` (stored dtype); the error names tensor, region,
/// writer and block.
Status check_span(const TensorInfo& t, const CheckedSpan& span, const char* bytes);

/// Copies the part of `want` inside `span` from `bytes` into `dst` laid out as `frame`, converting
/// to `dst_type` (a float-to-float conversion when it differs; checked by the caller).
void copy_span_out(const TensorInfo& t, const CheckedSpan& span, const char* bytes, const Box& want,
                   const planner::Frame& frame, DType dst_type, void* dst);

}  // namespace h5ckpt::storage
