// h5ckpt-bench: in one run, on the same storage and the same synthetic-trainer state, measures
// h5ckpt's save/load against the floors a checkpoint system can at best reach (plain write+fsync,
// memcpy, plain read), and prints one JSON line per scenario plus a summary line with ratios.
// Run under mpirun/srun like a trainer. See docs/performance.md.
#include <fcntl.h>
#include <mpi.h>
#include <sys/resource.h>
#include <unistd.h>
#include <xxhash.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench_support.h"
#include "device/staging.h"
#include "storage/verify_blocks.h"
#include "h5ckpt/config.h"
#include "h5ckpt/h5ckpt.hpp"
#include "workload.h"

using namespace h5ckpt;
using namespace h5ckpt::bench;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

int g_rank = 0, g_size = 1;

// A load's LoadReport split, as the load_phases lines print it per rank.
constexpr size_t kPhaseFields = 8;
constexpr const char* kPhaseNames[kPhaseFields] = {"plan_s", "open_s",        "read_s",     "io_s",
                                                   "copy_s", "verify_busy_s", "exchange_s", "total_s"};
std::array<double, kPhaseFields> phase_fields(const LoadReport& r) {
  return {r.plan_s, r.open_s, r.read_s, r.io_s, r.copy_s, r.verify_s, r.exchange_s, r.total_s};
}

void write_all(int fd, const char* p, size_t n) {
  while (n) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      die(std::string("write: ") + std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Writes p[0, n) at offset `at` of `path`, opened with `flags`: the block-aligned part with
// O_DIRECT in requests of at most `request` bytes, the tail (< 4 KiB) buffered, then fsync.
void write_direct(const std::string& path, int flags, const char* p, size_t n, uint64_t at, size_t request) {
  int fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
  if (fd < 0) die("cannot open " + path + " with O_DIRECT");
  const size_t aligned = n / 4096 * 4096;
  for (size_t done = 0; done < aligned;) {
    const ssize_t w = ::pwrite(fd, p + done, std::min(aligned - done, request), static_cast<off_t>(at + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) die(std::string("pwrite: ") + std::strerror(errno));
    done += static_cast<size_t>(w);
  }
  ::close(fd);
  fd = ::open(path.c_str(), O_WRONLY);
  ::pwrite(fd, p + aligned, n - aligned, static_cast<off_t>(at + aligned));
  ::fsync(fd);
  ::close(fd);
}

// Reads bytes [begin, end) of a file into buf (grown as needed) with one pread per call, or
// with preads of at most `request` bytes.
template <class A>
void read_range(const std::string& path, uint64_t begin, uint64_t end, std::vector<char, A>& buf,
                uint64_t request = UINT64_MAX) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) die("cannot open " + path);
  if (buf.size() < end - begin) buf.resize(end - begin);
  for (uint64_t done = 0; begin + done < end;) {
    const uint64_t want = std::min(end - begin - done, request);
    const ssize_t r = ::pread(fd, buf.data() + done, want, static_cast<off_t>(begin + done));
    if (r <= 0) die("short read of " + path);
    done += static_cast<uint64_t>(r);
  }
  ::close(fd);
}

// Page cache dropped so reads come from the device (root only; reported when it fails).
bool drop_caches(bool enabled) {
  int ok = 1;
  if (g_rank == 0 && enabled) {
    ::sync();
    FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w");
    ok = f && std::fputs("3\n", f) >= 0 ? 1 : 0;
    if (f) std::fclose(f);
  }
  if (!enabled) ok = 0;
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return ok != 0;
}

// Re-touches every page of a buffer so the timed phase does not pay for faults (this VM hands
// idle memory back to the host; touching it again is slow and random).
template <class A>
void prewarm(std::vector<char, A>& buf) {
  for (size_t i = 0; i < buf.size(); i += 4096) buf[i] = static_cast<char>(buf[i] + 1);
}

// Same for the caller's state that a save reads: one read per page of every item's buffer.
void prewarm(const StateDict& sd) {
  volatile char sink = 0;
  for (const auto& it : sd.items()) {
    const char* p = static_cast<const char*>(it.data);
    const size_t n = static_cast<size_t>(it.shard.numel()) * dtype_size(it.dtype);
    for (size_t i = 0; i < n; i += 4096) sink = sink + p[i];
  }
}

// Memory of one phase: the library's own allocation peak (Checkpointer::memory_peak_bytes) and
// the growth of the process's peak RSS over its RSS at the start (VmHWM is reset through
// /proc/self/clear_refs): the state and the benchmark's buffers exist before, so the growth is
// what the phase took. The overhead is the larger of the two, in MiB.
uint64_t proc_status_kib(const char* field) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  uint64_t v = 0;
  const size_t n = std::strlen(field);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, field, n) == 0) v = std::strtoull(line + n, nullptr, 10);
  std::fclose(f);
  return v;
}
struct PhaseMemory {
  Checkpointer* ck = nullptr;
  uint64_t rss_start_kib = 0;
  void start(Checkpointer& c) {
    ck = &c;
    c.reset_memory_peak();
    if (FILE* f = std::fopen("/proc/self/clear_refs", "w")) {  // resets VmHWM to the current RSS
      std::fputs("5", f);
      std::fclose(f);
    }
    rss_start_kib = proc_status_kib("VmRSS:");
  }
  // {library peak, RSS growth} in MiB
  std::pair<double, double> end() const {
    const uint64_t hwm = proc_status_kib("VmHWM:");
    const double rss = hwm > rss_start_kib ? static_cast<double>(hwm - rss_start_kib) / 1024.0 : 0.0;
    return {static_cast<double>(ck->memory_peak_bytes()) / (1024.0 * 1024.0), rss};
  }
};

