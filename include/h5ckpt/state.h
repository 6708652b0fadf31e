// The state a rank saves or loads: references to the caller's own buffers, never copies.
#pragma once

#include <string>
#include <vector>

#include "h5ckpt/export.h"
#include "h5ckpt/types.h"

namespace h5ckpt {

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

  const std::vector<StateItem>& items() const { return items_; }
  std::vector<StateItem>& items() { return items_; }
  const StateItem* find(const std::string& key) const;
  size_t size() const { return items_.size(); }

 private:
  std::vector<StateItem> items_;
};

}  // namespace h5ckpt
