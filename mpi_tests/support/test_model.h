// A small Megatron-like state for resharding tests: values are a pure function of (key, global
// flat index), so any rank can check any buffer it holds, element by element.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "h5ckpt/h5ckpt.hpp"

namespace h5ckpt::testing {

struct Layout {
  int tp = 1, dp = 1, pp = 1;
  bool zero = false;  ///< optimizer states flattened and split over DP
  std::string name() const;
};

/// Every (tp, pp in {1,2}, zero on/off) layout of `world` ranks.
std::vector<Layout> layouts_for(int world);

/// Expected value of element `flat` of tensor `key`, as the bytes of `dtype`.
void expected_value(const std::string& key, DType dtype, int64_t flat, void* out);

/// Global flat index of element j of a buffer laid out as `shard` of `shape`.
int64_t global_flat_index(const ShardSpec& shard, const Shape& shape, int64_t j);

/// Owns buffers for this rank's part of the test model under `layout`.
class TestModel {
 public:
  TestModel(const Layout& layout, RankCoords coords, bool fill);
  StateDict& state() { return state_; }
  /// Overwrites every buffer with garbage (what a trainer does right after save_async).
  void scribble();
  /// Number of elements that differ from expected_value (0 = all good); describes the first.
  int64_t count_mismatches(std::string* first) const;

 private:
  void add(const std::string& key, DType dtype, Shape shape, ShardSpec shard, bool fill);
  StateDict state_;
  std::vector<std::vector<unsigned char>> buffers_;
};

/// Every dataset's raw bytes, read through the HDF5 library (independent of h5ckpt's reader).
std::vector<unsigned char> read_dataset_bytes(const std::string& file, const std::string& dataset);

/// True when two checkpoints hold the same keys and byte-identical datasets (rank-local).
bool same_datasets(const std::string& a, const std::string& b, std::string* why);

/// same_datasets on every rank of MPI_COMM_WORLD (collective): *here is this rank's answer (with
/// *why), the return value whether every rank answered yes.
bool same_datasets_on_all_ranks(const std::string& a, const std::string& b, bool* here, std::string* why);

/// Expects (gtest, on every rank) that a and b hold the same datasets everywhere. Collective.
inline void expect_same_datasets(const std::string& a, const std::string& b) {
  std::string why;
  bool here = false;
  const bool everywhere = same_datasets_on_all_ranks(a, b, &here, &why);
  EXPECT_TRUE(here) << why;
  EXPECT_TRUE(everywhere);
}

/// This process's rank and the size of MPI_COMM_WORLD.
int world_rank();
int world_size();
/// Sum and maximum of a value over MPI_COMM_WORLD (every rank gets the result).
uint64_t sum_all(uint64_t v);
uint64_t max_all(uint64_t v);

/// A fresh directory shared by all ranks of `comm` (created by rank 0).
std::string shared_temp_dir(MPI_Comm comm, const std::string& tag);

}  // namespace h5ckpt::testing