// Device copies of every buffer of a state, and a StateDict over them (--device).
class DeviceState {
 public:
  DeviceState(const StateDict& host, device::Staging& s) : s_(s) {
    for (const auto& it : host.items()) {
      const size_t n = static_cast<size_t>(it.shard.numel()) * dtype_size(it.dtype);
      void* d = n ? s_.alloc_device(n) : nullptr;
      if (n && !d) die("cannot allocate " + std::to_string(n) + " bytes of device memory");
      if (n && !s_.copy_to_device(d, it.data, n).ok()) die("host-to-device copy failed");
      bufs_.push_back({d, it.data, n});
      sd_.add(it.key, it.dtype, it.global_shape, it.shard, d, Device::kCuda);
    }
    if (!s_.synchronize().ok()) die("device synchronize failed");
  }
  ~DeviceState() {
    for (auto& b : bufs_) s_.free_device(b.device);
  }
  StateDict& state() { return sd_; }
  uint64_t bytes() const {
    uint64_t n = 0;
    for (auto& b : bufs_) n += b.bytes;
    return n;
  }

 private:
  struct Buf {
    void* device;
    void* host;
    size_t bytes;
  };
  device::Staging& s_;
  StateDict sd_;
  std::vector<Buf> bufs_;
};

template <class T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) {}
  T* allocate(size_t n) {
    void* p = std::aligned_alloc(4096, (n * sizeof(T) + 4095) / 4096 * 4096);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const {
    return true;
  }
};

struct Layout {
  int tp = 1, pp = 1, dp = 1;
  bool zero = false;
  std::string tag() const {
    return "tp" + std::to_string(tp) + ".pp" + std::to_string(pp) + ".dp" + std::to_string(dp) + (zero ? ".zero" : "");
  }
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  set_tool("h5ckpt-bench");

  CLI::App app{"h5ckpt-bench: h5ckpt save/load against raw write/read and memcpy floors, one run"};
  Layout save_l, load_l;
  workload::ModelConfig model;
  model.layers = 6;
  model.hidden = 1024;
  model.heads = 8;
  model.kv_heads = 4;
  model.ffn = 4096;
  model.vocab = 16384;
  std::string dir = "h5ckpt-bench-data";
  int repeats = 3;
  int read_rounds = 3;
  bool no_prewarm = false, no_drop = false, keep = false;
  uint64_t staging = 0;
  std::string memory_bytes;
  std::string config_file, device_kind = "none", auth_key_file;
  app.add_option("--tp", save_l.tp, "save layout: tensor parallel size");
  app.add_option("--pp", save_l.pp, "save layout: pipeline parallel size");
  app.add_option("--dp", save_l.dp, "save layout: data parallel size (default: world / (tp*pp))");
  app.add_flag("--zero", save_l.zero, "save layout: distributed optimizer (ZeRO)");
  app.add_option("--load-tp", load_l.tp, "resharding load layout: TP (default: a different layout)");
  app.add_option("--load-pp", load_l.pp, "resharding load layout: PP");
  app.add_option("--load-dp", load_l.dp, "resharding load layout: DP");
  app.add_option("--layers", model.layers, "model layers")->capture_default_str();
  app.add_option("--hidden", model.hidden, "hidden size")->capture_default_str();
  app.add_option("--ffn", model.ffn, "FFN size")->capture_default_str();
  app.add_option("--vocab", model.vocab, "vocabulary")->capture_default_str();
  app.add_option("--dir", dir, "storage directory for the benchmark files")->capture_default_str();
  app.add_option("--repeats", repeats, "runs of every scenario (medians are reported)")->capture_default_str();
  app.add_option("--staging-bytes", staging, "staging pool bound for save_async (0: whole state)");
  app.add_option("--memory-bytes", memory_bytes,
                 "memory budget of the library (checkpointer.memory_bytes), e.g. 64MiB or 'eighth' (1/8 of this "
                 "rank's saved bytes); default: as configured");
  app.add_option("--read-rounds", read_rounds, "cold read floors and loads measured this many times per repeat")
      ->capture_default_str();
  app.add_flag("--no-prewarm", no_prewarm, "do not re-touch buffers before each timed phase");
  app.add_flag("--no-drop-caches", no_drop, "do not drop the page cache before reads (needs root)");
  app.add_flag("--keep", keep, "keep the files written");
  app.add_option("--device", device_kind,
                 "also save from and load into device memory: cuda (needs a GPU) or simulated (the CPU stand-in; "
                 "exercises the path, its times mean nothing)")
      ->check(CLI::IsMember({"none", "cuda", "simulated"}));
  app.add_option("--auth-key-file", auth_key_file,
                 "authenticate every save and load with this key (also checkpointer.auth_key_file / "
                 "$H5CKPT_AUTH_KEY_FILE): load_verified_over_unverified is then the cost of keyed MACs");
  app.add_option("--config", config_file, "h5ckpt configuration file (also $H5CKPT_CONFIG and H5CKPT_* variables)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = g_rank == 0 ? app.exit(e) : (e.get_exit_code() ? 1 : 0);
    MPI_Finalize();
    return rc;
  }
  if (save_l.dp == 1 && save_l.tp * save_l.pp != g_size) save_l.dp = g_size / (save_l.tp * save_l.pp);
  if (load_l.tp * load_l.pp * load_l.dp != g_size) {
    // Default resharding target: swap TP and DP (and keep PP), with the optimizer layout flipped.
    // When the model cannot take the swapped TP (TP must divide the KV heads), the largest other
    // TP it can take.
    auto valid = [&](const Layout& l) {
      workload::TrainConfig cfg;
      cfg.model = model;
      cfg.sizes = ParallelSizes{l.tp, l.dp, l.pp};
      return cfg.validate(g_size).ok();
    };
    load_l = Layout{save_l.dp, save_l.pp, save_l.tp, !save_l.zero};
    const int tp_pp = g_size / save_l.pp;
    for (int tp = tp_pp; !valid(load_l) && tp >= 1; --tp)
      if (tp != save_l.tp && tp_pp % tp == 0) load_l = Layout{tp, save_l.pp, tp_pp / tp, !save_l.zero};
    if (load_l.tp == save_l.tp) load_l.zero = !save_l.zero;
  }

