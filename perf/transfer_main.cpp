// h5ckpt-transfer: publishing live state from the first half of the world (a trainer, tensors
// split by rows over it) to the second half (inference ranks, split by rows over another count)
// with StateTransfer, against an MPI_Alltoallv moving the same byte counts between the same
// ranks, straight from the source buffers into the destination buffers, in the same run. Also a
// delta (one element changed per tensor); verified (staged), in-place verified and unverified.
// --device cuda|simulated adds the verified transfer between device buffers against its floor:
// the sources' bytes copied down, the same MPI_Alltoallv, the destinations' bytes copied up.
// Prints one JSON line per repeat and a summary with the ratios (docs/performance.md).
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_support.h"
#include "device/staging.h"
#include "h5ckpt/h5ckpt.hpp"
#include "h5ckpt/transfer.h"

using namespace h5ckpt;
using namespace h5ckpt::bench;
using nlohmann::json;

namespace {

int64_t part_begin(int64_t n, int parts, int i) { return n * i / parts; }

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  set_tool("h5ckpt-transfer");
  CLI::App app("h5ckpt-transfer: StateTransfer against MPI_Alltoallv of the same bytes");
  int tensors = 8, repeats = 5;
  int64_t cols = 1024;
  double mib = 256;
  std::string device_kind = "none";
  int threads = 0;
  app.add_option("--tensors", tensors, "tensors in the state");
  app.add_option("--mib", mib, "MiB of the whole state (f32)");
  app.add_option("--cols", cols, "columns of each tensor");
  app.add_option("--repeats", repeats, "timed repeats (the summary takes medians)");
  app.add_option("--device", device_kind, "also transfer between device buffers: cuda or simulated");
  app.add_option("--threads", threads, "TransferOptions::threads (0: the node's cores shared by its ranks)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    MPI_Finalize();
    return rc;
  }
  if (size < 2) die("needs at least 2 ranks");
  if (device_kind == "simulated") device::set_staging_for_testing(device::make_simulated_staging(0));
  if (device_kind != "none" && !device::staging().has_device())
    die("--device " + device_kind + ": no GPU runtime here (staging '" + device::staging().name() + "')");
  const int k = size / 2, m = size - k;  // sources, destinations
  const bool source = rank < k;
  const int64_t rows = std::max<int64_t>(size, static_cast<int64_t>(mib * (1 << 20) / 4 / tensors / cols));
  const Shape shape{rows, cols};
  const uint64_t row_bytes = static_cast<uint64_t>(cols) * 4;
  auto value = [](int t, int64_t g) { return static_cast<float>((g * 31 + t * 7) % 1000) * 0.5f; };

  // Each rank's rows: sources split over k, destinations over m; the same rows of every tensor.
  const int mine = source ? rank : rank - k, parts = source ? k : m;
  const int64_t r0 = part_begin(rows, parts, mine), r1 = part_begin(rows, parts, mine + 1);
  std::vector<std::vector<float>> bufs(tensors, std::vector<float>(static_cast<size_t>((r1 - r0) * cols)));
  StateDict state;
  for (int t = 0; t < tensors; ++t) {
    if (source)
      for (int64_t i = 0; i < (r1 - r0) * cols; ++i) bufs[t][i] = value(t, r0 * cols + i);
    state.add("model/t" + std::to_string(t), DType::kF32, shape, ShardSpec::box_of({r0, 0}, {r1 - r0, cols}),
              bufs[t].data());
  }
  StateDict* src = source ? &state : nullptr;
  StateDict* dst = source ? nullptr : &state;

