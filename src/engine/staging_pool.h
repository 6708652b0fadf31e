// A bounded host staging area reused across saves: a FIFO ring the snapshot fills and the
// background writer drains, so a save can snapshot while earlier pieces are still being written.
// Its memory comes from the device seam (page-locked when a GPU runtime is present), and loads
// and synchronous saves of device buffers borrow it while no asynchronous save is running.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>

namespace h5ckpt::device {
class Staging;
}

namespace h5ckpt::engine {

class MemoryBudget;

class StagingPool {
 public:
  StagingPool() = default;
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;
  ~StagingPool();

  /// Allocates `bytes` of page-touched memory if the pool is smaller; call only while idle.
  /// With a budget, the capacity is leased from it: a pool the budget cannot hold is not
  /// allocated (capacity() stays below `bytes`; callers check it).
  void reserve(size_t bytes);
  /// Frees the pool when it holds more than `bytes` and allocates `bytes` again (only while idle):
  /// under a budget, room for a level's own buffers beside it.
  void shrink_to(size_t bytes);
  /// The budget the pool's capacity is leased from (set once, before the first reserve).
  void set_budget(MemoryBudget* budget) { budget_ = budget; }
  MemoryBudget* budget() const { return budget_; }
  size_t capacity() const { return capacity_; }
  /// The whole pool, for a caller that uses it outside the ring (only while idle).
  char* base() { return base_; }
  /// Reads every page once (only while idle).
  void touch() const;

  /// Reserves `n` contiguous bytes (0 < n <= capacity), waiting until the consumer released
  /// enough. Sets *waited when it had to wait.
  char* acquire(size_t n, bool* waited);
  /// The same without waiting: null when the pool has no room for `n` bytes now.
  char* try_acquire(size_t n);
  /// Releases the oldest acquired block (blocks are released in acquire order).
  void release();

 private:
  struct Block {
    size_t offset, size;
  };
  bool fits(size_t n, size_t* offset) const;
  std::mutex mu_;
  std::condition_variable cv_;
  void free_memory();
  device::Staging* allocator_ = nullptr;  // who allocated base_
  MemoryBudget* budget_ = nullptr;        // capacity_ is leased from it
  char* base_ = nullptr;
  size_t capacity_ = 0;
  size_t head_ = 0;  // next free byte
  std::deque<Block> blocks_;
};

}  // namespace h5ckpt::engine
