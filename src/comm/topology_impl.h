// Internal state of a Topology: owned communicators and the coordination tree.
#pragma once

#include <string>
#include <vector>

#include "comm/comm.h"
#include "h5ckpt/topology.h"

namespace h5ckpt {

// Hidden although nested in an exported class (nested classes take the visibility of the outer one).
struct [[gnu::visibility("hidden")]] Topology::Impl {
  comm::Comm world, tp, dp, pp;
  ParallelSizes sizes;
  RankCoords coords;
  std::vector<RankCoords> all_coords;
  int coordinator = 0;  ///< world rank with coordinates (0,0,0): root of the TP-DP-PP tree

  /// Gathers every rank's bytes to the coordinator up the tree (TP groups, then DP among TP
  /// leaders, then PP among DP leaders). Returns per-world-rank bytes on the coordinator, empty
  /// elsewhere. Collective over the world.
  Result<std::vector<std::string>> tree_gather(const std::string& mine) const;
};

namespace detail {
// The only way to a Topology's internals: Topology::Impl is not part of the installed contract.
struct TopologyAccess {
  static Topology::Impl& of(const Topology& t) { return *t.impl_; }
};
}  // namespace detail

}  // namespace h5ckpt
