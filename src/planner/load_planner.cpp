#include "planner/load_planner.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>
#include <string_view>

#include "planner/box_math.h"
#include "planner/bulk_allocator.h"
#include "planner/id_slots.h"
#include "planner/largest_first.h"
#include "util/checked_math.h"

namespace h5ckpt::planner {

namespace {

// Appends a value's bytes: the signature is compared, never parsed.
template <class T>
void append(std::string& s, const T& v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void append_shape(std::string& s, const Shape& v) {
  append<uint64_t>(s, v.size());
  s.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
}

}  // namespace

LoadRequest make_request(const LoadWant& want) {
  const ItemDesc& d = want.desc;
  LoadRequest q;
  q.signature.reserve(d.key.size() + 96);
  append<uint64_t>(q.signature, d.key.size());
  q.signature += d.key;
  append<uint8_t>(q.signature, static_cast<uint8_t>(d.dtype));
  append_shape(q.signature, d.global_shape);
  append_shape(q.signature, d.shard.box.offset);
  append_shape(q.signature, d.shard.box.shape);
  append<int64_t>(q.signature, d.shard.flat ? d.shard.flat->first : -1);
  append<int64_t>(q.signature, d.shard.flat ? d.shard.flat->second : -1);
  append<uint8_t>(q.signature, static_cast<uint8_t>((want.pad ? 1 : 0) | (want.on_device ? 2 : 0)));
  q.bytes = static_cast<uint64_t>(d.shard.numel()) * dtype_size(d.dtype);
  return q;
}

namespace {

// A signature's hash, a word at a time (signatures are about 130 bytes).
uint64_t signature_hash(std::string_view s) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 29;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  h = (h ^ tail) * 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 32);
}

// Groups of identical signatures, numbered in order of first appearance, in an open-addressing
// table of group numbers over compact (hash, first signature) records: at 8,960 ranks there are
// 3 million requests in 730,000 groups, and a hash map with a node per group spent most of the
// coordinator's load step allocating and freeing. The hashes come first, in one pass over the
// requests, so that the table's slots can be fetched ahead of their probes (each is a cache miss).
class SignatureGroups {
 public:
  explicit SignatureGroups(size_t requests) { seeds_.reserve(requests); }

  // Room for `more` new groups without growing; the slots stay put until the next call.
  void reserve_more(size_t more) {
    while (2 * (seeds_.size() + more) > slots_.size()) grow();
  }
  void prefetch(uint64_t hash) const { __builtin_prefetch(&slots_[hash & (slots_.size() - 1)]); }

  // The group of `signature` (whose hash is `h`), added when new.
  uint32_t find_or_add(const std::string& signature, uint64_t h) {
    const uint32_t next = static_cast<uint32_t>(seeds_.size());
    const uint32_t g = find_or_insert_id(
        slots_, h, next, [&](uint32_t g) { return seeds_[g].hash == h && *seeds_[g].signature == signature; });
    if (g == next) seeds_.push_back(Seed{h, &signature});
    return g;
  }
  size_t size() const { return seeds_.size(); }

 private:
  struct Seed {
    uint64_t hash;
    const std::string* signature;  // the first request's
  };
  void grow() {
    rehash_ids(slots_, static_cast<uint32_t>(seeds_.size()), 1024, [&](uint32_t g) { return seeds_[g].hash; });
  }
  BulkVector<Seed> seeds_;
  BulkVector<uint32_t> slots_;
};

}  // namespace

LoadPlan plan_load(const std::vector<std::vector<LoadRequest>>& ranks, bool deduplicate) {
  LoadPlan plan;
  size_t total = 0;
  for (const auto& r : ranks) total += r.size();
  // Each request's group (groups in order of first appearance; 32 bits, as ItemRole::group), then the groups with their
  // member lists allocated once at their final size, filled in rank order.
  BulkVector<uint32_t> group_of(total);
  size_t ngroups = 0;
  if (deduplicate) {
    // Rank by rank: its requests' hashes (each signature its own heap block, fetched a few
    // requests ahead), then their groups, the slot of a request a few places ahead fetched while
    // the current one is probed.
    constexpr size_t kAhead = 8;
    SignatureGroups groups(total);
    std::vector<uint64_t> hashes;
    size_t k = 0;
    for (const auto& requests : ranks) {
      hashes.resize(requests.size());
      for (size_t i = 0; i < requests.size(); ++i) {
        if (i + kAhead < requests.size()) __builtin_prefetch(requests[i + kAhead].signature.data());
        hashes[i] = signature_hash(requests[i].signature);
      }
      groups.reserve_more(requests.size());
      for (size_t i = 0; i < requests.size(); ++i) {
        if (i + kAhead < requests.size()) groups.prefetch(hashes[i + kAhead]);
        group_of[k++] = groups.find_or_add(requests[i].signature, hashes[i]);
      }
    }
    ngroups = groups.size();
  } else {
    std::iota(group_of.begin(), group_of.end(), 0u);
    ngroups = total;
  }
  {
    BulkVector<uint32_t> members(ngroups, 0);
    for (uint32_t g : group_of) ++members[g];
    plan.groups.resize(ngroups);
    for (size_t g = 0; g < ngroups; ++g) plan.groups[g].members.reserve(members[g]);
  }
  size_t k = 0;
  for (size_t r = 0; r < ranks.size(); ++r)
    for (size_t i = 0; i < ranks[r].size(); ++i) {
      LoadGroup& grp = plan.groups[group_of[k++]];
      if (grp.members.empty()) grp.bytes = ranks[r][i].bytes;  // the first request's, as for the signature
      grp.members.push_back({static_cast<int>(r), static_cast<int>(i)});
    }
  plan.read_bytes_by_rank.assign(ranks.size(), 0);
  // Largest groups first, ties in group order. The order jumps between groups, each of whose
  // member lists is a heap block of its own: both are asked for a few groups ahead.
  const BulkVector<uint32_t> order = largest_first(plan.groups);
  constexpr size_t kGroupAhead = 8, kMembersAhead = 4;
  for (size_t k = 0; k < order.size(); ++k) {
    if (k + kGroupAhead < order.size()) __builtin_prefetch(&plan.groups[order[k + kGroupAhead]]);
    if (k + kMembersAhead < order.size()) __builtin_prefetch(plan.groups[order[k + kMembersAhead]].members.data());
    LoadGroup& grp = plan.groups[order[k]];
    int best = grp.members[0].rank;
    for (const auto& m : grp.members)
      if (plan.read_bytes_by_rank[m.rank] < plan.read_bytes_by_rank[best]) best = m.rank;
    grp.reader = best;
    plan.read_bytes_by_rank[best] += grp.bytes;
  }
  return plan;
}

