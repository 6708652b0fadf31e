#include "engine/wire.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "comm/comm.h"
#include "util/checked_math.h"
#include "util/bytes.h"

namespace h5ckpt::engine::wire {

namespace {

// Smallest encodings, which bound every count a decoder accepts.
constexpr size_t kMinItemBytes = 1 + 1 + 3 * 4 + 8;  // an items message's record: flags, dtype, counts, key length
constexpr size_t kMinTensorBytes = 8 + 1 + 8 + 8;
constexpr size_t kMinRegionBytes = 8 + 8 + 1 + 4;
constexpr size_t kMinCompactTensorBytes = 8 + 1 + 8 + 8 + 8;  // key length, dtype, shape, boxes, regions
constexpr size_t kMinBoxBytes = 8 + 8;
constexpr size_t kMinCompactRegionBytes = 4 + 1 + 4;  // box number, flat, writer
// The first word of a plan's message in the compact encoding, where the older one (each region's
// shard in full) starts with its tensor count, which the bytes left bound: never this large.
constexpr uint64_t kCompactPlanTag = 0xc0de'9a11'0000'0002ull;
constexpr size_t kMinRoleBytes = 4 + 4 + 4 + 8;
constexpr size_t kMinRequestBytes = 1 + 8 + 8;    // flags, signature length, bytes
constexpr size_t kChecksumBytes = 4 + 4 + 8 + 8;  // without its blocks

DType get_dtype(ByteReader& r, bool* bad) {
  const uint8_t v = r.get<uint8_t>();
  if (v > static_cast<uint8_t>(DType::kBool)) *bad = true;
  return static_cast<DType>(v);
}

Status malformed(const char* what) {
  return Status(ErrorCode::kInternal, std::string("malformed ") + what + " message");
}

}  // namespace

void put_shard(ByteWriter& w, const ShardSpec& s) {
  w.put_vec(s.box.offset);
  w.put_vec(s.box.shape);
  w.put<uint8_t>(s.flat ? 1 : 0);
  if (s.flat) {
    w.put<int64_t>(s.flat->first);
    w.put<int64_t>(s.flat->second);
  }
}

ShardSpec get_shard(ByteReader& r) {
  ShardSpec s;
  s.box.offset = r.get_vec();
  s.box.shape = r.get_vec();
  if (r.get<uint8_t>()) {
    const int64_t b = r.get<int64_t>();
    const int64_t e = r.get<int64_t>();
    s.flat = std::make_pair(b, e);
  }
  return s;
}

// A box's element count, false when an extent is negative or the product overflows (a damaged
// local manifest must be refused, not multiplied).
bool box_volume(const Box& box, int64_t* volume) {
  *volume = 1;
  for (int64_t e : box.shape)
    if (e < 0 || !checked_mul(*volume, e, volume)) return false;
  return true;
}

// Numbers the distinct boxes of one tensor's regions as they are decoded from the older plan
// encoding (each region's box repeated: local manifests of earlier versions hold it), by hash: a
// tensor may have thousands of boxes. Numbered in order of first appearance, as plan_save numbers
// them, so a decoded plan equals the encoded one field by field.
class BoxNumbers {
 public:
  void clear() {
    by_hash_.clear();
    last_ = UINT32_MAX;
  }
  uint32_t number(std::vector<Box>& boxes, Box&& box) {
    if (last_ != UINT32_MAX && boxes[last_] == box) return last_;  // neighbours often share one
    uint64_t h = 0xcbf29ce484222325ull;
    for (const Shape* v : {&box.offset, &box.shape}) {
      h = (h ^ v->size()) * 0x100000001b3ull;
      for (int64_t x : *v) h = (h ^ static_cast<uint64_t>(x)) * 0x100000001b3ull;
    }
    auto [at, end] = by_hash_.equal_range(h);
    for (; at != end; ++at)
      if (boxes[at->second] == box) return last_ = at->second;
    last_ = static_cast<uint32_t>(boxes.size());
    boxes.push_back(std::move(box));
    by_hash_.emplace(h, last_);
    return last_;
  }

