// Multi-piece items (StateItem::pieces): several boxes or flat ranges of one global tensor in one
// buffer (fused layouts such as Megatron's [gate_t; up_t] SwiGLU fc1 shard or grouped QKV).
//
// The format knows nothing of them: every piece is a shard like any other. Saves describe one
// planner::ItemDesc per piece (pointing back at the item and the piece's byte offset, so writes
// and the async snapshot read the caller's buffer directly); loads run on an expanded state with
// one single-shard item per piece whose buffer starts at the piece's offset.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "h5ckpt/state.h"

namespace h5ckpt::engine {

/// add_pieces records an empty list as an item without pieces whose shard is this sentinel flat
/// range, so the save or load that sees it reports it (no valid shard has a negative range).
inline constexpr int64_t kEmptyPiecesMark = -1;
bool is_empty_pieces_mark(const StateItem& item);

/// True for an item with pieces (or add_pieces' empty-list mark).
inline bool is_multi_piece(const StateItem& item) { return !item.pieces.empty() || is_empty_pieces_mark(item); }

/// Checks a multi-piece item: at least one piece; every piece inside the shape, starting at a
/// multiple of the element size; pieces disjoint in the tensor and in the buffer. Messages name
/// the piece (the caller adds the key).
Status check_pieces(const StateItem& item);

/// "piece 1 (offset [..] shape [..])", for messages.
std::string describe_piece(const StateItem& item, size_t piece);

/// A state with every multi-piece item replaced by one item per piece (same key, dtype, shape,
/// device and allow_shape_mismatch; the piece's shard; data at the piece's buffer offset). Items
/// are listed in the original order, a multi-piece item's pieces in their order. Without
/// multi-piece items, `state()` is the caller's own state (nothing is copied).
class ExpandedState {
 public:
  explicit ExpandedState(StateDict& original);
  StateDict& state() { return expanded_ ? *expanded_ : *original_; }
  bool expanded() const { return expanded_ != nullptr; }
  /// The original item of expanded item i, and its piece (-1: a single-shard item).
  size_t origin(size_t i) const { return expanded_ ? origin_[i] : i; }
  int piece(size_t i) const { return expanded_ ? piece_[i] : -1; }
  /// "key 'k'" or "key 'k' piece j (...)", the context of expanded item i's errors.
  std::string context(size_t i) const;
  /// The first invalid multi-piece item's error (with its key), else Ok.
  const Status& status() const { return status_; }

 private:
  StateDict* original_;
  std::unique_ptr<StateDict> expanded_;
  std::vector<size_t> origin_;
  std::vector<int> piece_;
  Status status_;
};

}  // namespace h5ckpt::engine
