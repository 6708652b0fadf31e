// The CUDA staging class, shared with the NCCL transport (which runs on its stream).
#pragma once

#include <cuda_runtime.h>

#include <deque>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "device/staging.h"

namespace h5ckpt::device::cuda {

Status cuda_status(cudaError_t e, const char* what);

class CudaStaging final : public Staging {
 public:
  explicit CudaStaging(int device);
  ~CudaStaging() override;
  const char* name() const override { return "cuda"; }
  bool has_device() const override { return true; }
  bool is_device_pointer(const void* p) const override;
  void* alloc_host(size_t bytes) override;
  void free_host(void* p, size_t bytes) override;
  void* alloc_device(size_t bytes) override;
  void free_device(void* p) override;
  Status copy_to_host(void* host, const void* dev, size_t bytes) override;
  Status copy_to_device(void* dev, const void* host, size_t bytes) override;
  uint64_t record() override;
  Status wait(uint64_t marker) override;
  Status order_after(void* stream) override;

  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }

 private:
  static constexpr uint64_t kSyncAll = ~0ull;  // a marker meaning "synchronize the stream"
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  std::mutex mu_;
  uint64_t started_ = 0;                                 // copies started so far
  std::deque<std::pair<uint64_t, cudaEvent_t>> events_;  // recorded, not yet waited past
  std::vector<cudaEvent_t> free_events_;
  std::set<void*> pageable_;  // host staging that could not be pinned
};

}  // namespace h5ckpt::device::cuda