 private:
  std::unordered_multimap<uint64_t, uint32_t> by_hash_;
  uint32_t last_ = UINT32_MAX;
};

// An items message: the item count, then every item's extents (global shape, box offset and
// extents, and for a flat range its begin and end) as one int64 array 16 bytes into the message
// (after its length), which the coordinator's views point into rather than copy, then one record
// per item (flags: flat 1, continues 2; dtype; the three counts; the key).
std::string encode_items(const std::vector<planner::ItemDesc>& items) {
  size_t extents = 0, size = 16;
  for (const auto& it : items) {
    const ShardSpec& s = it.shard;
    extents += it.global_shape.size() + s.box.offset.size() + s.box.shape.size() + (s.flat ? 2 : 0);
    size += kMinItemBytes + it.key.size();
  }
  ByteWriter w;
  w.reserve(size + 8 * extents);
  w.put<uint64_t>(items.size());
  w.put<uint64_t>(extents);
  for (const auto& it : items) {
    for (const Shape* v : {&it.global_shape, &it.shard.box.offset, &it.shard.box.shape})
      w.put_bytes(v->data(), v->size() * sizeof(int64_t));
    if (it.shard.flat) {
      w.put<int64_t>(it.shard.flat->first);
      w.put<int64_t>(it.shard.flat->second);
    }
  }
  for (const auto& it : items) {
    w.put<uint8_t>((it.shard.flat ? 1 : 0) | (it.continues ? 2 : 0));
    w.put<uint8_t>(static_cast<uint8_t>(it.dtype));
    for (const Shape* v : {&it.global_shape, &it.shard.box.offset, &it.shard.box.shape})
      w.put<uint32_t>(static_cast<uint32_t>(std::min<size_t>(v->size(), UINT32_MAX)));
    w.put_string(it.key);
  }
  return std::move(w.str());
}

namespace {

// One items message as views appended to `views`: keys and extents in `bytes`, where it holds its
// extents 8-byte aligned (a std::string's buffer always does); otherwise the extents are copied
// to `dims`, which must have room for them (bytes.size() / 8), so that it never moves under the
// views. A key or extents equal to those of the view at the same position in `before` (the
// previous rank's: the same tensor, a replica) are that view's: the planner's tests see them equal
// by pointer, and its scan reads bytes already in cache rather than every message again.
Status decode_item_views(std::string_view bytes, std::span<const planner::ItemView> before,
                         planner::BulkVector<planner::ItemView>* views, planner::BulkVector<int64_t>* dims) {
  ByteReader r(bytes.data(), bytes.size());
  const size_t count = r.get_count(kMinItemBytes);
  uint64_t nextents = 0;
  const char* area = r.get_vec_bytes(&nextents);
  if (!r.ok()) return malformed("item list");
  const int64_t* extents = reinterpret_cast<const int64_t*>(area);
  if (reinterpret_cast<uintptr_t>(area) % alignof(int64_t) != 0) {
    const size_t at = dims->size();
    dims->resize(at + nextents);
    if (nextents) std::memcpy(dims->data() + at, area, nextents * sizeof(int64_t));
    extents = dims->data() + at;
  }
  bool bad = false;
  uint64_t used = 0;  // extents taken by the items so far
  const size_t first = views->size();
  views->resize(first + count);
  for (size_t i = 0; i < count && !bad; ++i) {
    planner::ItemView& it = (*views)[first + i];
    const uint8_t flags = r.get<uint8_t>();
    it.dtype = get_dtype(r, &bad);
    uint32_t n[3];
    for (uint32_t& c : n) c = r.get<uint32_t>();  // global shape, box offset, box extents
    it.key = r.get_string_view();
    if (!r.ok() || flags > 3 || std::max({n[0], n[1], n[2]}) > planner::ItemView::kMaxCount) break;
    it.global_ndim = static_cast<uint16_t>(n[0]);
    it.offset_ndim = static_cast<uint16_t>(n[1]);
    it.shape_ndim = static_cast<uint16_t>(n[2]);
    it.flat = (flags & 1) != 0;
    it.continues = (flags & 2) != 0;
    if (it.extents() > nextents - used) break;
    it.dims = extents + used;
    used += it.extents();
    const planner::ItemView* same = i < before.size() ? &before[i] : nullptr;
    if (same && same->key == it.key) it.key = same->key;
    if (same && same->same_extents(it)) it.dims = same->dims;
    if (i + 1 == count && used == nextents) return r.at_end() && !bad ? Status::Ok() : malformed("item list");
  }
  if (count == 0 && nextents == 0 && r.at_end()) return Status::Ok();
  return malformed("item list");
}

}  // namespace

Result<std::vector<planner::ItemDesc>> decode_items(std::string_view bytes) {
  planner::BulkVector<planner::ItemView> views;
  planner::BulkVector<int64_t> dims;
  dims.reserve(bytes.size() / sizeof(int64_t));
  H5CKPT_RETURN_IF_ERROR(decode_item_views(bytes, {}, &views, &dims));
  std::vector<planner::ItemDesc> items;
  items.reserve(views.size());
  for (const planner::ItemView& v : views) items.push_back(v.desc());
  return items;
}

Result<GatheredItems> decode_gathered_items(const std::vector<std::string>& messages) {
  // Both arrays sized first, from each message's count and length, so that neither moves under
  // the views (a malformed count reads as none here and fails its decode below).
  size_t views = 0, bytes = 0;
  for (const std::string& m : messages) {
    ByteReader r(m);
    views += r.get_count(kMinItemBytes);
    bytes += m.size();
  }
  GatheredItems out;
  out.views.reserve(views);
  out.dims.reserve(bytes / sizeof(int64_t));
  std::vector<size_t> begin(messages.size() + 1, 0);
  for (size_t r = 0; r < messages.size(); ++r) {
    const std::span<const planner::ItemView> before =
        r > 0 ? std::span<const planner::ItemView>(out.views.data() + begin[r - 1], begin[r] - begin[r - 1])
              : std::span<const planner::ItemView>();
    if (Status st = decode_item_views(messages[r], before, &out.views, &out.dims); !st.ok())
      return st.with_context("from rank " + std::to_string(r));
    begin[r + 1] = out.views.size();
  }
  out.items.reserve(messages.size());
  for (size_t r = 0; r < messages.size(); ++r)
    out.items.emplace_back(out.views.data() + begin[r], begin[r + 1] - begin[r]);
  return out;
}

std::string encode_tensors(const std::vector<planner::TensorPlan>& tensors) {
  // Each tensor's distinct boxes once, then each region by its box's number: a 405B plan's
  // 1.45 million regions lie on 120,000 boxes, and repeating each region's box made the message
  // 91 MB, which the coordinator writes into fresh pages and every rank decodes.
  // Sized first, so that the message is not grown by doubling (copied and faulted in twice).
  size_t size = 16;
  for (const auto& t : tensors) {
    size += 8 + t.key.size() + 1 + 8 + 8 * t.shape.size() + 8 + 8;
    for (const Box& b : t.boxes) size += 16 + 8 * (b.offset.size() + b.shape.size());
    for (const auto& reg : t.regions) size += 4 + 1 + (reg.flat ? 16 : 0) + 4;
  }
  ByteWriter w;
  w.reserve(size);
  w.put<uint64_t>(kCompactPlanTag);
  w.put<uint64_t>(tensors.size());
  for (const auto& t : tensors) {
    w.put_string(t.key);
    w.put<uint8_t>(static_cast<uint8_t>(t.dtype));
    w.put_vec(t.shape);
    w.put<uint64_t>(t.boxes.size());
    for (const Box& b : t.boxes) {
      w.put_vec(b.offset);
      w.put_vec(b.shape);
    }
    w.put<uint64_t>(t.regions.size());
    for (const auto& reg : t.regions) {
      w.put<uint32_t>(reg.box);
      w.put<uint8_t>(reg.flat);
      if (reg.flat) {
        w.put<int64_t>(reg.begin);
        w.put<int64_t>(reg.end);
      }
      w.put<int32_t>(reg.writer);
    }
  }
  return std::move(w.str());
}

namespace {

// The older encoding, which local manifests of earlier versions hold: each region's shard in full,
// as put_shard writes it, its box numbered here in order of first appearance (as plan_save
// numbers them).
bool decode_full_shards(ByteReader& r, std::vector<planner::TensorPlan>& tensors) {
  bool bad = false;
  BoxNumbers boxes;
  tensors.resize(r.get_count(kMinTensorBytes));
  for (auto& t : tensors) {
    t.key = r.get_string();
    t.dtype = get_dtype(r, &bad);
    t.shape = r.get_vec();
    const uint64_t nregions = r.get_count(kMinRegionBytes);
    t.regions.reserve(nregions);
    boxes.clear();
    for (uint64_t k = 0; k < nregions && r.ok(); ++k) {
      ShardSpec s = get_shard(r);
      const int32_t writer = r.get<int32_t>();
      t.regions.push_back(planner::PlannedRegion{s.flat ? s.flat->first : 0, s.flat ? s.flat->second : 0,
                                                 boxes.number(t.boxes, std::move(s.box)), s.flat ? 1u : 0u, writer});
      if (!s.flat && !box_volume(t.boxes[t.regions.back().box], &t.regions.back().end)) bad = true;
    }
    if (!r.ok()) break;
  }
  return !bad;
}

// The compact encoding: each tensor's boxes, then its regions by box number. A box number out of
// range, or a whole-box region of a box whose element count is negative or overflows, is refused.
bool decode_compact(ByteReader& r, std::vector<planner::TensorPlan>& tensors) {
  bool bad = false;
  std::vector<int64_t> volumes;
  tensors.resize(r.get_count(kMinCompactTensorBytes));
  for (auto& t : tensors) {
    t.key = r.get_string();
    t.dtype = get_dtype(r, &bad);
    t.shape = r.get_vec();
    t.boxes.resize(r.get_count(kMinBoxBytes));
    volumes.resize(t.boxes.size());
    for (size_t b = 0; b < t.boxes.size() && r.ok(); ++b) {
      t.boxes[b].offset = r.get_vec();
      t.boxes[b].shape = r.get_vec();
      if (!box_volume(t.boxes[b], &volumes[b])) volumes[b] = -1;
    }
    const uint64_t nregions = r.get_count(kMinCompactRegionBytes);
    // Zeroed, then assigned: PlannedRegion's bit fields are stored by reading their word, and a
    // fresh page read before it is written faults twice (the zero page, then the copy). Every
    // rank decodes the whole plan: 1.45 million regions at 405B.
    t.regions.resize(nregions);  // bounded by the bytes left
    for (uint64_t k = 0; k < nregions && r.ok(); ++k) {
      const uint32_t box = r.get<uint32_t>();
      const bool flat = r.get<uint8_t>() != 0;
      const int64_t begin = flat ? r.get<int64_t>() : 0;
      const int64_t end = flat ? r.get<int64_t>() : 0;
      const int32_t writer = r.get<int32_t>();
      if (!r.ok()) break;
      // PlannedRegion numbers boxes in 31 bits.
      if (box >= t.boxes.size() || box >= (1u << 31) || (!flat && volumes[box] < 0)) {
        bad = true;
        break;
      }
      t.regions[k] = planner::PlannedRegion{begin, flat ? end : volumes[box], box, flat ? 1u : 0u, writer};
    }
    if (!r.ok() || bad) break;
  }
  return !bad;
}

}  // namespace

Result<std::vector<planner::TensorPlan>> decode_tensors(const std::string& bytes) {
  ByteReader r(bytes);
  std::vector<planner::TensorPlan> tensors;
  bool good = false;
  if (ByteReader peek(bytes); peek.get<uint64_t>() == kCompactPlanTag && peek.ok()) {
    (void)r.get<uint64_t>();
    good = decode_compact(r, tensors);
  } else {
    good = decode_full_shards(r, tensors);
  }
  if (!good || !r.ok() || !r.at_end()) return malformed("save plan");
  return tensors;
}

std::string encode_requests(const std::vector<LoadRequestEntry>& requests) {
  ByteWriter w;
  w.put<uint64_t>(requests.size());
  for (const auto& q : requests) {
    w.put<uint8_t>((q.skip ? 1 : 0) | (q.on_device ? 2 : 0));
    w.put_string(q.skip ? std::string() : q.request.signature);
    w.put<uint64_t>(q.request.bytes);
  }
  return std::move(w.str());
}

namespace {

// Parses a requests message, handing each entry to `f(skip, on_device, request)` with its
// signature viewed in `bytes`; the count is read first (`f_count(n)`), to size the output.
template <class Count, class Entry>
Status for_each_request(const std::string& bytes, Count&& f_count, Entry&& f) {
  ByteReader r(bytes);
  const uint64_t n = r.get_count(kMinRequestBytes);
  f_count(n);
  for (uint64_t i = 0; i < n && r.ok(); ++i) {
    const uint8_t flags = r.get<uint8_t>();
    planner::RequestView q;
    q.signature = r.get_string_view();
    q.bytes = r.get<uint64_t>();
    if (r.ok()) f((flags & 1) != 0, (flags & 2) != 0, q);
  }
  if (!r.ok() || !r.at_end()) return malformed("load request");
  return Status::Ok();
}

}  // namespace

Result<GatheredRequests> decode_gathered_requests(const std::vector<std::string>& messages) {
  GatheredRequests in;
  const size_t world = messages.size();
  in.requests.resize(world);
  in.item_of.resize(world);
  in.on_device.resize(world);
  in.items.assign(world, 0);
  for (size_t r = 0; r < world; ++r) {
    H5CKPT_RETURN_IF_ERROR(for_each_request(
        messages[r],
        [&](uint64_t n) {
          in.requests[r].reserve(n);
          in.item_of[r].reserve(n);
          in.on_device[r].reserve(n);
        },
        [&](bool skip, bool on_device, const planner::RequestView& q) {
          const int item = static_cast<int>(in.on_device[r].size());
          in.on_device[r].push_back(on_device);
          if (skip) return;
          in.requests[r].push_back(q);
          in.item_of[r].push_back(item);
        }));
    in.items[r] = in.on_device[r].size();
  }
  return in;
}

Result<std::vector<LoadRequestEntry>> decode_requests(const std::string& bytes) {
  std::vector<LoadRequestEntry> out;
  H5CKPT_RETURN_IF_ERROR(for_each_request(
      bytes, [&](uint64_t n) { out.reserve(n); },
      [&](bool skip, bool on_device, const planner::RequestView& q) {
        out.push_back({skip, on_device, {std::string(q.signature), q.bytes}});
      }));
  return out;
}

namespace {

// A role's fixed fields (role, group, peer, target count) in one append: the coordinator writes
// 3 million of them at 8,960 ranks.
void put_role(ByteWriter& w, planner::Role role, int32_t group, int32_t peer, uint64_t targets) {
  char head[kMinRoleBytes];
  const int32_t r = static_cast<int32_t>(role);
  std::memcpy(head, &r, 4);
  std::memcpy(head + 4, &group, 4);
  std::memcpy(head + 8, &peer, 4);
  std::memcpy(head + 12, &targets, 8);
  w.put_bytes(head, sizeof head);
}

}  // namespace

std::string encode_roles(const std::vector<planner::ItemRole>& roles) {
  ByteWriter w;
  w.put<uint64_t>(roles.size());
  for (const auto& x : roles) {
    put_role(w, x.role, x.group, x.peer, x.targets.size());
    for (int32_t t : x.targets) w.put<int32_t>(t);
  }
  return std::move(w.str());
}

std::string encode_roles(const planner::LoadPlan& plan, const planner::RoleTable& table, size_t rank) {
  ByteWriter w;
  const size_t n = table.items(rank);
  w.reserve(8 + n * kMinRoleBytes);  // and a reader's targets
  w.put<uint64_t>(n);
  // Items' groups lie anywhere among the plan's 730,000 (8,960 ranks): each is asked for ahead.
  constexpr size_t kAhead = 8;
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n)
      if (const int32_t a = table.group(rank, i + kAhead); a >= 0) __builtin_prefetch(&plan.groups[a]);
    const planner::ItemRole role = table.role_head(plan, rank, i);
    if (role.role != planner::Role::kRead) {
      put_role(w, role.role, role.group, role.peer, 0);
      continue;
    }
    const int reader = static_cast<int>(rank);
    const auto members = plan.members_of(static_cast<size_t>(role.group));
    uint64_t targets = 0;
    for (const planner::LoadMember& m : members) targets += m.rank != reader;
    put_role(w, role.role, role.group, role.peer, targets);
    for (const planner::LoadMember& m : members)
      if (m.rank != reader) w.put<int32_t>(m.rank);
  }
  return std::move(w.str());
}

