// Writes the checkpoints the CLI tests run on (run under mpirun, any rank count >= 1):
//   ROOT/ckpts/step-10, step-20 (latest), a fake in-progress save, a data file without metadata
//   and one with damaged metadata; ROOT/relayout (step-20's tensors saved by another layout) and
//   ROOT/perturbed (like relayout, with one element of model/embed changed by +0.25).
// Element values follow a closed formula that tests/cli/cli_checks.py recomputes on its own.
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "h5ckpt/h5ckpt.hpp"

using namespace h5ckpt;

namespace {

enum class Split { kRows, kCols, kFlat, kWhole };

struct Spec {
  const char* key;
  DType dtype;
  Shape shape;
  int seed;
  Split split;  // in the "tp" layout; the "zero" layout uses flat ranges everywhere
};

// The value of global element i as raw bits (the formula of cli_checks.py: expected_values).
void put_value(DType t, int seed, int64_t i, void* dst) {
  const int64_t k = (i * 7 + seed * 13) % 61 - 30;
  const double f = static_cast<double>(k) * 0.5;  // exact in every float type below
  const int64_t iv = (i * 13 + seed * 7) % 200 - 100;
  switch (t) {
    case DType::kF32: {
      float v = static_cast<float>(f);
      std::memcpy(dst, &v, 4);
      break;
    }
    case DType::kF64: std::memcpy(dst, &f, 8); break;
    case DType::kF16:
    case DType::kBF16: {
      // f is k/2 with |k| <= 30: build the IEEE half / bfloat16 bits from the f32 bits.
      float v = static_cast<float>(f);
      uint32_t b;
      std::memcpy(&b, &v, 4);
      uint16_t h;
      if (t == DType::kBF16) h = static_cast<uint16_t>(b >> 16);  // exact: low bits are zero
      else if (v == 0) h = static_cast<uint16_t>((b >> 16) & 0x8000);
      else {
        const uint32_t sign = (b >> 16) & 0x8000, exp = ((b >> 23) & 0xff) - 127 + 15, man = (b >> 13) & 0x3ff;
        h = static_cast<uint16_t>(sign | (exp << 10) | man);
      }
      std::memcpy(dst, &h, 2);
      break;
    }
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kU8: *static_cast<uint8_t*>(dst) = static_cast<uint8_t>((i * 29 + seed * 11) % 256); break;
    case DType::kBool: *static_cast<uint8_t*>(dst) = ((i * 5 + seed) % 3 == 0) ? 1 : 0; break;
    case DType::kI8: {
      int8_t v = static_cast<int8_t>(iv);
      std::memcpy(dst, &v, 1);
      break;
    }
    case DType::kI16: {
      int16_t v = static_cast<int16_t>(iv * 300);
      std::memcpy(dst, &v, 2);
      break;
    }
    case DType::kI32: {
      int32_t v = static_cast<int32_t>(iv * 1000003);
      std::memcpy(dst, &v, 4);
      break;
    }
    case DType::kI64: {
      int64_t v = iv * 1000000007LL;
      std::memcpy(dst, &v, 8);
      break;
    }
  }
}

// step-20 (and relayout/perturbed): one tensor of every dtype, every kind of shard.
std::vector<Spec> main_specs() {
  return {
      {"model/embed", DType::kF32, {37, 16}, 1, Split::kRows},
      {"model/layers.0.attn.qkv", DType::kBF16, {12, 24}, 2, Split::kCols},
      {"model/layers.0.attn.bias", DType::kF16, {24}, 3, Split::kWhole},
      {"model/layers.0.mlp.fc", DType::kF64, {5, 3, 4}, 4, Split::kFlat},
      {"model/mask", DType::kBool, {5, 5}, 5, Split::kWhole},
      {"model/counts", DType::kI32, {9}, 6, Split::kRows},
      {"model/small", DType::kI8, {3, 7}, 7, Split::kRows},
      {"model/mid", DType::kI16, {4, 4}, 8, Split::kCols},
      {"model/bytes", DType::kU8, {33}, 9, Split::kWhole},
      {"model/fp8a", DType::kF8E4M3, {16}, 10, Split::kRows},
      {"model/fp8b", DType::kF8E5M2, {2, 8}, 11, Split::kCols},
      {"optimizer/exp_avg/model/embed", DType::kF32, {37, 16}, 12, Split::kFlat},
      {"optimizer/step", DType::kI64, {1}, 13, Split::kWhole},
      {"loader/replicated", DType::kU8, {20}, 14, Split::kWhole},
      {"extra/global_step", DType::kI64, {1}, 15, Split::kWhole},
  };
}

// step-10: a different key set, values, a dtype change and a shape change.
std::vector<Spec> old_specs() {
  return {
      {"model/embed", DType::kF32, {37, 16}, 101, Split::kRows},
      {"model/old_only", DType::kF32, {4}, 102, Split::kWhole},
      {"model/counts", DType::kI64, {9}, 6, Split::kRows},
      {"model/mid", DType::kI16, {4, 5}, 8, Split::kCols},
  };
}

ShardSpec shard_for(const Spec& s, bool zero, int world, int rank) {
  int64_t n = 1;
  for (auto d : s.shape) n *= d;
  Split how = zero ? Split::kFlat : s.split;
  if (how == Split::kCols && (s.shape.size() < 2 || s.shape[1] < world)) how = Split::kFlat;
  if (how == Split::kRows && s.shape[0] < world) how = Split::kFlat;
  if (how == Split::kFlat && n < world) how = Split::kWhole;
  switch (how) {
    case Split::kRows: return ShardSpec::split(s.shape, 0, world, rank);
    case Split::kCols: return ShardSpec::split(s.shape, 1, world, rank);
    case Split::kFlat:
      return ShardSpec::flat_range(ShardSpec::whole(s.shape).box, n * rank / world, n * (rank + 1) / world);
    case Split::kWhole: break;
  }
  return ShardSpec::whole(s.shape);
}

// Global row-major indices of a shard's elements, in buffer order (computed here, not with
// the library's box math, so that the fixture is an independent expectation).
std::vector<int64_t> global_indices(const Shape& shape, const ShardSpec& spec) {
  std::vector<int64_t> out;
  if (spec.flat) {
    // flat ranges here are always over the whole tensor
    for (int64_t i = spec.flat->first; i < spec.flat->second; ++i) out.push_back(i);
    return out;
  }
  const size_t nd = shape.size();
  std::vector<int64_t> c(nd, 0);
  int64_t vol = 1;
  for (auto e : spec.box.shape) vol *= e;
  for (int64_t k = 0; k < vol; ++k) {
    int64_t g = 0;
    for (size_t d = 0; d < nd; ++d) g = g * shape[d] + spec.box.offset[d] + c[d];
    out.push_back(g);
    for (size_t d = nd; d-- > 0;) {
      if (++c[d] < spec.box.shape[d]) break;
      c[d] = 0;
    }
  }
  return out;
}

bool save(const std::vector<Spec>& specs, bool zero, const std::string& path, int64_t step, bool update_latest,
          const char* perturb_key, int64_t perturb_index) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  auto topo = Topology::create(MPI_COMM_WORLD, zero ? ParallelSizes{1, world, 1} : ParallelSizes{world, 1, 1});
  if (!topo.ok()) {
    std::fprintf(stderr, "topology: %s\n", topo.status().to_string().c_str());
    return false;
  }
  std::vector<std::vector<uint8_t>> bufs;
  bufs.reserve(specs.size());
  StateDict sd;
  for (const Spec& s : specs) {
    ShardSpec spec = shard_for(s, zero, world, rank);
    const size_t es = dtype_size(s.dtype);
    auto idx = global_indices(s.shape, spec);
    bufs.emplace_back(idx.size() * es);
    for (size_t k = 0; k < idx.size(); ++k) {
      put_value(s.dtype, s.seed, idx[k], bufs.back().data() + k * es);
      if (perturb_key && std::strcmp(perturb_key, s.key) == 0 && idx[k] == perturb_index) {
        float v;  // only used on an f32 tensor
        std::memcpy(&v, bufs.back().data() + k * es, 4);
        v += 0.25f;
        std::memcpy(bufs.back().data() + k * es, &v, 4);
      }
    }
    sd.add(s.key, s.dtype, s.shape, spec, bufs.back().data());
  }
  Checkpointer ck(*topo);
  ck.set_attribute("fixture", "cli-tests");
  SaveOptions o;
  o.step = step;
  o.update_latest = update_latest;
  auto r = ck.save(sd, path, o);
  if (!r.ok()) {
    std::fprintf(stderr, "save %s: %s\n", path.c_str(), r.status().to_string().c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc != 2) {
    if (rank == 0) std::fprintf(stderr, "usage: make_fixture ROOT\n");
    MPI_Finalize();
    return 2;
  }
  namespace fs = std::filesystem;
  const std::string root = argv[1];
  if (rank == 0) {
    fs::remove_all(root);
    fs::create_directories(root + "/ckpts");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  bool ok = save(old_specs(), false, root + "/ckpts/step-10", 10, true, nullptr, 0) &&
            save(main_specs(), false, root + "/ckpts/step-20", 20, true, nullptr, 0) &&
            save(main_specs(), true, root + "/relayout", 20, false, nullptr, 0) &&
            save(main_specs(), true, root + "/perturbed", 20, false, "model/embed", 123);
  if (ok && rank == 0) {
    // What a crashed save leaves behind, and two damaged checkpoints.
    fs::create_directories(root + "/ckpts/.step-30.inprogress-deadbeef");
    std::ofstream(root + "/ckpts/.step-30.inprogress-deadbeef/data.h5") << "partial";
    fs::create_directories(root + "/ckpts/step-25");
    std::ofstream(root + "/ckpts/step-25/data.h5") << "no metadata";
    fs::copy(root + "/ckpts/step-10", root + "/ckpts/step-15", fs::copy_options::recursive);
    std::ofstream(root + "/ckpts/step-15/metadata.json", std::ios::trunc) << "{\"format\": \"h5ckpt\"";
    fs::create_directories(root + "/ckpts/logs");  // not a checkpoint: not listed
  }
  int good = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&good, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Finalize();
  return all ? 0 : 1;
}
