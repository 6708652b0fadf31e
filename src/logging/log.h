// Rank-prefixed logging through spdlog; level from H5CKPT_LOG_LEVEL (trace..off, default warn).
// A layer of its own below comm and storage, which log but must not include metrics.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>

namespace h5ckpt::logging {

/// The library's logger ("h5ckpt"), created on first use with the MPI rank in its pattern.
spdlog::logger& log();

/// Wall-clock seconds since an arbitrary origin (steady clock).
inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace h5ckpt::logging