Result<std::vector<planner::ItemRole>> decode_roles(const std::string& bytes) {
  ByteReader r(bytes);
  std::vector<planner::ItemRole> roles(r.get_count(kMinRoleBytes));
  bool bad = false;
  for (auto& x : roles) {
    const int32_t role = r.get<int32_t>();
    bad = bad || role < 0 || role > static_cast<int32_t>(planner::Role::kReceive);
    x.role = static_cast<planner::Role>(role);
    x.group = r.get<int32_t>();
    x.peer = r.get<int32_t>();
    x.targets.resize(r.get_count(sizeof(int32_t)));
    for (auto& t : x.targets) t = r.get<int32_t>();
    if (!r.ok()) break;
  }
  if (bad || !r.ok() || !r.at_end()) return malformed("load plan");
  return roles;
}

std::string encode_checksums(const std::vector<RegionChecksum>& sums) {
  ByteWriter w;
  w.put<uint64_t>(sums.size());
  for (const auto& s : sums) {
    w.put<int32_t>(s.tensor);
    w.put<int32_t>(s.region);
    w.put<uint64_t>(s.block_bytes);
    w.put<uint64_t>(s.blocks.size());
    for (uint64_t b : s.blocks) w.put<uint64_t>(b);
  }
  return std::move(w.str());
}

