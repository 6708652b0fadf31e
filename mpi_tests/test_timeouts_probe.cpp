// The MPI program behind the timeout drivers (mpi_tests/timeouts/*.sh). MPI_Abort ends a job that
// times out, so these checks live in shell drivers that look at the exit code, the time it took
// and the output, not in googletest.
//
//   timeout_probe wait OP LATE_RANK TIMEOUT_S
//       OP: agree|bcast|gather|scatter|barrier|transport, or blocking (a blocking MPI_Barrier
//       under a comm::BlockingGuard, as a collective inside parallel HDF5 would be).
//       Every rank but LATE_RANK enters OP, then an agreement, with the timeout set; LATE_RANK
//       sleeps 60 s instead.
//       The others must abort naming the operation/phase and LATE_RANK; exit 0 means they did not.
//   timeout_probe save-loop DIR    Saves step 1, 2, ... into DIR (settings from H5CKPT_* variables,
//       e.g. H5CKPT_TIMEOUT_S, H5CKPT_ASYNC) until a rank is stopped; each rank writes its pid to
//       DIR/pids/rank-R first. Keeps the two newest checkpoints. Exits 3 after 60 s or 400 steps.
//   timeout_probe load DIR SAVED_RANKS   Loads DIR's latest checkpoint and checks every value.
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "comm/deadline.h"
#include "comm/transport.h"
#include "h5ckpt/config.h"
#include "h5ckpt/h5ckpt.hpp"
#include "util/phase.h"

namespace fs = std::filesystem;
using namespace h5ckpt;

namespace {

constexpr int64_t kRows = 1024, kCols = 1024;  // 4 MiB of f32 per rank

int wait_mode(const std::string& op, int late, double timeout_s) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  comm::set_timeout(timeout_s);
  auto c = comm::Comm::duplicate(MPI_COMM_WORLD);
  if (!c.ok()) return 2;
  const MPI_Comm w = c->get();
  if (rank == late) {
    std::this_thread::sleep_for(std::chrono::seconds(60));  // the job is aborted long before
    return 0;
  }
  // The phase each operation ends in (as in the engine), for the message.
  PhaseScope scope(op == "scatter" || op == "transport" ? "load"
                   : op == "barrier"                    ? "save_async"
                                                        : "save",
                   op == "agree" || op == "blocking" ? "write"
                   : op == "bcast"                   ? "prepare"
                   : op == "gather"                  ? "commit"
                   : op == "scatter"                 ? "plan"
                   : op == "barrier"                 ? "start"
                                                     : "read");
  Status st;
  if (op == "agree") {
    st = comm::agree(Status::Ok(), w);
  } else if (op == "bcast") {
    std::string s = rank == 0 ? "temp-dir-name" : "";
    st = comm::bcast_bytes(s, 0, w);
  } else if (op == "gather") {
    st = comm::gather_bytes(std::string(100, 'c'), 0, w).status();
  } else if (op == "scatter") {
    st = comm::scatter_bytes(std::vector<std::string>(size, "part"), 0, w).status();
  } else if (op == "barrier") {
    st = comm::idle_barrier(w);
  } else if (op == "blocking") {
    comm::BlockingGuard guard("blocking collective (MPI_Barrier)", w);
    st = comm::mpi_status(MPI_Barrier(w), "MPI_Barrier");
  } else if (op == "transport") {
    auto t = comm::make_mpi_transport(w);
    std::vector<char> buf(4096);
    st = t->post_recv(late, buf.data(), buf.size(), 5);
    if (st.ok()) st = t->wait_all();
  } else {
    std::fprintf(stderr, "unknown operation %s\n", op.c_str());
    return 2;
  }
  // Like every engine phase, end in an agreement: a rank whose part of OP completed without the
  // late one (a gather's leaf) waits there, so it is heard from when the deadline passes.
  st = comm::agree(st, w);
  std::fprintf(stderr, "rank %d: %s returned (%s) although rank %d never arrived\n", rank, op.c_str(),
               st.to_string().c_str(), late);
  return 0;
}

float value(int64_t flat, int64_t step) { return static_cast<float>((flat * 31 + step) % 8388608); }

