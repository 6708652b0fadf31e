// Internal state of a Topology: owned communicators and the coordination tree.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "h5ckpt/topology.h"

namespace h5ckpt {

// Hidden although nested in an exported class (nested classes take the visibility of the outer one).
struct [[gnu::visibility("hidden")]] Topology::Impl {
  comm::Comm world, tp, dp, pp;
  /// Context, dense DP x CP, expert and expert-DP groups (the library's own phases use only the
  /// ones above; the async writer's copy leaves these null).
  comm::Comm cp, dp_cp, ep, edp;
  /// The machine's shape: the ranks of this node (MPI_COMM_TYPE_SHARED; $H5CKPT_RANKS_PER_NODE
  /// cuts a node into smaller simulated ones), and one leader per node (null elsewhere), the
  /// coordinator first. Coordination goes through the leaders, so the coordinator exchanges
  /// messages with O(nodes) peers, not O(ranks).
  comm::Comm node, leaders;
  std::vector<int> node_ranks;                 ///< world ranks of this rank's node, in node order
  std::vector<std::vector<int>> node_members;  ///< coordinator only: node_ranks of each leader
  int nodes = 1;
  ParallelSizes sizes;
  RankCoords coords;
  std::vector<RankCoords> all_coords;
  int coordinator = 0;  ///< world rank with coordinates (0,0,0,0): root of the TP-CP-DP-PP tree

  bool leader() const { return leaders.get() != MPI_COMM_NULL; }

  /// Gathers every rank's bytes to the coordinator through the node leaders. Returns
  /// per-world-rank bytes on the coordinator, empty elsewhere. Collective over the world.
  Result<std::vector<std::string>> gather(const std::string& mine) const;
  /// Scatters parts[world rank] from the coordinator through the node leaders (`parts` is read
  /// on the coordinator only). Collective over the world.
  Result<std::string> scatter(const std::vector<std::string>& parts) const;
  /// Broadcasts from the coordinator to the leaders, then within each node. Collective.
  Status bcast(std::string & bytes) const;

  /// One copy per node of `size` bytes that only the coordinator has (`fill` writes them into the
  /// buffer on the coordinator): the coordinator broadcasts them to the node leaders, straight
  /// into each node's shared buffer, which every rank then reads in place. Collective; every rank
  /// gets the same Status, and on success a buffer holding the coordinator's bytes.
  Result<comm::NodeShared> share_with_nodes(uint64_t size, const std::function<Status(char*)>& fill) const;

  /// Builds node, leaders and the member lists (after coordinator is known). Collective.
  Status setup_nodes();
  /// Copies of the node communicators and lists of `other` (for the async writer's own comms).
  Status duplicate_nodes_of(const Impl& other);
};

namespace detail {
// The only way to a Topology's internals: Topology::Impl is not part of the installed contract.
struct TopologyAccess {
  static Topology::Impl& of(const Topology& t) { return *t.impl_; }
};
}  // namespace detail

}  // namespace h5ckpt
