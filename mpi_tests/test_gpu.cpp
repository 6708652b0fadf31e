// On a real GPU (label gpu): saves from and loads into CUDA memory at 1-4 ranks sharing the
// GPU, the ordering of a snapshot after the trainer's stream (SaveOptions::device_stream), and
// the NCCL transport (at one rank; ranks sharing one GPU are refused by NCCL). Skipped where no
// GPU is visible. scripts/gpu_check.sh builds and runs it on a lent GPU machine, including the
// NCCL set-up deadline check (NcclSetupDeadlineEndsTheJobWhenAPeerStops), which only runs there.
//
// "The trainer's work" is queued on a stream of the test's own: a host function that sleeps
// (an optimizer step still running), then a memset of intermediate bytes and a copy of the final
// values into the device buffers. Before it, the buffers hold stale bytes (0x5a). A snapshot that
// does not wait for that stream reads stale or intermediate bytes; the control test shows it does
// when it is told to wait for an unrelated stream.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <thread>

#include "comm/deadline.h"
#include "device/cuda/cuda_staging.h"
#include "device/staging.h"
#include "support/device_mirror.h"
#include "support/test_model.h"

#if __has_include(<nccl.h>)
#include <nccl.h>
#define H5CKPT_TEST_HAVE_NCCL_H 1

// Fault injection for the NCCL set-up deadline: with H5CKPT_GPU_TEST_STOP_RANK=r in the
// environment, world rank r stops itself (SIGSTOP, alive but stuck: what a launcher cannot see)
// just before it would create its NCCL communicator. The library's calls resolve to this
// definition (the test binary links the library statically); everything else goes to NCCL.
extern "C" ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                               ncclConfig_t* config) {
  using Fn = ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "ncclCommInitRankConfig"));
  if (const char* stop = std::getenv("H5CKPT_GPU_TEST_STOP_RANK")) {
    int me = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (std::atoi(stop) == me) {
      std::fprintf(stderr, "[rank %d] stopping itself (SIGSTOP) before ncclCommInitRankConfig\n", me);
      std::raise(SIGSTOP);
    }
  }
  if (!real) return ncclSystemError;
  return real(comm, nranks, id, rank, config);
}
#endif

using namespace h5ckpt;
using h5ckpt::testing::DeviceMirror;
using h5ckpt::testing::Layout;
using h5ckpt::testing::TestModel;
using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

bool everything(const std::string&) { return true; }

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

// A stream of the test's own (the trainer's compute stream, or some other work on the device).
class Stream {
 public:
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() {
    cudaStreamSynchronize(s_);
    cudaStreamDestroy(s_);
  }
  operator cudaStream_t() const { return s_; }
  bool idle() const { return cudaStreamQuery(s_) == cudaSuccess; }

 private:
  cudaStream_t s_ = nullptr;
};

void CUDART_CB sleep_on_stream(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<const int*>(ms)));
}

// One device buffer of a state and, in pinned memory, the values it must end up holding.
struct Final {
  void* dev = nullptr;
  void* host = nullptr;  // the host state's buffer (where TestModel checks values)
  void* pinned = nullptr;
  size_t bytes = 0;
};

// Pairs the device state's buffers with the host state's (same items, same order: DeviceMirror).
class Finals {
 public:
  Finals(StateDict& host, StateDict& dev) {
    for (size_t i = 0; i < host.items().size(); ++i) {
      const StateItem& h = host.items()[i];
      const size_t bytes = static_cast<size_t>(h.shard.numel()) * dtype_size(h.dtype);
      if (bytes == 0 || dev.items()[i].data == h.data) continue;
      Final f{dev.items()[i].data, h.data, nullptr, bytes};
      EXPECT_EQ(cudaMallocHost(&f.pinned, bytes), cudaSuccess);
      std::memcpy(f.pinned, h.data, bytes);
      all_.push_back(f);
    }
  }
  ~Finals() {
    for (auto& f : all_) cudaFreeHost(f.pinned);
  }
  const std::vector<Final>& all() const { return all_; }

