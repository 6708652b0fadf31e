// Pure load planning (no MPI, no HDF5). Zero-redundancy loading: identical requests from several
// ranks (DP replicas of one shard) are read from storage by one of them and sent to the others.
// The coordinator turns every rank's requests into groups and roles (plan_load, assign_roles);
// each rank turns its roles into ReadItems (plan_rank_load), which the engine only executes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "h5ckpt/types.h"
#include "planner/bulk_allocator.h"
#include "planner/save_planner.h"

namespace h5ckpt::planner {

/// One item a rank wants to load. Requests with equal signatures want identical bytes.
struct LoadRequest {
  std::string signature;  ///< key, dtype, global shape, shard, options: anything that changes the bytes
  uint64_t bytes = 0;
};
/// A request as the coordinator plans it: its signature viewed in the message it came in (3
/// million requests at 8,960 ranks are not copied into strings of their own).
struct RequestView {
  std::string_view signature;
  uint64_t bytes = 0;
};

/// One of a rank's items as load planning sees it.
struct LoadWant {
  ItemDesc desc;
  bool on_device = false;  ///< destination in device memory (groups never mix host and device)
  bool pad = false;        ///< allow_shape_mismatch: a stored shape of the same rank is accepted
  bool skip = false;       ///< not in the checkpoint (non-strict loads): nothing is planned for it
};

/// The request of a wanted item: identical bytes <=> identical signature.
LoadRequest make_request(const LoadWant& want);

/// One request of a group: rank `rank`'s request number `item`.
struct LoadMember {
  int rank;
  int item;  ///< index into that rank's request list
};

/// The ranks wanting identical bytes, and the one that reads them. The members lie in the plan's
/// one array (a vector per group cost the coordinator 730,000 allocations at 8,960 ranks).
struct LoadGroup {
  uint32_t first = 0;  ///< the members are LoadPlan::members[first, first + count), sorted by rank
  uint32_t count = 0;
  int reader = -1;  ///< rank that reads from storage and sends to the other members
  uint64_t bytes = 0;
};

struct LoadPlan {
  std::vector<LoadGroup> groups;             ///< in a fixed order every rank uses for messaging
  BulkVector<LoadMember> members;            ///< every group's members, group after group
  std::vector<uint64_t> read_bytes_by_rank;  ///< storage bytes each rank reads
  std::span<const LoadMember> members_of(size_t g) const { return {members.data() + groups[g].first, groups[g].count}; }
  /// Whether group g's bytes go from its reader to another rank (not only to its own items).
  bool crosses_ranks(size_t g) const {
    for (const LoadMember& m : members_of(g))
      if (m.rank != groups[g].reader) return true;
    return false;
  }
};

/// Groups identical requests and picks each group's reader worst-fit by bytes (largest groups
/// first, each to its least-loaded member), so storage reads are balanced and every byte is read
/// from storage once per job. With `deduplicate` false every request is its own group.
LoadPlan plan_load(const std::vector<std::vector<RequestView>>& ranks, bool deduplicate = true);
/// The same from requests that own their signatures.
LoadPlan plan_load(const std::vector<std::vector<LoadRequest>>& ranks, bool deduplicate = true);

/// What one rank does for one of its items in a load.
enum class Role : int32_t { kSkip = 0, kRead = 1, kReceive = 2 };
struct ItemRole {
  Role role = Role::kSkip;
  int32_t group = 0;             ///< orders messages; both sides walk groups in ascending order
  int32_t peer = -1;             ///< kReceive: the reader
  std::vector<int32_t> targets;  ///< kRead: ranks to send the bytes to
  bool operator==(const ItemRole&) const = default;
};

/// Every rank's roles as the coordinator holds them: each item's group only (-1: skipped), since
/// the role follows from the group. Its reader reads and sends to the other members' ranks; they
/// receive from it. 4 bytes per item instead of an ItemRole with a vector (120 MB at 8,960 ranks).
class RoleTable {
 public:
  size_t ranks() const { return begin_.size() - 1; }
  size_t items(size_t rank) const { return begin_[rank + 1] - begin_[rank]; }
  int32_t group(size_t rank, size_t item) const { return group_[begin_[rank] + item]; }
  /// An item's role, group and peer, without the targets (a reader's are the other members'
  /// ranks): the one place the role follows from the group.
  ItemRole role_head(const LoadPlan& plan, size_t rank, size_t item) const;
  /// Rank `rank`'s roles in full, as the rank receives them.
  std::vector<ItemRole> roles_of(const LoadPlan& plan, size_t rank) const;

 private:
  friend RoleTable assign_roles(const LoadPlan&, const std::vector<std::vector<int>>&, const std::vector<size_t>&);
  std::vector<size_t> begin_{0};  // rank r's items are group_[begin_[r], begin_[r + 1])
  BulkVector<int32_t> group_;
};

/// Every rank's roles from a plan. `item_of[r][k]` is the item index of rank r's request k
/// (requests leave out skipped items); `items[r]` is rank r's item count.
RoleTable assign_roles(const LoadPlan& plan, const std::vector<std::vector<int>>& item_of,
                       const std::vector<size_t>& items);

/// A stored tensor as load planning needs it.
struct StoredTensor {
  DType dtype = DType::kF32;
  Shape shape;
  int64_t file_offset = -1;  ///< start of the contiguous dataset in the data file; -1: empty tensor
};

/// One step of a rank's load, as plain data: where the bytes of one destination item come from.
struct ReadItem {
  int item = -1;  ///< index into the rank's items: the destination buffer
  Role role = Role::kSkip;
  int group = 0;               ///< identical-bytes group; orders and tags the messages
  int reader = -1;             ///< kReceive: the rank that reads the bytes and sends them here
  std::vector<int> receivers;  ///< kRead: ranks the bytes are sent to once read
  bool on_device = false;      ///< destination in device memory
  uint64_t bytes = 0;          ///< destination bytes
  StoredTensor stored;         ///< kRead: the dataset read from
  std::vector<Box> boxes;      ///< kRead: parts of the dataset read (global coordinates)
  bool zero_fill = false;      ///< kRead: stored shape differs; the buffer is zeroed before the reads
};

/// A rank's load plan.
struct RankLoadPlan {
  std::vector<ReadItem> items;  ///< every non-skipped item, in group order
  std::vector<int> skipped;     ///< items not in the checkpoint (non-strict loads)
  /// The kRead entries of `items` in the order to read them: file order when `file_order`
  /// (the kernel's read-ahead then sees one forward stream), else group order.
  std::vector<size_t> read_order;
  /// One line per item, for logs and tests.
  std::string describe(const std::vector<LoadWant>& wants) const;
};

/// The parts of a stored tensor an item's shard reads: its boxes, cut to the stored shape when a
/// padded item's shape differs (the rest of the buffer is zeroed, the surplus dropped).
std::vector<Box> wanted_boxes(const StoredTensor& stored, const LoadWant& want);

/// Turns this rank's roles into ReadItems. `stored[i]` is item i's dataset (unused for skipped
/// items). `file_order`: read in file order (needs tags that tell groups apart).
RankLoadPlan plan_rank_load(const std::vector<ItemRole>& roles, const std::vector<LoadWant>& wants,
                            const std::vector<StoredTensor>& stored, bool file_order);

}  // namespace h5ckpt::planner
