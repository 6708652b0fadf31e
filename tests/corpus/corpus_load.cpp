// MPI side of the hostile-input tests (label `corpus`), at any rank count:
//   corpus_load load REF MANIFEST  loads every case of a corpus (tests/corpus/make_corpus.py) with
//                                  verified checksums; each must be a clean error on every rank or
//                                  give exactly REF's data, and the manifest's "error" cases must fail
//   corpus_load hints DIR          saves with unusable MPI-IO hints (cb_nodes = 0 raised SIGFPE in
//                                  Open MPI): a clean error on every rank, then a good save works
// Only the public API. Progress goes to stdout before each case, so a hang names its case.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "h5ckpt/h5ckpt.hpp"

using namespace h5ckpt;

namespace {

int g_rank = 0, g_world = 1;

// The tensors of a checkpoint, split along dim 0 over the ranks where they can be.
struct Buffers {
  std::vector<std::vector<unsigned char>> bytes;
  StateDict state;
};

void build(const CheckpointInfo& info, Buffers* b) {
  b->bytes.resize(info.tensors.size());
  for (size_t i = 0; i < info.tensors.size(); ++i) {
    const TensorInfo& t = info.tensors[i];
    ShardSpec shard = t.shape[0] >= g_world ? ShardSpec::split(t.shape, 0, g_world, g_rank) : ShardSpec::whole(t.shape);
    b->bytes[i].assign(static_cast<size_t>(shard.numel()) * dtype_size(t.dtype), 0xa5);
    b->state.add(t.key, t.dtype, t.shape, shard, b->bytes[i].data());
  }
}

bool any_rank(bool mine) {
  int v = mine ? 1 : 0, any = 0;
  MPI_Allreduce(&v, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any != 0;
}

int run_load(const std::string& ref, const std::string& manifest_path, Checkpointer& ck) {
  auto info = read_checkpoint_info(ref);
  if (!info.ok()) {
    std::fprintf(stderr, "reference %s: %s\n", ref.c_str(), info.status().to_string().c_str());
    return 1;
  }
  Buffers want, got;
  build(*info, &want);
  build(*info, &got);
  LoadOptions opt;
  opt.verify_checksums = true;  // a flipped data byte must not load
  if (auto r = ck.load(want.state, ref, opt); !r.ok()) {
    std::fprintf(stderr, "reference load: %s\n", r.status().to_string().c_str());
    return 1;
  }
  std::ifstream in(manifest_path);
  const auto manifest = nlohmann::json::parse(in);
  int failures = 0, loaded = 0, refused = 0;
  for (const auto& c : manifest) {
    const std::string name = c["name"], target = c["target"], expect = c["load"];
    if (g_rank == 0) {
      std::printf("case %-45s ", name.c_str());
      std::fflush(stdout);
    }
    for (auto& b : got.bytes) std::memset(b.data(), 0xa5, b.size());
    auto r = ck.load(got.state, target, opt);
    // Every rank must return the same outcome.
    const bool mixed = any_rank(r.ok()) && any_rank(!r.ok());
    bool wrong = false;
    if (r.ok())
      for (size_t i = 0; i < want.bytes.size(); ++i) wrong = wrong || want.bytes[i] != got.bytes[i];
    wrong = any_rank(wrong);
    std::string verdict;
    if (mixed) verdict = "FAIL: ranks disagree on the outcome";
    else if (wrong) verdict = "FAIL: loaded WRONG DATA";
    else if (r.ok() && expect == "error") verdict = "FAIL: loaded a checkpoint that must be refused";
    else if (!r.ok() && expect == "ok") verdict = "FAIL: refused the pristine checkpoint";
    else if (!r.ok() && c.value("refuse_not_found", false) && r.status().code() == ErrorCode::kNotFound)
      verdict = "FAIL: damaged checkpoints reported as \"not found\" (a trainer would start fresh over them)";
    (r.ok() ? loaded : refused)++;
    if (!verdict.empty()) ++failures;
    if (g_rank == 0)
      std::printf("%s\n", !verdict.empty() ? (verdict + (r.ok() ? "" : ": " + r.status().to_string())).c_str()
                          : r.ok()         ? "loaded, data equal"
                                           : ("error: " + r.status().to_string().substr(0, 160)).c_str());
  }
  if (g_rank == 0)
    std::printf("%zu cases at %d rank(s): %d loaded with the original data, %d refused, %d failures\n", manifest.size(),
                g_world, loaded, refused, failures);
  return failures ? 1 : 0;
}

int run_hints(const std::string& dir, const Topology& topo) {
  std::vector<float> data(64, 1.5f);
  if (g_rank == 0) std::filesystem::create_directories(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  int failures = 0, n = 0;
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"cb_nodes", "0"}, {"cb_buffer_size", "-5"}, {"striping_factor", "4294967297"}, {"striping_unit", "1e6"}};
  for (const auto& [k, v] : bad) {
    CheckpointerOptions o;
    o.async = false;
    o.mpi_hints = {{k, v}};
    Checkpointer ck(topo, o);
    StateDict sd;
    sd.add("model/w", DType::kF32, {64 * g_world}, ShardSpec::split({64 * g_world}, 0, g_world, g_rank), data.data());
    auto r = ck.save(sd, dir + "/bad" + std::to_string(n++));
    const bool named = !r.ok() && r.status().message().find("MPI-IO hint '" + k + "'") != std::string::npos;
    if (any_rank(!named)) {
      ++failures;
      if (g_rank == 0) std::printf("FAIL: hint %s=%s: %s\n", k.c_str(), v.c_str(), r.status().to_string().c_str());
    } else if (g_rank == 0) {
      std::printf("hint %s=%s refused: %s\n", k.c_str(), v.c_str(), r.status().to_string().c_str());
    }
  }
  CheckpointerOptions o;
  o.async = false;
  o.mpi_hints = {{"cb_nodes", "1"}, {"cb_buffer_size", "1048576"}};
  Checkpointer ck(topo, o);
  StateDict sd;
  sd.add("model/w", DType::kF32, {64 * g_world}, ShardSpec::split({64 * g_world}, 0, g_world, g_rank), data.data());
  SaveOptions so;
  so.overwrite = true;
  auto r = ck.save(sd, dir + "/good", so);
  if (any_rank(!r.ok())) {
    ++failures;
    if (g_rank == 0) std::printf("FAIL: save with valid hints: %s\n", r.status().to_string().c_str());
  }
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  int rc = 2;
  const std::string mode = argc > 1 ? argv[1] : "";
  {
    auto topo = Topology::create(MPI_COMM_WORLD, {1, g_world, 1});
    if (!topo.ok()) {
      std::fprintf(stderr, "topology: %s\n", topo.status().to_string().c_str());
    } else if (mode == "load" && argc == 4) {
      Checkpointer ck(*topo);
      rc = run_load(argv[2], argv[3], ck);
    } else if (mode == "hints" && argc == 3) {
      rc = run_hints(argv[2], *topo);
    } else if (g_rank == 0) {
      std::fprintf(stderr, "usage: corpus_load load REF MANIFEST | corpus_load hints DIR\n");
    }
  }
  int all = 0;
  MPI_Allreduce(&rc, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return all;
}