  // Stale bytes in every device buffer, synchronously (the state before the step).
  void make_stale() const {
    for (auto& f : all_) CUDA_OK(cudaMemset(f.dev, 0x5a, f.bytes));
    CUDA_OK(cudaDeviceSynchronize());
  }
  // Stale bytes queued on `s`, not waited for.
  void queue_stale(cudaStream_t s) const {
    for (auto& f : all_) CUDA_OK(cudaMemsetAsync(f.dev, 0x5a, f.bytes, s));
  }
  // Queues the rest of an optimizer step on `s`: `*delay_ms` of work, intermediate bytes, then
  // the final values. Nothing waits for it here.
  void queue_step(cudaStream_t s, const int* delay_ms) const {
    if (delay_ms) {
      CUDA_OK(cudaLaunchHostFunc(s, sleep_on_stream, const_cast<int*>(delay_ms)));
    }
    for (auto& f : all_) {
      CUDA_OK(cudaMemsetAsync(f.dev, 0xa5, f.bytes, s));
      CUDA_OK(cudaMemcpyAsync(f.dev, f.pinned, f.bytes, cudaMemcpyHostToDevice, s));
    }
  }
  // The device bytes, read on a stream of their own (not the library's staging stream, so
  // nothing the library left queued there is waited for), into the host buffers.
  void read_back_into_host() const {
    Stream reader;
    for (auto& f : all_) CUDA_OK(cudaMemcpyAsync(f.host, f.dev, f.bytes, cudaMemcpyDeviceToHost, reader));
    CUDA_OK(cudaStreamSynchronize(reader));
  }
  // Poison in every device buffer, synchronously.
  void poison() const { make_stale(); }

 private:
  std::vector<Final> all_;
};

cudaStream_t staging_stream() {
  auto* cs = dynamic_cast<device::cuda::CudaStaging*>(&device::staging());
  return cs ? cs->stream() : nullptr;
}

Layout layout_for(int n) { return Layout{n % 2 == 0 ? 2 : 1, n % 2 == 0 ? n / 2 : n, 1, true}; }

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(device::staging().name()) != "cuda") GTEST_SKIP() << "no GPU visible";
    root_ = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "gpu");
    ASSERT_FALSE(root_.empty());
  }
  void TearDown() override {
    if (root_.empty()) return;
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) fs::remove_all(root_);
  }
  // Loads `path` into fresh host buffers under layout L and counts wrong elements (all ranks).
  int64_t mismatches_in(const Topology& topo, const Layout& L, const std::string& path, std::string* first) {
    TestModel back(L, topo.coords(), false);
    Checkpointer ck(topo);
    auto r = ck.load(back.state(), path);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return static_cast<int64_t>(h5ckpt::testing::sum_all(static_cast<uint64_t>(back.count_mismatches(first))));
  }
  std::string root_;
};

TEST_F(Gpu, Environment) {
  if (world_rank() != 0) return;
  int driver = 0, runtime = 0, dev = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  cudaGetDevice(&dev);
  cudaDeviceProp p{};
  cudaGetDeviceProperties(&p, dev);
  int nccl = 0;
#ifdef H5CKPT_TEST_HAVE_NCCL_H
  ncclGetVersion(&nccl);
#endif
  std::printf("[env] device %d: %s, driver %d, runtime %d, NCCL %d, %d ranks\n", dev, p.name, driver, runtime, nccl,
              world_size());
}

TEST_F(Gpu, SaveFromDeviceAndLoadBackResharded) {
  const int n = world_size();
  const Layout L = layout_for(n);
  auto topo = Topology::create(MPI_COMM_WORLD, {L.tp, L.dp, L.pp});
  ASSERT_TRUE(topo.ok());
  TestModel model(L, topo->coords(), true);
  {
    DeviceMirror mirror(model.state(), everything, false);  // detected with cudaPointerGetAttributes
    Checkpointer ck(*topo);
    auto h = ck.save_async(mirror.state(), root_ + "/dev");
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    mirror.scribble();
    auto r = h->wait();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_TRUE(ck.save(model.state(), root_ + "/host").ok());
    std::string why;
    EXPECT_TRUE(h5ckpt::testing::same_datasets(root_ + "/dev", root_ + "/host", &why)) << why;
  }
  // Load into device memory under pure DP (replicas: NCCL where it can start, else MPI).
  auto dp = Topology::create(MPI_COMM_WORLD, {1, n, 1});
  ASSERT_TRUE(dp.ok());
  TestModel loaded(Layout{1, n, 1, false}, dp->coords(), false);
  DeviceMirror mirror(loaded.state(), everything, true);
  Finals bufs(loaded.state(), mirror.state());
  bufs.poison();
  Checkpointer ck(*dp);
  auto r = ck.load(mirror.state(), root_ + "/dev");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // Complete when load returns: nothing left on the staging stream, and a reader on another
  // stream sees the loaded values.
  EXPECT_EQ(cudaStreamQuery(staging_stream()), cudaSuccess);
  bufs.read_back_into_host();
  std::string first;
  EXPECT_EQ(loaded.count_mismatches(&first), 0) << first << " (transport " << r->transport << ")";
}