  if (device_kind == "simulated") device::set_staging_for_testing(device::make_simulated_staging(0));
  if (device_kind != "none" && !device::staging().has_device())
    die("--device " + device_kind + ": no GPU runtime here (staging '" + device::staging().name() + "')");

  auto make = [&](const Layout& l) {
    workload::TrainConfig cfg;
    cfg.model = model;
    cfg.sizes = ParallelSizes{l.tp, l.dp, l.pp};
    cfg.zero = l.zero;
    if (Status st = cfg.validate(g_size); !st.ok()) die("layout " + l.tag() + ": " + st.to_string());
    return cfg;
  };
  const auto save_cfg = make(save_l), load_cfg = make(load_l);
  Topology save_topo = check(Topology::create(MPI_COMM_WORLD, save_cfg.sizes), "topology");
  Topology load_topo = check(Topology::create(MPI_COMM_WORLD, load_cfg.sizes), "topology");
  workload::Workload state_w(save_cfg, save_topo);    // what is saved
  workload::Workload same_w(save_cfg, save_topo);     // loaded into, same layout
  workload::Workload reshard_w(load_cfg, load_topo);  // loaded into, another layout
  StateDict save_sd;
  state_w.stage_save(save_sd);

  const Config config = check(resolve_config(config_file), "configuration");
  CheckpointerOptions copts = config.checkpointer;
  if (!auth_key_file.empty()) copts.auth_key_file = auth_key_file;
  if (staging) copts.staging_bytes = staging;
  copts.metrics = false;           // the benchmark reports its own figures
  if (memory_bytes == "eighth") {  // 1/8 of the largest rank's share of the unique bytes
    StateDict probe;
    state_w.stage_save(probe);
    uint64_t mine = 0;
    for (const auto& it : probe.items()) mine += static_cast<uint64_t>(it.shard.numel()) * dtype_size(it.dtype);
    uint64_t most = 0;
    MPI_Allreduce(&mine, &most, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    copts.memory_bytes = std::max<uint64_t>(most / 8, 1024);
  } else if (!memory_bytes.empty()) {
    copts.memory_bytes = check(parse_byte_size(memory_bytes), "--memory-bytes");
  }
  Checkpointer ck(save_topo, copts), ck_reshard(load_topo, copts);
  // Per phase, the largest {library peak, RSS growth} seen on this rank (MiB).
  std::map<std::string, std::pair<double, double>> mem;
  auto note = [&mem](const std::string& phase, const PhaseMemory& pm) {
    const auto [lib, rss] = pm.end();
    auto& m = mem[phase];
    m.first = std::max(m.first, lib);
    m.second = std::max(m.second, rss);
  };

  if (g_rank == 0) fs::create_directories(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string raw_file = dir + "/raw-rank" + std::to_string(g_rank) + ".bin";
  // One node-level stream: all ranks of a node append to one file in turn.
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &node);
  int node_rank = 0, node_size = 1, node_id = 0;
  MPI_Comm_rank(node, &node_rank);
  MPI_Comm_size(node, &node_size);
  // The multi-threaded copy floor uses as many threads as the snapshot would (snapshot_threads,
  // or the node's hardware threads shared by its ranks, at most 8).
  const int copy_threads =
      copts.snapshot_threads > 0
          ? copts.snapshot_threads
          : std::min(8, std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / node_size));
  {
    int leader = node_rank == 0 ? g_rank : 0;
    MPI_Bcast(&leader, 1, MPI_INT, 0, node);
    node_id = leader;
  }
  const std::string stream_file = dir + "/raw-node" + std::to_string(node_id) + ".bin";
  // One file for the whole job, each rank writing its bytes into its own block-aligned range at
  // once: the I/O pattern of a one-file checkpoint without anything else of a save. Where a file
  // lives on one server (GlusterFS distribute, Lustre stripe count 1) and the per-rank files
  // spread over several, the two floors differ by the servers' count.
  const std::string shared_file = dir + "/raw-shared.bin";

