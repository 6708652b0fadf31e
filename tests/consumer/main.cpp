// Saves a tensor split over all ranks and loads it back whole on every rank.
#include <cstdio>
#include <h5ckpt/h5ckpt.hpp>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int failed = 0;
  {
    auto topo = h5ckpt::Topology::create(MPI_COMM_WORLD, {size, 1, 1});
    if (!topo.ok()) return 2;
    const h5ckpt::Shape shape{10, 3};
    auto shard = h5ckpt::ShardSpec::split(shape, 0, size, rank);
    std::vector<float> mine(shard.numel());
    for (int64_t j = 0; j < shard.numel(); ++j) mine[j] = float(shard.box.offset[0] * 3 + j);
    h5ckpt::StateDict out;
    out.add("model/w", h5ckpt::DType::kF32, shape, shard, mine.data());
    h5ckpt::Checkpointer ck(*topo);
    const std::string path = argc > 1 ? argv[1] : "consumer-ckpt";
    auto saved = ck.save(out, path);
    std::vector<float> all(30, -1);
    h5ckpt::StateDict in;
    in.add_replicated("model/w", h5ckpt::DType::kF32, shape, all.data());
    auto loaded = saved.ok() ? ck.load(in, path) : h5ckpt::Result<h5ckpt::LoadReport>(saved.status());
    if (!loaded.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, loaded.status().to_string().c_str());
      failed = 1;
    }
    for (int i = 0; i < 30 && !failed; ++i) failed |= all[i] != float(i);
  }
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) std::printf("consumer %s (h5ckpt %s)\n", any ? "FAILED" : "ok", h5ckpt::version());
  MPI_Finalize();
  return any;
}