// SaveOptions::device_stream: the snapshot waits for the work queued on that stream, in sync and
// async saves; without it, the library synchronizes the device. Element by element.
TEST_F(Gpu, SnapshotWaitsForTheTrainersStream) {
  int level = 0;
  MPI_Query_thread(&level);
  const Layout L = layout_for(world_size());
  auto topo = Topology::create(MPI_COMM_WORLD, {L.tp, L.dp, L.pp});
  ASSERT_TRUE(topo.ok());
  TestModel model(L, topo->coords(), true);  // the final values
  DeviceMirror mirror(model.state(), everything, false);
  Finals step(model.state(), mirror.state());
  ASSERT_FALSE(step.all().empty());
  Stream trainer;
  Checkpointer ck(*topo);
  static const int kStepMs = 500;
  for (bool async : {false, true}) {
    if (async && level < MPI_THREAD_MULTIPLE) continue;
    for (bool given : {true, false}) {
      const std::string path = root_ + (async ? "/async" : "/sync") + (given ? "_stream" : "_device");
      SCOPED_TRACE(path);
      ASSERT_NO_FATAL_FAILURE(step.make_stale());
      MPI_Barrier(MPI_COMM_WORLD);
      ASSERT_NO_FATAL_FAILURE(step.queue_step(trainer, &kStepMs));  // not synchronized
      SaveOptions o;
      o.device_stream = given ? static_cast<void*>(static_cast<cudaStream_t>(trainer)) : nullptr;
      const auto t0 = Clock::now();
      if (async) {
        auto h = ck.save_async(mirror.state(), path, o);
        ASSERT_TRUE(h.ok()) << h.status().to_string();
        const double returned = since(t0);
        EXPECT_TRUE(trainer.idle()) << "save_async returned before the step it was ordered after";
        EXPECT_GE(returned, kStepMs / 1000.0 * 0.8) << "the snapshot did not wait for the step";
        step.make_stale();  // the trainer's next step: the snapshot must not see it
        auto r = h->wait();
        ASSERT_TRUE(r.ok()) << r.status().to_string();
      } else {
        auto r = ck.save(mirror.state(), path, o);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        EXPECT_TRUE(trainer.idle()) << "save returned before the step it was ordered after";
        EXPECT_GE(since(t0), kStepMs / 1000.0 * 0.8) << "the snapshot did not wait for the step";
      }
      CUDA_OK(cudaStreamSynchronize(trainer));
      std::string first;
      EXPECT_EQ(mismatches_in(*topo, L, path, &first), 0) << first;
    }
  }
}

