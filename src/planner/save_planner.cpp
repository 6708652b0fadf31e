#include "planner/save_planner.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "planner/box_math.h"
#include "planner/bulk_allocator.h"
#include "planner/id_slots.h"
#include "planner/largest_first.h"
#include "planner/region_overlap.h"
#include "util/checked_math.h"
#include "util/shard_bounds.h"

namespace h5ckpt::planner {

// Keys become HDF5 link paths and appear in every message and metadata entry: bounded.
constexpr size_t kMaxKeyLength = 1024;

Status validate_key(std::string_view key) {
  auto bad = [&](std::string_view why) {
    return Status(ErrorCode::kInvalidArgument, "key '" + printable(key) + "': " + std::string(why));
  };
  if (key.empty()) return bad("empty key");
  if (key.size() > kMaxKeyLength) return bad("longer than " + std::to_string(kMaxKeyLength) + " characters");
  for (char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '.' || c == '-' || c == '/';
    if (!ok)
      return bad("character '" + printable(std::string_view(&c, 1)) + "' not allowed (letters, digits, _ . - /)");
  }
  if (key.front() == '/' || key.back() == '/' || key.find("//") != std::string::npos)
    return bad("empty path component");
  if (key == "meta" || key.rfind("meta/", 0) == 0) return bad("the 'meta' group is reserved");
  size_t start = 0;
  while (start <= key.size()) {
    size_t end = key.find('/', start);
    if (end == std::string::npos) end = key.size();
    const std::string_view comp = key.substr(start, end - start);
    if (comp == "." || comp == "..") return bad("'.' and '..' components not allowed");
    start = end + 1;
  }
  return Status::Ok();
}

ShardSpec TensorPlan::shard(size_t region) const {
  const PlannedRegion& r = regions[region];
  ShardSpec s{boxes[r.box], std::nullopt};
  if (r.flat) s.flat = std::pair{r.begin, r.end};
  return s;
}

bool TensorPlan::holds(size_t region, const ShardSpec& s) const {
  const PlannedRegion& r = regions[region];
  if (r.flat != s.flat.has_value()) return false;
  if (s.flat && (s.flat->first != r.begin || s.flat->second != r.end)) return false;
  return boxes[r.box] == s.box;  // without a flat range, begin and end follow from the box
}

void TensorPlan::add_region(const ShardSpec& s, int writer) {
  size_t b = boxes.size();
  while (b > 0 && !(boxes[b - 1] == s.box)) --b;
  if (b == 0) {
    boxes.push_back(s.box);
    b = boxes.size();
  }
  const int64_t begin = s.flat ? s.flat->first : 0, end = s.flat ? s.flat->second : s.box.volume();
  regions.push_back(PlannedRegion{begin, end, static_cast<uint32_t>(b - 1), s.flat ? 1u : 0u, writer});
}

Result<ItemView> ItemView::of(const ItemDesc& d, std::vector<int64_t>& dims) {
  const ShardSpec& s = d.shard;
  for (const Shape* v : {&d.global_shape, &s.box.offset, &s.box.shape})
    if (v->size() > kMaxCount)
      return Status(ErrorCode::kInvalidArgument, "key '" + printable(d.key) + "': " + std::to_string(v->size()) +
                                                     " extents in a shape (a view counts at most " +
                                                     std::to_string(kMaxCount) + ")");
  const size_t at = dims.size();
  for (const Shape* v : {&d.global_shape, &s.box.offset, &s.box.shape}) dims.insert(dims.end(), v->begin(), v->end());
  if (s.flat) dims.insert(dims.end(), {s.flat->first, s.flat->second});
  return ItemView{d.key,
                  dims.data() + at,
                  static_cast<uint16_t>(d.global_shape.size()),
                  static_cast<uint16_t>(s.box.offset.size()),
                  static_cast<uint16_t>(s.box.shape.size()),
                  d.dtype,
                  s.flat.has_value(),
                  d.continues};
}

ShardSpec ItemView::shard() const {
  ShardSpec s{Box{Shape(offset().begin(), offset().end()), Shape(shape().begin(), shape().end())}, std::nullopt};
  if (flat) s.flat = std::pair{flat_begin(), flat_end()};
  return s;
}

ItemDesc ItemView::desc() const {
  ItemDesc d;
  d.key = std::string(key);
  d.dtype = dtype;
  d.global_shape = Shape(global_shape().begin(), global_shape().end());
  d.shard = shard();
  d.continues = continues;
  return d;
}

namespace {

using Dims = std::span<const int64_t>;

Shape to_shape(Dims dims) { return Shape(dims.begin(), dims.end()); }

uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull; }

// splitmix64's finalizer: every input bit reaches the low bits an open-addressing table uses.
uint64_t finish(uint64_t h) {
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

// Of an item's box.
uint64_t box_hash(const ItemView& b) {
  uint64_t h = b.offset_ndim;
  for (int64_t v : b.offset()) h = mix(h, static_cast<uint64_t>(v));
  for (int64_t v : b.shape()) h = mix(h, static_cast<uint64_t>(v));
  return finish(h);
}

// Equal extents compared inline: the scan compares millions of two- and three-element shapes,
// where a comparison of vectors calls memcmp once per vector.
bool same_dims(Dims a, Dims b) {
  if (a.size() != b.size()) return false;
  for (size_t d = 0; d < a.size(); ++d)
    if (a[d] != b[d]) return false;
  return true;
}
bool same_box(const ItemView& a, const ItemView& b) {
  return same_dims(a.shape(), b.shape()) && same_dims(a.offset(), b.offset());
}
// The same key: views of one tensor's key often share its bytes (wire::decode_gathered_items).
bool same_key(std::string_view a, std::string_view b) {
  return a.size() == b.size() && (a.data() == b.data() || a == b);
}

// The elements of a shard as a range of its box's row-major order (a whole box: all of them).
// Wrapping, not overflowing: the scan hashes items ahead of their validation.
std::pair<int64_t, int64_t> flat_span(const ItemView& s) {
  if (s.flat) return {s.flat_begin(), s.flat_end()};
  uint64_t v = 1;
  for (int64_t e : s.shape()) v *= static_cast<uint64_t>(e);
  return {0, static_cast<int64_t>(v)};
}
int64_t numel(const ItemView& s) {
  const auto [begin, end] = flat_span(s);
  return end - begin;
}
Box box_of(const ItemView& s) { return Box{to_shape(s.offset()), to_shape(s.shape())}; }

// ShardSpec::validate on a view: its message (from a copy) only when the shard is wrong.
Status validate_shard(const ItemView& it) {
  const std::pair<int64_t, int64_t> range{it.flat_begin(), it.flat_end()};
  if (shard_problem(it.global_shape(), it.offset(), it.shape(), it.flat ? &range : nullptr).empty())
    return Status::Ok();
  return it.shard().validate(to_shape(it.global_shape()));
}

// A unique non-empty region of a tensor, as integers, so that the checks and the plan compare
// them rather than chase the descriptions of thousands of ranks: its box (whose description, for
// messages and the exact overlap test, the tensor's distinct box keeps), range and flatness. 24
// bytes: at 8,960 ranks there are 1.45 million, and on a VM every fresh page costs a trap to the
// host. No bit fields: GCC stored them by reading the word first, and a fresh page read before
// it is written faults twice (the zero page, then the copy).
struct UniqueRegion {
  int64_t begin, end;     // flat_span of its first holder's item
  uint32_t box_and_flat;  // the tensor's distinct box it lies in (TensorAcc::boxes), times 2, plus
                          // 1 for a flat range of that box
  uint32_t position;      // its place in the plan (tensors by key, then order of appearance)

  UniqueRegion(int64_t b, int64_t e, uint32_t box, uint32_t flat)
      : begin(b), end(e), box_and_flat(box << 1 | flat), position(0) {}
  uint32_t box() const { return box_and_flat >> 1; }
  uint32_t flat() const { return box_and_flat & 1; }
};
static_assert(sizeof(UniqueRegion) == 24);

// Of box and range: replicas hash alike. From the shard alone (not its box's number), so that the
// scan can fetch the slot of an item a few places ahead.
uint64_t region_hash(uint64_t box_hash, int64_t begin, int64_t end) {
  return finish(mix(mix(box_hash, static_cast<uint64_t>(begin)), static_cast<uint64_t>(end)));
}

// Every unique region of every tensor, numbered in order of discovery: one pool reserved for the
// worst case (one region per item) up front, so it never moves and only the pages it uses are
// touched, where per-tensor vectors grew by doubling and copied everything on the way.
using RegionPool = BulkVector<UniqueRegion>;

// A tensor as the ranks declare it while their items are gathered, with its unique regions in
// order of first appearance, found by shard in an open-addressing table of its own (small, so
// the lookups of the next ranks, which hold the same tensors, stay in cache), and the distinct
// boxes of those regions (the TP shards; ZeRO's flat ranges share one), told apart here, while
// the new region's description is in cache, so the checks compare box numbers.
struct TensorAcc {
  static constexpr size_t kInlineDims = 4;
  struct DistinctBox {
    uint64_t hash;
    const ItemView* item;  // a region's item with this box, for the plan and the checks (and for the
                           // lookups of boxes of more than kInlineDims dimensions: the latest, likely
                           // in cache)
    // Offset then shape, for boxes of at most kInlineDims dimensions: a lookup compares them
    // here, in the table it has just read, not in another rank's description.
    size_t ndim;
    int64_t dims[2 * kInlineDims];

    DistinctBox(uint64_t h, const ItemView& b) : hash(h), item(&b), ndim(b.shape_ndim), dims{} {
      if (ndim > kInlineDims) return;
      std::copy(b.offset().begin(), b.offset().end(), dims);
      std::copy(b.shape().begin(), b.shape().end(), dims + ndim);
    }
    bool holds(const ItemView& b) {
      if (b.shape_ndim != ndim || b.offset_ndim != ndim) return false;
      if (ndim > kInlineDims) {
        if (!same_box(*item, b)) return false;
        item = &b;  // recently read, likely still in cache for the next lookup
        return true;
      }
      for (size_t d = 0; d < ndim; ++d)
        if (dims[d] != b.offset()[d] || dims[ndim + d] != b.shape()[d]) return false;
      return true;
    }
  };
  const ItemView* first;  // key, dtype and global shape as first declared
  int first_rank;
  int last_rank = -1;             // the last rank declaring it: another declaration there is a duplicate
  ArenaVector<uint32_t> regions;  // pool ids, in order of first appearance
  ArenaVector<uint32_t> hashes;   // beside regions: the low bits of each one's region_hash
  ArenaVector<uint32_t> slots;    // indices into regions
  ArenaVector<DistinctBox> boxes;
  ArenaVector<uint32_t> box_slots;  // indices into boxes

  // `lists`: what the plan reads after the scan (regions, boxes); `tables`: what only the scan
  // uses (the hashes and hash tables), whose pages the plan's scratch reuses once the scan is done.
  TensorAcc(const ItemView* first_item, int rank, BulkArena& lists, BulkArena& tables)
      : first(first_item),
        first_rank(rank),
        regions(ArenaAllocator<uint32_t>(lists)),
        hashes(ArenaAllocator<uint32_t>(tables)),
        slots(ArenaAllocator<uint32_t>(tables)),
        boxes(ArenaAllocator<DistinctBox>(lists)),
        box_slots(ArenaAllocator<uint32_t>(tables)) {}

  // The scan is done: its tables go back to their arena.
  void drop_tables() {
    for (ArenaVector<uint32_t>* v : {&hashes, &slots, &box_slots}) ArenaVector<uint32_t>(v->get_allocator()).swap(*v);
  }

  // Asks for the slot where find_or_add(shard, bh) will start probing (`bh`: box_hash of its
  // box): the tables of 15,000 tensors do not stay in cache, and the scan knows its next items'
  // tensors.
  void prefetch_slot(const ItemView& shard, uint64_t bh) const {
    if (slots.empty()) return;
    const auto [begin, end] = flat_span(shard);
    __builtin_prefetch(&slots[region_hash(bh, begin, end) & (slots.size() - 1)]);
  }

  // The pool id of the region `shard`, added to the pool when new. Its box is numbered first, so
  // a known region is recognized by integers (box number, range, flat or not) without reading
  // its first holder's description, which lies with another rank's items, likely out of cache.
  uint32_t find_or_add(const ItemView& shard, uint64_t bh, RegionPool& pool) {
    // Table positions are the hashes' low bits: kept beside the regions, they are rehashed
    // without reading the pool, where a tensor's regions lie a rank's items apart.
    if (2 * (regions.size() + 1) > slots.size())
      rehash_ids(slots, static_cast<uint32_t>(regions.size()), 8, [&](uint32_t k) { return hashes[k]; });
    const uint32_t box = box_id(shard, bh);
    // Plain variables, not a structured binding: the lambda below captures them (clang 14, which
    // the fuzz build uses, refuses to capture bindings).
    const auto span = flat_span(shard);
    const int64_t begin = span.first, end = span.second;
    const uint32_t flat = shard.flat ? 1 : 0;
    const uint32_t next = static_cast<uint32_t>(regions.size());
    const uint64_t h = region_hash(bh, begin, end);
    const uint32_t k = find_or_insert_id(slots, h, next, [&](uint32_t k) {
      if (hashes[k] != static_cast<uint32_t>(h)) return false;  // most probes end here, out of the pool
      const UniqueRegion& known = pool[regions[k]];
      return known.box_and_flat == (box << 1 | flat) && known.begin == begin && known.end == end;
    });
    if (k == next) {
      regions.push_back(static_cast<uint32_t>(pool.size()));
      hashes.push_back(static_cast<uint32_t>(h));
      pool.push_back(UniqueRegion(begin, end, box, flat));
    }
    return regions[k];
  }

 private:
  uint32_t box_id(const ItemView& box, uint64_t bh) {
    if (2 * (boxes.size() + 1) > box_slots.size())
      rehash_ids(box_slots, static_cast<uint32_t>(boxes.size()), 8, [&](uint32_t b) { return boxes[b].hash; });
    const uint32_t next = static_cast<uint32_t>(boxes.size());
    const uint32_t b =
        find_or_insert_id(box_slots, bh, next, [&](uint32_t b) { return boxes[b].hash == bh && boxes[b].holds(box); });
    if (b == next) boxes.emplace_back(bh, box);
    return b;
  }
};

// The regions of one tensor, k = 0, 1, ... in order of first appearance.
struct TensorRegions {
  const RegionPool& pool;
  const ArenaVector<uint32_t>& ids;
  size_t size() const { return ids.size(); }
  const UniqueRegion& operator[](size_t k) const { return pool[ids[k]]; }
  // A tensor's regions lie in the pool a rank's items apart: the first pass over them asks for
  // each a few regions ahead.
  static constexpr size_t kAhead = 8;
  void prefetch(size_t k) const {
    if (k + kAhead < ids.size()) __builtin_prefetch(&pool[ids[k + kAhead]]);
  }
};

using DistinctBoxes = ArenaVector<TensorAcc::DistinctBox>;

// A region as a ShardSpec (for messages and the exact overlap test): its box from the item that
// the tensor's distinct box keeps, which holds that box.
ShardSpec shard_of(const UniqueRegion& region, const DistinctBoxes& boxes) {
  ShardSpec s{box_of(*boxes[region.box()].item), std::nullopt};
  if (region.flat()) s.flat = std::pair{region.begin, region.end};
  return s;
}

// Two regions sharing an element, from their pieces; exact for any boxes and flat ranges, and
// O(n log n) for the usual layouts (see find_overlap).
Result<std::optional<std::pair<size_t, size_t>>> piece_overlap(const Shape& shape, const TensorRegions& regions,
                                                               const DistinctBoxes& boxes) {
  std::vector<Box> pieces;
  std::vector<size_t> region_of;
  for (size_t r = 0; r < regions.size(); ++r)
    for (auto& b : shard_boxes(shard_of(regions[r], boxes))) {
      pieces.push_back(std::move(b));
      region_of.push_back(r);
    }
  H5CKPT_ASSIGN_OR_RETURN(auto overlap, find_overlap(shape, pieces));
  if (!overlap) return std::optional<std::pair<size_t, size_t>>();
  return std::optional(std::pair{region_of[overlap->first], region_of[overlap->second]});
}

// Buffers the checks of one tensor after another reuse (15,000 tensors at 8,960 ranks).
struct CheckScratch {
  std::vector<uint32_t> order;
  std::vector<uint32_t> group_start;  // per box: where its regions start in `order`
  std::vector<Box> boxes;
};

// The regions' positions grouped by box, ranges ascending within a group, so that any overlap
// inside a group shows between neighbours. A counting sort by box number (a tensor has a few
// boxes, its regions hundreds: the TP shards and their ZeRO slices, which arrive interleaved, TP
// rank by TP rank), keeping the order of first appearance within a box; a group is sorted by
// range only if it is not already (the slices arrive DP rank by DP rank, ascending).
void group_by_box(const TensorRegions& regions, size_t nboxes, CheckScratch& scratch) {
  std::vector<uint32_t>& start = scratch.group_start;
  start.assign(nboxes + 1, 0);
  for (size_t k = 0; k < regions.size(); ++k) {
    regions.prefetch(k);
    ++start[regions[k].box() + 1];
  }
  std::partial_sum(start.begin(), start.end(), start.begin());
  std::vector<uint32_t>& order = scratch.order;
  order.resize(regions.size());
  for (size_t k = 0; k < regions.size(); ++k) order[start[regions[k].box()]++] = static_cast<uint32_t>(k);
  // `start[b]` is now where group b ends, which is where group b + 1 starts.
  auto by_begin = [&](uint32_t a, uint32_t b) { return regions[a].begin < regions[b].begin; };
  for (size_t b = 0, from = 0; b < nboxes; from = start[b++]) {
    const auto first = order.begin() + static_cast<std::ptrdiff_t>(from);
    const auto last = order.begin() + static_cast<std::ptrdiff_t>(start[b]);
    if (!std::is_sorted(first, last, by_begin)) std::sort(first, last, by_begin);
  }
}

// Regions that are neither identical nor disjoint, and regions that leave elements out, are
// errors. Coverage is counted; disjointness is checked on the regions' boxes: regions on one box
// (the flat ranges of a ZeRO shard, or the box itself) must have disjoint ranges, and the distinct
// boxes (a few per tensor: the TP shards) must be disjoint. Only when two distinct boxes overlap
// are all the regions' pieces compared, which is exact but slower.
Status check_disjoint_and_complete(const std::string& key, const Shape& shape, const TensorRegions& regions,
                                   const DistinctBoxes& distinct, const std::function<int(size_t)>& holder_rank,
                                   CheckScratch& scratch) {
  int64_t total = 1;
  for (auto s : shape)
    if (s < 0 || !checked_mul(total, s, &total))
      return Status(ErrorCode::kInvalidArgument,
                    "key '" + key + "': global shape " + to_string_shape(shape) + " has too many elements");
  int64_t covered = 0;
  for (size_t k = 0; k < regions.size(); ++k)
    if (!checked_add(covered, regions[k].end - regions[k].begin, &covered)) covered = INT64_MAX;
  auto overlapping = [&](size_t a, size_t b) {
    if (a > b) std::swap(a, b);
    return Status(ErrorCode::kInvalidArgument,
                  "key '" + key + "': shard " + to_string_spec(shard_of(regions[a], distinct)) + " on rank " +
                      std::to_string(holder_rank(a)) + " overlaps shard " +
                      to_string_spec(shard_of(regions[b], distinct)) + " on rank " + std::to_string(holder_rank(b)) +
                      " without being identical (replicas must hold identical regions)");
  };
  if (regions.size() >= 2) {
    group_by_box(regions, distinct.size(), scratch);
    const std::vector<uint32_t>& order = scratch.order;
    for (size_t k = 1; k < order.size(); ++k) {
      const UniqueRegion &prev = regions[order[k - 1]], &cur = regions[order[k]];
      if (prev.box() == cur.box() && prev.end > cur.begin) return overlapping(order[k - 1], order[k]);
    }
    if (distinct.size() >= 2) {
      scratch.boxes.resize(distinct.size());
      for (size_t b = 0; b < distinct.size(); ++b) {  // into the scratch's vectors: no allocation
        const ItemView& it = *distinct[b].item;
        scratch.boxes[b].offset.assign(it.offset().begin(), it.offset().end());
        scratch.boxes[b].shape.assign(it.shape().begin(), it.shape().end());
      }
      auto boxes_meet = find_overlap(shape, scratch.boxes);
      if (!boxes_meet.ok() || *boxes_meet) {  // the ranges may still avoid each other: compare the pieces
        auto pair = piece_overlap(shape, regions, distinct);
        if (!pair.ok()) return pair.status().with_context("key '" + key + "'");
        if (*pair) return overlapping((*pair)->first, (*pair)->second);
      }
    }
  }
  if (covered != total)
    return Status(ErrorCode::kInvalidArgument, "key '" + key + "': the ranks' shards cover " + std::to_string(covered) +
                                                   " of " + std::to_string(total) + " elements of global shape " +
                                                   to_string_shape(shape));
  return Status::Ok();
}

}  // namespace

namespace {

// The scan reads each item's key, global shape and box where its view points: in a rank's
// message and extents, read in order, when decoded; in four heap blocks of an ItemDesc, when
// viewed. Asking for those of an item a few places ahead lets the cache misses of the second
// case overlap instead of each waiting for the one before.
constexpr size_t kPrefetchAhead = 4;
constexpr size_t kSlotAhead = 2;
void prefetch(const ItemView& item) {
  __builtin_prefetch(item.key.data());
  __builtin_prefetch(item.dims);
}

// What the scan found out about an item ahead of its turn, kept for that turn (a ring over the
// next kSlotAhead + 1 positions): whether its extents (shape and shard) are those of the previous
// rank's item at its position and, when not, its box hash, with which it asked for the item's
// hash slot.
struct Ahead {
  static constexpr size_t kRing = kSlotAhead + 1;
  struct Entry {
    size_t position = SIZE_MAX;
    bool same_extents = false;
    uint64_t box_hash = 0;
  };
  Entry ring[kRing];
  void put(size_t position, bool same, uint64_t hash) { ring[position % kRing] = Entry{position, same, hash}; }
  const Entry* get(size_t position) const {
    const Entry& e = ring[position % kRing];
    return e.position == position ? &e : nullptr;
  }
};

// Each tensor's plan without its regions, from its first declaration, with its distinct boxes
// (numbered in the scan: the regions refer to them by that number).
std::vector<TensorPlan> tensor_heads(const std::vector<TensorAcc>& accs) {
  std::vector<TensorPlan> heads(accs.size());
  for (size_t a = 0; a < accs.size(); ++a) {
    const TensorAcc& acc = accs[a];
    heads[a] = TensorPlan{std::string(acc.first->key), acc.first->dtype, to_shape(acc.first->global_shape()), {}, {}};
    heads[a].boxes.reserve(acc.boxes.size());
    for (const TensorAcc::DistinctBox& b : acc.boxes) heads[a].boxes.push_back(box_of(*b.item));
  }
  return heads;
}

// A key may not be both a dataset and a group ("a" and "a/b"): looks up every '/' prefix.
Status check_group_prefixes(const std::vector<TensorAcc>& accs,
                            const std::unordered_map<std::string_view, uint32_t>& acc_of) {
  for (const TensorAcc& acc : accs) {
    const std::string_view key = acc.first->key;
    for (size_t pos = key.find('/'); pos != std::string_view::npos; pos = key.find('/', pos + 1))
      if (acc_of.count(key.substr(0, pos)))
        return Status(ErrorCode::kInvalidArgument, "key '" + std::string(key.substr(0, pos)) +
                                                       "' is also a group prefix of key '" + std::string(key) + "'");
  }
  return Status::Ok();
}

// The ranks holding each region of the plan (by plan position), ascending: counted, then placed
// (no list per region).
struct Holders {
  explicit Holders(BulkArena& arena) : begin(ArenaAllocator<uint32_t>(arena)), ranks(ArenaAllocator<int>(arena)) {}
  ArenaVector<uint32_t> begin;  // plan position -> its first entry in `ranks`; one past the last at the end
  ArenaVector<int> ranks;
  int first(uint32_t position) const { return ranks[begin[position]]; }
};
constexpr uint32_t kNone = UINT32_MAX;  // no tensor; an item that holds nothing of its tensor

// `region_of_item`: every rank's items in order, each its region's pool id or kNone; turned into
// plan positions on the way. Each region's entries are placed from its end, the items visited
// backwards, so the counts become the starts without an array of cursors.
Holders list_holders(std::span<const std::span<const ItemView>> ranks, const RegionPool& pool,
                     BulkVector<uint32_t>& region_of_item, BulkArena& arena) {
  Holders h(arena);
  h.begin.assign(pool.size() + 1, 0);
  for (uint32_t& region : region_of_item)
    if (region != kNone) ++h.begin[region = pool[region].position];
  std::partial_sum(h.begin.begin(), h.begin.end(), h.begin.begin());  // begin[p]: where p's entries end
  h.ranks.resize(h.begin.back());
  size_t k = region_of_item.size();
  for (size_t r = ranks.size(); r-- > 0;)
    for (size_t i = ranks[r].size(); i-- > 0;)
      if (const uint32_t position = region_of_item[--k]; position != kNone)
        h.ranks[--h.begin[position]] = static_cast<int>(r);
  return h;
}

// The first rank holding the region with pool id `id`, for a message: a pass over every item,
// taken only when a check has failed.
int first_holder(std::span<const std::span<const ItemView>> ranks, const BulkVector<uint32_t>& region_of_item,
                 uint32_t id) {
  size_t k = 0;
  for (size_t r = 0; r < ranks.size(); ++r)
    for (size_t i = 0; i < ranks[r].size(); ++i)
      if (region_of_item[k++] == id) return static_cast<int>(r);
  return -1;
}

// Worst-fit balancing: largest regions first (ties in plan order), each to its least-loaded
// holder (ties to the lowest rank). `class_at`: each plan position's size class, replaced by its
// writer (read once, then written: the writers need no array of their own); `scratch`: a buffer
// for the order, reused when large enough. Writers are stored in one pass over the plan (not
// scattered over its 1.45 million regions at 8,960 ranks).
void assign_writers(const SizeClasses<int64_t>& sizes, std::span<uint32_t> class_at, const Holders& holders,
                    BulkVector<uint32_t> scratch, SavePlan& plan) {
  const BulkVector<uint32_t> order = sizes.largest_first(class_at, std::move(scratch));
  // The order jumps between plan positions, and each leads to its holders by one more lookup:
  // each is asked for a few jobs ahead of its turn, once the one before it has arrived.
  constexpr size_t kBeginAhead = 8, kRanksAhead = 4;
  const size_t n = order.size();
  for (size_t k = 0; k < n; ++k) {
    if (k + kBeginAhead < n) {
      __builtin_prefetch(&holders.begin[order[k + kBeginAhead]]);
      __builtin_prefetch(&class_at[order[k + kBeginAhead]]);
    }
    if (k + kRanksAhead < n) __builtin_prefetch(&holders.ranks[holders.begin[order[k + kRanksAhead]]]);
    const uint32_t pos = order[k];
    int best = holders.first(pos);
    for (uint32_t h = holders.begin[pos]; h < holders.begin[pos + 1]; ++h)
      if (plan.bytes_by_rank[holders.ranks[h]] < plan.bytes_by_rank[best]) best = holders.ranks[h];
    plan.bytes_by_rank[best] += static_cast<uint64_t>(sizes.bytes(class_at[pos]));
    class_at[pos] = static_cast<uint32_t>(best);
  }
  size_t pos = 0;
  for (TensorPlan& tp : plan.tensors)
    for (PlannedRegion& reg : tp.regions) reg.writer = static_cast<int>(class_at[pos++]);
}

// The scan's tensors into the plan: checked disjoint and complete, sorted by key, each region given
// its writer. `region_of_item` (as list_holders takes it) is consumed; `arrays`: an arena for the
// plan's per-region arrays.
Result<SavePlan> plan_from_scan(std::span<const std::span<const ItemView>> ranks, const std::vector<TensorAcc>& accs,
                                RegionPool& pool, BulkVector<uint32_t> region_of_item, BulkArena& arrays) {
  std::vector<TensorPlan> heads = tensor_heads(accs);

  // Tensors sorted by key: every rank creates the datasets in this order.
  std::vector<uint32_t> by_key(accs.size());
  std::iota(by_key.begin(), by_key.end(), 0);
  std::sort(by_key.begin(), by_key.end(), [&](uint32_t a, uint32_t b) { return heads[a].key < heads[b].key; });

  SavePlan plan;
  plan.bytes_by_rank.assign(ranks.size(), 0);
  plan.tensors.reserve(accs.size());
  SizeClasses<int64_t> sizes;
  ArenaVector<uint32_t> class_at{ArenaAllocator<uint32_t>(arrays)};  // by plan position
  class_at.reserve(pool.size());
  CheckScratch scratch;
  for (uint32_t a : by_key) {
    const TensorAcc& acc = accs[a];
    const TensorRegions regions{pool, acc.regions};
    TensorPlan& tp = heads[a];
    H5CKPT_RETURN_IF_ERROR(check_disjoint_and_complete(
        tp.key, tp.shape, regions, acc.boxes,
        [&](size_t k) { return first_holder(ranks, region_of_item, acc.regions[k]); }, scratch));
    // The regions into the plan while the check has them in cache: 24 bytes each, from the pool
    // alone (the items are not read again), and each one's plan position into the pool.
    const int64_t es = static_cast<int64_t>(dtype_size(tp.dtype));  // numel * es checked in the scan
    // Zeroed first: PlannedRegion's bit fields are stored by reading their word, and a fresh page
    // read before it is written faults twice.
    tp.regions.resize(regions.size());
    for (size_t k = 0; k < regions.size(); ++k) {
      UniqueRegion& reg = pool[acc.regions[k]];
      reg.position = static_cast<uint32_t>(class_at.size());
      tp.regions[k] = PlannedRegion{reg.begin, reg.end, reg.box(), reg.flat(), -1};
      class_at.push_back(sizes.of((reg.end - reg.begin) * es));
    }
    plan.tensors.push_back(std::move(tp));
  }

  const Holders holders = list_holders(ranks, pool, region_of_item, arrays);
  // Its buffer (one entry per item, at least one per region) becomes the writers' order.
  assign_writers(sizes, class_at, holders, std::move(region_of_item), plan);
  return plan;
}

}  // namespace

Result<SavePlan> plan_save(std::span<const std::span<const ItemView>> ranks) {
  size_t nitems = 0;
  for (const auto& items : ranks) nitems += items.size();
  // The tensors' lists and tables, grown by doubling into each other's outgrown blocks, take about
  // 15 bytes per item at 8,960 ranks; room for more is only address space, and beyond it they come
  // from malloc. Once the scan is done its tables are dead, and the plan's per-region scratch takes
  // their pages (25 MB at 405B that would otherwise be fresh).
  BulkArena lists(64 * nitems + (1u << 20)), tables(64 * nitems + (1u << 20));
  std::vector<TensorAcc> accs;
  std::unordered_map<std::string_view, uint32_t> acc_of;  // key -> accs index (views of the ranks' keys)
  RegionPool pool;
  pool.reserve(nitems);
  // Per item, its region's pool id (kNone: holds nothing), to list the holders after the scan.
  BulkVector<uint32_t> region_of_item;
  region_of_item.reserve(nitems);
  // Ranks of one pipeline stage list the same keys in the same order, and often the same shards
  // (replicas): each item is first compared with the previous rank's item at its position, whose
  // tensor and region are known and whose memory is still in cache.
  std::vector<std::pair<uint32_t, uint32_t>> previous;  // by position: the previous rank's (tensor, region)

  for (size_t r = 0; r < ranks.size(); ++r) {
    auto where = [&] { return " (rank " + std::to_string(r) + ")"; };
    const std::span<const ItemView>* before = r > 0 ? &ranks[r - 1] : nullptr;
    Ahead ahead;
    for (size_t i = 0; i < ranks[r].size(); ++i) {
      if (i + kPrefetchAhead < ranks[r].size()) prefetch(ranks[r][i + kPrefetchAhead]);
      // The item two ahead (its description asked for two items ago) likely belongs to the tensor
      // the previous rank had there: ask for its slot (a wrong guess costs a wasted fetch), unless
      // it holds that item's shard of the same shape, a replica whose region the scan will take
      // from it.
      if (const size_t j = i + kSlotAhead; j < ranks[r].size() && j < previous.size() && previous[j].first != kNone) {
        const ItemView& shard = ranks[r][j];
        if ((*before)[j].same_extents(shard)) {
          ahead.put(j, true, 0);
        } else {
          const uint64_t bh = box_hash(shard);
          ahead.put(j, false, bh);
          accs[previous[j].first].prefetch_slot(shard, bh);
        }
      }
      const Ahead::Entry* seen = ahead.get(i);  // (*before)[i] and this item's extents compared already
      const ItemView& it = ranks[r][i];
      const ItemView* prev = before && i < before->size() && i < previous.size() ? &(*before)[i] : nullptr;
      uint32_t t = kNone;
      if (prev && previous[i].first != kNone && same_key(prev->key, it.key)) {
        t = previous[i].first;
      } else if (auto found = acc_of.find(it.key); found != acc_of.end()) {
        t = found->second;
        prev = nullptr;
      } else {  // a new key: checked once, here
        if (auto st = validate_key(it.key); !st.ok()) return st.with_context("rank " + std::to_string(r));
        t = static_cast<uint32_t>(accs.size());
        accs.emplace_back(&it, static_cast<int>(r), lists, tables);
        acc_of.emplace(it.key, t);
        prev = nullptr;
      }
      TensorAcc& acc = accs[t];
      if (acc.last_rank == static_cast<int>(r) && !it.continues)
        return Status(ErrorCode::kInvalidArgument, "key '" + std::string(it.key) + "' added twice" + where());
      acc.last_rank = static_cast<int>(r);
      // The previous rank's item at this position, of the same tensor, with the same shard and
      // global shape (a replica): validated when it was scanned, and its region is this item's.
      const bool replica = prev && (seen ? seen->same_extents : prev->same_extents(it));
      if (!replica)
        if (auto st = validate_shard(it); !st.ok())
          return st.with_context("key '" + std::string(it.key) + "'" + where());
      // The previous rank's item agreed with the first declaration: comparing with it suffices.
      const ItemView& agreed = prev ? *prev : *acc.first;
      if (agreed.dtype != it.dtype)
        return Status(ErrorCode::kDtypeMismatch, "key '" + std::string(it.key) + "': dtype " +
                                                     dtype_name(acc.first->dtype) + " on rank " +
                                                     std::to_string(acc.first_rank) + " but " + dtype_name(it.dtype) +
                                                     " on rank " + std::to_string(r));
      if (!replica && !same_dims(agreed.global_shape(), it.global_shape()))
        return Status(ErrorCode::kShapeMismatch, "key '" + std::string(it.key) + "': global shape " +
                                                     to_string_shape(to_shape(acc.first->global_shape())) +
                                                     " on rank " + std::to_string(acc.first_rank) + " but " +
                                                     to_string_shape(to_shape(it.global_shape())) + " on rank " +
                                                     std::to_string(r));
      uint32_t region = kNone;  // stays so for an item that holds nothing of its tensor
      if (replica) {
        region = previous[i].second;
      } else if (numel(it) > 0) {
        int64_t bytes = 0;
        if (!checked_mul(numel(it), static_cast<int64_t>(dtype_size(it.dtype)), &bytes))
          return Status(ErrorCode::kInvalidArgument,
                        "key '" + std::string(it.key) + "': shard has too many bytes" + where());
        region = acc.find_or_add(it, seen && !seen->same_extents ? seen->box_hash : box_hash(it), pool);
      }
      region_of_item.push_back(region);
      if (i >= previous.size()) previous.resize(i + 1, {kNone, kNone});
      previous[i] = {t, region};
    }
    // Positions past this rank's items describe no previous item for the next rank.
    for (size_t i = ranks[r].size(); i < previous.size(); ++i) previous[i] = {kNone, kNone};
  }

  H5CKPT_RETURN_IF_ERROR(check_group_prefixes(accs, acc_of));
  for (TensorAcc& acc : accs) acc.drop_tables();
  tables.recycle();
  return plan_from_scan(ranks, accs, pool, std::move(region_of_item), tables);
}

Result<SavePlan> plan_save(const std::vector<std::vector<ItemDesc>>& ranks) {
  // Every view in one array and every extent in another, both reserved so that neither moves.
  std::vector<ItemView> views;
  std::vector<int64_t> dims;
  size_t items = 0, extents = 0;
  for (const auto& rank : ranks)
    for (const ItemDesc& d : rank) {
      ++items;
      extents += d.global_shape.size() + d.shard.box.offset.size() + d.shard.box.shape.size() + 2;
    }
  views.reserve(items);
  dims.reserve(extents);
  for (const auto& rank : ranks)
    for (const ItemDesc& d : rank) {
      H5CKPT_ASSIGN_OR_RETURN(ItemView v, ItemView::of(d, dims));
      views.push_back(v);
    }
  std::vector<std::span<const ItemView>> spans;
  spans.reserve(ranks.size());
  for (size_t r = 0, at = 0; r < ranks.size(); at += ranks[r++].size())
    spans.emplace_back(views.data() + at, ranks[r].size());
  return plan_save(spans);
}

Result<std::vector<WriteItem>> plan_writes(int rank, const std::vector<TensorPlan>& tensors,
                                           const std::vector<ItemDesc>& items, uint64_t max_bytes) {
  // Found from the rank's own items (a rank writes only regions it holds), each item's tensor by
  // binary search of the sorted keys: a scan of every region would cost each of 10,000 ranks
  // over a million regions per save.
  struct Found {
    int tensor, region, item;
  };
  std::vector<Found> found;
  for (size_t i = 0, run_end = 0; i < items.size(); i = run_end) {
    // The pieces of one multi-piece item (a run of descriptions that continue the first) are
    // matched to this rank's regions of their tensor by shard.
    for (run_end = i + 1; run_end < items.size() && items[run_end].continues; ++run_end) {
    }
    const std::string& key = items[i].key;
    const auto t = std::lower_bound(tensors.begin(), tensors.end(), key,
                                    [](const TensorPlan& tp, const std::string& k) { return tp.key < k; });
    if (t == tensors.end() || t->key != key)
      return Status(ErrorCode::kInternal,
                    "key '" + key + "': rank " + std::to_string(rank) + " holds it, but the plan has no such tensor");
    for (size_t r = 0; r < t->regions.size(); ++r) {
      if (t->regions[r].writer != rank) continue;
      size_t holder = i;
      while (holder < run_end && !t->holds(r, items[holder].shard)) ++holder;
      if (holder == run_end)
        return Status(ErrorCode::kInternal, "key '" + key + "': rank " + std::to_string(rank) +
                                                " was chosen to write a region it does not hold");
      found.push_back(Found{static_cast<int>(t - tensors.begin()), static_cast<int>(r), static_cast<int>(holder)});
    }
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return a.tensor != b.tensor ? a.tensor < b.tensor : a.region < b.region;
  });
  std::vector<WriteItem> out;
  for (const Found& f : found) {
    const TensorPlan& tp = tensors[f.tensor];
    const PlannedRegion& reg = tp.regions[f.region];
    const uint64_t es = dtype_size(tp.dtype);
    const int64_t per = static_cast<int64_t>(std::clamp<uint64_t>(max_bytes / es, 1, INT64_MAX));
    const int64_t n = reg.numel();
    // The buffer holding the region: the description's own item, or a multi-piece item's.
    const ItemDesc& desc = items[f.item];
    const int item = desc.source >= 0 ? desc.source : f.item;
    const uint64_t base = desc.buffer_offset;
    if (n <= per) {  // the common case: the region in one write, as planned
      out.push_back(WriteItem{f.tensor, f.region, item, tp.shard(f.region), base, static_cast<uint64_t>(n) * es, true});
      continue;
    }
    // A large region: consecutive flat sub-ranges of its box, each a few hyperslabs.
    const int64_t b0 = reg.begin;
    for (int64_t b = 0; b < n; b += per) {
      const int64_t e = std::min(n, b + per);
      out.push_back(WriteItem{f.tensor, f.region, item, ShardSpec::flat_range(tp.box_of(f.region), b0 + b, b0 + e),
                              base + static_cast<uint64_t>(b) * es, static_cast<uint64_t>(e - b) * es, e == n});
    }
  }
  return out;
}

}  // namespace h5ckpt::planner
