#include "engine/plan_codec.h"

#include "util/bytes.h"

namespace h5ckpt::engine {

namespace {

void put_shard(ByteWriter& w, const ShardSpec& s) {
  w.put_vec(s.box.offset);
  w.put_vec(s.box.shape);
  w.put<uint8_t>(s.flat ? 1 : 0);
  if (s.flat) {
    w.put<int64_t>(s.flat->first);
    w.put<int64_t>(s.flat->second);
  }
}

ShardSpec get_shard(ByteReader& r) {
  ShardSpec s;
  s.box.offset = r.get_vec();
  s.box.shape = r.get_vec();
  if (r.get<uint8_t>()) {
    const int64_t b = r.get<int64_t>();
    const int64_t e = r.get<int64_t>();
    s.flat = std::make_pair(b, e);
  }
  return s;
}

Status malformed() { return Status(ErrorCode::kInternal, "malformed planning message"); }

}  // namespace

std::string encode_items(const std::vector<planner::ItemDesc>& items) {
  ByteWriter w;
  w.put<uint64_t>(items.size());
  for (const auto& it : items) {
    w.put_string(it.key);
    w.put<uint8_t>(static_cast<uint8_t>(it.dtype));
    w.put_vec(it.global_shape);
    put_shard(w, it.shard);
  }
  return std::move(w.str());
}

Result<std::vector<planner::ItemDesc>> decode_items(const std::string& bytes) {
  ByteReader r(bytes);
  std::vector<planner::ItemDesc> items(r.get<uint64_t>() & 0xffffff);
  for (auto& it : items) {
    it.key = r.get_string();
    it.dtype = static_cast<DType>(r.get<uint8_t>());
    it.global_shape = r.get_vec();
    it.shard = get_shard(r);
  }
  if (!r.ok() || !r.at_end()) return malformed();
  return items;
}

std::string encode_tensors(const std::vector<planner::TensorPlan>& tensors) {
  ByteWriter w;
  w.put<uint64_t>(tensors.size());
  for (const auto& t : tensors) {
    w.put_string(t.key);
    w.put<uint8_t>(static_cast<uint8_t>(t.dtype));
    w.put_vec(t.shape);
    w.put<uint64_t>(t.regions.size());
    for (const auto& reg : t.regions) {
      put_shard(w, reg.shard);
      w.put<int32_t>(reg.writer);
    }
  }
  return std::move(w.str());
}

Result<std::vector<planner::TensorPlan>> decode_tensors(const std::string& bytes) {
  ByteReader r(bytes);
  std::vector<planner::TensorPlan> tensors(r.get<uint64_t>() & 0xffffff);
  for (auto& t : tensors) {
    t.key = r.get_string();
    t.dtype = static_cast<DType>(r.get<uint8_t>());
    t.shape = r.get_vec();
    t.regions.resize(r.get<uint64_t>() & 0xffffff);
    for (auto& reg : t.regions) {
      reg.shard = get_shard(r);
      reg.writer = r.get<int32_t>();
    }
    if (!r.ok()) break;
  }
  if (!r.ok() || !r.at_end()) return malformed();
  return tensors;
}

}  // namespace h5ckpt::engine
