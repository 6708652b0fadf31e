// ShardSpec::validate's rule over plain spans, for callers that hold views of a message rather
// than a ShardSpec (the save coordinator plans 3.5 million item views at 8,960 ranks).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>

namespace h5ckpt {

/// Why a shard (its box's offset and extents, and a flat range when `flat` is set) does not fit
/// `global_shape`; empty when it does.
std::string shard_problem(std::span<const int64_t> global_shape, std::span<const int64_t> offset,
                          std::span<const int64_t> shape, const std::pair<int64_t, int64_t>* flat);

}  // namespace h5ckpt
