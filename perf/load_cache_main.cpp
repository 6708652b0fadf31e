// h5ckpt-load-cache: what a repeated load of the same checkpoint costs before its reads, with
// every rank's load plan cached and with none cached, for a checkpoint whose index is large
// (many regions: each rank holds its tensors as many pieces). Prints one JSON line with the
// median over the repeats of the slowest rank's LoadReport::plan_s for each case, and whether the
// cached loads shared the index (docs/performance.md).
//
//   mpirun -np 4 build/perf/h5ckpt-load-cache --dir /tmp/lc --tensors 64 --pieces 512
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "h5ckpt/h5ckpt.hpp"

using namespace h5ckpt;
namespace fs = std::filesystem;

namespace {

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "h5ckpt-load-cache: %s\n", msg.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

template <class T>
T check(Result<T> r, const char* what) {
  if (!r.ok()) die(std::string(what) + ": " + r.status().to_string());
  return std::move(r).value();
}

double max_all(double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return v;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// `tensors` tensors of [ranks * pieces, 16] f32; rank r holds rows r, r + ranks, ... (one
// piece per row, `pieces` of them), so the checkpoint has tensors * ranks * pieces regions.
struct PieceState {
  PieceState(int tensors, int pieces, int rank, int ranks) : buf(static_cast<size_t>(tensors)) {
    const Shape shape{static_cast<int64_t>(ranks) * pieces, 16};
    for (int t = 0; t < tensors; ++t) {
      std::vector<ShardPiece> ps;
      for (int p = 0; p < pieces; ++p)
        ps.push_back({ShardSpec::box_of({static_cast<int64_t>(p) * ranks + rank, 0}, {1, 16}),
                      static_cast<uint64_t>(p) * 16 * sizeof(float)});
      buf[static_cast<size_t>(t)].assign(static_cast<size_t>(pieces) * 16, static_cast<float>(t + rank));
      state.add_pieces("t/" + std::to_string(t), DType::kF32, shape, std::move(ps), buf[static_cast<size_t>(t)].data());
    }
  }
  std::vector<std::vector<float>> buf;
  StateDict state;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  CLI::App app{"h5ckpt-load-cache: a repeated load's planning cost, cached and not"};
  std::string dir = "/tmp/h5ckpt-load-cache";
  int tensors = 64, pieces = 512, repeats = 5;
  app.add_option("--dir", dir, "where the checkpoint is saved (removed at the end)");
  app.add_option("--tensors", tensors, "tensors in the checkpoint");
  app.add_option("--pieces", pieces, "pieces (regions) of each tensor per rank");
  app.add_option("--repeats", repeats, "loads of each kind");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    MPI_Finalize();
    return app.exit(e);
  }
  auto topo = check(Topology::create(MPI_COMM_WORLD, {ranks, 1, 1}), "topology");
  const std::string path = dir + "/ckpt";
  {
    PieceState s(tensors, pieces, rank, ranks);
    Checkpointer ck(topo);
    check(ck.save(s.state, path), "save");
  }
  std::vector<double> cached_plan, full_plan;
  int cached_everywhere = 1, shared_index = 0;
  Checkpointer ck(topo);
  for (int k = 0; k <= repeats; ++k) {
    PieceState s(tensors, pieces, rank, ranks);
    const LoadReport r = check(ck.load(s.state, path), "cached load");
    const double plan = max_all(r.plan_s);
    if (k == 0) continue;  // the first load plans
    cached_plan.push_back(plan);
    cached_everywhere &= r.plan_cached ? 1 : 0;
    shared_index |= r.index_shared ? 1 : 0;  // index_shared
  }
  for (int k = 0; k < repeats; ++k) {
    PieceState s(tensors, pieces, rank, ranks);
    Checkpointer fresh(topo);  // nothing cached
    const LoadReport r = check(fresh.load(s.state, path), "load");
    full_plan.push_back(max_all(r.plan_s));
  }
  MPI_Allreduce(MPI_IN_PLACE, &cached_everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &shared_index, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) {
    nlohmann::json out;
    out["ranks"] = ranks;
    out["tensors"] = tensors;
    out["regions"] = static_cast<int64_t>(tensors) * ranks * pieces;
    out["data_file_bytes"] = fs::file_size(fs::path(path) / "data.h5");
    out["repeats"] = repeats;
    out["plan_cached_everywhere"] = cached_everywhere == 1;
    out["cached_loads_shared_index"] = shared_index == 1;
    out["cached_load_plan_s"] = median(cached_plan);
    out["uncached_load_plan_s"] = median(full_plan);
    std::printf("%s\n", out.dump().c_str());
    fs::remove_all(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  return 0;
}
