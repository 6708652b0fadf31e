// Writes seed inputs for the wire and loader-state fuzzers (real encodings of typical messages,
// each prefixed with the byte that selects its decoder) and for the format-v2 index fuzzer (a
// summary and its tables' image). Usage: fuzz_make_seeds OUTDIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/wire.h"
#include "util/bytes.h"
#include "extras/synthetic_loader.h"
#include "h5ckpt/loader_state.h"
#include "storage/meta_v2.h"

using namespace h5ckpt;
namespace wire = h5ckpt::engine::wire;

namespace {

void write(const std::filesystem::path& dir, const std::string& name, char selector, const std::string& bytes) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << selector << bytes;
}

// A format-v2 index as fuzz_meta_v2 reads it: a flag byte (1: re-sign after mutation), summary
// length (4 bytes LE), summary, image.
bool write_index(const std::filesystem::path& dir, const std::string& name, const CheckpointInfo& info) {
  auto e = storage::v2::encode(info);
  if (!e.ok()) {
    std::fprintf(stderr, "%s\n", e.status().to_string().c_str());
    return false;
  }
  std::array<int64_t, storage::v2::kTableCount> offsets;
  int64_t at = 4096;
  for (size_t i = 0; i < offsets.size(); ++i) {
    offsets[i] = e->tables[i].empty() ? -1 : at;
    at += static_cast<int64_t>(e->tables[i].size());
  }
  const std::string summary = e->summary_json(offsets);
  const std::vector<char> image = e->image();
  std::string input(5, '\1');
  for (int i = 0; i < 4; ++i) input[1 + i] = static_cast<char>((summary.size() >> (8 * i)) & 0xff);
  input += summary;
  input.append(image.begin(), image.end());
  std::filesystem::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << input;
  return true;
}