  // The floor: one MPI_Alltoallv per tensor with the byte counts the layouts imply.
  std::vector<int> scount(size, 0), sdispl(size, 0), rcount(size, 0), rdispl(size, 0);
  for (int s = 0; s < k; ++s)
    for (int d = 0; d < m; ++d) {
      const int64_t a = std::max(part_begin(rows, k, s), part_begin(rows, m, d));
      const int64_t b = std::min(part_begin(rows, k, s + 1), part_begin(rows, m, d + 1));
      if (b <= a) continue;
      if (rank == s)
        scount[k + d] = static_cast<int>((b - a) * row_bytes), sdispl[k + d] = static_cast<int>((a - r0) * row_bytes);
      if (rank == k + d)
        rcount[s] = static_cast<int>((b - a) * row_bytes), rdispl[s] = static_cast<int>((a - r0) * row_bytes);
    }
  std::vector<char> dummy(1);
  auto alltoallv = [&] {
    for (int t = 0; t < tensors; ++t) {
      char* sb = source ? reinterpret_cast<char*>(bufs[t].data()) : dummy.data();
      char* rb = source ? dummy.data() : reinterpret_cast<char*>(bufs[t].data());
      MPI_Alltoallv(sb, scount.data(), sdispl.data(), MPI_BYTE, rb, rcount.data(), rdispl.data(), MPI_BYTE,
                    MPI_COMM_WORLD);
    }
  };
  auto check_dest = [&](int64_t changed_g, float changed_v) {
    if (source) return;
    for (int t = 0; t < tensors; ++t)
      for (int64_t i = 0; i < (r1 - r0) * cols; ++i) {
        const int64_t g = r0 * cols + i;
        const float want = g == changed_g ? changed_v : value(t, g);
        if (bufs[t][i] != want) die("tensor " + std::to_string(t) + " element " + std::to_string(g) + " is wrong");
      }
  };

