// Pure planning of a transfer between live ranks (no MPI, no storage): the load planner's
// question "which rank holds the bytes this rank wants" answered from the sources' shards instead
// of a checkpoint's regions. Every destination box is cut into pieces, each held by one unique
// source shard; each piece is sent by one of that shard's holders (the destination itself when it
// holds it, else the least loaded holder by bytes, largest pieces first), so every byte arrives
// once and replicas share the sending.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "h5ckpt/status.h"
#include "h5ckpt/types.h"
#include "planner/save_planner.h"

namespace h5ckpt::planner {

/// One destination item as transfer planning sees it.
struct TransferWant {
  ItemDesc desc;
  bool pad = false;  ///< allow_shape_mismatch: a source shape differing in dimension 0 is accepted
};

struct TransferPlanOptions {
  bool strict = true;         ///< a destination key no source holds fails the plan (else it is skipped)
  bool convert_dtype = true;  ///< float-to-float conversion at the destination
  /// Pieces are cut into runs of whole rows of at most this many bytes (one row at least).
  uint64_t max_piece_bytes = 64ull << 20;
  /// 0: one round. Else the pieces are grouped into rounds in which no rank stages more than
  /// this many bytes (received pieces plus packed sends; a piece sent to itself counts twice).
  uint64_t round_bytes = 0;
};

/// One box moved from one source rank's item to one destination rank's item.
struct TransferPiece {
  int src_rank = -1, src_item = -1;
  int dst_rank = -1, dst_item = -1;
  Box box;  ///< global coordinates, inside both shards (and the source shape)
  DType src_dtype = DType::kF32;
  Shape src_shape;
  int round = 0;
  uint64_t bytes = 0;  ///< in the source dtype: what travels
  bool operator==(const TransferPiece&) const = default;
};

struct TransferPlan {
  std::vector<TransferPiece> pieces;      ///< in message order (by destination rank, item, box)
  std::vector<std::vector<int>> skipped;  ///< per destination rank: items no source holds (non-strict)
  /// Per destination rank and item: dimension 0 of the sources' shape (1 for a scalar, -1 when
  /// skipped), so a padded destination zeroes the rows the sources lack.
  std::vector<std::vector<int64_t>> source_rows;
  int rounds = 1;
  std::vector<uint64_t> sent_by_rank;  ///< bytes each rank sends
};

/// Plans a transfer. `sources[r]` / `dests[r]`: rank r's source and destination items (either
/// may be empty). Checks: source dtype and shape agree across ranks for each key, source shards
/// are identical (replicas) or disjoint, every destination element is held by a source, dtypes
/// and shapes match as for a load. Errors name the key and the ranks.
Result<TransferPlan> plan_transfer(const std::vector<std::vector<ItemDesc>>& sources,
                                   const std::vector<std::vector<TransferWant>>& dests,
                                   const TransferPlanOptions& options);

}  // namespace h5ckpt::planner
