// The memory budget of one Checkpointer (CheckpointerOptions::memory_bytes): every buffer the
// library takes for a save or a load beyond the caller's own buffers (the staging pool, read
// windows, conversion and verification buffers, host staging of device bytes) is leased here
// first. With a limit, a lease that would exceed it is refused (the operation then fails, or its
// caller sizes its pipeline to what is left); without one (0) leases always succeed and are only
// counted. The peak of what was leased is what the library itself used (Checkpointer::
// memory_peak_bytes, the benchmark's *_overhead_mib, the tests' allocation counter).
#pragma once

#include <cstdint>
#include <mutex>

#include "h5ckpt/status.h"

namespace h5ckpt::engine {

/// The smallest non-zero budget: two pipeline slots of the widest element, two read windows of
/// the smallest size aggregated reads accept, with room to spare. Below it nothing can progress.
inline constexpr uint64_t kMinMemoryBytes = 1024;

class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t limit = 0) : limit_(limit) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  uint64_t limit() const { return limit_; }
  bool bounded() const { return limit_ != 0; }
  /// Bytes a new lease may still take (a large number when unbounded).
  uint64_t available() const;
  uint64_t in_use() const;
  uint64_t peak() const;
  /// Starts a new peak measurement from what is leased now.
  void reset_peak();

  /// Leases `bytes`; false (nothing leased) when it would exceed the limit.
  bool try_reserve(uint64_t bytes);
  /// Like try_reserve, as a Status naming `what` (kInvalidArgument: the budget is a setting).
  Status reserve(uint64_t bytes, const char* what);
  void release(uint64_t bytes);

  /// An RAII lease.
  class Lease {
   public:
    Lease() = default;
    Lease(MemoryBudget* b, uint64_t n) : b_(b), n_(n) {}
    Lease(Lease&& o) noexcept : b_(o.b_), n_(o.n_) { o.b_ = nullptr, o.n_ = 0; }
    Lease& operator=(Lease&& o) noexcept {
      reset();
      b_ = o.b_, n_ = o.n_;
      o.b_ = nullptr, o.n_ = 0;
      return *this;
    }
    ~Lease() { reset(); }
    void reset() {
      if (b_) b_->release(n_);
      b_ = nullptr, n_ = 0;
    }
    uint64_t bytes() const { return n_; }

   private:
    MemoryBudget* b_ = nullptr;
    uint64_t n_ = 0;
  };
  /// A lease of `bytes`, or an error when it does not fit.
  Result<Lease> lease(uint64_t bytes, const char* what);

 private:
  const uint64_t limit_;
  mutable std::mutex mu_;
  uint64_t used_ = 0, peak_ = 0;
};

/// The error every rank gives when memory_bytes is below kMinMemoryBytes (checked before any
/// communication, identically on every rank, so no rank waits for another).
Status check_memory_bytes(uint64_t memory_bytes);

}  // namespace h5ckpt::engine
