// Parallel layout of a job: tensor-, context-, data-, pipeline- and expert-parallel groups over MPI.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "h5ckpt/export.h"
#include "h5ckpt/status.h"

namespace h5ckpt {
namespace detail {
struct TopologyAccess;  // the library's way to the internals (src/comm/topology_impl.h)
}  // namespace detail

/// Sizes of the parallel dimensions (Megatron's): the world size must equal tp * cp * dp * pp.
/// Dense parts of the model are split over TP and PP and replicated over CP and DP. Experts
/// (mixture of experts) are split over EP inside the dp * cp ranks of one (tp, pp) position, with
/// dp * cp / ep expert-data-parallel replicas; ep must divide dp * cp.
struct ParallelSizes {
  int tp = 1;
  int dp = 1;
  int pp = 1;
  int cp = 1;  ///< context parallel: ranks that split one sequence (they share one data stream)
  int ep = 1;  ///< expert parallel: ranks that split the experts of a MoE layer
  /// Expert-data-parallel size: dp * cp / ep.
  int edp() const { return ep > 0 ? dp * cp / ep : 0; }
};

/// Coordinates of one rank: dense (tp, cp, dp, pp) and expert (ep, edp) positions.
/// With cp = ep = 1: cp = ep = 0 and edp = dp.
struct RankCoords {
  int tp = 0;
  int dp = 0;
  int pp = 0;
  int cp = 0;
  int ep = 0;   ///< expert-parallel rank (which slice of the experts)
  int edp = 0;  ///< expert-data-parallel rank (which replica of that slice)
  /// Compares the dense position (tp, cp, dp, pp), which within one topology determines ep and
  /// edp (so RankCoords{tp, dp, pp} still equals a cp = ep = 1 rank's coords, whose edp is dp).
  bool operator==(const RankCoords& o) const { return tp == o.tp && dp == o.dp && pp == o.pp && cp == o.cp; }
};

/// The TP/CP/DP/PP/EP communicators and the coordination tree of a job. All communicators are
/// duplicates owned by the Topology; the caller's communicators are never used directly.
/// Move-only; freeing it frees its communicators (so destroy it before MPI_Finalize).
class H5CKPT_API Topology {
 public:
  /// Megatron rank order: TP fastest, then CP, then DP, then PP
  /// (world rank = tp + TP * (cp + CP * (dp + DP * pp))). Experts: inside the DP x CP group of a
  /// (tp, pp) position, with g = dp * CP + cp, ep = g % EP and edp = g / EP (Megatron's expert
  /// order tp-ep-dp-pp). Collective over `world`.
  static Result<Topology> create(MPI_Comm world, ParallelSizes sizes);
  /// From the caller's own TP/DP/PP communicators (each rank's ranks in them give its coords);
  /// cp = ep = 1. Collective over `world`.
  static Result<Topology> from_comms(MPI_Comm world, MPI_Comm tp, MPI_Comm dp, MPI_Comm pp);
  /// From the caller's own TP/CP/DP/PP/EP communicators. The expert-data-parallel group of a rank
  /// is the ranks with its (tp, pp, ep) in its DP x CP group, ordered by dp * CP + cp. The
  /// communicators must form a grid (each (tp, cp, dp, pp) and each (tp, pp, ep, edp) once) and
  /// ep * edp must equal dp * cp. Collective over `world`.
  static Result<Topology> from_comms(MPI_Comm world, MPI_Comm tp, MPI_Comm cp, MPI_Comm dp, MPI_Comm pp, MPI_Comm ep);

  Topology(Topology&&) noexcept;
  Topology& operator=(Topology&&) noexcept;
  ~Topology();

  int rank() const;  ///< rank in the world communicator
  int size() const;  ///< world size
  ParallelSizes sizes() const;
  RankCoords coords() const;
  /// Coordinates of every world rank (index = world rank).
  const std::vector<RankCoords>& all_coords() const;

  MPI_Comm world() const;
  MPI_Comm tp_comm() const;
  MPI_Comm dp_comm() const;  ///< dense data parallel: same (tp, cp, pp), ordered by dp
  MPI_Comm pp_comm() const;
  MPI_Comm cp_comm() const;  ///< context parallel: same (tp, dp, pp), ordered by cp
  /// Dense DP x CP group (same tp, pp), ordered by dp * CP + cp: the distributed optimizer's group
  /// for dense parameters (Megatron's data-parallel group with context parallelism).
  MPI_Comm dp_cp_comm() const;
  MPI_Comm ep_comm() const;         ///< expert parallel: same (tp, pp, edp), ordered by ep
  MPI_Comm expert_dp_comm() const;  ///< expert data parallel: same (tp, pp, ep), ordered by edp

  struct Impl;

 private:
  friend struct detail::TopologyAccess;
  explicit Topology(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace h5ckpt