Result<std::vector<RegionChecksum>> decode_checksums(const std::string& bytes) {
  ByteReader r(bytes);
  std::vector<RegionChecksum> sums(r.get_count(kChecksumBytes));
  for (auto& s : sums) {
    s.tensor = r.get<int32_t>();
    s.region = r.get<int32_t>();
    s.block_bytes = r.get<uint64_t>();
    s.blocks.resize(r.get_count(sizeof(uint64_t)));
    for (auto& b : s.blocks) b = r.get<uint64_t>();
    if (!r.ok()) break;
  }
  if (!r.ok() || !r.at_end()) return malformed("checksum");
  return sums;
}

std::string encode_pair(const std::string& first, const std::string& second) {
  ByteWriter w;
  w.put_string(first);
  w.put_string(second);
  return std::move(w.str());
}

Result<std::pair<std::string, std::string>> decode_pair(const std::string& bytes) {
  ByteReader r(bytes);
  std::string a = r.get_string();
  std::string b = r.get_string();
  if (!r.ok() || !r.at_end()) return malformed("two-string");
  return std::make_pair(std::move(a), std::move(b));
}

std::string encode_outcome(const Result<std::string>& on_root) {
  ByteWriter w;
  w.put<int32_t>(static_cast<int32_t>(on_root.status().code()));
  w.put_string(on_root.ok() ? std::string() : on_root.status().message());
  w.put_string(on_root.ok() ? *on_root : std::string());
  return std::move(w.str());
}

