// Parallel layout of a job: tensor-, data- and pipeline-parallel groups over MPI.
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

/// Sizes of the parallel dimensions. world size must equal tp * dp * pp.
/// (Expert and context parallelism fold into these for now.)
struct ParallelSizes {
  int tp = 1;
  int dp = 1;
  int pp = 1;
};

/// Coordinates of one rank in the TP x DP x PP grid.
struct RankCoords {
  int tp = 0;
  int dp = 0;
  int pp = 0;
  bool operator==(const RankCoords&) const = default;
};

/// The TP/DP/PP communicators and the coordination tree of a job. All communicators are
/// duplicates owned by the Topology; the caller's communicators are never used directly.
/// Move-only; freeing it frees its communicators (so destroy it before MPI_Finalize).
class H5CKPT_API Topology {
 public:
  /// Megatron rank order: TP fastest, then DP, then PP.
  /// Collective over `world`.
  static Result<Topology> create(MPI_Comm world, ParallelSizes sizes);
  /// From the caller's own TP/DP/PP communicators (each rank's ranks in them give its coords).
  /// Collective over `world`.
  static Result<Topology> from_comms(MPI_Comm world, MPI_Comm tp, MPI_Comm dp, MPI_Comm pp);

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
  MPI_Comm dp_comm() const;
  MPI_Comm pp_comm() const;

  struct Impl;

 private:
  friend struct detail::TopologyAccess;
  explicit Topology(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace h5ckpt
