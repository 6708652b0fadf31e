// Pure load planning for zero-redundancy loading: identical requests from several ranks (DP
// replicas of the same shard) are read from storage by one of them and sent to the others.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace h5ckpt::planner {

/// One item a rank wants to load. Requests with equal signatures want identical bytes.
struct LoadRequest {
  std::string signature;  ///< key, dtype, global shape, shard, options: anything that changes the bytes
  uint64_t bytes = 0;
};

/// The ranks wanting identical bytes, and the one that reads them.
struct LoadGroup {
  struct Member {
    int rank;
    int item;  ///< index into that rank's request list
  };
  std::vector<Member> members;  ///< sorted by rank
  int reader = -1;              ///< rank that reads from storage and sends to the other members
  uint64_t bytes = 0;
};

struct LoadPlan {
  std::vector<LoadGroup> groups;            ///< in a fixed order every rank uses for messaging
  std::vector<uint64_t> read_bytes_by_rank;  ///< storage bytes each rank reads
};

/// Groups identical requests and picks each group's reader worst-fit by bytes (largest groups
/// first, each to its least-loaded member), so storage reads are balanced and every byte is read
/// from storage once per job. With `deduplicate` false every request is its own group.
LoadPlan plan_load(const std::vector<std::vector<LoadRequest>>& ranks, bool deduplicate = true);

}  // namespace h5ckpt::planner
