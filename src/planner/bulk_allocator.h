// An allocator for the planner's large scratch arrays (millions of entries at 8,960 ranks):
// arrays of 4 MiB and more are mapped on their own, with transparent huge pages requested
// (MADV_HUGEPAGE) where they pay (huge_pages_pay), so touching them costs one fault per 2 MiB
// rather than one per 4 KiB page: 256 MiB of fresh 4 KiB pages took 1.1 s of CPU on one 2-core VM,
// with huge pages 0.02 s (docs/performance.md). Smaller arrays, and systems where the advice is
// refused or huge pages are off, get ordinary pages: only the cost changes.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <new>
#include <utility>
#include <vector>

namespace h5ckpt::planner {

/// Whether large arrays ask for huge pages. Not where the kernel gives free memory back to its
/// hypervisor in blocks of a huge page or less (free page reporting, as on Firecracker VMs):
/// there every free huge page has been handed back, and its first touch costs the host's fault
/// of 512 small pages, 2.4-3.4 ms per MiB against 0.5 for 4 KiB pages on the 2-core VM (which
/// reuses small pages it still holds). `H5CKPT_HUGE_PAGES=0` or `1` decides instead (to measure
/// both on one machine). Read once.
bool huge_pages_pay();
/// The rule, from what sysfs says (-1: absent): free page reporting of blocks of 2^`order` pages
/// of `page_bytes`, `reported_kib` handed back so far.
bool huge_pages_pay_with(long long order, long long reported_kib, long long page_bytes);

template <class T>
struct BulkAllocator {
  using value_type = T;
  static constexpr size_t kHugePage = size_t{2} << 20;
  static constexpr size_t kMinBulk = size_t{4} << 20;  // below this, malloc's pages are as good

  BulkAllocator() = default;
  template <class U>
  BulkAllocator(const BulkAllocator<U>&) noexcept {}

  T* allocate(size_t n) {
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_array_new_length();
    const size_t bytes = n * sizeof(T);
    if (bytes < kMinBulk) return static_cast<T*>(::operator new(bytes));
    // Rounded up to whole huge pages: the kernel backs an aligned 2 MiB range with one page.
    void* p = ::mmap(nullptr, mapped(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    if (huge_pages_pay()) (void)::madvise(p, mapped(bytes), MADV_HUGEPAGE);  // advice: refused or ignored is fine
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) noexcept {
    const size_t bytes = n * sizeof(T);
    if (bytes < kMinBulk) ::operator delete(p);
    else ::munmap(p, mapped(bytes));
  }
  template <class U>
  bool operator==(const BulkAllocator<U>&) const noexcept {
    return true;
  }

 private:
  static size_t mapped(size_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }
};

/// A vector whose large buffers come from BulkAllocator.
template <class T>
using BulkVector = std::vector<T, BulkAllocator<T>>;

/// One uninitialized buffer from BulkAllocator, freed when it goes: for scratch that every use
/// writes before it reads, so that nothing pays for zero-filling it.
class BulkBuffer {
 public:
  BulkBuffer() = default;
  explicit BulkBuffer(size_t bytes) : size_(bytes), data_(bytes ? BulkAllocator<char>().allocate(bytes) : nullptr) {}
  ~BulkBuffer() {
    if (data_) BulkAllocator<char>().deallocate(data_, size_);
  }
  BulkBuffer(BulkBuffer&& o) noexcept : size_(std::exchange(o.size_, 0)), data_(std::exchange(o.data_, nullptr)) {}
  BulkBuffer& operator=(BulkBuffer&& o) noexcept {
    std::swap(size_, o.size_);
    std::swap(data_, o.data_);
    return *this;
  }

  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  size_t size_ = 0;
  char* data_ = nullptr;
};

/// Bump allocation from one huge-page mapping, for many small vectors that grow while a large
/// input is scanned (the save planner's 15,000 per-tensor tables at 8,960 ranks: about 40 MB
/// that, taken from malloc, faulted in 10,000 fresh 4 KiB pages). A block given back is kept
/// for the next request of its size when that size is a power of two, as a vector's doublings
/// and a hash table's are: the tables of later tensors grow into the blocks earlier ones
/// outgrew, instead of into fresh pages. A request beyond the reservation falls back to operator
/// new. Only the pages used are touched: the reservation is address space.
class BulkArena {
 public:
  explicit BulkArena(size_t bytes) : buf_(bytes) {}

  void* allocate(size_t bytes) {
    bytes = rounded(bytes);
    if (const int c = size_class(bytes); c >= 0 && free_[c]) {
      void* p = free_[c];
      free_[c] = *static_cast<void**>(p);
      return p;
    }
    if (bytes > buf_.size() - used_) return ::operator new(bytes);
    void* p = buf_.data() + used_;
    used_ += bytes;
    return p;
  }
  void deallocate(void* p, size_t bytes) noexcept {
    if (!owns(p)) return ::operator delete(p);
    if (const int c = size_class(rounded(bytes)); c >= 0) {  // the block's first word links it to the next free one
      *static_cast<void**>(p) = free_[c];
      free_[c] = p;
    }
  }
  /// Bytes taken from the reservation so far.
  size_t used() const { return used_; }
  /// Starts over at the reservation's beginning, forgetting every block: for scratch after a
  /// phase whose blocks are all dead (given back or never to be touched again), so that later
  /// requests land on pages the process has already faulted in.
  void recycle() {
    used_ = 0;
    std::fill(std::begin(free_), std::end(free_), nullptr);
  }

 private:
  static constexpr size_t kAlign = 16;
  static size_t rounded(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
  // The free list for blocks of `bytes` (a multiple of kAlign), or -1 when it is no power of two.
  static int size_class(size_t bytes) { return bytes != 0 && (bytes & (bytes - 1)) == 0 ? __builtin_ctzll(bytes) : -1; }
  bool owns(const void* p) const {
    return p >= static_cast<const void*>(buf_.data()) && p < static_cast<const void*>(buf_.data() + buf_.size());
  }
  BulkBuffer buf_;
  size_t used_ = 0;
  void* free_[64] = {};
};

/// A std allocator drawing from a BulkArena.
template <class T>
struct ArenaAllocator {
  using value_type = T;
  explicit ArenaAllocator(BulkArena& a) noexcept : arena(&a) {}
  template <class U>
  ArenaAllocator(const ArenaAllocator<U>& other) noexcept : arena(other.arena) {}
  T* allocate(size_t n) {
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(arena->allocate(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) noexcept { arena->deallocate(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const ArenaAllocator<U>& other) const noexcept {
    return arena == other.arena;
  }
  BulkArena* arena;
};

template <class T>
using ArenaVector = std::vector<T, ArenaAllocator<T>>;

}  // namespace h5ckpt::planner