struct Model {
  std::vector<float> w;
  int64_t step = 0;
  StateDict state;
  Model(int parts, int index) : w(static_cast<size_t>(kRows * kCols)) {
    const Shape shape{kRows * parts, kCols};
    state.add("model/w", DType::kF32, shape, ShardSpec::split(shape, 0, parts, index), w.data());
    state.add_replicated("extra/step", DType::kI64, {1}, &step);
  }
};

int save_loop(const std::string& dir) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto cfg = resolve_config();
  if (!cfg.ok()) {
    std::fprintf(stderr, "%s\n", cfg.status().to_string().c_str());
    return 2;
  }
  auto topo = Topology::create(MPI_COMM_WORLD, {1, size, 1});
  if (!topo.ok()) return 2;
  fs::create_directories(dir + "/pids");
  std::ofstream(dir + "/pids/rank-" + std::to_string(rank)) << getpid() << "\n";
  Model m(size, rank);
  const auto t0 = std::chrono::steady_clock::now();
  {
    Checkpointer ck(*topo, cfg->checkpointer);
    for (int64_t step = 1; step <= 400; ++step) {
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) break;
      m.step = step;
      for (int64_t j = 0; j < kRows * kCols; ++j) m.w[j] = value(rank * kRows * kCols + j, step);
      SaveOptions so = cfg->save;
      so.step = step;
      char name[32];
      std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
      auto h = ck.save_async(m.state, dir + "/" + name, so);
      auto r = h.ok() ? h->wait() : Result<SaveReport>(h.status());
      if (!r.ok()) {
        std::fprintf(stderr, "rank %d: save %lld failed: %s\n", rank, static_cast<long long>(step),
                     r.status().to_string().c_str());
        return 1;
      }
      if (rank == 0 && step >= 3) {  // keep the two newest (latest names the newest)
        std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step - 2));
        std::error_code ec;
        fs::remove_all(dir + "/" + name, ec);
      }
    }
  }
  std::fprintf(stderr, "rank %d: save loop ended without being stopped\n", rank);
  return 3;
}

int load_mode(const std::string& dir, int saved_ranks) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (saved_ranks % size != 0) return 2;
  auto topo = Topology::create(MPI_COMM_WORLD, {1, size, 1});
  if (!topo.ok()) return 2;
  // Each rank loads saved_ranks/size of the saved row blocks.
  const int per = saved_ranks / size;
  std::vector<float> w(static_cast<size_t>(per * kRows * kCols), -1.0f);
  int64_t step = -1;
  StateDict state;
  const Shape shape{kRows * saved_ranks, kCols};
  state.add("model/w", DType::kF32, shape, ShardSpec::split(shape, 0, size, rank), w.data());
  state.add_replicated("extra/step", DType::kI64, {1}, &step);
  int64_t bad = 0;
  {
    auto cfg = resolve_config();  // H5CKPT_LOCAL_DIR: the newest servable level, else the shared one
    if (!cfg.ok()) return 2;
    Checkpointer ck(*topo, cfg->checkpointer);
    auto r = ck.load(state, dir);
    if (!r.ok()) {
      std::fprintf(stderr, "rank %d: load failed: %s\n", rank, r.status().to_string().c_str());
      return 1;
    }
    const int64_t base = static_cast<int64_t>(rank) * per * kRows * kCols;
    for (size_t j = 0; j < w.size(); ++j) bad += w[j] != value(base + static_cast<int64_t>(j), step);
    std::fprintf(stderr, "rank %d: loaded %s: step %lld, %lld wrong values\n", rank, r->path.c_str(),
                 static_cast<long long>(step), static_cast<long long>(bad));
  }
  int64_t all_bad = 0;
  MPI_Allreduce(&bad, &all_bad, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return step >= 1 && all_bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  const std::string mode = argc > 1 ? argv[1] : "";
  int rc = 2;
  if (mode == "wait" && argc == 5) rc = wait_mode(argv[2], std::atoi(argv[3]), std::atof(argv[4]));
  else if (mode == "save-loop" && argc == 3) rc = save_loop(argv[2]);
  else if (mode == "load" && argc == 4) rc = load_mode(argv[2], std::atoi(argv[3]));
  else std::fprintf(stderr, "usage: see the comment at the top of mpi_tests/test_timeouts_probe.cpp\n");
  MPI_Finalize();
  return rc;
}
