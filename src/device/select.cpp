// Picks the device implementation for this process: the only place that knows whether the
// CUDA target was built.
#include <atomic>
#include <mutex>

#include "device/staging.h"
#include "logging/log.h"

#ifdef H5CKPT_HAVE_CUDA
#include "device/cuda/cuda_backend.h"
#endif

namespace h5ckpt::device {

namespace {

std::mutex g_mu;
std::unique_ptr<Staging> g_default;   // created on first use, lives for the process
std::unique_ptr<Staging> g_override;  // tests
std::atomic<Staging*> g_current{nullptr};

std::unique_ptr<Staging> make_default() {
#ifdef H5CKPT_HAVE_CUDA
  if (auto s = cuda::make_cuda_staging()) return s;  // null when no GPU is visible
#endif
  return make_host_staging();
}

}  // namespace

Staging& staging() {
  if (Staging* s = g_current.load(std::memory_order_acquire)) return *s;
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_current.load()) {
    g_default = make_default();
    g_current.store(g_default.get(), std::memory_order_release);
  }
  return *g_current.load();
}

void set_staging_for_testing(std::unique_ptr<Staging> s) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_override = std::move(s);
  if (g_override) {
    g_current.store(g_override.get(), std::memory_order_release);
  } else {
    if (!g_default) g_default = make_default();
    g_current.store(g_default.get(), std::memory_order_release);
  }
}

bool is_device_item(const StateItem& item) {
  return item.device == Device::kCuda || (item.data && staging().is_device_pointer(item.data));
}

std::unique_ptr<comm::Transport> make_simulated_transport(MPI_Comm comm, Staging& s);  // simulated_device.cpp

std::unique_ptr<comm::Transport> make_device_transport(MPI_Comm comm, Staging& s, std::string* why) {
  const std::string kind = s.name();
  if (kind == "simulated") return make_simulated_transport(comm, s);
#ifdef H5CKPT_HAVE_CUDA
  if (kind == "cuda") return cuda::make_nccl_transport(comm, s, why);
#endif
  *why = "no device transport for staging '" + kind + "'";
  return nullptr;
}

}  // namespace h5ckpt::device
