// The device seam: moving bytes between device memory and host staging memory. The engine
// sees only this interface; CUDA lives in src/device/cuda and is picked in select.cpp.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "comm/transport.h"
#include "h5ckpt/state.h"

namespace h5ckpt::device {

/// Copies between host staging memory and device memory on one dedicated in-order queue (a
/// CUDA stream): copies complete in the order they were started.
class Staging {
 public:
  virtual ~Staging() = default;
  /// "host" (no device), "cuda", or "simulated" (the CPU stand-in used by tests).
  virtual const char* name() const = 0;
  /// False for the host implementation: device buffers are then an error.
  virtual bool has_device() const = 0;
  /// True when `p` points into device memory.
  virtual bool is_device_pointer(const void* p) const = 0;

  /// Host memory for staging, page-locked where the device runtime supports it (fast DMA).
  virtual void* alloc_host(size_t bytes) = 0;
  virtual void free_host(void* p, size_t bytes) = 0;
  /// Device memory (for tests and the benchmark; trainers bring their own).
  virtual void* alloc_device(size_t bytes) = 0;
  virtual void free_device(void* p) = 0;

  /// Start a copy on the staging queue and return at once. `host` must be staging memory that
  /// stays valid until a marker recorded after the copy has been waited for.
  virtual Status copy_to_host(void* host, const void* dev, size_t bytes) = 0;
  virtual Status copy_to_device(void* dev, const void* host, size_t bytes) = 0;
  /// A marker after every copy started so far; wait(m) blocks until they have completed.
  virtual uint64_t record() = 0;
  virtual Status wait(uint64_t marker) = 0;
  Status synchronize() { return wait(record()); }

  /// Copies started after this call begin only once the trainer's work on `stream` (a
  /// cudaStream_t) submitted so far has completed; null: once all work on the device has (a
  /// device-wide synchronization, which blocks). Saves call it before their first device copy, so
  /// a snapshot never reads weights an optimizer step is still writing.
  virtual Status order_after(void* stream) { return Status::Ok(); }
};

/// The process's staging implementation: the test override if one is set, else CUDA when it is
/// built and a GPU is visible, else the host implementation.
Staging& staging();

/// Replaces the process's implementation (tests: a simulated device). Call while no Checkpointer
/// exists (their staging pools were allocated by the implementation in place); pass null to go
/// back to the default.
void set_staging_for_testing(std::unique_ptr<Staging> s);

/// No device: host memory from the allocator, device buffers refused.
std::unique_ptr<Staging> make_host_staging();

/// A CPU stand-in for a GPU, so the staging and device-transport paths run where no GPU is.
/// Its "device memory" is address space with no access rights (touching it from host code
/// crashes, as it would on a GPU); the bytes live elsewhere and only its copies reach them. The
/// copies run on a worker thread, each delayed by `copy_latency_us`, and a device-to-host copy
/// fills its destination with a poison byte when it starts, so a caller that uses bytes before
/// waiting for their copy reads wrong data.
std::unique_ptr<Staging> make_simulated_staging(int copy_latency_us = 1000);

/// Simulated device only (tests): "launches a kernel" on `stream` that writes `bytes` from `src`
/// (copied at once) into device memory `dev` after `delay_us`, on a compute thread of its own, the
/// way a trainer's optimizer step is still running when it calls save. kUnsupported elsewhere.
Status simulated_launch(Staging& s, void* stream, void* dev, const void* src, size_t bytes, int delay_us);

/// Simulated device only (tests): the `nth` copy to the device (`to_device`) or to the host,
/// counted from this call, fails as an asynchronous device error does: it does not happen, and
/// the next wait (or synchronize) returns kIo naming it. kUnsupported elsewhere.
Status simulated_fail_copy(Staging& s, bool to_device, uint64_t nth);

/// True when `item`'s buffer is device memory (declared by the caller or detected).
bool is_device_item(const StateItem& item);

/// A transport that moves bytes between device buffers directly (NCCL with CUDA; the simulated
/// device's own transport in tests), created collectively over `comm`. Null when `s` has none;
/// *why then says why. Every rank must call it; all get a transport or none does.
std::unique_ptr<comm::Transport> make_device_transport(MPI_Comm comm, Staging& s, std::string* why);

}  // namespace h5ckpt::device