// Control: the test above can fail. Told to wait for an idle, unrelated stream, a save snapshots
// while the step is still running, and the checkpoint holds stale bytes.
TEST_F(Gpu, ControlAnUnrelatedStreamDoesNotOrderTheSnapshot) {
  const Layout L = layout_for(world_size());
  auto topo = Topology::create(MPI_COMM_WORLD, {L.tp, L.dp, L.pp});
  ASSERT_TRUE(topo.ok());
  TestModel model(L, topo->coords(), true);
  DeviceMirror mirror(model.state(), everything, false);
  Finals step(model.state(), mirror.state());
  Stream trainer, unrelated;
  Checkpointer ck(*topo);
  ASSERT_TRUE(ck.save(mirror.state(), root_ + "/warm").ok());  // staging memory allocated
  static const int kLongStepMs = 3000;
  ASSERT_NO_FATAL_FAILURE(step.make_stale());
  MPI_Barrier(MPI_COMM_WORLD);
  ASSERT_NO_FATAL_FAILURE(step.queue_step(trainer, &kLongStepMs));
  SaveOptions o;
  o.device_stream = static_cast<cudaStream_t>(unrelated);
  auto r = ck.save(mirror.state(), root_ + "/early", o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const bool step_running = !trainer.idle();
  CUDA_OK(cudaStreamSynchronize(trainer));
  if (h5ckpt::testing::sum_all(step_running ? 0 : 1) != 0) GTEST_SKIP() << "the save outlasted the 3 s step";
  std::string first;
  EXPECT_GT(mismatches_in(*topo, L, root_ + "/early", &first), 0) << "the snapshot saw the step's values";
}

// With device_stream, other streams' work is not waited for (no device-wide synchronization);
// without it, it is (the documented default).
TEST_F(Gpu, DeviceStreamDoesNotWaitForOtherStreamsButNoStreamSynchronizesTheDevice) {
  int level = 0;
  MPI_Query_thread(&level);
  const Layout L = layout_for(world_size());
  auto topo = Topology::create(MPI_COMM_WORLD, {L.tp, L.dp, L.pp});
  ASSERT_TRUE(topo.ok());
  TestModel model(L, topo->coords(), true);
  DeviceMirror mirror(model.state(), everything, false);
  Finals step(model.state(), mirror.state());
  Stream trainer, other;
  Checkpointer ck(*topo);
  // Staging memory allocated before anything is timed (pinned allocations may synchronize).
  ASSERT_TRUE(ck.save(mirror.state(), root_ + "/warm").ok());
  if (level >= MPI_THREAD_MULTIPLE) {
    auto h = ck.save_async(mirror.state(), root_ + "/warm_async");
    ASSERT_TRUE(h.ok() && h->wait().ok());
  }
  static const int kOtherMs = 4000;
  for (bool async : {false, true}) {
    if (async && level < MPI_THREAD_MULTIPLE) continue;
    SCOPED_TRACE(async ? "save_async" : "save");
    ASSERT_NO_FATAL_FAILURE(step.make_stale());
    MPI_Barrier(MPI_COMM_WORLD);
    CUDA_OK(cudaLaunchHostFunc(other, sleep_on_stream, const_cast<int*>(&kOtherMs)));  // e.g. a prefetch
    ASSERT_NO_FATAL_FAILURE(step.queue_step(trainer, nullptr));
    SaveOptions o;
    o.device_stream = static_cast<cudaStream_t>(trainer);
    const std::string with = root_ + (async ? "/with_stream_async" : "/with_stream");
    auto t0 = Clock::now();
    if (async) {
      auto h = ck.save_async(mirror.state(), with, o);
      ASSERT_TRUE(h.ok()) << h.status().to_string();
      EXPECT_FALSE(other.idle()) << "save_async with device_stream waited for another stream (" << since(t0) << " s)";
      ASSERT_TRUE(h->wait().ok());
    } else {
      ASSERT_TRUE(ck.save(mirror.state(), with, o).ok());
    }
    EXPECT_FALSE(other.idle()) << "a save with device_stream waited for another stream (" << since(t0) << " s)";
    // The same without a stream: the whole device, the other stream included, is waited for.
    // (Stale bytes queued on the trainer's stream: a synchronous memset would wait for `other`.)
    ASSERT_NO_FATAL_FAILURE(step.queue_stale(trainer));
    ASSERT_NO_FATAL_FAILURE(step.queue_step(trainer, nullptr));
    ASSERT_FALSE(other.idle()) << "the other stream's work ended before the second save (" << since(t0) << " s)";
    const std::string without = root_ + (async ? "/without_stream_async" : "/without_stream");
    t0 = Clock::now();
    if (async) {
      auto h = ck.save_async(mirror.state(), without);
      ASSERT_TRUE(h.ok()) << h.status().to_string();
      EXPECT_TRUE(other.idle()) << "save_async without device_stream did not synchronize the device";
      ASSERT_TRUE(h->wait().ok());
    } else {
      ASSERT_TRUE(ck.save(mirror.state(), without).ok());
      EXPECT_TRUE(other.idle()) << "save without device_stream did not synchronize the device";
    }
    CUDA_OK(cudaDeviceSynchronize());
    std::string first;
    EXPECT_EQ(mismatches_in(*topo, L, with, &first), 0) << first;
    EXPECT_EQ(mismatches_in(*topo, L, without, &first), 0) << first;
  }
}

// A load into device memory has completed when load returns, under the saved layout and under
// pure DP (replicas); read back on a stream other than the library's.
TEST_F(Gpu, LoadIntoDeviceMemoryIsCompleteWhenLoadReturns) {
  const int n = world_size();
  const Layout L = layout_for(n);
  auto topo = Topology::create(MPI_COMM_WORLD, {L.tp, L.dp, L.pp});
  ASSERT_TRUE(topo.ok());
  {
    TestModel model(L, topo->coords(), true);
    Checkpointer ck(*topo);
    ASSERT_TRUE(ck.save(model.state(), root_ + "/host").ok());
  }
  for (const Layout& to : {L, Layout{1, n, 1, false}}) {
    SCOPED_TRACE(to.name());
    auto t = Topology::create(MPI_COMM_WORLD, {to.tp, to.dp, to.pp});
    ASSERT_TRUE(t.ok());
    TestModel loaded(to, t->coords(), false);
    DeviceMirror mirror(loaded.state(), everything, true);
    Finals bufs(loaded.state(), mirror.state());
    ASSERT_NO_FATAL_FAILURE(bufs.poison());
    Checkpointer ck(*t);
    auto r = ck.load(mirror.state(), root_ + "/host");
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(cudaStreamQuery(staging_stream()), cudaSuccess) << "load returned with copies still queued";
    ASSERT_NO_FATAL_FAILURE(bufs.read_back_into_host());
    std::string first;
    EXPECT_EQ(loaded.count_mismatches(&first), 0) << first << " (transport " << r->transport << ")";
  }
}

TEST_F(Gpu, NcclTransportDeliversToItselfAtOneRank) {
  if (world_size() != 1) GTEST_SKIP() << "NCCL needs one GPU per rank; this machine has one";
  device::Staging& s = device::staging();
  std::string why;
  auto t = device::make_device_transport(MPI_COMM_WORLD, s, &why);
  ASSERT_NE(t, nullptr) << why;
  EXPECT_STREQ(t->name(), "nccl");
  const size_t n = 1 << 20;
  std::vector<uint32_t> host(n), back(n, 0);
  std::iota(host.begin(), host.end(), 7u);
  void* src = s.alloc_device(n * 4);
  void* dst = s.alloc_device(n * 4);
  ASSERT_TRUE(src && dst);
  CUDA_OK(cudaMemset(dst, 0x5a, n * 4));
  ASSERT_TRUE(s.copy_to_device(src, host.data(), n * 4).ok());
  ASSERT_TRUE(t->post_send(0, src, n * 4, 0).ok());
  ASSERT_TRUE(t->post_recv(0, dst, n * 4, 0).ok());
  ASSERT_TRUE(t->wait_all().ok());
  {  // delivered when wait_all returns: read on another stream, nothing synchronized first
    Stream reader;
    CUDA_OK(cudaMemcpyAsync(back.data(), dst, n * 4, cudaMemcpyDeviceToHost, reader));
    CUDA_OK(cudaStreamSynchronize(reader));
  }
  EXPECT_EQ(back, host);
  // A second round on the same communicator, through the staging stream as the load uses it.
  std::fill(back.begin(), back.end(), 0u);
  ASSERT_TRUE(t->post_send(0, dst, n * 4, 0).ok());
  ASSERT_TRUE(t->post_recv(0, src, n * 4, 0).ok());
  ASSERT_TRUE(t->wait_all().ok());
  ASSERT_TRUE(s.copy_to_host(back.data(), src, n * 4).ok());
  ASSERT_TRUE(s.synchronize().ok());
  EXPECT_EQ(back, host);
  t.reset();  // ncclCommDestroy of a non-blocking communicator
  s.free_device(src);
  s.free_device(dst);
}

#ifdef H5CKPT_TEST_HAVE_NCCL_H
// What the set-up deadline relies on: a non-blocking ncclCommInitRankConfig returns at once and
// stays in progress while a peer is missing (so the library can poll it against timeout_s), and
// such a communicator can be aborted; NCCL still works afterwards.
TEST_F(Gpu, NcclNonBlockingInitWithAMissingPeerStaysInProgressAndAborts) {
  if (world_size() != 1) GTEST_SKIP() << "one rank only";
  ncclUniqueId id{};
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t c = nullptr;
  auto t0 = Clock::now();
  const ncclResult_t r = ncclCommInitRankConfig(&c, 2, id, 0, &config);  // rank 1 never comes
  const double call_s = since(t0);
  ASSERT_TRUE(r == ncclInProgress || r == ncclSuccess) << ncclGetErrorString(r);
  ASSERT_NE(c, nullptr);
  EXPECT_LT(call_s, 5.0) << "non-blocking init blocked";
  ncclResult_t state = ncclInProgress;
  t0 = Clock::now();
  while (since(t0) < 2.0) {
    ASSERT_EQ(ncclCommGetAsyncError(c, &state), ncclSuccess);
    if (state != ncclInProgress) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(state, ncclInProgress) << ncclGetErrorString(state);
  t0 = Clock::now();
  EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
  std::printf("[nccl] non-blocking init returned in %.3f s, abort took %.3f s\n", call_s, since(t0));
  EXPECT_LT(since(t0), 20.0);
  std::string why;
  auto t = device::make_device_transport(MPI_COMM_WORLD, device::staging(), &why);
  EXPECT_NE(t, nullptr) << why;
}
#endif

// Ranks sharing one GPU: every rank gets the same answer (a transport or none), in bounded time,
// and repeated refusals do not leak device memory.
TEST_F(Gpu, NcclSetUpAgreesOnEveryRankWhenRanksShareTheGpu) {
  if (world_size() < 2) GTEST_SKIP() << "needs ranks sharing the GPU";
  size_t free0 = 0, free1 = 0, total = 0;
  const int attempts = 4;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    const auto t0 = Clock::now();
    std::string why;
    auto t = device::make_device_transport(MPI_COMM_WORLD, device::staging(), &why);
    const double took = since(t0);
    const uint64_t got = t ? 1 : 0;
    EXPECT_EQ(h5ckpt::testing::sum_all(got), got * world_size()) << "ranks disagree on the NCCL transport";
    EXPECT_LT(took, 60.0);
    if (world_rank() == 0)
      std::printf("[nccl] %d ranks on one GPU, attempt %d: %s after %.3f s\n", world_size(), attempt,
                  t ? "a transport" : ("none: " + why).c_str(), took);
    t.reset();
    cudaMemGetInfo(attempt == 0 ? &free0 : &free1, &total);
  }
  const double leaked_mib = (static_cast<double>(free0) - static_cast<double>(free1)) / (1 << 20);
  std::printf("[nccl] rank %d: free device memory after attempt 1 and %d differ by %.1f MiB\n", world_rank(), attempts,
              leaked_mib);
  // Free memory is the whole GPU's (every rank's). NCCL 2.28.9 itself keeps up to 1 MiB per rank
  // of every refused init (seen on an H100: 2 MiB per attempt at 2 ranks, 2.7 at 4, with or
  // without ncclCommAbort, which frees nothing of a communicator whose init failed that early;
  // ncclCommDestroy returns the init error and leaves NCCL's group open). Bound it, loosely.
  EXPECT_LE(leaked_mib, 2.0 * world_size() * (attempts - 1)) << "failed NCCL set-ups keep device memory";
}

// The NCCL set-up deadline: a rank that stops (SIGSTOP) before creating its communicator leaves
// the others polling a non-blocking init; at timeout_s they name the phase and end the job
// (MPI_Abort, exit code 124). Only under scripts/gpu_check.sh, which sets
// H5CKPT_GPU_TEST_STOP_RANK and expects the job to end that way; the test body must not finish.
TEST_F(Gpu, NcclSetupDeadlineEndsTheJobWhenAPeerStops) {
#ifndef H5CKPT_TEST_HAVE_NCCL_H
  GTEST_SKIP() << "built without nccl.h: no fault injection";
#endif
  if (!std::getenv("H5CKPT_GPU_TEST_STOP_RANK")) GTEST_SKIP() << "run by scripts/gpu_check.sh only";
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks";
  comm::set_timeout(5);
  std::string why;
  const auto t0 = Clock::now();
  auto t = device::make_device_transport(MPI_COMM_WORLD, device::staging(), &why);
  ADD_FAILURE() << "make_device_transport returned after " << since(t0) << " s ("
                << (t ? std::string("a transport") : why) << ") although a rank stopped";
}

}  // namespace
