// A copy for large snapshots that bypasses the CPU caches on the way out.
#pragma once

#include <cstddef>

namespace h5ckpt::detail {

/// Copies n bytes like memcpy (regions must not overlap). Large copies use non-temporal
/// stores: a snapshot is written once and read back much later by the writer thread or the
/// DMA engine, so pulling each destination line into the cache first (read-for-ownership)
/// only halves the bandwidth. glibc's memcpy switches to such stores only above a threshold
/// scaled to the last-level cache (tens of MiB on servers), which typical tensors stay under.
void stream_copy(void* dst, const void* src, size_t n);

/// Below this many bytes stream_copy is plain memcpy: small pieces are cheap either way, and a
/// small destination may well be read again soon.
inline constexpr size_t kStreamCopyMin = size_t{256} << 10;

}  // namespace h5ckpt::detail
