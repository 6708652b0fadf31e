// h5ckpt-multilevel: a local (node-level) save against a shared-level save of the same state, and
// recovery from partner copies against a load from the shared level, with the floors measured in
// the same run: memcpy of each rank's bytes (the blocking floor of any asynchronous save), and a
// plain write + fsync of the bytes a local save writes (the rank's own and its partner's) plus
// the plain MPI transfer of the partner copy. Prints one JSON line per repeat and a summary with
// the ratios (docs/performance.md, "Multi-level checkpoints"), and the library's own memory peak
// per phase (Checkpointer::memory_peak_bytes, slowest rank) beside the budget (--memory-bytes).
//
// Nodes: real ones, or cut out of one machine with H5CKPT_RANKS_PER_NODE; the local directory is
// --local-dir (default <dir>/node{node}), the shared one <dir>/shared.
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_support.h"
#include "comm/topology_impl.h"
#include "engine/local_level.h"
#include "h5ckpt/config.h"
#include "h5ckpt/h5ckpt.hpp"
#include "workload.h"

using namespace h5ckpt;
using namespace h5ckpt::bench;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

int g_rank = 0, g_size = 1;

double mib(uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

void write_file(const std::string& path, const char* data, uint64_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) die("cannot create " + path);
  for (uint64_t at = 0; at < n;) {
    const ssize_t w = ::write(fd, data + at, std::min<uint64_t>(n - at, 1ull << 30));
    if (w <= 0) die("write " + path);
    at += static_cast<uint64_t>(w);
  }
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  set_tool("h5ckpt-multilevel");
  CLI::App app{"h5ckpt-multilevel: local saves and partner-copy recovery against their floors, one run"};
  workload::ModelConfig model;
  int tp = 1, repeats = 3;
  std::string dir = "multilevel-bench", local_dir, memory_bytes;
  app.add_option("--tp", tp, "tensor parallelism (dp = ranks / tp)")->capture_default_str();
  app.add_option("--layers", model.layers)->capture_default_str();
  app.add_option("--hidden", model.hidden)->capture_default_str();
  app.add_option("--ffn", model.ffn)->capture_default_str();
  app.add_option("--vocab", model.vocab)->capture_default_str();
  app.add_option("--repeats", repeats)->capture_default_str();
  app.add_option("--dir", dir, "shared directory of the run (and default local directories)")->capture_default_str();
  app.add_option("--local-dir", local_dir, "node-local directory ({node}: node index); default <dir>/node{node}");
  app.add_option("--memory-bytes", memory_bytes,
                 "memory budget of both checkpointers (checkpointer.memory_bytes, e.g. 64MiB); default "
                 "$H5CKPT_MEMORY_BYTES or the configuration's");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = g_rank == 0 ? app.exit(e) : (e.get_exit_code() ? 1 : 0);
    MPI_Finalize();
    return rc;
  }
  if (provided < MPI_THREAD_MULTIPLE) die("needs MPI_THREAD_MULTIPLE (asynchronous saves)");
  dir = fs::absolute(dir).string();
  if (local_dir.empty()) local_dir = dir + "/node{node}";
  workload::TrainConfig cfg;
  cfg.model = model;
  cfg.sizes = ParallelSizes{tp, g_size / tp, 1};
  cfg.zero = true;
  if (Status st = cfg.validate(g_size); !st.ok()) die(st.to_string());
  Topology topo = check(Topology::create(MPI_COMM_WORLD, cfg.sizes), "topology");
  workload::Workload w(cfg, topo);
  StateDict sd;
  w.stage_save(sd);

  const std::string shared = dir + "/shared";
  if (g_rank == 0) {
    fs::remove_all(dir);
    fs::create_directories(shared);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CheckpointerOptions local_opts, shared_opts;
  local_opts.metrics = shared_opts.metrics = false;
  const uint64_t budget = memory_bytes.empty() ? check(resolve_config(), "configuration").checkpointer.memory_bytes
                                               : check(parse_byte_size(memory_bytes), "--memory-bytes");
  local_opts.memory_bytes = shared_opts.memory_bytes = budget;
  local_opts.local_dir = local_dir;
  local_opts.local_keep = 1;
  shared_opts.keep_last = 1;
  Checkpointer local_ck(topo, local_opts), shared_ck(topo, shared_opts);

  // The floors' partner: the rank a local save sends this rank's copy to, and the one it gets from.
  auto nodes = check(engine::local::make_node_map(detail::TopologyAccess::of(topo)), "node map");
  if (nodes->nodes() < 2) die("one node: run with H5CKPT_RANKS_PER_NODE or on several nodes");
  const int to = engine::local::replica_targets(*nodes, g_rank, 1).at(0);
  int from = -1;
  for (int q = 0; q < g_size; ++q)
    if (engine::local::replica_targets(*nodes, q, 1).at(0) == g_rank) from = q;
  const std::string my_local = storage::expand_local_dir(local_dir, nodes->my_node);
  fs::create_directories(my_local);

  // Warm-up: plans both saves and tells each rank its bytes (those the floors then move).
  SaveOptions so;
  so.step = 0;
  auto warm = check(local_ck.save(sd, shared + "/warm", so), "warm-up local save");
  check(shared_ck.save(sd, shared + "/warm", so), "warm-up shared save");
  // And the asynchronous path: each Checkpointer's staging pool is allocated (and its pages
  // touched) by its first save_async, which the timed saves would otherwise pay once.
  so.step = 1;
  check(check(local_ck.save_async(sd, shared + "/warm-async", so), "warm-up local save_async").wait(),
        "warm-up local save_async");
  check(check(shared_ck.save_async(sd, shared + "/warm-async", so), "warm-up shared save_async").wait(),
        "warm-up shared save_async");
  const uint64_t mine = warm.bytes_written;
  uint64_t partner_bytes = 0;
  MPI_Sendrecv(&mine, 1, MPI_UINT64_T, to, 1, &partner_bytes, 1, MPI_UINT64_T, from, 1, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
  std::vector<char> bytes(std::max<uint64_t>(mine, 1), 1), copy(std::max<uint64_t>(mine, 1), 0),
      partner(std::max<uint64_t>(partner_bytes, 1), 0);

  // The load target, and one untimed local load into it (its buffers and the local level's
  // window are then allocated and touched, as they are in a job that loads more than once).
  workload::Workload into(cfg, topo);
  {
    StateDict warm_sd;
    auto info = check(local_ck.resolve(shared), "resolve");
    if (Status st = into.stage_load(warm_sd, info.info); !st.ok()) die(st.to_string());
    check(local_ck.load(warm_sd, shared), "warm-up local load");
  }

  std::map<std::string, std::vector<double>> t;
  for (int rep = 0; rep < repeats; ++rep) {
    const int64_t step = 10 * (rep + 1);
    t["memcpy_s"].push_back(timed([&] { std::memcpy(copy.data(), bytes.data(), mine); }));
    // What a local save does, without the library: write own bytes, transfer, write the copy.
    t["raw_local_write_s"].push_back(
        timed([&] { write_file(my_local + "/raw-own-" + std::to_string(g_rank), bytes.data(), mine); }));
    t["raw_transfer_s"].push_back(timed([&] {
      MPI_Request r[2];
      MPI_Irecv(partner.data(), static_cast<int>(partner_bytes), MPI_BYTE, from, 2, MPI_COMM_WORLD, &r[0]);
      MPI_Isend(bytes.data(), static_cast<int>(mine), MPI_BYTE, to, 2, MPI_COMM_WORLD, &r[1]);
      MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
      write_file(my_local + "/raw-copy-" + std::to_string(g_rank), partner.data(), partner_bytes);
    }));
    for (const char* level : {"local", "shared"}) {
      Checkpointer& ck = std::string(level) == "local" ? local_ck : shared_ck;
      so.step = step;
      ck.reset_memory_peak();
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = now_s();
      SaveHandle h = check(ck.save_async(sd, shared + "/" + level + "-" + std::to_string(step), so), "save_async");
      const double blocked = now_s() - t0;
      check(h.wait(), std::string(level) + " save");
      const double total = now_s() - t0;
      t[std::string(level) + "_block_s"].push_back(max_all(blocked));
      t[std::string(level) + "_total_s"].push_back(max_all(total));
      t[std::string(level) + "_save_overhead_mib"].push_back(max_all(mib(ck.memory_peak_bytes())));
    }
    // A load of the local checkpoint of this step into another workload's state (not the one
    // saved), timed with its own memory. Every load of the run, shared ones too, lands in the same
    // buffers, touched by the warm-up load: none of them pays first-touch page faults.
    StateDict load_sd;
    auto local_load = [&](const char* what, const char* time_key, const char* mib_key) {
      load_sd = StateDict();
      auto info = check(local_ck.resolve(shared), "resolve");
      if (info.level != "local") die(std::string(what) + " did not come from the local level: " + info.reason);
      if (Status st = into.stage_load(load_sd, info.info); !st.ok()) die(st.to_string());
      local_ck.reset_memory_peak();
      t[time_key].push_back(
          timed([&] { check(local_ck.load(load_sd, shared + "/local-" + std::to_string(step)), what); }));
      t[mib_key].push_back(max_all(mib(local_ck.memory_peak_bytes())));
    };
    // Every node's disk intact: each rank reads mostly its own node's files.
    local_load("the local load", "local_load_s", "local_load_overhead_mib");
    // Recovery: the last node's disk is lost; its ranks' bytes come from the partner copies.
    if (g_rank == nodes->members.back().front()) fs::remove_all(my_local + "/local-" + std::to_string(step));
    MPI_Barrier(MPI_COMM_WORLD);
    local_load("recovery", "recover_local_s", "recover_overhead_mib");
    t["load_shared_s"].push_back(
        timed([&] { check(shared_ck.load(load_sd, shared + "/shared-" + std::to_string(step)), "shared load"); }));
    if (g_rank == 0) {
      json j;
      j["scenario"] = "repeat";
      j["repeat"] = rep;
      for (const auto& [k, v] : t) j[k] = v.back();
      std::printf("%s\n", j.dump().c_str());
    }
  }
  if (g_rank == 0) {
    auto m = [&](const char* k) { return median(t[k]); };
    json s;
    s["scenario"] = "summary";
    s["ranks"] = g_size;
    s["nodes"] = nodes->nodes();
    s["bytes"] = warm.bytes_total;
    s["repeats"] = repeats;
    s["memory_budget_mib"] = mib(budget);  // 0: unbounded
    // The library's own peak of every phase within the budget (the bound is budget + 64 MiB
    // of process growth; the library's leases alone must fit the budget itself).
    bool within = budget != 0;
    for (const char* k :
         {"local_save_overhead_mib", "shared_save_overhead_mib", "local_load_overhead_mib", "recover_overhead_mib"})
      for (double v : t[k]) within = within && v <= mib(budget);
    s["overhead_within_budget"] = within;
    for (const auto& [k, v] : t) s[k] = median(v);
    const double floor_total = m("raw_local_write_s") + m("raw_transfer_s");
    s["local_block_over_memcpy"] = m("local_block_s") / m("memcpy_s");
    s["local_total_over_raw_write_plus_transfer"] = m("local_total_s") / floor_total;
    s["local_total_over_shared_total"] = m("local_total_s") / m("shared_total_s");
    s["local_block_over_shared_block"] = m("local_block_s") / m("shared_block_s");
    s["recover_local_over_load_shared"] = m("recover_local_s") / m("load_shared_s");
    std::printf("%s\n", s.dump().c_str());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  return 0;
}
