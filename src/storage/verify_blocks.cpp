#include "storage/verify_blocks.h"

#include <xxhash.h>
#if H5CKPT_XXH3_DISPATCH
#define XXH_DISPATCH_DISABLE_REPLACE  // the dispatched entry points are called by name below
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>
#include <cstring>

#include "planner/region_index.h"
#include "storage/auth.h"
#include "util/checked_math.h"
#include "util/dtype_convert.h"

namespace h5ckpt::storage {

namespace {
// The block sums through xxHash's own run-time dispatch where the library has it (its x86-64
// builds): the same XXH3 values, computed with the widest vector unit the CPU has (AVX2,
// AVX-512). The plain entry points are built for baseline x86-64: on the 2-core VM (AVX2) they
// hashed a block in cache at 8 GB/s against 23-27 dispatched (from memory 5-6 against 8), and
// every verified byte of a save, a load and a transfer goes through here.
#if H5CKPT_XXH3_DISPATCH
uint64_t xxh3(const void* data, uint64_t size) { return XXH3_64bits_dispatch(data, size); }
uint64_t xxh3_seeded(const void* data, uint64_t size, uint64_t seed) {
  return XXH3_64bits_withSeed_dispatch(data, size, seed);
}
void xxh3_update(XXH3_state_t* state, const void* data, uint64_t size) {
  (void)XXH3_64bits_update_dispatch(state, data, size);
}
// The dispatch picks its implementation on its first call and stores it in a table of its own
// without synchronization; the checking threads would race to fill it. So it is filled here,
// once, as the library is loaded, before any thread of ours hashes.
[[maybe_unused]] const bool dispatch_chosen = [] {
  (void)XXH3_64bits_dispatch("", 0);
  return true;
}();
#else
uint64_t xxh3(const void* data, uint64_t size) { return XXH3_64bits(data, size); }
uint64_t xxh3_seeded(const void* data, uint64_t size, uint64_t seed) { return XXH3_64bits_withSeed(data, size, seed); }
void xxh3_update(XXH3_state_t* state, const void* data, uint64_t size) { (void)XXH3_64bits_update(state, data, size); }
#endif
}  // namespace

uint64_t region_slab_bytes(const ShardSpec& region, DType dtype) {
  uint64_t slab = dtype_size(dtype);
  if (region.flat) return slab;
  for (size_t d = 1; d < region.box.shape.size(); ++d) slab *= static_cast<uint64_t>(region.box.shape[d]);
  return std::max<uint64_t>(slab, 1);
}

uint64_t choose_block_bytes(const ShardSpec& region, DType dtype, uint64_t target) {
  const uint64_t slab = region_slab_bytes(region, dtype);
  return std::max<uint64_t>(1, target / slab) * slab;
}

uint64_t region_identity(const std::string& key, DType dtype, const Shape& shape, const ShardSpec& region) {
  std::string id = key;
  id += '\0';
  id += dtype_name(dtype);
  id += '\0';
  id += to_string_shape(shape);
  id += '\0';
  id += to_string_spec(region);
  return XXH3_64bits(id.data(), id.size());
}

uint64_t block_checksum(uint64_t identity, uint64_t block_index, const void* data, uint64_t size) {
  // The index is folded into the seed with a multiplier so neighbouring blocks get unrelated seeds.
  const uint64_t seed = identity ^ (block_index * 0x9E3779B97F4A7C15ull);
  return auth::enabled() ? auth::tag64(seed, data, size) : xxh3_seeded(data, size, seed);
}

BlockHasher::BlockHasher(uint64_t identity, uint64_t block_bytes, uint64_t region_bytes)
    : identity_(identity), block_bytes_(block_bytes), region_bytes_(region_bytes), state_(XXH3_createState()) {
  sums_.reserve(block_count(region_bytes, block_bytes));
  start_block();
}

BlockHasher::~BlockHasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void BlockHasher::start_block() {
  const uint64_t seed = identity_ ^ (static_cast<uint64_t>(sums_.size()) * 0x9E3779B97F4A7C15ull);
  if (auth::enabled()) mac_.emplace(seed);
  else XXH3_64bits_reset_withSeed(static_cast<XXH3_state_t*>(state_), seed);
  in_block_ = 0;
}

void BlockHasher::update(const void* data, uint64_t size) {
  auto* p = static_cast<const char*>(data);
  auto* st = static_cast<XXH3_state_t*>(state_);
  while (size > 0) {
    const uint64_t n = std::min(size, block_bytes_ - in_block_);
    if (mac_) mac_->update(p, n);
    else xxh3_update(st, p, n);
    p += n;
    size -= n;
    in_block_ += n;
    seen_ += n;
    if (in_block_ == block_bytes_) {
      sums_.push_back(mac_ ? mac_->final() : XXH3_64bits_digest(st));
      start_block();
    }
  }
}

std::vector<uint64_t> BlockHasher::finish() {
  if (in_block_ > 0) {
    sums_.push_back(mac_ ? mac_->final() : XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_)));
    start_block();
  }
  return std::move(sums_);
}