  // Warm-up (untimed): plans the save, allocates and touches the staging pool, and tells each
  // rank how many unique bytes it writes, which the raw floors then write too.
  auto first = check(ck.save(save_sd, dir + "/warm", config.save), "first save");
  const double plan_first = max_all(first.plan_s);
  const uint64_t my_bytes = first.bytes_written;
  const double most_bytes = max_all(static_cast<double>(my_bytes));  // the checksum rates' bytes
  const uint64_t total_bytes = first.bytes_total;
  auto warm_async = check(ck.save_async(save_sd, dir + "/warm-async", config.save), "warm-up save_async");
  check(warm_async.wait(), "warm-up save_async");
  // Page-aligned (the O_DIRECT floor writes straight from it).
  std::vector<char, AlignedAllocator<char>> raw(my_bytes ? my_bytes : 1, 1), copy(my_bytes ? my_bytes : 1, 0);
  std::vector<char> scratch;  // the untimed page-cache warm-up reads and the checkpoint read floor
  uint64_t node_offset = 0, shared_offset = 0, shared_bytes = 0;  // the one-file floor's range, its file
  {
    uint64_t padded = (my_bytes + 4095) / 4096 * 4096;
    MPI_Exscan(&padded, &shared_offset, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0) shared_offset = 0;
    MPI_Allreduce(&padded, &shared_bytes, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  }
  {
    uint64_t mine = my_bytes;
    MPI_Exscan(&mine, &node_offset, 1, MPI_UINT64_T, MPI_SUM, node);
    if (node_rank == 0) node_offset = 0;
  }

  std::map<std::string, std::vector<double>> t;
  std::vector<double> plan_cached;
  bool cold = true;
  int step = 0;
  auto remove = [&](const std::string& p) {
    if (g_rank == 0) fs::remove_all(p);
    MPI_Barrier(MPI_COMM_WORLD);
  };
  // Per load kind, each sample's LoadReport split (load_phases below).
  std::map<std::string, std::vector<std::array<double, kPhaseFields>>> phases;
  int verify_threads = 0, io_threads = 0;
  for (int rep = 0; rep < repeats; ++rep) {
    // --- write floors --------------------------------------------------------------------
    if (!no_prewarm) prewarm(raw);
    t["raw_write_rank_s"].push_back(timed([&] {
      int fd = ::open(raw_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0) die("cannot create " + raw_file);
      write_all(fd, raw.data(), my_bytes);
      ::fsync(fd);
      ::close(fd);
    }));
    // The same bytes with O_DIRECT from block-aligned memory (the better way on some storage;
    // h5ckpt writes long runs this way by default).
    if (!no_prewarm) prewarm(raw);
    t["raw_write_direct_s"].push_back(
        timed([&] { write_direct(raw_file, O_WRONLY | O_CREAT | O_TRUNC, raw.data(), my_bytes, 0, SIZE_MAX); }));
    if (g_rank == 0) {  // created and allocated outside the timing, as a save's file is
      const int fd = ::open(shared_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0) die("cannot create " + shared_file);
      (void)::posix_fallocate(fd, 0, static_cast<off_t>(shared_bytes));  // where the file system has it
      ::close(fd);
    }
    if (!no_prewarm) prewarm(raw);
    t["raw_write_shared_s"].push_back(
        timed([&] { write_direct(shared_file, O_WRONLY, raw.data(), my_bytes, shared_offset, 8u << 20); }));
    if (!no_prewarm) prewarm(raw);
    t["raw_write_stream_s"].push_back(timed([&] {
      // Token passing in node-rank order keeps the file a single sequential stream.
      if (node_rank > 0) MPI_Recv(nullptr, 0, MPI_BYTE, node_rank - 1, 7, node, MPI_STATUS_IGNORE);
      int fd = ::open(stream_file.c_str(), O_WRONLY | O_CREAT | (node_rank == 0 ? O_TRUNC : 0), 0644);
      if (fd < 0) die("cannot open " + stream_file);
      ::lseek(fd, static_cast<off_t>(node_offset), SEEK_SET);
      write_all(fd, raw.data(), my_bytes);
      if (node_rank == node_size - 1) ::fsync(fd);
      ::close(fd);
      if (node_rank + 1 < node_size) MPI_Send(nullptr, 0, MPI_BYTE, node_rank + 1, 7, node);
    }));
    if (!no_prewarm) {
      prewarm(raw);
      prewarm(copy);
    }
    t["memcpy_s"].push_back(timed([&] { std::memcpy(copy.data(), raw.data(), my_bytes); }));
    // The same bytes copied by copy_threads threads, each one contiguous slice (threads started
    // inside the timing, as a snapshot's copiers are woken inside its blocking time).
    if (!no_prewarm) {
      prewarm(raw);
      prewarm(copy);
    }
    t["memcpy_parallel_s"].push_back(timed([&] {
      std::vector<std::thread> copiers;
      const uint64_t per = (my_bytes + copy_threads - 1) / copy_threads;
      for (int i = 0; i < copy_threads; ++i) {
        const uint64_t b = std::min<uint64_t>(my_bytes, per * i), e = std::min<uint64_t>(my_bytes, b + per);
        copiers.emplace_back([&, b, e] { std::memcpy(copy.data() + b, raw.data() + b, e - b); });
      }
      for (auto& c : copiers) c.join();
    }));
    // The block sums of the same bytes on one thread, as a save computes them and a verified load
    // checks them (1 MiB blocks; the keyed MAC when authenticated), and the same with libxxhash's
    // plain entry point, which is built for baseline x86-64: what the sums cost without xxHash's
    // run-time dispatch to the CPU's vector unit.
    volatile uint64_t sink = 0;
    auto library_sum = [](uint64_t b, const char* p, uint64_t n) { return storage::block_checksum(7, b, p, n); };
    auto plain_sum = [](uint64_t b, const char* p, uint64_t n) {
      return XXH3_64bits_withSeed(p, n, storage::block_seed(7, b));
    };
    auto time_sums = [&](const char* field, auto sum) {
      if (!no_prewarm) prewarm(raw);
      t[field].push_back(timed([&] {
        for (uint64_t at = 0, b = 0; at < my_bytes; at += 1u << 20, ++b)
          sink = sink + sum(b, raw.data() + at, std::min<uint64_t>(1u << 20, my_bytes - at));
      }));
    };
    // The same two on one block already in cache (as when the sums follow the copy that brought
    // the bytes in): the hash's own speed, without memory's.
    const uint64_t hot = std::min<uint64_t>(1u << 20, my_bytes);
    auto time_cached = [&](const char* field, auto sum) {
      t[field].push_back(timed([&] {
        for (uint64_t b = 0; b < 256; ++b) sink = sink + sum(b, raw.data(), hot);
      }));
    };
    time_sums("checksum_s", library_sum);
    time_sums("checksum_plain_s", plain_sum);
    time_cached("checksum_cached_s", library_sum);
    time_cached("checksum_plain_cached_s", plain_sum);

    // --- h5ckpt saves ---------------------------------------------------------------------
    const std::string sync_path = dir + "/sync-" + std::to_string(rep);
    if (!no_prewarm) prewarm(save_sd);
    double plan = 0;
    PhaseMemory pm;
    pm.start(ck);
    t["sync_save_s"].push_back(timed([&] {
      auto r = check(ck.save(save_sd, sync_path, config.save), "save");
      plan = r.plan_s;
    }));
    note("save", pm);
    plan_cached.push_back(max_all(plan));
    const std::string async_path = dir + "/async-" + std::to_string(rep);
    SaveHandle h;
    if (!no_prewarm) {
      prewarm(save_sd);
      ck.touch_staging();  // the pool the snapshot copies into, as the memcpy floor's buffers
    }
    pm.start(ck);
    MPI_Barrier(MPI_COMM_WORLD);
    const double a0 = now_s();
    h = check(ck.save_async(save_sd, async_path, config.save), "save_async");
    const double blocked = now_s() - a0;
    check(h.wait(), "save_async wait");
    const double total = now_s() - a0;
    note("async", pm);
    t["async_block_s"].push_back(max_all(blocked));
    t["async_total_s"].push_back(max_all(total));
    ++step;

    // --- read floors and loads (cold cache) -----------------------------------------------
    // Every timed read starts with the page cache dropped. On this VM the page cache's memory
    // must be warm as well: pages the guest has not used for a few seconds are handed back to
    // the host, and a read into them costs ~1.7 s/GiB of kernel time instead of ~0.1 s. So each
    // phase first reads its file once (untimed), which leaves recently used pages behind when
    // the cache is dropped, the page-cache counterpart of prewarm().
    auto cold_start = [&](const std::string& file, uint64_t begin, uint64_t end) {
      if (!no_prewarm) read_range(file, begin, end, scratch);
      cold = drop_caches(!no_drop) && cold;
    };
    const std::string sync_data = sync_path + "/data.h5", async_data = async_path + "/data.h5";
    const uint64_t sync_size = fs::file_size(sync_data), async_size = fs::file_size(async_data);
    // This rank's contiguous 1/N share of a file of `size` bytes (the last rank takes the rest).
    auto my_share = [&](uint64_t size) {
      const uint64_t per = size / static_cast<uint64_t>(g_size);
      return std::pair<uint64_t, uint64_t>{per * g_rank, g_rank + 1 == g_size ? size : per * (g_rank + 1)};
    };
    const auto [ck_begin, ck_end] = my_share(sync_size);
    const auto [async_begin, async_end] = my_share(async_size);
    StateDict same_sd, reshard_sd;
    auto info = check(read_checkpoint_info(sync_path), "reading metadata");
    if (Status st = same_w.stage_load(same_sd, info); !st.ok()) die(st.to_string());
    if (Status st = reshard_w.stage_load(reshard_sd, info); !st.ok()) die(st.to_string());
    if (!no_prewarm) {
      // Touch the load destinations (the workloads' buffers) with an untimed load of another
      // checkpoint: its plan is not reused by the timed loads (different metadata).
      check(ck.load(same_sd, dir + "/warm", config.load), "prewarm load");
      check(ck_reshard.load(reshard_sd, dir + "/warm", config.load), "prewarm load");
    }
    LoadOptions plain = config.load;
    plain.zero_redundancy = false;
    LoadOptions aggregated = config.load;
    aggregated.aggregate_reads = true;
    LoadOptions unverified = config.load;  // what every load was before verification blocks
    unverified.verify = false;
    uint64_t read_bytes = 0;
    // The four loads the ratios compare (verified and unverified, same layout and resharding)
    // each run on a Checkpointer made for it outside the timing, so each plans as a job's one
    // load at its start does: on a reused one, a load after another with the same options (the
    // unverified after the verified) found its plan cached and skipped 2-11 ms of planning that
    // the other paid. The other loads' options differ from their neighbours', so they plan too.
    std::optional<Checkpointer> once;
    auto fresh = [&](const Topology& topo) -> Checkpointer& {
      once.reset();
      return once.emplace(topo, copts);
    };
    // Cold reads vary most on this VM, so each repeat measures them in several interleaved
    // rounds: floors and loads alternate and see the same conditions.
    for (int round = 0; round < read_rounds; ++round) {
      cold_start(raw_file, 0, my_bytes);
      if (!no_prewarm) prewarm(copy);
      t["raw_read_rank_s"].push_back(timed([&] { read_range(raw_file, 0, my_bytes, copy); }));
      // The same number of bytes from the checkpoint's own data file: each rank one contiguous
      // share with one read.
      cold_start(sync_data, ck_begin, ck_end);
      if (!no_prewarm) prewarm(scratch);
      t["raw_read_ckpt_s"].push_back(timed([&] { read_range(sync_data, ck_begin, ck_end, scratch); }));
      // And in 8 MiB preads, the size of a load's larger reads: on the GlusterFS volume one huge
      // pread was sometimes faster and sometimes slower than these (sixteenth session).
      cold_start(sync_data, ck_begin, ck_end);
      if (!no_prewarm) prewarm(scratch);
      t["raw_read_ckpt_chunked_s"].push_back(
          timed([&] { read_range(sync_data, ck_begin, ck_end, scratch, uint64_t{8} << 20); }));
      cold_start(sync_data, ck_begin, ck_end);
      if (!no_prewarm) prewarm(same_sd);
      LoadReport lr;
      Checkpointer& ck_load = fresh(save_topo);
      pm.start(ck_load);
      t["load_s"].push_back(timed([&] { lr = check(ck_load.load(same_sd, sync_path, config.load), "load"); }));
      note("load", pm);
      t["load_bytes_read"].push_back(static_cast<double>(sum_all(lr.bytes_read)));
      // Where the load's time goes (slowest rank in each part).
      t["load_plan_s"].push_back(max_all(lr.plan_s));
      t["load_read_s"].push_back(max_all(lr.read_s));
      t["load_exchange_s"].push_back(max_all(lr.exchange_s));
      t["load_verify_s"].push_back(max_all(lr.verify_s));
      verify_threads = lr.verify_threads;
      io_threads = lr.io_threads;
      phases["verified"].push_back(phase_fields(lr));
      // The same load without checking the verification blocks (LoadOptions::verify = false).
      cold_start(sync_data, ck_begin, ck_end);
      if (!no_prewarm) prewarm(same_sd);
      Checkpointer& ck_unverified = fresh(save_topo);
      t["load_unverified_s"].push_back(
          timed([&] { lr = check(ck_unverified.load(same_sd, sync_path, unverified), "load"); }));
      read_bytes = lr.bytes_read;
      phases["unverified"].push_back(phase_fields(lr));
      t["load_unverified_bytes_read"].push_back(static_cast<double>(sum_all(read_bytes)));
      cold_start(async_data, async_begin, async_end);
      if (!no_prewarm) prewarm(reshard_sd);
      Checkpointer& ck_reshard_unverified = fresh(load_topo);
      t["reshard_load_unverified_s"].push_back(timed([&] {
        read_bytes = check(ck_reshard_unverified.load(reshard_sd, async_path, unverified), "reshard load").bytes_read;
      }));
      // The same load with every DP replica reading for itself (zero-redundancy off).
      cold_start(sync_data, ck_begin, ck_end);
      if (!no_prewarm) prewarm(same_sd);
      t["load_no_zr_s"].push_back(
          timed([&] { read_bytes = check(ck.load(same_sd, sync_path, plain), "load").bytes_read; }));
      t["load_no_zr_bytes_read"].push_back(static_cast<double>(sum_all(read_bytes)));
      // The same load with two-phase reads (each rank reads one contiguous domain, MPI moves
      // the pieces).
      cold_start(sync_data, ck_begin, ck_end);
      if (!no_prewarm) prewarm(same_sd);
      t["load_aggregated_s"].push_back(
          timed([&] { read_bytes = check(ck.load(same_sd, sync_path, aggregated), "load").bytes_read; }));
      t["load_aggregated_bytes_read"].push_back(static_cast<double>(sum_all(read_bytes)));
      cold_start(async_data, async_begin, async_end);
      if (!no_prewarm) prewarm(reshard_sd);
      Checkpointer& ck_reshard_load = fresh(load_topo);
      pm.start(ck_reshard_load);
      t["reshard_load_s"].push_back(
          timed([&] { lr = check(ck_reshard_load.load(reshard_sd, async_path, config.load), "reshard load"); }));
      read_bytes = lr.bytes_read;
      phases["reshard"].push_back(phase_fields(lr));
      note("reshard", pm);
      t["reshard_bytes_read"].push_back(static_cast<double>(sum_all(read_bytes)));
      once.reset();
    }
    // --- device memory (--device) ----------------------------------------------------------
    if (device_kind != "none") {
      device::Staging& s = device::staging();
      DeviceState dev_save(save_sd, s), dev_load(same_sd, s);
      // Floor: one plain device-to-pinned-host copy of the bytes this rank snapshots.
      char* pinned = static_cast<char*>(s.alloc_host(my_bytes ? my_bytes : 1));
      void* dbuf = s.alloc_device(my_bytes ? my_bytes : 1);
      if (!pinned || !dbuf) die("cannot allocate the device copy floor's buffers");
      t["d2h_memcpy_s"].push_back(timed([&] {
        if (!s.copy_to_host(pinned, dbuf, my_bytes).ok() || !s.synchronize().ok()) die("device copy failed");
      }));
      s.free_device(dbuf);
      s.free_host(pinned, my_bytes ? my_bytes : 1);
      const std::string dev_path = dir + "/device-" + std::to_string(rep);
      MPI_Barrier(MPI_COMM_WORLD);
      const double d0 = now_s();
      SaveHandle dh = check(ck.save_async(dev_save.state(), dev_path, config.save), "device save_async");
      const double dblock = now_s() - d0;
      check(dh.wait(), "device save_async wait");
      t["device_async_block_s"].push_back(max_all(dblock));
      t["device_async_total_s"].push_back(max_all(now_s() - d0));
      cold_start(sync_data, ck_begin, ck_end);
      pm.start(ck);
      t["device_load_s"].push_back(
          timed([&] { check(ck.load(dev_load.state(), sync_path, config.load), "device load"); }));
      note("device_load", pm);
      t["device_load_bytes"].push_back(static_cast<double>(sum_all(dev_load.bytes())));
      remove(dev_path);
    }
    remove(sync_path);
    remove(async_path);
  }

  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  const double rss_mib = max_all(static_cast<double>(ru.ru_maxrss) / 1024.0);
  // Every rank takes part in the same reductions, in the same order (phases every rank ran).
  std::map<std::string, std::pair<double, double>> mem_max;
  for (const char* phase : {"save", "async", "load", "reshard", "device_load"}) {
    if (std::string(phase) == "device_load" && device_kind == "none") continue;
    mem_max[phase] = {max_all(mem[phase].first), max_all(mem[phase].second)};
  }

  // Where each rank's load time goes: the median of every phase over the samples, per rank.
  std::map<std::string, std::vector<double>> phase_table;  // rank 0: kind -> ranks x kPhaseFields
  for (const char* kind : {"verified", "unverified", "reshard"}) {
    std::array<double, kPhaseFields> mine{};
    for (size_t f = 0; f < mine.size(); ++f) {
      std::vector<double> v;
      for (const auto& sample : phases[kind]) v.push_back(sample[f]);
      mine[f] = median(v);
    }
    std::vector<double> all(g_rank == 0 ? kPhaseFields * static_cast<size_t>(g_size) : 0);
    MPI_Gather(mine.data(), kPhaseFields, MPI_DOUBLE, all.data(), kPhaseFields, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    phase_table[kind] = std::move(all);
  }

  if (g_rank == 0) {
    for (const auto& [kind, all] : phase_table) {
      json ranks = json::array();
      for (int r = 0; r < g_size; ++r) {
        const double* p = &all[kPhaseFields * static_cast<size_t>(r)];
        json row = {{"rank", r}};
        for (size_t f = 0; f < kPhaseFields; ++f) row[kPhaseNames[f]] = p[f];
        ranks.push_back(std::move(row));
      }
      // plan: metadata, opening the data file (open_s, part of plan_s) and the plan; read: reads,
      // of which io_s waited in pread and copy_s copied out of bounce buffers (both summed over
      // the reader threads), with the block checks and copies out of landing buffers running
      // beside them (verify_busy_s: their summed busy time, hidden inside read_s when
      // verify_threads > 0); exchange: waiting for transfers.
      std::printf(
          "%s\n",
          json{{"scenario", "load_phases"}, {"load", kind}, {"verify_threads", verify_threads}, {"per_rank", ranks}}
              .dump()
              .c_str());
    }
    const std::vector<std::string> order = {"raw_write_rank_s",
                                            "raw_write_direct_s",
                                            "raw_write_stream_s",
                                            "raw_write_shared_s",
                                            "memcpy_s",
                                            "memcpy_parallel_s",
                                            "checksum_s",
                                            "checksum_plain_s",
                                            "checksum_cached_s",
                                            "checksum_plain_cached_s",
                                            "sync_save_s",
                                            "async_block_s",
                                            "async_total_s",
                                            "raw_read_rank_s",
                                            "raw_read_ckpt_s",
                                            "raw_read_ckpt_chunked_s",
                                            "load_s",
                                            "load_no_zr_s",
                                            "load_aggregated_s",
                                            "reshard_load_s",
                                            "load_unverified_s",
                                            "reshard_load_unverified_s"};
    std::vector<std::string> printed = order;
    if (device_kind != "none")
      for (const char* k : {"d2h_memcpy_s", "device_async_block_s", "device_async_total_s", "device_load_s"})
        printed.push_back(k);
    for (const auto& k : printed) {
      json line{{"scenario", k.substr(0, k.size() - 2)},
                {"ranks", g_size},
                {"bytes", total_bytes},
                {"median_s", median(t[k])},
                {"runs_s", t[k]}};
      std::printf("%s\n", line.dump().c_str());
    }
    auto m = [&](const char* k) { return median(t[k]); };
    const double raw_write = std::min({m("raw_write_rank_s"), m("raw_write_stream_s"), m("raw_write_direct_s")});
    const double raw_read = std::min({m("raw_read_rank_s"), m("raw_read_ckpt_s"), m("raw_read_ckpt_chunked_s")});
    json s;
    s["scenario"] = "summary";
    s["ranks"] = g_size;
    s["bytes"] = total_bytes;
    s["save_layout"] = save_l.tag();
    s["reshard_layout"] = load_l.tag();
    s["repeats"] = repeats;
    s["cold_reads"] = cold;
    for (const auto& k : printed) s[k] = m(k.c_str());
    s["raw_write_s"] = raw_write;
    s["raw_read_s"] = raw_read;
    s["plan_s"] = plan_first;
    s["plan_cached_s"] = median(plan_cached);
    s["load_bytes_read"] = m("load_bytes_read");
    s["reshard_bytes_read"] = m("reshard_bytes_read");
    s["load_no_zr_bytes_read"] = m("load_no_zr_bytes_read");
    s["load_aggregated_bytes_read"] = m("load_aggregated_bytes_read");
    for (const char* k : {"load_plan_s", "load_read_s", "load_exchange_s", "load_verify_s"}) s[k] = m(k);
    s["verify_threads"] = verify_threads;
    s["io_threads"] = io_threads;
    s["memcpy_threads"] = copy_threads;
    s["zr_read_bytes_saved"] = 1.0 - m("load_bytes_read") / m("load_no_zr_bytes_read");
    s["peak_rss_mib"] = rss_mib;
    // Memory per phase (issue target: overhead <= memory_budget_mib + 64 in every phase when a
    // budget is set): the larger of the library's allocation peak and the RSS growth, max over
    // ranks; both parts are printed too.
    s["memory_budget_mib"] = static_cast<double>(copts.memory_bytes) / (1024.0 * 1024.0);
    for (const auto& [phase, v] : mem_max) {
      s[phase + "_overhead_mib"] = std::max(v.first, v.second);
      s[phase + "_library_peak_mib"] = v.first;
      s[phase + "_rss_growth_mib"] = v.second;
    }
    s["sync_save_over_raw_write"] = m("sync_save_s") / raw_write;
    // Against the same bytes written to one shared file: what is left is the save's own cost.
    s["sync_save_over_raw_write_shared"] = m("sync_save_s") / m("raw_write_shared_s");
    s["async_block_over_memcpy"] = m("async_block_s") / m("memcpy_s");
    s["async_block_over_memcpy_parallel"] = m("async_block_s") / m("memcpy_parallel_s");
    s["async_block_over_sync_save"] = m("async_block_s") / m("sync_save_s");
    // What one thread hashes from memory (the largest rank's bytes over the slowest rank's time),
    // with the dispatch and without it.
    s["checksum_gb_per_s"] = most_bytes / m("checksum_s") / 1e9;
    s["checksum_plain_gb_per_s"] = most_bytes / m("checksum_plain_s") / 1e9;
    s["checksum_over_memcpy"] = m("checksum_s") / m("memcpy_s");
    const double hot_bytes = 256.0 * std::min(most_bytes, 1048576.0);
    s["checksum_cached_gb_per_s"] = hot_bytes / m("checksum_cached_s") / 1e9;
    s["checksum_plain_cached_gb_per_s"] = hot_bytes / m("checksum_plain_cached_s") / 1e9;
    s["load_over_raw_read"] = m("load_s") / raw_read;
    s["load_aggregated_over_raw_read"] = m("load_aggregated_s") / raw_read;
    s["reshard_load_over_load"] = m("reshard_load_s") / m("load_s");
    // Verification's cost (issue target: <= 1.10): verified over unverified, same layout and resharded.
    s["load_verified_over_unverified"] = m("load_s") / m("load_unverified_s");
    s["authenticated"] = !copts.auth_key_file.empty();
    s["reshard_verified_over_unverified"] = m("reshard_load_s") / m("reshard_load_unverified_s");
    s["load_bytes_read_verified_over_unverified"] = m("load_bytes_read") / m("load_unverified_bytes_read");
    if (device_kind != "none") {
      s["device"] = device_kind;
      s["device_async_block_over_d2h_memcpy"] = m("device_async_block_s") / m("d2h_memcpy_s");
      s["device_load_over_load"] = m("device_load_s") / m("load_s");
      s["device_load_gb_per_s"] = m("device_load_bytes") / m("device_load_s") / 1e9;
    }
    std::printf("%s\n", s.dump().c_str());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (!keep && g_rank == 0) fs::remove_all(dir);
  MPI_Comm_free(&node);
  MPI_Finalize();
  return 0;
}