  StateTransfer x(MPI_COMM_WORLD);
  TransferOptions full;
  full.delta = false;
  full.threads = threads;
  int64_t version = 0;
  auto publish = [&](const TransferOptions& base) {
    TransferOptions o = base;
    o.version = ++version;
    return check(x.transfer(src, dst, o), "transfer");
  };
  // Warm-up: touches every buffer and caches the plan.
  alltoallv();
  publish(full);
  check_dest(-1, 0);
  std::map<std::string, std::vector<double>> t;
  uint64_t full_bytes = 0, delta_bytes = 0, delta_blocks = 0, total_blocks = 0;
  for (int rep = 0; rep < repeats; ++rep) {
    if (!source)
      for (auto& b : bufs) std::fill(b.begin(), b.end(), -1.0f);
    t["alltoallv_s"].push_back(timed(alltoallv));
    check_dest(-1, 0);
    TransferReport r;
    // One full transfer into destinations reset to -1, timed under `name`, then checked.
    auto timed_publish = [&](const char* name, const TransferOptions& o) {
      if (!source)
        for (auto& b : bufs) std::fill(b.begin(), b.end(), -1.0f);
      t[name].push_back(timed([&] { r = publish(o); }));
      check_dest(-1, 0);
    };
    TransferOptions unverified = full;  // no checksums, received in place
    unverified.verify = false;
    timed_publish("unverified_s", unverified);
    TransferOptions in_place = full;  // checked where received, the overwritten bytes kept aside
    in_place.in_place = true;
    timed_publish("in_place_s", in_place);
    TransferOptions unkept = in_place;  // checked where received, a failure leaves new bytes
    unkept.keep_previous = false;
    timed_publish("in_place_unkept_s", unkept);
    timed_publish("transfer_s", full);
    {  // where the verified transfer's time goes (slowest rank in each part)
      double parts[4] = {r.plan_s, r.checksum_s, r.exchange_s, r.commit_s}, worst[4];
      MPI_Allreduce(parts, worst, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      t["transfer_plan_s"].push_back(worst[0]);
      t["transfer_checksum_s"].push_back(worst[1]);
      t["transfer_exchange_s"].push_back(worst[2]);
      t["transfer_commit_s"].push_back(worst[3]);
    }
    full_bytes = sum_all(r.bytes_received);
    // Delta: one element of every tensor changes on the source (global element 5 of each).
    const float changed = 1000.0f + static_cast<float>(rep);
    if (source && r0 == 0)
      for (auto& b : bufs) b[5] = changed;
    TransferOptions d = full;
    d.delta = true;
    t["delta_s"].push_back(timed([&] { r = publish(d); }));
    if (!r.delta) die("the second transfer of a version pair was not a delta");
    check_dest(5, changed);
    delta_bytes = sum_all(r.bytes_received);
    delta_blocks = sum_all(r.blocks_received);
    total_blocks = sum_all(r.blocks_total);
    if (source && r0 == 0)
      for (int tt = 0; tt < tensors; ++tt) bufs[tt][5] = value(tt, 5);
    if (rank == 0) {
      json j;
      j["scenario"] = "repeat";
      j["repeat"] = rep;
      for (const auto& [key, v] : t) j[key] = v.back();
      std::printf("%s\n", j.dump().c_str());
    }
  }
  // Device buffers: every tensor mirrored in device memory; the floor copies the bytes down on
  // the sources, runs the same MPI_Alltoallv between host buffers and copies them up.
  if (device_kind != "none") {
    device::Staging& ds = device::staging();
    const size_t n = bufs[0].size() * 4;
    std::vector<void*> dev(tensors);
    StateDict dstate;
    for (int tt = 0; tt < tensors; ++tt) {
      dev[tt] = ds.alloc_device(std::max<size_t>(n, 1));
      if (!dev[tt]) die("cannot allocate device memory");
      if (!ds.copy_to_device(dev[tt], bufs[tt].data(), n).ok()) die("host-to-device copy failed");
      dstate.add("model/t" + std::to_string(tt), DType::kF32, shape, ShardSpec::box_of({r0, 0}, {r1 - r0, cols}),
                 dev[tt], Device::kCuda);
    }
    if (!ds.synchronize().ok()) die("device synchronize failed");
    auto device_floor = [&] {
      for (int tt = 0; tt < tensors && source; ++tt) (void)ds.copy_to_host(bufs[tt].data(), dev[tt], n);
      if (!ds.synchronize().ok()) die("device synchronize failed");
      alltoallv();
      for (int tt = 0; tt < tensors && !source; ++tt) (void)ds.copy_to_device(dev[tt], bufs[tt].data(), n);
      if (!ds.synchronize().ok()) die("device synchronize failed");
    };
    StateTransfer dx(MPI_COMM_WORLD);
    auto device_publish = [&] {
      TransferOptions o = full;
      o.version = ++version;
      check(dx.transfer(source ? &dstate : nullptr, source ? nullptr : &dstate, o), "device transfer");
    };
    device_publish();  // warm-up: plan, staging
    for (int rep = 0; rep < repeats; ++rep) {
      t["device_floor_s"].push_back(timed(device_floor));
      if (!source)  // the floor left the right bytes: wipe them so the transfer must bring them
        for (int tt = 0; tt < tensors; ++tt) {
          std::fill(bufs[tt].begin(), bufs[tt].end(), -1.0f);
          (void)ds.copy_to_device(dev[tt], bufs[tt].data(), n);
        }
      if (!ds.synchronize().ok()) die("device synchronize failed");
      t["device_transfer_s"].push_back(timed(device_publish));
      for (int tt = 0; tt < tensors && !source; ++tt) (void)ds.copy_to_host(bufs[tt].data(), dev[tt], n);
      if (!ds.synchronize().ok()) die("device synchronize failed");
      check_dest(-1, 0);
    }
    for (void* d : dev) ds.free_device(d);
  }
  if (rank == 0) {
    json s;
    s["scenario"] = "summary";
    s["ranks"] = size;
    s["sources"] = k;
    s["destinations"] = m;
    s["bytes"] = full_bytes;
    s["repeats"] = repeats;
    for (const auto& [key, v] : t) s[key] = median(v);
    s["transfer_over_alltoallv"] = median(t["transfer_s"]) / median(t["alltoallv_s"]);
    s["in_place_over_alltoallv"] = median(t["in_place_s"]) / median(t["alltoallv_s"]);
    s["in_place_unkept_over_alltoallv"] = median(t["in_place_unkept_s"]) / median(t["alltoallv_s"]);
    s["unverified_over_alltoallv"] = median(t["unverified_s"]) / median(t["alltoallv_s"]);
    s["delta_bytes"] = delta_bytes;
    s["delta_blocks"] = delta_blocks;
    s["total_blocks"] = total_blocks;
    s["delta_over_full_bytes"] = static_cast<double>(delta_bytes) / static_cast<double>(full_bytes);
    s["delta_over_transfer"] = median(t["delta_s"]) / median(t["transfer_s"]);
    if (device_kind != "none") {
      s["device"] = device::staging().name();
      s["device_transfer_over_floor"] = median(t["device_transfer_s"]) / median(t["device_floor_s"]);
    }
    std::printf("%s\n", s.dump().c_str());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  return 0;
}
