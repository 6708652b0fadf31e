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

const StateItem* StateDict::find(const std::string& key) const {
  for (const auto& it : items_)
    if (it.key == key) return &it;
  return nullptr;
}

}  // namespace h5ckpt