RegionBlocks region_blocks(const TensorInfo& t, const SavedRegion& r) {
  RegionBlocks b;
  const uint64_t bytes = static_cast<uint64_t>(r.shard.numel()) * dtype_size(t.dtype);
  // A block size means blocks: a region whose checksums are missing is not "unverified" but
  // corrupt, which checked_spans reports (the count must be exactly the region's).
  if (r.block_bytes != 0 || !r.block_checksums.empty()) {
    b.verified = true;
    b.identity = region_identity(t.key, t.dtype, t.shape, r.shard);
    b.block_bytes = r.block_bytes;
    b.sums = &r.block_checksums;
  } else if (r.checksum != 0) {
    b.verified = true;
    b.seeded = false;
    b.block_bytes = std::max<uint64_t>(bytes, 1);
    b.v1_sum = r.checksum;
  }
  return b;
}

bool blocks_fit(const TensorInfo& t, const SavedRegion& r, const RegionBlocks& rb) {
  const uint64_t es = dtype_size(t.dtype);
  const uint64_t region_bytes = static_cast<uint64_t>(r.shard.numel()) * es;
  return rb.block_bytes != 0 && rb.block_bytes % es == 0 &&
         rb.block_bytes <= max_block_bytes(region_slab_bytes(r.shard, t.dtype)) &&
         (!rb.seeded || rb.sums->size() == block_count(region_bytes, rb.block_bytes));
}

namespace {
std::string region_name(const TensorInfo& t, size_t i) {
  const SavedRegion& r = t.regions[i];
  return "tensor '" + t.key + "' region " + std::to_string(i) + " (" + to_string_spec(r.shard) + ", written by rank " +
         std::to_string(r.writer_rank) + ")";
}
}  // namespace