Result<std::string> bcast_outcome(const Result<std::string>& on_root, int root, MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string msg;
  if (rank == root) msg = encode_outcome(on_root);
  H5CKPT_RETURN_IF_ERROR(comm::bcast_bytes(msg, root, comm));
  return decode_outcome(msg);
}

Result<std::string> decode_outcome(const std::string& msg) {
  ByteReader r(msg);
  const auto code = static_cast<ErrorCode>(r.get<int32_t>());
  std::string text = r.get_string();
  std::string payload = r.get_string();
  if (!r.ok() || !r.at_end()) return malformed("broadcast");
  if (code != ErrorCode::kOk) return Status(code, std::move(text));
  return payload;
}

std::string encode_listing(const std::vector<storage::LocalEntry>& entries) {
  ByteWriter w;
  w.put<uint64_t>(entries.size());
  for (const auto& e : entries) {
    w.put_string(e.name);
    w.put<uint64_t>(e.manifest_id);
    w.put<int64_t>(e.step);
    w.put<uint64_t>(e.world);
    w.put<uint64_t>(e.ranks.size());
    for (int r : e.ranks) w.put<int64_t>(r);
    w.put<uint64_t>(e.node_of_rank.size());
    for (int n : e.node_of_rank) w.put<int64_t>(n);
  }
  return w.str();
}