// Row, column and ZeRO regions with verification blocks, an empty tensor and attributes.
CheckpointInfo index_seed(bool checksums) {
  CheckpointInfo info;
  info.library_version = "seed";
  info.step = 5;
  info.saved_sizes = {2, 2, 1};
  info.saved_coords = {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0}};
  info.attributes = {{"layout", "tp2.dp2"}};
  auto add = [&](std::string key, DType dtype, Shape shape, int64_t offset, std::vector<SavedRegion> regions) {
    int64_t n = 1;
    for (int64_t e : shape) n *= e;
    TensorInfo t{std::move(key),   dtype,
                 std::move(shape), static_cast<uint64_t>(n) * dtype_size(dtype),
                 n ? offset : -1,  std::move(regions)};
    for (auto& r : t.regions)
      if (!checksums) {
        r.block_bytes = 0;
        r.block_checksums.clear();
      }
    info.tensors.push_back(std::move(t));
  };
  add("model/w", DType::kBF16, {8, 6}, 0,
      {{ShardSpec::split({8, 6}, 0, 2, 0), 0, 0, 24, {11, 12}}, {ShardSpec::split({8, 6}, 0, 2, 1), 1, 0, 48, {13}}});
  add("model/c", DType::kF32, {4, 6}, 96,
      {{ShardSpec::split({4, 6}, 1, 2, 0), 2, 0, 48, {21}}, {ShardSpec::split({4, 6}, 1, 2, 1), 3, 0, 24, {22, 23}}});
  add("model/empty", DType::kI32, {0, 3}, 0, {});
  add("optimizer/exp_avg/w", DType::kF32, {8, 6}, 192,
      {{ShardSpec::flat_range(Box{{0, 0}, {4, 6}}, 0, 10), 0, 0, 16, {31, 32, 33}},
       {ShardSpec::flat_range(Box{{0, 0}, {4, 6}}, 10, 24), 2, 0, 64, {34}},
       {ShardSpec::flat_range(Box{{4, 0}, {4, 6}}, 0, 24), 1, 0, 96, {35}}});
  return info;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds OUTDIR\n");
    return 2;
  }
  const std::filesystem::path out = argv[1], w = out / "wire", l = out / "loader_state";
  // A row split, a column split and ZeRO flat ranges of the same tensors, as two ranks hold them.
  const Shape shape{8, 6};
  std::vector<planner::ItemDesc> r0{
      {"model/w", DType::kBF16, shape, ShardSpec::split(shape, 0, 2, 0)},
      {"model/b", DType::kF32, {6}, ShardSpec::whole({6})},
      {"optimizer/exp_avg/w", DType::kF32, shape, ShardSpec::flat_range(Box{{0, 0}, {8, 6}}, 0, 20)}};
  std::vector<planner::ItemDesc> r1{
      {"model/w", DType::kBF16, shape, ShardSpec::split(shape, 0, 2, 1)},
      {"model/b", DType::kF32, {6}, ShardSpec::whole({6})},
      {"optimizer/exp_avg/w", DType::kF32, shape, ShardSpec::flat_range(Box{{0, 0}, {8, 6}}, 20, 48)},
      {"model/c", DType::kI64, {4, 6}, ShardSpec::whole({4, 6})}};
  write(w, "items0", 0, wire::encode_items(r0));
  write(w, "items1", 0, wire::encode_items(r1));
  auto plan = planner::plan_save({r0, r1});
  if (!plan.ok()) {
    std::fprintf(stderr, "%s\n", plan.status().to_string().c_str());
    return 1;
  }
  write(w, "tensors", 1, wire::encode_tensors(plan->tensors));
  {  // the same plan in the older encoding (each region's shard in full), as older local manifests hold it
    ByteWriter o;
    o.put<uint64_t>(plan->tensors.size());
    for (const auto& t : plan->tensors) {
      o.put_string(t.key);
      o.put<uint8_t>(static_cast<uint8_t>(t.dtype));
      o.put_vec(t.shape);
      o.put<uint64_t>(t.regions.size());
      for (size_t r = 0; r < t.regions.size(); ++r) {
        o.put_vec(t.box_of(r).offset);
        o.put_vec(t.box_of(r).shape);
        o.put<uint8_t>(t.regions[r].flat);
        if (t.regions[r].flat) {
          o.put<int64_t>(t.regions[r].begin);
          o.put<int64_t>(t.regions[r].end);
        }
        o.put<int32_t>(t.regions[r].writer);
      }
    }
    if (!wire::decode_tensors(o.str()).ok()) {
      std::fprintf(stderr, "the older plan encoding no longer decodes\n");
      return 1;
    }
    write(w, "tensors_older", 1, o.str());
  }
  std::vector<wire::LoadRequestEntry> reqs(3);
  reqs[0].request = planner::make_request(planner::LoadWant{r0[0], false, false, false});
  reqs[1].skip = true;
  reqs[2].on_device = true;
  reqs[2].request = planner::make_request(planner::LoadWant{r0[2], true, true, false});
  write(w, "requests", 2, wire::encode_requests(reqs));
  std::vector<planner::ItemRole> roles(3);
  roles[0] = {planner::Role::kRead, 0, -1, {1, 3}};
  roles[1] = {planner::Role::kReceive, 1, 0, {}};
  write(w, "roles", 3, wire::encode_roles(roles));
  write(w, "checksums", 4, wire::encode_checksums({{0, 0, 64, {0x1234567890abcdefull, 3}}, {2, 1, 0, {}}}));
  write(w, "pair", 5, wire::encode_pair("/ckpt/step-20", "{\"format\":\"h5ckpt\"}"));

  const auto cfg = extras::default_loader_config(7, 2, 64);
  const auto rep = loader::initial_replicated(cfg, 4);
  auto shard = loader::initial_shard(rep, 1);
  shard.pending = {{0, 3}, {1, 9}};
  shard.buffer = {{{0, 2}, 5, 40}};
  const auto as_string = [](const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); };
  write(l, "replicated", 0, as_string(loader::serialize(rep)));
  write(l, "shard", 1, as_string(loader::serialize(shard)));
  write(l, "key", 2, loader::shard_key(3, 1));
  if (!write_index(out / "meta_v2", "checksums", index_seed(true)) ||
      !write_index(out / "meta_v2", "no_checksums", index_seed(false)))
    return 1;
  std::printf("seeds in %s\n", out.c_str());
  return 0;
}
