#include "planner/load_planner.h"

#include <xxhash.h>

#include <algorithm>
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

// A signature's hash (signatures are about 130 bytes): XXH3 mixes 16 bytes per step in
// independent lanes, where a word-at-a-time chain of multiplies took 40% of the grouping's
// instructions.
uint64_t signature_hash(std::string_view s) { return XXH3_64bits(s.data(), s.size()); }

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
  uint32_t find_or_add(std::string_view signature, uint64_t h) {
    const uint32_t next = static_cast<uint32_t>(seeds_.size());
    const uint32_t g = find_or_insert_id(
        slots_, h, next, [&](uint32_t g) { return seeds_[g].hash == h && seeds_[g].signature == signature; });
    if (g == next) seeds_.push_back(Seed{h, signature});
    return g;
  }
  size_t size() const { return seeds_.size(); }

 private:
  struct Seed {
    uint64_t hash;
    std::string_view signature;  // the first request's
  };
  void grow() {
    rehash_ids(slots_, static_cast<uint32_t>(seeds_.size()), 1024, [&](uint32_t g) { return seeds_[g].hash; });
  }
  BulkVector<Seed> seeds_;
  BulkVector<uint32_t> slots_;
};

}  // namespace

LoadPlan plan_load(const std::vector<std::vector<LoadRequest>>& ranks, bool deduplicate) {
  std::vector<std::vector<RequestView>> views(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r)
    for (const LoadRequest& q : ranks[r]) views[r].push_back(RequestView{q.signature, q.bytes});
  return plan_load(views, deduplicate);
}

LoadPlan plan_load(const std::vector<std::vector<RequestView>>& ranks, bool deduplicate) {
  LoadPlan plan;
  size_t total = 0;
  for (const auto& r : ranks) total += r.size();
  // Each request's group (groups in order of first appearance; 32 bits, as ItemRole::group), then
  // the groups with their members.
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
  // The members in one array, each group's run sized by a count and filled in rank order.
  plan.groups.resize(ngroups);
  for (uint32_t g : group_of) ++plan.groups[g].count;
  uint32_t first = 0;
  for (LoadGroup& grp : plan.groups) {
    grp.first = first;
    first += grp.count;
    grp.count = 0;  // counted again as the members are placed
  }
  plan.members.resize(total);
  size_t k = 0;
  for (size_t r = 0; r < ranks.size(); ++r)
    for (size_t i = 0; i < ranks[r].size(); ++i) {
      LoadGroup& grp = plan.groups[group_of[k++]];
      if (grp.count == 0) grp.bytes = ranks[r][i].bytes;  // the first request's, as for the signature
      plan.members[grp.first + grp.count++] = {static_cast<int>(r), static_cast<int>(i)};
    }
  plan.read_bytes_by_rank.assign(ranks.size(), 0);
  // Largest groups first, ties in group order. The order jumps between groups and their members:
  // both are asked for a few groups ahead.
  const BulkVector<uint32_t> order = largest_first(plan.groups);
  constexpr size_t kGroupAhead = 8, kMembersAhead = 4;
  for (size_t o = 0; o < order.size(); ++o) {
    if (o + kGroupAhead < order.size()) __builtin_prefetch(&plan.groups[order[o + kGroupAhead]]);
    if (o + kMembersAhead < order.size())
      __builtin_prefetch(&plan.members[plan.groups[order[o + kMembersAhead]].first]);
    LoadGroup& grp = plan.groups[order[o]];
    const std::span<const LoadMember> members = plan.members_of(order[o]);
    int best = members[0].rank;
    for (const LoadMember& m : members)
      if (plan.read_bytes_by_rank[m.rank] < plan.read_bytes_by_rank[best]) best = m.rank;
    grp.reader = best;
    plan.read_bytes_by_rank[best] += grp.bytes;
  }
  return plan;
}

RoleTable assign_roles(const LoadPlan& plan, const std::vector<std::vector<int>>& item_of,
                       const std::vector<size_t>& items) {
  RoleTable table;
  table.begin_.resize(items.size() + 1);
  for (size_t r = 0; r < items.size(); ++r) table.begin_[r + 1] = table.begin_[r] + items[r];
  table.group_.assign(table.begin_.back(), -1);
  for (size_t g = 0; g < plan.groups.size(); ++g)
    for (const LoadMember& m : plan.members_of(g))
      table.group_[table.begin_[m.rank] + item_of[m.rank][m.item]] = static_cast<int32_t>(g);
  return table;
}

ItemRole RoleTable::role_head(const LoadPlan& plan, size_t rank, size_t item) const {
  ItemRole role;
  const int32_t g = group(rank, item);
  if (g < 0) return role;
  role.group = g;
  const int reader = plan.groups[g].reader;
  if (static_cast<int>(rank) == reader) {
    role.role = Role::kRead;
  } else {
    role.role = Role::kReceive;
    role.peer = reader;
  }
  return role;
}

std::vector<ItemRole> RoleTable::roles_of(const LoadPlan& plan, size_t rank) const {
  std::vector<ItemRole> roles(items(rank));
  for (size_t i = 0; i < roles.size(); ++i) {
    ItemRole& role = roles[i] = role_head(plan, rank, i);
    if (role.role != Role::kRead) continue;
    const int reader = static_cast<int>(rank);
    role.targets.reserve(plan.groups[role.group].count - 1);
    for (const LoadMember& o : plan.members_of(role.group))
      if (o.rank != reader) role.targets.push_back(o.rank);
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
