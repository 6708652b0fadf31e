#include "engine/staging_pool.h"

#include <cstring>

#include "device/staging.h"
#include "engine/memory_budget.h"

namespace h5ckpt::engine {

StagingPool::~StagingPool() { free_memory(); }

void StagingPool::free_memory() {
  if (base_) allocator_->free_host(base_, capacity_);
  if (budget_) budget_->release(capacity_);
  base_ = nullptr;
  capacity_ = 0;
}

void StagingPool::reserve(size_t bytes) {
  if (bytes == 0) return;
  if (bytes <= capacity_ && allocator_ == &device::staging()) return;
  free_memory();
  head_ = 0;
  blocks_.clear();
  if (budget_ && !budget_->try_reserve(bytes)) return;  // over budget: no pool
  allocator_ = &device::staging();
  base_ = static_cast<char*>(allocator_->alloc_host(bytes));
  if (!base_ && budget_) budget_->release(bytes);
  capacity_ = base_ ? bytes : 0;
  // Touch every page now: first-touch faults would otherwise land in the timed snapshot.
  if (base_) std::memset(base_, 0, capacity_);
  head_ = 0;
  blocks_.clear();
}

void StagingPool::shrink_to(size_t bytes) {
  if (capacity_ <= bytes) return;
  free_memory();
  reserve(bytes);
}

void StagingPool::touch() const {
  volatile char sink = 0;
  for (size_t i = 0; i < capacity_; i += 4096) sink = sink + base_[i];
}

bool StagingPool::fits(size_t n, size_t* offset) const {
  if (blocks_.empty()) {
    *offset = 0;
    return n <= capacity_;
  }
  const size_t tail = blocks_.front().offset;
  if (head_ > tail) {              // used [tail, head_): free space after head_ and before tail
    if (capacity_ - head_ >= n) {  // room after head
      *offset = head_;
      return true;
    }
    if (tail >= n) {  // wrap to the start; the end of the ring stays unused this round
      *offset = 0;
      return true;
    }
    return false;
  }
  // Wrapped (head_ <= tail): the free gap is [head_, tail)
  *offset = head_;
  return tail - head_ >= n;
}

char* StagingPool::acquire(size_t n, bool* waited) {
  std::unique_lock<std::mutex> lock(mu_);
  size_t offset = 0;
  if (!fits(n, &offset)) {
    *waited = true;
    cv_.wait(lock, [&] { return fits(n, &offset); });
  }
  blocks_.push_back(Block{offset, n});
  head_ = offset + n;
  return base_ + offset;
}

char* StagingPool::try_acquire(size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t offset = 0;
  if (!fits(n, &offset)) return nullptr;
  blocks_.push_back(Block{offset, n});
  head_ = offset + n;
  return base_ + offset;
}

void StagingPool::release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    blocks_.pop_front();
    if (blocks_.empty()) head_ = 0;
  }
  cv_.notify_all();
}

}  // namespace h5ckpt::engine
