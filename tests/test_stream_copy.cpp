// stream_copy must be byte-for-byte memcpy at every size and alignment, and write nothing
// outside its destination.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "util/stream_copy.h"

namespace {

using h5ckpt::detail::kStreamCopyMin;
using h5ckpt::detail::stream_copy;

constexpr unsigned char kGuard = 0xA5;
constexpr size_t kSlack = 128;  // room for misalignment plus guard bytes on both sides

std::vector<unsigned char> pattern(size_t n, uint64_t seed) {
  std::vector<unsigned char> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<unsigned char>(x);
  }
  return v;
}

void check_copy(size_t n, size_t src_off, size_t dst_off) {
  SCOPED_TRACE(testing::Message() << "n=" << n << " src_off=" << src_off << " dst_off=" << dst_off);
  const auto src = pattern(n + kSlack, n + src_off);
  std::vector<unsigned char> dst(n + 2 * kSlack, kGuard);
  unsigned char* d = dst.data() + kSlack / 2 + dst_off;
  stream_copy(d, src.data() + src_off, n);
  size_t wrong = 0, first_wrong = n;
  for (size_t i = 0; i < n; ++i)
    if (d[i] != src[src_off + i] && wrong++ == 0) first_wrong = i;
  EXPECT_EQ(wrong, 0u) << "first differing byte at " << first_wrong;
  for (unsigned char* p = dst.data(); p < d; ++p) ASSERT_EQ(*p, kGuard) << "wrote before the destination";
  for (unsigned char* p = d + n; p < dst.data() + dst.size(); ++p) ASSERT_EQ(*p, kGuard) << "wrote past the end";
}

TEST(StreamCopy, SmallCopiesAreExact) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{4097}})
    for (size_t so : {0, 3})
      for (size_t dof : {0, 1, 17}) check_copy(n, so, dof);
}

TEST(StreamCopy, StreamedCopiesAreExactAtEveryAlignment) {
  const size_t sizes[] = {kStreamCopyMin - 1, kStreamCopyMin, kStreamCopyMin + 1, kStreamCopyMin + 63,
                          (size_t{3} << 20) + 37};
  for (size_t n : sizes)
    for (size_t so : {0, 1, 8, 33})
      for (size_t dof : {0, 1, 15, 16, 48, 63}) check_copy(n, so, dof);
}

}  // namespace
