#include "engine/staging_pool.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

namespace h5ckpt::engine {

StagingPool::~StagingPool() { std::free(base_); }

void StagingPool::reserve(size_t bytes) {
  if (bytes <= capacity_) return;
  std::free(base_);
  base_ = static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  capacity_ = base_ ? bytes : 0;
  // Touch every page now: first-touch faults would otherwise land in the timed snapshot.
  if (base_) std::memset(base_, 0, capacity_);
  head_ = 0;
  blocks_.clear();
}

bool StagingPool::fits(size_t n, size_t* offset) const {
  if (blocks_.empty()) {
    *offset = 0;
    return n <= capacity_;
  }
  const size_t tail = blocks_.front().offset;
  if (head_ > tail) {  // used [tail, head_): free space after head_ and before tail
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

void StagingPool::release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    blocks_.pop_front();
    if (blocks_.empty()) head_ = 0;
  }
  cv_.notify_all();
}

}  // namespace h5ckpt::engine