Result<std::vector<CheckedSpan>> checked_spans(const TensorInfo& t, const Box& want,
                                               const planner::RegionIndex* index) {
  std::vector<CheckedSpan> spans;
  const uint64_t es = dtype_size(t.dtype);
  // The regions to test: every one, or (with an index of this tensor's regions) the candidates
  // the index finds, in the same ascending order; the tests below decide either way.
  std::vector<size_t> candidates;
  if (index) index->find(want, &candidates, /*by_box=*/true);
  const size_t count = index ? candidates.size() : t.regions.size();
  for (size_t c = 0; c < count; ++c) {
    const size_t ri = index ? candidates[c] : c;
    const SavedRegion& reg = t.regions[ri];
    const Box& box = reg.shard.box;
    const auto hit = planner::intersect(want, box);
    if (!hit) continue;
    const int64_t n = reg.shard.numel();
    const int64_t f0 = reg.shard.flat ? reg.shard.flat->first : 0;
    // The part of the canonical stream the wanted box touches: whole rows of a box region, the
    // covering element range of a flat one.
    int64_t lo = 0, hi = n;
    if (!reg.shard.flat) {
      if (!box.shape.empty() && box.shape[0] > 0) {
        const int64_t slab = n / box.shape[0];
        lo = (hit->offset[0] - box.offset[0]) * slab;
        hi = (hit->offset[0] + hit->shape[0] - box.offset[0]) * slab;
      }
    } else {
      const planner::Frame whole{box, 0};
      Shape last = hit->offset;
      for (size_t d = 0; d < last.size(); ++d) last[d] += hit->shape[d] - 1;
      lo = std::max(whole.index_of(hit->offset), f0) - f0;
      hi = std::min(whole.index_of(last) + 1, reg.shard.flat->second) - f0;
    }
    if (lo >= hi) continue;
    const RegionBlocks rb = region_blocks(t, reg);
    if (!rb.verified) {
      spans.push_back({ri, lo, hi, false, 0});
      continue;
    }
    if (!blocks_fit(t, reg, rb))
      return Status(ErrorCode::kCorrupt, "verification blocks of " + region_name(t, ri) + " do not fit the region");
    const int64_t be = static_cast<int64_t>(rb.block_bytes / es);
    const int64_t b0 = lo / be * be, b1 = std::min((hi + be - 1) / be * be, n);
    spans.push_back({ri, b0, b1, true, static_cast<uint64_t>((b1 - b0) - (hi - lo)) * es});
  }
  return spans;
}

std::vector<Box> span_boxes(const TensorInfo& t, const CheckedSpan& span) {
  const ShardSpec& s = t.regions[span.region].shard;
  const int64_t f0 = s.flat ? s.flat->first : 0;
  return planner::decompose_flat(s.box, f0 + span.begin, f0 + span.end);
}

planner::Frame span_frame(const TensorInfo& t, const CheckedSpan& span) {
  const ShardSpec& s = t.regions[span.region].shard;
  return planner::Frame{s.box, (s.flat ? s.flat->first : 0) + span.begin};
}

Status check_span(const TensorInfo& t, const CheckedSpan& span, const char* bytes) {
  if (!span.verified) return Status::Ok();
  const SavedRegion& reg = t.regions[span.region];
  const RegionBlocks rb = region_blocks(t, reg);
  const uint64_t es = dtype_size(t.dtype);
  const int64_t n = reg.shard.numel(), be = static_cast<int64_t>(rb.block_bytes / es);
  for (int64_t b = span.begin / be; b * be < span.end; ++b) {
    const uint64_t off = static_cast<uint64_t>(b * be - span.begin) * es;
    const uint64_t len = static_cast<uint64_t>(std::min((b + 1) * be, n) - b * be) * es;
    const uint64_t sum =
        rb.seeded ? block_checksum(rb.identity, static_cast<uint64_t>(b), bytes + off, len) : xxh3(bytes + off, len);
    if (sum != rb.expected(static_cast<uint64_t>(b)))
      return Status(ErrorCode::kCorrupt, "checksum mismatch in " + region_name(t, span.region) + ", block " +
                                             std::to_string(b) + " (region bytes [" + std::to_string(b * be * es) +
                                             ", " + std::to_string(b * be * es + len) +
                                             ")): the data file does not hold what was saved");
  }
  return Status::Ok();
}

void copy_span_out(const TensorInfo& t, const CheckedSpan& span, const char* bytes, const Box& want,
                   const planner::Frame& frame, DType dst_type, void* dst) {
  const uint64_t es = dtype_size(t.dtype), ds = dtype_size(dst_type);
  auto* out = static_cast<char*>(dst);
  const planner::Frame src = span_frame(t, span);
  for (const Box& piece : span_boxes(t, span)) {
    const auto p = planner::intersect(piece, want);
    if (!p) continue;
    planner::for_each_run(*p, src, frame, [&](int64_t si, int64_t di, int64_t cnt) {
      if (t.dtype == dst_type) std::memcpy(out + di * ds, bytes + si * es, cnt * es);
      else detail::convert_elements(bytes + si * es, t.dtype, out + di * ds, dst_type, cnt);
    });
  }
}

}  // namespace h5ckpt::storage