Result<std::vector<storage::LocalEntry>> decode_listing(const std::string& bytes) {
  ByteReader r(bytes);
  std::vector<storage::LocalEntry> out;
  const uint64_t n = r.get_count(8 + 8 + 8 + 8 + 8 + 8);
  for (uint64_t i = 0; i < n && r.ok(); ++i) {
    storage::LocalEntry e;
    e.name = r.get_string();
    e.manifest_id = r.get<uint64_t>();
    e.step = r.get<int64_t>();
    e.world = r.get<uint64_t>();
    const uint64_t k = r.get_count(8);
    for (uint64_t j = 0; j < k && r.ok(); ++j) e.ranks.push_back(static_cast<int>(r.get<int64_t>()));
    const uint64_t m = r.get_count(8);
    for (uint64_t j = 0; j < m && r.ok(); ++j) e.node_of_rank.push_back(static_cast<int>(r.get<int64_t>()));
    out.push_back(std::move(e));
  }
  if (!(r.ok() && r.at_end())) return malformed("local listing");
  return out;
}

std::string encode_choice(const LevelChoice& c) {
  ByteWriter w;
  w.put<uint64_t>(c.local ? 1 : 0);
  w.put_string(c.reason);
  w.put_string(c.name);
  if (!c.local) return w.str();
  w.put<uint64_t>(c.manifest_id);
  w.put<int64_t>(c.manifest_root);
  w.put<uint64_t>(c.server.size());
  for (int s : c.server) w.put<int64_t>(s);
  return w.str();
}