std::vector<std::vector<ItemRole>> assign_roles(const LoadPlan& plan, const std::vector<std::vector<int>>& item_of,
                                                const std::vector<size_t>& items) {
  std::vector<std::vector<ItemRole>> roles(items.size());
  for (size_t r = 0; r < items.size(); ++r) roles[r].resize(items[r]);
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    const LoadGroup& grp = plan.groups[g];
    for (const auto& m : grp.members) {
      ItemRole& role = roles[m.rank][item_of[m.rank][m.item]];
      role.group = static_cast<int32_t>(g);
      if (m.rank == grp.reader) {
        role.role = Role::kRead;
        role.targets.reserve(grp.members.size() - 1);
        for (const auto& o : grp.members)
          if (o.rank != grp.reader) role.targets.push_back(o.rank);
      } else {
        role.role = Role::kReceive;
        role.peer = grp.reader;
      }
    }
  }
  return roles;
}

std::vector<Box> wanted_boxes(const StoredTensor& stored, const LoadWant& want) {
  Box readable{Shape(stored.shape.size(), 0), stored.shape};
  if (stored.shape != want.desc.global_shape)
    for (size_t d = 0; d < stored.shape.size() && d < want.desc.global_shape.size(); ++d)
      readable.shape[d] = std::min(stored.shape[d], want.desc.global_shape[d]);
  std::vector<Box> parts;
  for (const Box& box : shard_boxes(want.desc.shard))
    if (auto part = intersect(box, readable)) parts.push_back(*part);
  return parts;
}

RankLoadPlan plan_rank_load(const std::vector<ItemRole>& roles, const std::vector<LoadWant>& wants,
                            const std::vector<StoredTensor>& stored, bool file_order) {
  RankLoadPlan plan;
  for (size_t i = 0; i < roles.size(); ++i) {
    const ItemRole& role = roles[i];
    if (role.role == Role::kSkip) {
      plan.skipped.push_back(static_cast<int>(i));
      continue;
    }
    const LoadWant& want = wants[i];
    ReadItem r;
    r.item = static_cast<int>(i);
    r.role = role.role;
    r.group = role.group;
    r.on_device = want.on_device;
    r.bytes = static_cast<uint64_t>(want.desc.shard.numel()) * dtype_size(want.desc.dtype);
    if (role.role == Role::kRead) {
      r.receivers.assign(role.targets.begin(), role.targets.end());
      r.stored = stored[i];
      r.zero_fill = stored[i].shape != want.desc.global_shape;
      r.boxes = wanted_boxes(stored[i], want);
    } else {
      r.reader = role.peer;
    }
    plan.items.push_back(std::move(r));
  }
  std::stable_sort(plan.items.begin(), plan.items.end(),
                   [](const ReadItem& a, const ReadItem& b) { return a.group < b.group; });
  for (size_t k = 0; k < plan.items.size(); ++k)
    if (plan.items[k].role == Role::kRead) plan.read_order.push_back(k);
  if (file_order)
    std::stable_sort(plan.read_order.begin(), plan.read_order.end(), [&](size_t a, size_t b) {
      return plan.items[a].stored.file_offset < plan.items[b].stored.file_offset;
    });
  return plan;
}

std::string RankLoadPlan::describe(const std::vector<LoadWant>& wants) const {
  std::ostringstream o;
  for (const ReadItem& r : items) {
    o << "group " << r.group << " '" << wants[r.item].desc.key << "' " << to_string_spec(wants[r.item].desc.shard)
      << (r.on_device ? " device" : " host") << ' ' << r.bytes << " B: ";
    if (r.role == Role::kRead) {
      o << "read " << r.boxes.size() << " box(es) at file offset " << r.stored.file_offset;
      if (r.zero_fill) o << " (zero-filled)";
      if (!r.receivers.empty()) {
        o << ", send to";
        for (int t : r.receivers) o << ' ' << t;
      }
    } else {
      o << "receive from " << r.reader;
    }
    o << '\n';
  }
  for (int i : skipped) o << "skip '" << wants[i].desc.key << "' (not in the checkpoint)\n";
  return o.str();
}

}  // namespace h5ckpt::planner
