// What every h5ckpt benchmark needs: MPI-wide timing and reductions, medians, and a fatal exit
// that names the tool and the rank (set_tool once in main).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "h5ckpt/status.h"

namespace h5ckpt::bench {

inline const char*& tool_name() {
  static const char* name = "h5ckpt";
  return name;
}
/// The name die() prints, e.g. "h5ckpt-bench".
inline void set_tool(const char* name) { tool_name() = name; }

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double max_all(double v) {
  double m = 0;
  MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}
inline uint64_t sum_all(uint64_t v) {
  uint64_t s = 0;
  MPI_Allreduce(&v, &s, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return s;
}

/// Times `fn` between two barriers; the slowest rank's time is the job's time.
inline double timed(const std::function<void()>& fn) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = now_s();
  fn();
  const double dt = now_s() - t0;
  MPI_Barrier(MPI_COMM_WORLD);
  return max_all(dt);
}

/// Prints "<tool> (rank r): msg" and ends the whole job.
[[noreturn]] inline void die(const std::string& msg) {
  int rank = 0, up = 0;
  MPI_Initialized(&up);
  if (up) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "%s (rank %d): %s\n", tool_name(), rank, msg.c_str());
  if (up) MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

template <class T>
T check(Result<T> r, const std::string& what) {
  if (!r.ok()) die(what + ": " + r.status().to_string());
  return std::move(r).value();
}

/// The middle value (the mean of the two middle ones for an even count); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace h5ckpt::bench
