#include "engine/memory_budget.h"

#include <limits>
#include <string>

namespace h5ckpt::engine {

uint64_t MemoryBudget::available() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!limit_) return std::numeric_limits<uint64_t>::max() / 4;
  return used_ >= limit_ ? 0 : limit_ - used_;
}

uint64_t MemoryBudget::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

uint64_t MemoryBudget::peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

void MemoryBudget::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = used_;
}

bool MemoryBudget::try_reserve(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (limit_ && (bytes > limit_ || used_ > limit_ - bytes)) return false;
  used_ += bytes;
  if (used_ > peak_) peak_ = used_;
  return true;
}

Status MemoryBudget::reserve(uint64_t bytes, const char* what) {
  if (try_reserve(bytes)) return Status::Ok();
  return Status(ErrorCode::kInvalidArgument, std::string(what) + " needs " + std::to_string(bytes) +
                                                 " bytes, but only " + std::to_string(available()) +
                                                 " of memory_bytes = " + std::to_string(limit_) +
                                                 " are left: raise memory_bytes (H5CKPT_MEMORY_BYTES)");
}

void MemoryBudget::release(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  used_ = bytes > used_ ? 0 : used_ - bytes;
}

Result<MemoryBudget::Lease> MemoryBudget::lease(uint64_t bytes, const char* what) {
  H5CKPT_RETURN_IF_ERROR(reserve(bytes, what));
  return Lease(this, bytes);
}

Status check_memory_bytes(uint64_t memory_bytes) {
  if (memory_bytes == 0 || memory_bytes >= kMinMemoryBytes) return Status::Ok();
  return Status(ErrorCode::kInvalidArgument, "memory_bytes = " + std::to_string(memory_bytes) +
                                                 " is too small to make progress: the least is " +
                                                 std::to_string(kMinMemoryBytes) + " bytes (0: no bound)");
}

}  // namespace h5ckpt::engine