Result<LevelChoice> decode_choice(const std::string& bytes) {
  ByteReader r(bytes);
  LevelChoice c;
  c.local = r.get<uint64_t>() != 0;
  c.reason = r.get_string();
  c.name = r.get_string();
  if (c.local) {
    c.manifest_id = r.get<uint64_t>();
    c.manifest_root = static_cast<int>(r.get<int64_t>());
    const uint64_t n = r.get_count(8);
    for (uint64_t i = 0; i < n && r.ok(); ++i) c.server.push_back(static_cast<int>(r.get<int64_t>()));
  }
  if (!(r.ok() && r.at_end())) return malformed("level choice");
  return c;
}

void put_local_request(ByteWriter& w, const LocalRequest& q) {
  w.put<uint64_t>(q.tensor);
  w.put<uint64_t>(q.region);
  put_shard(w, q.want);
}

Result<std::vector<LocalRequest>> decode_local_requests(const std::string& bytes) {
  ByteReader r(bytes);
  std::vector<LocalRequest> out;
  while (r.ok() && !r.at_end()) {
    LocalRequest q;
    q.tensor = r.get<uint64_t>();
    q.region = r.get<uint64_t>();
    q.want = get_shard(r);
    out.push_back(std::move(q));
  }
  if (!r.ok()) return malformed("local-level request");
  return out;
}

}  // namespace h5ckpt::engine::wire
