// The load contract (pure: no MPI, no HDF5): what a load request asks that the checkpoint cannot
// give. Every rank checks its own items into a LoadContract; the engine merges them over the ranks
// (encode / merge / decode) so that every rank decides with the same lists and fails, when it
// fails, with the same one message naming every problem of every kind.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "h5ckpt/status.h"
#include "h5ckpt/types.h"
#include "planner/load_planner.h"

namespace h5ckpt::planner {

/// Problems of a load request, each list sorted and without duplicates after merge_contract.
struct LoadContract {
  std::vector<std::string> missing;     ///< keys the state asks for that the checkpoint lacks
  std::vector<std::string> shape;       ///< "'key': checkpoint has global shape [..], the state wants [..]"
  std::vector<std::string> dtype;       ///< "'key': checkpoint holds f32, the state wants i64"
  std::vector<std::string> unexpected;  ///< keys the checkpoint holds that no rank asked for
  bool operator==(const LoadContract&) const = default;
};

/// One item of a request as the contract sees it.
struct ContractItem {
  const std::string& key;
  DType dtype;
  const Shape& global_shape;
  bool allow_shape_mismatch;
};

/// Checks one item against the tensor the checkpoint stores under its key (`stored` null: none)
/// and appends each problem to `out`. `convert_dtype`: float-to-float conversion is allowed.
/// Returns false when the key is missing (the item has nothing to load).
bool check_contract_item(const StoredTensor* stored, const ContractItem& item, bool convert_dtype, LoadContract* out);

/// Sorts every list and removes duplicates (the same problem seen by several ranks or pieces).
void normalize_contract(LoadContract& c);
/// Appends `from`'s lists to `into`'s and normalizes.
void merge_contract(LoadContract& into, const LoadContract& from);

std::string encode_contract(const LoadContract& c);
Result<LoadContract> decode_contract(const std::string& bytes);

/// How many entries of each list an error message shows (the counts are always complete).
constexpr size_t kContractShown = 10;

/// The load's outcome under the contract: Ok when nothing fails, else one error listing the
/// count and the first `shown` entries of every non-empty list, unexpected keys included (marked
/// "not an error" when they do not fail the load). Shape and dtype problems always fail; missing
/// keys when `fail_missing`, unexpected keys when `fail_unexpected`. The code is that of the first
/// failing kind in the order missing (kNotFound), shape (kShapeMismatch), dtype (kDtypeMismatch),
/// unexpected (kInvalidArgument).
Status contract_status(const LoadContract& c, bool fail_missing, bool fail_unexpected, size_t shown = kContractShown);

}  // namespace h5ckpt::planner
