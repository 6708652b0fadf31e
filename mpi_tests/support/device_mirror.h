// Device copies of a test state's buffers, through the process's staging implementation
// (simulated device or CUDA), for tests of saves from and loads into device memory.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "device/staging.h"
#include "h5ckpt/state.h"

namespace h5ckpt::testing {

// Device copies of (some of) a host state's buffers, and a StateDict over them.
class DeviceMirror {
 public:
  DeviceMirror(StateDict& host, const std::function<bool(const std::string&)>& on_device, bool declare)
      : s_(device::staging()) {
    for (const auto& it : host.items()) {
      const size_t bytes = static_cast<size_t>(it.shard.numel()) * dtype_size(it.dtype);
      void* buf = it.data;
      if (on_device(it.key)) {
        buf = s_.alloc_device(bytes);
        dev_.push_back({buf, it.data, bytes});
      }
      StateItem& x = state_.add(it.key, it.dtype, it.global_shape, it.shard, buf,
                                declare && buf != it.data ? Device::kCuda : Device::kHost);
      x.allow_shape_mismatch = it.allow_shape_mismatch;
    }
    upload();
  }
  ~DeviceMirror() {
    for (auto& d : dev_) s_.free_device(d.device);
  }
  StateDict& state() { return state_; }
  size_t device_items() const { return dev_.size(); }
  void upload() {
    for (auto& d : dev_) EXPECT_TRUE(s_.copy_to_device(d.device, d.host, d.bytes).ok());
    EXPECT_TRUE(s_.synchronize().ok());
  }
  // Device bytes back into the host buffers (where TestModel checks them).
  void download() {
    for (auto& d : dev_) EXPECT_TRUE(s_.copy_to_host(d.host, d.device, d.bytes).ok());
    EXPECT_TRUE(s_.synchronize().ok());
  }
  // Overwrites the device buffers (what a trainer's next step does).
  void scribble() {
    std::vector<char> junk;
    for (auto& d : dev_) {
      junk.assign(d.bytes, static_cast<char>(0x5a));
      EXPECT_TRUE(s_.copy_to_device(d.device, junk.data(), d.bytes).ok());
      EXPECT_TRUE(s_.synchronize().ok());
    }
  }

 private:
  struct Buf {
    void* device;
    void* host;
    size_t bytes;
  };
  device::Staging& s_;
  StateDict state_;
  std::vector<Buf> dev_;
};

}  // namespace h5ckpt::testing
