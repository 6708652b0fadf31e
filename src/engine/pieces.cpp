#include "engine/pieces.h"

#include <algorithm>
#include <numeric>

#include "engine/engine.h"
#include "planner/box_math.h"
#include "planner/region_overlap.h"
#include "util/checked_math.h"

namespace h5ckpt::engine {

bool is_empty_pieces_mark(const StateItem& item) {
  return item.pieces.empty() && item.shard.flat && item.shard.flat->first == kEmptyPiecesMark &&
         item.shard.flat->second == kEmptyPiecesMark;
}

std::string describe_piece(const StateItem& item, size_t piece) {
  return "piece " + std::to_string(piece) + " (" + to_string_spec(item.pieces[piece].shard) + ", buffer offset " +
         std::to_string(item.pieces[piece].buffer_offset) + ")";
}

namespace {

// The single-shard item of one piece: what saves and loads treat like any other item.
StateItem piece_item(const StateItem& item, size_t p) {
  StateItem one;
  one.key = item.key;
  one.dtype = item.dtype;
  one.global_shape = item.global_shape;
  one.shard = item.pieces[p].shard;
  one.data = item.data ? static_cast<char*>(item.data) + item.pieces[p].buffer_offset : nullptr;
  one.device = item.device;
  one.allow_shape_mismatch = item.allow_shape_mismatch;
  return one;
}

}  // namespace

Status check_pieces(const StateItem& item) {
  if (item.pieces.empty()) return Status(ErrorCode::kInvalidArgument, "add_pieces was given an empty list of pieces");
  const uint64_t es = dtype_size(item.dtype);
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // buffer [begin, end) of each non-empty piece
  std::vector<size_t> span_piece;
  for (size_t p = 0; p < item.pieces.size(); ++p) {
    const ShardPiece& piece = item.pieces[p];
    if (Status st = piece.shard.validate(item.global_shape); !st.ok())
      return st.with_context(describe_piece(item, p) + " is outside the global shape");
    if (piece.buffer_offset % es != 0)
      return Status(ErrorCode::kInvalidArgument, describe_piece(item, p) + ": buffer offset is not a multiple of the " +
                                                     std::to_string(es) + "-byte element size");
    const uint64_t n = static_cast<uint64_t>(piece.shard.numel());
    if (n > 0 && item.data == nullptr)  // data + offset would pass the per-piece check below
      return Status(ErrorCode::kInvalidArgument, describe_piece(item, p) + ": null buffer for a non-empty piece");
    uint64_t bytes = 0, end = 0;
    if (__builtin_mul_overflow(n, es, &bytes) || __builtin_add_overflow(piece.buffer_offset, bytes, &end))
      return Status(ErrorCode::kInvalidArgument, describe_piece(item, p) + ": buffer range overflows");
    if (Status st = check_item_buffer(piece_item(item, p)); !st.ok()) return st.with_context(describe_piece(item, p));
    if (n == 0) continue;
    spans.emplace_back(piece.buffer_offset, end);
    span_piece.push_back(p);
  }
  // In the buffer: sorted by start, any overlap shows between neighbours.
  std::vector<size_t> order(spans.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return spans[a] < spans[b]; });
  for (size_t k = 1; k < order.size(); ++k)
    if (spans[order[k - 1]].second > spans[order[k]].first) {
      size_t a = span_piece[order[k - 1]], b = span_piece[order[k]];
      if (a > b) std::swap(a, b);
      return Status(ErrorCode::kInvalidArgument,
                    describe_piece(item, b) + " overlaps " + describe_piece(item, a) + " in the buffer");
    }
  // In the global tensor: the pieces' boxes (flat ranges decomposed) must be disjoint.
  std::vector<Box> boxes;
  std::vector<size_t> box_piece;
  for (size_t p = 0; p < item.pieces.size(); ++p)
    for (auto& b : planner::shard_boxes(item.pieces[p].shard)) {  // validated above
      boxes.push_back(std::move(b));
      box_piece.push_back(p);
    }
  auto overlap = planner::find_overlap(item.global_shape, boxes);
  if (!overlap.ok()) return overlap.status().with_context("checking the pieces for overlap");
  if (*overlap) {
    size_t a = box_piece[(*overlap)->first], b = box_piece[(*overlap)->second];
    if (a > b) std::swap(a, b);
    return Status(ErrorCode::kInvalidArgument,
                  describe_piece(item, b) + " overlaps " + describe_piece(item, a) + " in the global tensor");
  }
  return Status::Ok();
}

ExpandedState::ExpandedState(StateDict& original) : original_(&original) {
  const auto& items = original.items();
  if (std::none_of(items.begin(), items.end(), is_multi_piece)) return;
  expanded_ = std::make_unique<StateDict>();
  for (size_t i = 0; i < items.size(); ++i) {
    const StateItem& it = items[i];
    if (!is_multi_piece(it)) {
      expanded_->items().push_back(it);
      origin_.push_back(i);
      piece_.push_back(-1);
      continue;
    }
    if (Status st = check_pieces(it); !st.ok() && status_.ok()) status_ = st.with_context("key '" + it.key + "'");
    for (size_t p = 0; p < it.pieces.size(); ++p) {
      expanded_->items().push_back(piece_item(it, p));
      origin_.push_back(i);
      piece_.push_back(static_cast<int>(p));
    }
  }
}

std::string ExpandedState::context(size_t i) const {
  const std::string key = "key '" + (expanded_ ? expanded_->items()[i].key : original_->items()[i].key) + "'";
  if (piece(i) < 0) return key;
  return key + " " + describe_piece(original_->items()[origin(i)], static_cast<size_t>(piece(i)));
}

}  // namespace h5ckpt::engine
