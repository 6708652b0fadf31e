// Binary encoding of planning messages (item descriptors up the tree, the plan back down).
#pragma once

#include <string>
#include <vector>

#include "planner/save_planner.h"

namespace h5ckpt::engine {

std::string encode_items(const std::vector<planner::ItemDesc>& items);
Result<std::vector<planner::ItemDesc>> decode_items(const std::string& bytes);

std::string encode_tensors(const std::vector<planner::TensorPlan>& tensors);
Result<std::vector<planner::TensorPlan>> decode_tensors(const std::string& bytes);

}  // namespace h5ckpt::engine
