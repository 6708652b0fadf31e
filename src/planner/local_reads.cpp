#include "planner/local_reads.h"

#include "planner/box_math.h"

namespace h5ckpt::planner {

LocalFileOffsets local_file_offsets(const std::vector<TensorPlan>& tensors, size_t world) {
  std::vector<uint64_t> running(world, 0);
  LocalFileOffsets off(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    const uint64_t esize = dtype_size(tensors[t].dtype);
    for (const auto& r : tensors[t].regions) {
      const size_t w = r.writer >= 0 && static_cast<size_t>(r.writer) < world ? static_cast<size_t>(r.writer) : 0;
      off[t].push_back(running[w]);
      running[w] += static_cast<uint64_t>(r.numel()) * esize;
    }
  }
  return off;
}

std::vector<LocalReadItem> plan_local_reads(const std::vector<TensorPlan>& tensors, size_t t, const ShardSpec& want,
                                            const std::vector<int>& server, const LocalFileOffsets& offsets,
                                            int region) {
  std::vector<LocalReadItem> out;
  const TensorPlan& tp = tensors.at(t);
  const Shape& stored = tp.shape;
  const uint64_t esize = dtype_size(tp.dtype);
  const Box whole{Shape(stored.size(), 0), stored};
  const Frame dst = frame_of(want);
  std::vector<Box> wanted;  // cut to the stored shape
  for (const Box& wb : shard_boxes(want)) {
    if (wb.ndim() != stored.size()) continue;
    if (auto clip = intersect(wb, whole)) wanted.push_back(*clip);
  }
  const size_t first = region < 0 ? 0 : static_cast<size_t>(region);
  const size_t last = region < 0 ? tp.regions.size() : std::min(tp.regions.size(), first + 1);
  for (size_t g = first; g < last; ++g) {
    const ShardSpec shard = tp.shard(g);
    const Frame src = frame_of(shard);
    const int writer = tp.regions[g].writer;
    const int srv =
        writer >= 0 && static_cast<size_t>(writer) < server.size() ? server[static_cast<size_t>(writer)] : -1;
    const uint64_t base = offsets.at(t).at(g);
    for (const Box& wb : wanted)
      for (const Box& rb : shard_boxes(shard))
        if (auto x = intersect(wb, rb))
          for_each_run(*x, src, dst, [&](int64_t s, int64_t d, int64_t n) {
            out.push_back({srv, writer, static_cast<uint32_t>(g), base + static_cast<uint64_t>(s) * esize,
                           static_cast<uint64_t>(d), static_cast<uint64_t>(n) * esize, esize});
          });
  }
  return out;
}

}  // namespace h5ckpt::planner
