#include "storage/region_lookup.h"

namespace h5ckpt::storage {

const planner::RegionIndex* RegionLookup::of(const TensorInfo& t) {
  const TensorInfo* first = info_->tensors.data();
  // Compared as addresses of one array only when inside it (std::less: a total order on pointers).
  if (std::less<const TensorInfo*>()(&t, first) || !std::less<const TensorInfo*>()(&t, first + info_->tensors.size()))
    return nullptr;
  const size_t pos = static_cast<size_t>(&t - first);
  if (pos >= indexes_.size()) return nullptr;  // tensors added after this lookup was made
  auto& index = indexes_[pos];
  if (!index)
    index = std::make_unique<planner::RegionIndex>(t.shape, t.regions.size(),
                                                   [&](size_t k) -> const ShardSpec& { return t.regions[k].shard; });
  return index.get();
}

}  // namespace h5ckpt::storage
