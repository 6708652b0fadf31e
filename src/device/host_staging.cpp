// Staging without a device: plain page-aligned host memory; device buffers are refused.
#include <cstdlib>

#include "device/staging.h"

namespace h5ckpt::device {

namespace {

class HostStaging final : public Staging {
 public:
  const char* name() const override { return "host"; }
  bool has_device() const override { return false; }
  bool is_device_pointer(const void*) const override { return false; }
  void* alloc_host(size_t bytes) override { return std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096); }
  void free_host(void* p, size_t) override { std::free(p); }
  void* alloc_device(size_t) override { return nullptr; }
  void free_device(void*) override {}
  Status copy_to_host(void*, const void*, size_t) override { return unsupported(); }
  Status copy_to_device(void*, const void*, size_t) override { return unsupported(); }
  uint64_t record() override { return 0; }
  Status wait(uint64_t) override { return Status::Ok(); }

 private:
  static Status unsupported() {
    return Status(ErrorCode::kUnsupported, "device copy requested, but no GPU runtime is available");
  }
};

}  // namespace

std::unique_ptr<Staging> make_host_staging() { return std::make_unique<HostStaging>(); }

}  // namespace h5ckpt::device
