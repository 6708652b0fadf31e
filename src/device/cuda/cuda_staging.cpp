// CUDA staging: page-locked host memory and copies on one non-blocking stream, with events as
// markers. Any CUDA error becomes a Status naming the call.
#include "device/cuda/cuda_staging.h"

#include <cuda_runtime.h>

#include <cstdlib>

#include "device/cuda/cuda_backend.h"
#include "logging/log.h"

namespace h5ckpt::device::cuda {

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status(ErrorCode::kIo, std::string(what) + " failed: " + cudaGetErrorString(e));
}

CudaStaging::CudaStaging(int device) : device_(device) {
  cudaSetDevice(device_);
  cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
}

CudaStaging::~CudaStaging() {
  for (auto& [seq, ev] : events_) cudaEventDestroy(ev);
  for (cudaEvent_t ev : free_events_) cudaEventDestroy(ev);
  if (stream_) cudaStreamDestroy(stream_);
}

Status CudaStaging::order_after(void* stream) {
  cudaSetDevice(device_);
  if (!stream) return cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize (before the snapshot)");
  // The staging stream waits, on the device, for the trainer's work queued so far: no host block.
  cudaEvent_t ev = nullptr;
  H5CKPT_RETURN_IF_ERROR(cuda_status(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate"));
  Status st = cuda_status(cudaEventRecord(ev, static_cast<cudaStream_t>(stream)), "cudaEventRecord (trainer stream)");
  if (st.ok()) st = cuda_status(cudaStreamWaitEvent(stream_, ev, 0), "cudaStreamWaitEvent");
  cudaEventDestroy(ev);  // released once the wait has been satisfied
  return st;
}

bool CudaStaging::is_device_pointer(const void* p) const {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // host pointers unknown to CUDA report an error on old runtimes: clear it
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

void* CudaStaging::alloc_host(size_t bytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) == cudaSuccess) return p;
  cudaGetLastError();
  logging::log().warn("cudaHostAlloc of {} bytes failed: staging in pageable memory (slower copies)", bytes);
  p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  std::lock_guard<std::mutex> lock(mu_);
  if (p) pageable_.insert(p);
  return p;
}

void CudaStaging::free_host(void* p, size_t) {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pageable_.erase(p)) {
      std::free(p);
      return;
    }
  }
  cudaFreeHost(p);
}

void* CudaStaging::alloc_device(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

void CudaStaging::free_device(void* p) {
  if (p) cudaFree(p);
}

Status CudaStaging::copy_to_host(void* host, const void* dev, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ++started_;
  return cuda_status(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync D2H");
}

Status CudaStaging::copy_to_device(void* dev, const void* host, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ++started_;
  return cuda_status(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync H2D");
}

uint64_t CudaStaging::record() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!events_.empty() && events_.back().first == started_) return started_;
  cudaEvent_t ev;
  if (!free_events_.empty()) {
    ev = free_events_.back();
    free_events_.pop_back();
  } else if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
    cudaGetLastError();
    return kSyncAll;
  }
  cudaEventRecord(ev, stream_);
  events_.emplace_back(started_, ev);
  return started_;
}

Status CudaStaging::wait(uint64_t marker) {
  cudaEvent_t ev = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (marker == kSyncAll) return cuda_status(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    for (auto& [seq, e] : events_)
      if (seq >= marker) {
        ev = e;
        break;
      }
  }
  if (!ev) return Status::Ok();  // already retired: an earlier wait covered it
  Status st = cuda_status(cudaEventSynchronize(ev), "cudaEventSynchronize");
  std::lock_guard<std::mutex> lock(mu_);
  while (!events_.empty() && events_.front().first <= marker) {  // passed: reuse their events
    free_events_.push_back(events_.front().second);
    events_.pop_front();
  }
  return st;
}

std::unique_ptr<Staging> make_cuda_staging() {
  int count = 0;
  // Without a driver or GPU this reports an error rather than zero: either way, no device.
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return nullptr;
  }
  int device = 0;
  cudaGetDevice(&device);  // the trainer's current device (set before the first save/load)
  return std::make_unique<CudaStaging>(device);
}

}  // namespace h5ckpt::device::cuda
