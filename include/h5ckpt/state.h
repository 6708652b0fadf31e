// The state a rank saves or loads: references to the caller's own buffers, never copies.
#pragma once

#include <string>
#include <vector>

#include "h5ckpt/export.h"
#include "h5ckpt/types.h"

namespace h5ckpt {

/// One box (or flat range) of a multi-piece item and where its elements start in the item's buffer.
struct ShardPiece {
  ShardSpec shard;
  uint64_t buffer_offset = 0;  ///< bytes from StateItem::data to the piece's first element
};

/// One tensor (or one byte blob) as this rank sees it.
struct StateItem {
  /// Fully qualified, layout-independent name, e.g. "model/layers.0.mlp.fc1.weight" or
  /// "optimizer/exp_avg/layers.0.mlp.fc1.weight". '/' separates HDF5 groups; allowed characters
  /// are letters, digits and "_.-/"; the first component "meta" is reserved.
  std::string key;
  DType dtype = DType::kF32;
  Shape global_shape;
  ShardSpec shard;
  /// The caller's buffer of shard.numel() elements; read on save, written on load.
  void* data = nullptr;
  Device device = Device::kHost;
  /// Load only: if the checkpoint's global shape differs (e.g. a vocabulary padded to another
  /// multiple), copy the common part, zero-fill the rest and drop the surplus.
  bool allow_shape_mismatch = false;
  /// Several pieces of the global tensor in one buffer (fused layouts). When non-empty, `shard` is unused
  /// and each piece's elements (row-major within the piece) start at data + buffer_offset.
  std::vector<ShardPiece> pieces;
};

/// An ordered set of items with unique keys. Holds pointers to caller memory: the caller keeps
/// the buffers alive (and, for save_async, unchanged until the snapshot returns).
class H5CKPT_API StateDict {
 public:
  /// Adds a sharded tensor. Errors (duplicate key, spec outside the shape) surface in save/load.
  StateItem& add(std::string key, DType dtype, Shape global_shape, ShardSpec shard, void* data,
                 Device device = Device::kHost);
  /// Adds a tensor this rank holds whole (replicated over the ranks that add it too).
  StateItem& add_replicated(std::string key, DType dtype, Shape global_shape, void* data);
  /// Adds an opaque byte blob held whole by this rank (a 1-D uint8 tensor).
  StateItem& add_bytes(std::string key, void* data, size_t size);
  /// Adds several pieces (boxes or flat ranges) of one global tensor that live at the given byte
  /// offsets of one buffer, e.g. a fused SwiGLU fc1 shard [gate_t; up_t]. Each piece is saved,
  /// loaded and resharded like a separate shard of the same tensor. Errors (empty list, pieces
  /// overlapping in the tensor or in the buffer, a piece outside the shape or not starting at a
  /// multiple of the element size) surface in save/load, naming the key and the piece. An empty
  /// list is recorded as an item without pieces whose `shard` is the invalid flat range [-1, -1).
  StateItem& add_pieces(std::string key, DType dtype, Shape global_shape, std::vector<ShardPiece> pieces, void* data,
                        Device device = Device::kHost);

  const std::vector<StateItem>& items() const { return items_; }
  std::vector<StateItem>& items() { return items_; }
  const StateItem* find(const std::string& key) const;
  size_t size() const { return items_.size(); }

 private:
  std::vector<StateItem> items_;
};

}  // namespace h5ckpt
