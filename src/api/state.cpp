#include "h5ckpt/state.h"

namespace h5ckpt {

StateItem& StateDict::add(std::string key, DType dtype, Shape global_shape, ShardSpec shard, void* data,
                          Device device) {
  StateItem item;
  item.key = std::move(key);
  item.dtype = dtype;
  item.global_shape = std::move(global_shape);
  item.shard = std::move(shard);
  item.data = data;
  item.device = device;
  items_.push_back(std::move(item));
  return items_.back();
}

StateItem& StateDict::add_replicated(std::string key, DType dtype, Shape global_shape, void* data) {
  ShardSpec whole = ShardSpec::whole(global_shape);
  return add(std::move(key), dtype, std::move(global_shape), std::move(whole), data);
}

StateItem& StateDict::add_bytes(std::string key, void* data, size_t size) {
  Shape shape{static_cast<int64_t>(size)};
  return add(std::move(key), DType::kU8, shape, ShardSpec::whole(shape), data);
}

StateItem& StateDict::add_pieces(std::string key, DType dtype, Shape global_shape, std::vector<ShardPiece> pieces,
                                 void* data, Device device) {
  StateItem item;
  item.key = std::move(key);
  item.dtype = dtype;
  item.global_shape = std::move(global_shape);
  item.pieces = std::move(pieces);
  // An empty list is marked with a flat range no valid shard has (engine/pieces.h), so the save
  // or load that sees this item reports it with its key.
  if (item.pieces.empty()) item.shard = ShardSpec{Box{}, std::pair<int64_t, int64_t>{-1, -1}};
  item.data = data;
  item.device = device;
  items_.push_back(std::move(item));
  return items_.back();
}

const StateItem* StateDict::find(const std::string& key) const {
  for (const auto& it : items_)
    if (it.key == key) return &it;
  return nullptr;
}

}  // namespace h5ckpt
