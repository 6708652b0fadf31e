// A GPU stand-in for machines without one (see make_simulated_staging): inaccessible "device"
// address ranges backed by hidden host memory, an in-order copy queue on a worker thread, and
// a transport that moves device bytes through that queue and MPI.
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "device/staging.h"

namespace h5ckpt::device {

namespace {

// Runs jobs in order on a thread of its own, each after `latency_us`, and counts them, so a caller
// can wait for every job enqueued before a marker: a CUDA stream's semantics, on the CPU.
class SerialQueue {
 public:
  explicit SerialQueue(int latency_us) : latency_us_(latency_us), thread_([this] { run(); }) {}
  ~SerialQueue() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  /// Enqueues `f`; returns the marker that is complete once `f` has run.
  uint64_t enqueue(std::function<void()> f) {
    uint64_t marker = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(f));
      marker = ++enqueued_;
    }
    cv_.notify_all();
    return marker;
  }
  /// The marker after every job enqueued so far.
  uint64_t marker() {
    std::lock_guard<std::mutex> lock(mu_);
    return enqueued_;
  }
  void wait(uint64_t marker) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return completed_ >= marker; });
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto f = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      if (latency_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(latency_us_));
      f();
      lock.lock();
      ++completed_;
      done_cv_.notify_all();
    }
  }
  const int latency_us_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t enqueued_ = 0, completed_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

class SimulatedStaging final : public Staging {
 public:
  explicit SimulatedStaging(int latency_us)
      : copies_(std::make_unique<SerialQueue>(latency_us)), compute_(std::make_unique<SerialQueue>(0)) {}
  ~SimulatedStaging() override {
    copies_.reset();  // both queues finish before the memory their jobs touch goes
    compute_.reset();
    for (auto& [base, a] : allocs_) ::munmap(reinterpret_cast<void*>(base), a.reserved);
  }

  const char* name() const override { return "simulated"; }
  bool has_device() const override { return true; }
  bool is_device_pointer(const void* p) const override { return backing(p, 0) != nullptr; }

  void* alloc_host(size_t bytes) override { return std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096); }
  void free_host(void* p, size_t) override { std::free(p); }

  void* alloc_device(size_t bytes) override {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t reserved = std::max(page, (bytes + page - 1) / page * page);
    void* p = ::mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    std::lock_guard<std::mutex> lock(alloc_mu_);
    allocs_[reinterpret_cast<uintptr_t>(p)] = Alloc{bytes, reserved, std::vector<char>(std::max<size_t>(bytes, 1))};
    return p;
  }
  void free_device(void* p) override {
    std::lock_guard<std::mutex> lock(alloc_mu_);
    auto it = allocs_.find(reinterpret_cast<uintptr_t>(p));
    if (it == allocs_.end()) return;
    ::munmap(p, it->second.reserved);
    allocs_.erase(it);
  }

  Status copy_to_host(void* host, const void* dev, size_t bytes) override {
    char* src = backing(dev, bytes);
    if (!src) return out_of_range(dev, bytes);
    if (bytes) std::memset(host, kPoison, bytes);  // whoever reads it before the copy completes sees this
    if (bytes) enqueue_copy(false, host, src, bytes);
    return Status::Ok();
  }
  Status copy_to_device(void* dev, const void* host, size_t bytes) override {
    char* dst = backing(dev, bytes);
    if (!dst) return out_of_range(dev, bytes);
    if (bytes) enqueue_copy(true, dst, host, bytes);
    return Status::Ok();
  }
  uint64_t record() override { return copies_->marker(); }
  Status wait(uint64_t marker) override {
    copies_->wait(marker);
    std::lock_guard<std::mutex> lock(fault_mu_);
    return std::exchange(failed_, Status::Ok());  // reported once, as a sticky CUDA error is not
  }

  void fail_copy(bool to_device, uint64_t nth) {
    std::lock_guard<std::mutex> lock(fault_mu_);
    fail_at_[to_device] = counted_[to_device] + nth;
  }

  // The trainer's work: "kernels" run in order on the compute queue, whatever their stream.
  Status launch(void* stream, void* dev, const void* src, size_t bytes, int delay_us) {
    char* dst = backing(dev, bytes);
    if (!dst) return out_of_range(dev, bytes);
    std::vector<char> data(static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
    const uint64_t done = compute_->enqueue([dst, data = std::move(data), delay_us] {
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
      std::memcpy(dst, data.data(), data.size());
    });
    std::lock_guard<std::mutex> lock(stream_mu_);
    stream_marker_[stream] = done;
    return Status::Ok();
  }

  Status order_after(void* stream) override {
    // The compute queue is in order: a stream's last launch done means all before it are too.
    uint64_t until = compute_->marker();
    if (stream) {
      std::lock_guard<std::mutex> lock(stream_mu_);
      auto it = stream_marker_.find(stream);
      until = it == stream_marker_.end() ? 0 : it->second;
    }
    SerialQueue* compute = compute_.get();
    enqueue([compute, until] { compute->wait(until); });  // the next copies wait for it
    if (!stream) return synchronize();                    // device-wide synchronization blocks
    return Status::Ok();
  }

 private:
  struct Alloc {
    size_t bytes, reserved;
    std::vector<char> data;
  };
  // Where the bytes of device range [p, p + bytes) live; null when no allocation holds it.
  char* backing(const void* p, size_t bytes) const {
    std::lock_guard<std::mutex> lock(alloc_mu_);
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = allocs_.upper_bound(a);
    if (it == allocs_.begin()) return nullptr;
    --it;
    const size_t off = a - it->first;
    if (off >= std::max<size_t>(it->second.bytes, 1) || off + bytes > it->second.bytes) return nullptr;
    return it->second.data.data() + off;
  }
  static constexpr int kPoison = 0xcd;
  static Status out_of_range(const void* p, size_t bytes) {
    return Status(ErrorCode::kInvalidArgument,
                  "simulated device copy of " + std::to_string(bytes) + " bytes outside any device allocation");
  }
  void enqueue(std::function<void()> f) { copies_->enqueue(std::move(f)); }
  void enqueue_copy(bool to_device, void* to, const void* from, size_t bytes) {
    uint64_t number = 0;
    bool fail = false;
    {
      std::lock_guard<std::mutex> lock(fault_mu_);
      number = ++counted_[to_device];
      fail = number == fail_at_[to_device];
    }
    if (!fail) return enqueue([=] { std::memcpy(to, from, bytes); });
    enqueue([this, to_device, number, bytes] {
      std::lock_guard<std::mutex> lock(fault_mu_);
      if (failed_.ok())
        failed_ = Status(ErrorCode::kIo, std::string("simulated device copy ") + (to_device ? "to device" : "to host") +
                                             " failed (injected, copy " + std::to_string(number) + ", " +
                                             std::to_string(bytes) + " bytes)");
    });
  }

  mutable std::mutex alloc_mu_;
  mutable std::map<uintptr_t, Alloc> allocs_;
  std::unique_ptr<SerialQueue> copies_;   // the staging stream
  std::unique_ptr<SerialQueue> compute_;  // the trainer's streams (simulated_launch)
  std::mutex stream_mu_;
  std::map<void*, uint64_t> stream_marker_;             // compute marker of each stream's last launch
  std::mutex fault_mu_;                                 // tests' injected copy failures
  uint64_t counted_[2] = {0, 0}, fail_at_[2] = {0, 0};  // [to_device]: copies so far, the one to fail
  Status failed_;                                       // a failed copy, until a wait reports it
};

