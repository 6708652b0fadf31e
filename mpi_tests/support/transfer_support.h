// Shared by the transfer tests (host and device buffers): the world cut into sources and
// destinations, a new version of every element, and the agreed-error check.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>

#include "h5ckpt/status.h"
#include "h5ckpt/topology.h"
#include "support/test_model.h"

namespace h5ckpt::testing::transfer {

inline Topology make_topology(MPI_Comm comm, const Layout& L) {
  auto t = Topology::create(comm, ParallelSizes{L.tp, L.dp, L.pp});
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(t).value();
}

inline uint64_t state_bytes(const StateDict& s) {
  uint64_t n = 0;
  for (const auto& it : s.items()) n += static_cast<uint64_t>(it.shard.numel()) * dtype_size(it.dtype);
  return n;
}

// The world cut in two: sources (the first `k` ranks, like a trainer) and destinations (the rest).
struct Halves {
  int k = 1;
  bool source = false;
  MPI_Comm comm = MPI_COMM_NULL;
  Halves() {
    const int n = world_size();
    k = std::max(1, n / 2);
    source = world_rank() < k;
    MPI_Comm_split(MPI_COMM_WORLD, source ? 0 : 1, world_rank(), &comm);
  }
  ~Halves() { MPI_Comm_free(&comm); }
  int size() const { return source ? k : world_size() - k; }
};

// Flips the lowest bit of the first byte of every element (a new "version" of any dtype).
inline void flip_all(StateDict& s) {
  for (auto& it : s.items()) {
    const size_t es = dtype_size(it.dtype);
    for (int64_t j = 0; j < it.shard.numel(); ++j) static_cast<unsigned char*>(it.data)[j * es] ^= 1;
  }
}

// Elements that differ from the expected values with every element flipped (flip_all's version).
inline int64_t flipped_mismatches(const StateDict& s) {
  int64_t bad = 0;
  for (const auto& it : s.items()) {
    const size_t es = dtype_size(it.dtype);
    unsigned char want[8];
    for (int64_t j = 0; j < it.shard.numel(); ++j) {
      h5ckpt::testing::expected_value(it.key, it.dtype,
                                      h5ckpt::testing::global_flat_index(it.shard, it.global_shape, j), want);
      want[0] ^= 1;
      bad += std::memcmp(want, static_cast<const unsigned char*>(it.data) + j * es, es) != 0;
    }
  }
  return bad;
}

// Every rank got the same error code and a message naming `needle`.
inline void expect_agreed_error(const Status& st, ErrorCode code, const std::string& needle) {
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
  int here = st.ok() ? 0 : static_cast<int>(st.code()), lo = 0, hi = 0;
  MPI_Allreduce(&here, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&here, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi) << "ranks returned different codes";
}

// Calls fn on every copy this rank holds of global element g of the f32 tensor `key`; returns
// how many there were.
inline int64_t for_element(StateDict& s, const std::string& key, int64_t g, const std::function<void(float*)>& fn) {
  int64_t n = 0;
  for (auto& it : s.items())
    if (it.key == key)
      for (int64_t j = 0; j < it.shard.numel(); ++j)
        if (global_flat_index(it.shard, it.global_shape, j) == g) {
          fn(static_cast<float*>(it.data) + j);
          ++n;
        }
  return n;
}

}  // namespace h5ckpt::testing::transfer
