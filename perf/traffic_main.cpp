// h5ckpt-traffic: how many coordination messages and bytes the coordinator receives per save and
// per load (comm::received_traffic), with coordination through node leaders and, in the same run,
// through the flat tree that one rank per node gives (the baseline). Run it on the simulated
// cluster (scripts/cluster.sh) or a real one; docs/performance.md records the figures.
// (Open MPI's PML monitoring would count every message, but Debian's 4.1.4 drops its counters.)
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_support.h"
#include "comm/comm.h"
#include "h5ckpt/h5ckpt.hpp"
#include "workload.h"

using namespace h5ckpt;
using namespace h5ckpt::bench;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

int g_rank = 0, g_size = 1;

struct Received {
  unsigned long long coordinator_messages = 0, coordinator_bytes = 0;  // received by the coordinator
  unsigned long long max_messages = 0;                                 // most any one rank received
  unsigned long long total_messages = 0;                               // received by all ranks
};

// Runs `fn` and counts what every rank received in h5ckpt's coordination during it
// (comm::received_traffic: point-to-point pieces and the messages MPI's collective algorithms
// deliver; the counting itself comes after).
Received measure(int coordinator, const std::function<void()>& fn) {
  MPI_Barrier(MPI_COMM_WORLD);
  const comm::Traffic before = comm::received_traffic();
  fn();
  const comm::Traffic after = comm::received_traffic();
  unsigned long long mine[2] = {after.messages - before.messages, after.bytes - before.bytes};
  std::vector<unsigned long long> all(2 * static_cast<size_t>(g_size));
  MPI_Allgather(mine, 2, MPI_UNSIGNED_LONG_LONG, all.data(), 2, MPI_UNSIGNED_LONG_LONG, MPI_COMM_WORLD);
  Received out;
  out.coordinator_messages = all[2 * static_cast<size_t>(coordinator)];
  out.coordinator_bytes = all[2 * static_cast<size_t>(coordinator) + 1];
  for (int r = 0; r < g_size; ++r) {
    out.max_messages = std::max(out.max_messages, all[2 * static_cast<size_t>(r)]);
    out.total_messages += all[2 * static_cast<size_t>(r)];
  }
  return out;
}