// Device-to-device transfers as a GPU transport would do them, through the copy queue: a send
// stages the device bytes out after every copy queued before it (so a preceding host-to-device
// copy is seen), a receive lands in device memory when wait_all() completes.
class SimulatedTransport final : public comm::Transport {
 public:
  SimulatedTransport(MPI_Comm comm, Staging& s) : mpi_(comm::make_mpi_transport(comm)), s_(s) {}
  const char* name() const override { return "simulated-device"; }
  Status post_send(int peer, const void* data, uint64_t bytes, int tag) override {
    bounces_.emplace_back(bytes);
    H5CKPT_RETURN_IF_ERROR(s_.copy_to_host(bounces_.back().data(), data, bytes));
    H5CKPT_RETURN_IF_ERROR(s_.synchronize());
    return mpi_->post_send(peer, bounces_.back().data(), bytes, tag);
  }
  Status post_recv(int peer, void* data, uint64_t bytes, int tag) override {
    bounces_.emplace_back(bytes);
    landing_.push_back({data, &bounces_.back()});
    return mpi_->post_recv(peer, bounces_.back().data(), bytes, tag);
  }
  Status progress() override { return mpi_->progress(); }
  Status wait_all() override {
    Status st = mpi_->wait_all();
    for (const auto& [dev, bounce] : landing_)
      if (st.ok()) st = s_.copy_to_device(dev, bounce->data(), bounce->size());
    if (st.ok()) st = s_.synchronize();
    landing_.clear();
    bounces_.clear();
    return st;
  }

 private:
  std::unique_ptr<comm::Transport> mpi_;
  Staging& s_;
  std::deque<std::vector<char>> bounces_;  // deque: stable addresses while MPI holds them
  std::vector<std::pair<void*, std::vector<char>*>> landing_;
};

}  // namespace

std::unique_ptr<Staging> make_simulated_staging(int copy_latency_us) {
  return std::make_unique<SimulatedStaging>(copy_latency_us);
}

Status simulated_launch(Staging& s, void* stream, void* dev, const void* src, size_t bytes, int delay_us) {
  auto* sim = dynamic_cast<SimulatedStaging*>(&s);
  if (!sim) return Status(ErrorCode::kUnsupported, "simulated_launch needs the simulated device");
  return sim->launch(stream, dev, src, bytes, delay_us);
}

Status simulated_fail_copy(Staging& s, bool to_device, uint64_t nth) {
  auto* sim = dynamic_cast<SimulatedStaging*>(&s);
  if (!sim) return Status(ErrorCode::kUnsupported, "simulated_fail_copy needs the simulated device");
  sim->fail_copy(to_device, nth);
  return Status::Ok();
}

std::unique_ptr<comm::Transport> make_simulated_transport(MPI_Comm comm, Staging& s) {
  return std::make_unique<SimulatedTransport>(comm, s);
}

}  // namespace h5ckpt::device
