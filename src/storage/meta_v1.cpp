#include "storage/meta_v1.h"

#include "storage/verify_blocks.h"
#include "storage/signed_json.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "planner/box_math.h"
#include "planner/region_overlap.h"
#include "planner/save_planner.h"
#include "util/checked_math.h"

namespace h5ckpt::storage {

using nlohmann::json;

namespace {

Status corrupt(const std::string& why) { return Status(ErrorCode::kCorrupt, "metadata: " + why); }

template <class T>
bool as_int(const json& v, T* out) {
  return json_int(v, out);
}

template <class T>
bool get_int(const json& j, const char* name, T* out) {
  return json_member_int(j, name, out);
}

// Reads an int64 array field; false if absent or of the wrong type.
bool get_shape(const json& j, const char* name, Shape* out) {
  auto it = j.find(name);
  if (it == j.end() || !it->is_array() || it->size() > kMaxDims) return false;
  out->clear();
  for (const auto& v : *it) {
    int64_t x = 0;
    if (!as_int(v, &x)) return false;
    out->push_back(x);
  }
  return true;
}

bool get_str(const json& j, const char* name, std::string* out) {
  auto it = j.find(name);
  if (it == j.end() || !it->is_string()) return false;
  *out = it->get<std::string>();
  return true;
}

}  // namespace

std::string metadata_to_json(const CheckpointInfo& info) {
  json j;
  j["format"] = kFormatName;
  j["format_version"] = kFormatVersionV1;
  j["library_version"] = info.library_version;
  j["step"] = info.step;
  j["data_file"] = kDataFileName;
  json topo;
  topo["tp"] = info.saved_sizes.tp;
  topo["dp"] = info.saved_sizes.dp;
  topo["pp"] = info.saved_sizes.pp;
  topo["world"] = info.saved_coords.size();
  json coords = json::array();
  for (const auto& c : info.saved_coords) coords.push_back({c.tp, c.dp, c.pp});
  topo["coords"] = std::move(coords);
  j["topology"] = std::move(topo);
  j["attributes"] = info.attributes;
  json tensors = json::array();
  // "checksums": every region carries its xxh3. The in-memory form cannot tell a checksum of 0
  // from none, so a region whose sum is 0 (odds 2^-64) writes false, which only weakens the check.
  bool all_sums = true;
  for (const auto& t : info.tensors)
    for (const auto& r : t.regions) all_sums = all_sums && (r.checksum != 0 || !r.block_checksums.empty());
  j["checksums"] = all_sums;
  for (const auto& t : info.tensors) {
    json jt;
    jt["key"] = t.key;
    jt["dtype"] = dtype_name(t.dtype);
    jt["shape"] = t.shape;
    jt["nbytes"] = t.nbytes;
    jt["file_offset"] = t.file_offset;
    json regions = json::array();
    for (const auto& r : t.regions) {
      json jr;
      jr["offset"] = r.shard.box.offset;
      jr["shape"] = r.shard.box.shape;
      if (r.shard.flat) jr["flat"] = {r.shard.flat->first, r.shard.flat->second};
      jr["writer"] = r.writer_rank;
      if (r.checksum) jr["xxh3"] = hex64(r.checksum);
      if (!r.block_checksums.empty()) {
        json sums = json::array();
        for (uint64_t b : r.block_checksums) sums.push_back(hex64(b));
        jr["blocks"] = {{"bytes", r.block_bytes}, {"xxh3", std::move(sums)}};
      }
      regions.push_back(std::move(jr));
    }
    jt["regions"] = std::move(regions);
    tensors.push_back(std::move(jt));
  }
  j["tensors"] = std::move(tensors);
  return dump_signed_json(std::move(j));
}

namespace {

// The checkpoint's own fields: format, version, step, data file, topology, attributes, and
// whether every region must carry a checksum.
Status parse_header(const json& j, CheckpointInfo* info, bool* need_sums) {
  std::string format;
  if (!get_str(j, "format", &format) || format != kFormatName) return corrupt("format is not 'h5ckpt'");
  if (auto v = j.find("format_version");
      v != j.end() && v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(kFormatVersionV1))
    return v->get<uint64_t>() > static_cast<uint64_t>(kFormatVersion)
               ? newer_than_library(v->get<uint64_t>())
               : Status(ErrorCode::kUnsupported, "metadata: format version " + std::to_string(v->get<uint64_t>()) +
                                                     " is not the JSON index of format version 1 (read it with "
                                                     "read_metadata)");
  if (!get_int(j, "format_version", &info->format_version)) return corrupt("missing or out-of-range format_version");
  get_str(j, "library_version", &info->library_version);
  if (auto st = j.find("step"); st != j.end() && st->is_number() && !as_int(*st, &info->step))
    return corrupt("step is not a 64-bit integer");
  if (!get_str(j, "data_file", &info->data_file) || info->data_file != kDataFileName)
    return corrupt("data_file must be '" + std::string(kDataFileName) + "'");
  const auto topo = j.find("topology");
  if (topo == j.end() || !topo->is_object()) return corrupt("missing topology");
  if (!get_int(*topo, "tp", &info->saved_sizes.tp) || !get_int(*topo, "dp", &info->saved_sizes.dp) ||
      !get_int(*topo, "pp", &info->saved_sizes.pp))
    return corrupt("topology sizes missing or out of range");
  if (auto c = topo->find("coords"); c != topo->end() && c->is_array()) {
    for (const auto& e : *c) {
      RankCoords rc;
      if (!e.is_array() || e.size() != 3 || !as_int(e[0], &rc.tp) || !as_int(e[1], &rc.dp) || !as_int(e[2], &rc.pp))
        return corrupt("malformed topology coords");
      info->saved_coords.push_back(rc);
    }
  }
  if (auto a = j.find("attributes"); a != j.end() && a->is_object())
    for (auto it = a->begin(); it != a->end(); ++it)
      if (it->is_string()) info->attributes[it.key()] = it->get<std::string>();
  // Whether every region must carry a checksum: the flag when present; files written before it
  // existed had all regions checksummed or none, so one checksum anywhere means all.
  *need_sums = false;
  if (auto c = j.find("checksums"); c != j.end()) {
    if (!c->is_boolean()) return corrupt("'checksums' is not a boolean");
    *need_sums = c->get<bool>();
  } else if (auto ts = j.find("tensors"); ts != j.end() && ts->is_array()) {
    for (const auto& jt : *ts)
      if (auto rs = jt.find("regions"); jt.is_object() && rs != jt.end() && rs->is_array())
        for (const auto& jr : *rs)
          *need_sums = *need_sums || (jr.is_object() && (jr.contains("xxh3") || jr.contains("blocks")));
  }
  return Status::Ok();
}

// One region of tensor `t` (shape and dtype already checked); `world`: the saved ranks, 0 when
// the coordinates were not saved.
Result<SavedRegion> parse_region(const json& jr, const TensorInfo& t, int64_t world, bool need_sums) {
  auto bad = [&](const std::string& why) { return corrupt("tensor '" + t.key + "': " + why); };
  SavedRegion r;
  if (!jr.is_object() || !get_shape(jr, "offset", &r.shard.box.offset) || !get_shape(jr, "shape", &r.shard.box.shape))
    return bad("malformed region");
  if (auto f = jr.find("flat"); f != jr.end()) {
    std::pair<int64_t, int64_t> range;
    if (!f->is_array() || f->size() != 2 || !as_int((*f)[0], &range.first) || !as_int((*f)[1], &range.second))
      return bad("malformed flat range");
    r.shard.flat = range;
  }
  if (!get_int(jr, "writer", &r.writer_rank) || r.writer_rank < 0 || (world > 0 && r.writer_rank >= world))
    return bad("region writer rank invalid");
  if (auto x = jr.find("xxh3"); x != jr.end() && !parse_hex64(*x, &r.checksum)) return bad("malformed region checksum");
  if (auto st = r.shard.validate(t.shape); !st.ok()) return corrupt(st.message()).with_context(t.key);
  if (r.shard.numel() == 0) return bad("empty region");
  if (auto bl = jr.find("blocks"); bl != jr.end()) {
    // Whole slabs (so a read widens by rows), and exactly as many sums as blocks.
    const uint64_t slab = region_slab_bytes(r.shard, t.dtype);
    const auto sums = bl->is_object() ? bl->find("xxh3") : bl->end();
    int64_t bb = 0;
    if (!bl->is_object() || !get_int(*bl, "bytes", &bb) || bb <= 0 || static_cast<uint64_t>(bb) % slab != 0 ||
        sums == bl->end() || !sums->is_array())
      return bad("malformed verification blocks of region " + to_string_spec(r.shard));
    r.block_bytes = static_cast<uint64_t>(bb);
    const uint64_t region_bytes = static_cast<uint64_t>(r.shard.numel()) * dtype_size(t.dtype);
    if (sums->size() != block_count(region_bytes, r.block_bytes))
      return bad("region " + to_string_spec(r.shard) + " lists " + std::to_string(sums->size()) +
                 " block checksums for " + std::to_string(block_count(region_bytes, r.block_bytes)) + " blocks");
    r.block_checksums.resize(sums->size());
    for (size_t k = 0; k < sums->size(); ++k)
      if (!parse_hex64((*sums)[k], &r.block_checksums[k])) return bad("malformed block checksum");
  }
  if (need_sums && r.checksum == 0 && r.block_checksums.empty())
    return bad("region " + to_string_spec(r.shard) + " has no checksum in a checkpoint saved with checksums");
  return r;
}

// One tensor's entry: its dtype, shape and bytes within the data file, and regions that cover it
// exactly once.
Result<TensorInfo> parse_tensor(const json& jt, uint64_t data_file_size, int64_t world, bool need_sums) {
  TensorInfo t;
  std::string dt;
  if (!jt.is_object() || !get_str(jt, "key", &t.key)) return corrupt("tensor without key");
  auto bad = [&](const std::string& why) { return corrupt("tensor '" + t.key + "': " + why); };
  if (auto st = planner::validate_key(t.key); !st.ok()) return corrupt(st.message());
  if (!get_str(jt, "dtype", &dt)) return bad("missing dtype");
  auto dtype = dtype_from_name(dt);
  if (!dtype.ok()) return bad(dtype.status().message());
  t.dtype = *dtype;
  if (!get_shape(jt, "shape", &t.shape) || t.shape.empty()) return bad("missing or malformed shape");
  if (!get_int(jt, "file_offset", &t.file_offset) || !get_int(jt, "nbytes", &t.nbytes))
    return bad("missing or out-of-range file_offset/nbytes");
  int64_t numel = 1, nbytes = 0;
  for (auto s : t.shape)
    if (s < 0 || !checked_mul(numel, s, &numel)) return bad("shape " + to_string_shape(t.shape) + " invalid");
  if (!checked_mul(numel, static_cast<int64_t>(dtype_size(t.dtype)), &nbytes) ||
      static_cast<uint64_t>(nbytes) != t.nbytes)
    return bad("nbytes " + std::to_string(t.nbytes) + " does not match shape and dtype");
  if (t.nbytes > 0) {
    int64_t end = 0;
    if (t.file_offset < 0 || !checked_add(t.file_offset, nbytes, &end) || static_cast<uint64_t>(end) > data_file_size)
      return Status(ErrorCode::kCorrupt, "tensor '" + t.key + "': bytes [" + std::to_string(t.file_offset) + ", " +
                                             std::to_string(end) + ") lie outside the data file of " +
                                             std::to_string(data_file_size) + " bytes (truncated file?)");
  }
  const auto regions = jt.find("regions");
  if (regions == jt.end() || !regions->is_array()) return bad("missing regions");
  int64_t covered = 0;
  std::vector<Box> pieces;
  std::vector<size_t> region_of;
  for (const auto& jr : *regions) {
    H5CKPT_ASSIGN_OR_RETURN(SavedRegion r, parse_region(jr, t, world, need_sums));
    if (!checked_add(covered, r.shard.numel(), &covered)) covered = INT64_MAX;
    for (auto& b : planner::shard_boxes(r.shard)) {
      pieces.push_back(std::move(b));
      region_of.push_back(t.regions.size());
    }
    t.regions.push_back(std::move(r));
  }
  // Disjoint and complete: together with disjointness, the element count proves exact cover
  // (an empty region list covers nothing, so a non-empty tensor cannot drop its checksums).
  auto overlap = planner::find_overlap(t.shape, pieces);
  if (!overlap.ok()) return overlap.status().with_context("metadata: tensor '" + t.key + "'");  // too fragmented
  if (*overlap) {
    const auto& a = t.regions[region_of[(*overlap)->first]].shard;
    const auto& b = t.regions[region_of[(*overlap)->second]].shard;
    if (a == b) return bad("a region is listed twice: " + to_string_spec(a));
    return bad("regions " + to_string_spec(a) + " and " + to_string_spec(b) + " overlap");
  }
  if (covered != numel)
    return bad("regions cover " + std::to_string(covered) + " of " + std::to_string(numel) + " elements");
  return t;
}

// Keys unique, and datasets that do not share bytes (sorts `tensors` by key).
Status check_keys_and_spans(std::vector<TensorInfo>& tensors) {
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) { return a.key < b.key; });
  for (size_t i = 1; i < tensors.size(); ++i)
    if (tensors[i].key == tensors[i - 1].key) return corrupt("key '" + tensors[i].key + "' twice");
  // Datasets must not share bytes, or a write through one would corrupt another.
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const auto& t : tensors)
    if (t.nbytes) spans.emplace_back(t.file_offset, t.file_offset + static_cast<int64_t>(t.nbytes));
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second) return corrupt("two datasets overlap in the data file");
  return Status::Ok();
}

}  // namespace

Result<CheckpointInfo> metadata_from_json(const std::string& text, uint64_t data_file_size) {
  H5CKPT_ASSIGN_OR_RETURN(json j, parse_signed_json(text));
  CheckpointInfo info;
  bool need_sums = false;
  H5CKPT_RETURN_IF_ERROR(parse_header(j, &info, &need_sums));
  const auto tensors = j.find("tensors");
  if (tensors == j.end() || !tensors->is_array()) return corrupt("missing tensor list");
  const int64_t world = static_cast<int64_t>(info.saved_coords.size());
  for (const auto& jt : *tensors) {
    H5CKPT_ASSIGN_OR_RETURN(TensorInfo t, parse_tensor(jt, data_file_size, world, need_sums));
    info.tensors.push_back(std::move(t));
  }
  H5CKPT_RETURN_IF_ERROR(check_keys_and_spans(info.tensors));
  return info;
}

}  // namespace h5ckpt::storage
