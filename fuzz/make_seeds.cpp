// Writes seed inputs for the wire and loader-state fuzzers: real encodings of typical messages,
// each prefixed with the byte that selects its decoder. Usage: fuzz_make_seeds OUTDIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/wire.h"
#include "extras/synthetic_loader.h"
#include "h5ckpt/loader_state.h"

using namespace h5ckpt;
namespace wire = h5ckpt::engine::wire;

namespace {

void write(const std::filesystem::path& dir, const std::string& name, char selector, const std::string& bytes) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << selector << bytes;
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
  std::printf("seeds in %s\n", out.c_str());
  return 0;
}