// Coordination nodes as the topology forms them: the shared-memory split, each cut into
// H5CKPT_RANKS_PER_NODE ranks when that is set (simulated nodes).
int count_nodes() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &node);
  int node_rank = 0, node_size = 1, total = 0;
  MPI_Comm_rank(node, &node_rank);
  MPI_Comm_size(node, &node_size);
  const char* e = std::getenv("H5CKPT_RANKS_PER_NODE");
  const int per_node = e ? std::atoi(e) : 0;
  const int mine = node_rank != 0 ? 0 : per_node > 0 ? (node_size + per_node - 1) / per_node : 1;
  MPI_Allreduce(&mine, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Comm_free(&node);
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  set_tool("h5ckpt-traffic");

  CLI::App app{"h5ckpt-traffic: messages and bytes the coordinator receives per save and load"};
  int tp = 1, pp = 1, dp = 0, load_tp = 0, load_pp = 0, load_dp = 0, saves = 2;
  bool zero = false, flat = true;
  workload::ModelConfig model;
  model.layers = 4;
  model.hidden = 128;
  model.heads = 8;
  model.kv_heads = 4;
  model.ffn = 256;
  model.vocab = 1024;
  std::string dir = "h5ckpt-traffic-data";
  app.add_option("--tp", tp, "save layout: tensor parallel size")->capture_default_str();
  app.add_option("--pp", pp, "save layout: pipeline parallel size")->capture_default_str();
  app.add_option("--dp", dp, "save layout: data parallel size (default: world / (tp*pp))");
  app.add_flag("--zero", zero, "distributed optimizer (ZeRO) in both layouts");
  app.add_option("--load-tp", load_tp, "load layout TP (default: the save layout's)");
  app.add_option("--load-pp", load_pp, "load layout PP");
  app.add_option("--load-dp", load_dp, "load layout DP");
  app.add_option("--layers", model.layers, "model layers")->capture_default_str();
  app.add_option("--hidden", model.hidden, "hidden size")->capture_default_str();
  app.add_option("--ffn", model.ffn, "FFN size")->capture_default_str();
  app.add_option("--vocab", model.vocab, "vocabulary")->capture_default_str();
  app.add_option("--saves", saves, "saves per tree (the first plans, later ones reuse the plan)")
      ->capture_default_str();
  app.add_flag("!--no-flat", flat, "skip the flat-tree baseline (one rank per node)");
  app.add_option("--dir", dir, "directory for the checkpoints (shared by all ranks)")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = g_rank == 0 ? app.exit(e) : (e.get_exit_code() ? 1 : 0);
    MPI_Finalize();
    return rc;
  }
  if (dp == 0) dp = g_size / (tp * pp);
  if (load_tp == 0) load_tp = tp;
  if (load_pp == 0) load_pp = pp;
  if (load_dp == 0) load_dp = g_size / (load_tp * load_pp);
  auto config = [&](int t, int p, int d) {
    workload::TrainConfig cfg;
    cfg.model = model;
    cfg.sizes = ParallelSizes{t, d, p};
    cfg.zero = zero;
    if (Status st = cfg.validate(g_size); !st.ok()) die("layout: " + st.to_string());
    return cfg;
  };
  const auto save_cfg = config(tp, pp, dp), load_cfg = config(load_tp, load_pp, load_dp);
  if (g_rank == 0) fs::create_directories(dir);
  MPI_Barrier(MPI_COMM_WORLD);

  // One pass per coordination tree: the machine's nodes, then (baseline) every rank its own node.
  std::vector<std::pair<std::string, const char*>> trees = {{"nodes", nullptr}};
  if (flat) trees.push_back({"flat", "1"});
  const char* configured = std::getenv("H5CKPT_RANKS_PER_NODE");
  const std::string keep = configured ? configured : "";
  for (const auto& [tree, per_node] : trees) {
    if (per_node) setenv("H5CKPT_RANKS_PER_NODE", per_node, 1);
    else if (configured) setenv("H5CKPT_RANKS_PER_NODE", keep.c_str(), 1);
    Topology save_topo = check(Topology::create(MPI_COMM_WORLD, save_cfg.sizes), "topology");
    Topology load_topo = check(Topology::create(MPI_COMM_WORLD, load_cfg.sizes), "topology");
    const int nodes = count_nodes();
    int coordinator = 0;
    for (int r = 0; r < g_size; ++r) {
      const RankCoords c = save_topo.all_coords()[static_cast<size_t>(r)];
      if (c.tp == 0 && c.dp == 0 && c.pp == 0) coordinator = r;
    }
    workload::Workload state(save_cfg, save_topo);
    StateDict sd;
    state.stage_save(sd);
    CheckpointerOptions opts;
    opts.async = false;
    opts.metrics = false;
    Checkpointer ck(save_topo, opts), ck_load(load_topo, opts);
    auto emit = [&](const char* phase, int index, const Received& r) {
      if (g_rank != 0) return;
      json j{{"tree", tree},
             {"phase", phase},
             {"index", index},
             {"ranks", g_size},
             {"nodes", nodes},
             {"layout", save_cfg.layout_tag()},
             {"coordinator_recv_messages", r.coordinator_messages},
             {"coordinator_recv_bytes", r.coordinator_bytes},
             {"max_rank_recv_messages", r.max_messages},
             {"total_messages", r.total_messages}};
      if (std::string(phase) == "load") j["load_layout"] = load_cfg.layout_tag();
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    };
    const std::string path = dir + "/" + tree;
    for (int s = 0; s < saves; ++s) {
      SaveOptions so;
      so.overwrite = true;
      Received r = measure(coordinator, [&] { check(ck.save(sd, path, so), "save"); });
      emit("save", s, r);
    }
    auto info = check(read_checkpoint_info(path), "reading the checkpoint");
    workload::Workload target(load_cfg, load_topo);
    StateDict load_sd;
    if (Status st = target.stage_load(load_sd, info); !st.ok()) die(st.to_string());
    Received r = measure(coordinator, [&] { check(ck_load.load(load_sd, path), "load"); });
    emit("load", 0, r);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) fs::remove_all(dir);
  MPI_Finalize();
  return 0;
}
