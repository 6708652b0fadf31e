// The MPI program behind mpi_tests/transfer/sigstop_transfer.sh: the first half of the world
// publishes a 4 MiB f32 tensor (rows split over it) to the second half (whole copies), a new
// version every step, until a rank is stopped and the deadline (H5CKPT_TIMEOUT_S, default 5 s)
// ends the job with MPI_Abort.
//   transfer_probe loop DIR   each rank writes its pid to DIR/pids/rank-R; rank 0 creates
//                             DIR/ready after the first committed transfer. Exits 3 after 60 s.
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "h5ckpt/h5ckpt.hpp"
#include "h5ckpt/transfer.h"

using namespace h5ckpt;

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc != 3 || std::string(argv[1]) != "loop" || size < 2) {
    if (rank == 0) std::fprintf(stderr, "usage: transfer_probe loop DIR (at least 2 ranks)\n");
    MPI_Finalize();
    return 2;
  }
  const std::filesystem::path dir = argv[2];
  std::filesystem::create_directories(dir / "pids");
  std::ofstream(dir / "pids" / ("rank-" + std::to_string(rank))) << getpid() << "\n";
  const char* env = std::getenv("H5CKPT_TIMEOUT_S");
  const double timeout_s = env ? std::atof(env) : 5.0;

  const int k = size / 2;
  const bool source = rank < k;
  const Shape shape{1024, 1024};
  const ShardSpec shard = source ? ShardSpec::split(shape, 0, k, rank) : ShardSpec::whole(shape);
  std::vector<float> buf(static_cast<size_t>(shard.numel()), 0.0f);
  StateDict state;
  state.add("model/w", DType::kF32, shape, shard, buf.data());
  int rc = 3;
  {
    StateTransfer x(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t v = 1; std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60); ++v) {
      if (source)
        for (auto& f : buf) f = static_cast<float>(v);  // every block changes every version
      TransferOptions o;
      o.version = v;
      o.timeout_s = timeout_s;
      auto r = x.transfer(source ? &state : nullptr, source ? nullptr : &state, o);
      if (!r.ok()) {
        std::fprintf(stderr, "rank %d: transfer failed: %s\n", rank, r.status().to_string().c_str());
        rc = 1;
        break;
      }
      if (!source && buf.front() != static_cast<float>(v)) {
        std::fprintf(stderr, "rank %d: wrong value after version %lld\n", rank, static_cast<long long>(v));
        rc = 1;
        break;
      }
      if (v == 1 && rank == 0) std::ofstream(dir / "ready") << "1\n";
    }
  }
  MPI_Finalize();
  return rc;
}
