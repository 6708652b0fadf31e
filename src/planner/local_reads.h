// Load planning for the node-local level (no MPI, no I/O). A local checkpoint keeps each saved
// rank's regions in one file ("rank-<w>.bin", regions in plan order, each in its shard's element
// order), and one live rank serves each file. A load's ReadItems name that source: the serving
// rank, the saved rank's file and a byte offset in it, and where the bytes land in the wanted
// shard's buffer. A requester and a server derive the same items from the same (plan, wanted
// shard, region), so the bytes between them need no description beyond the request itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "h5ckpt/types.h"
#include "planner/save_planner.h"

namespace h5ckpt::planner {

/// Byte offset of every region in its writer's local file: [tensor][region].
using LocalFileOffsets = std::vector<std::vector<uint64_t>>;
/// Regions in plan order, per writer (`world` ranks saved; a writer outside it counts as rank 0).
LocalFileOffsets local_file_offsets(const std::vector<TensorPlan>& tensors, size_t world);

/// One contiguous piece of a local load: `bytes` at `file_offset` of saved rank `writer`'s file,
/// served by live rank `server`, are the elements from `dst_element` on of the wanted buffer.
struct LocalReadItem {
  int server = -1;
  int writer = -1;
  uint32_t region = 0;  ///< the saved region (index into the tensor's regions)
  uint64_t file_offset = 0;
  uint64_t dst_element = 0;
  uint64_t bytes = 0;
  uint64_t esize = 0;  ///< stored element size: pieces are cut at whole elements
};

/// The pieces of `want` (a shard of tensors[t], buffer laid out as frame_of(want)) held by
/// region `region` (every region when -1), in region order and, within a region, in row-major
/// order of the overlap. The wanted part is cut to the stored shape (a padded item's surplus is
/// not read). `server[w]` is the live rank serving saved rank w's file.
std::vector<LocalReadItem> plan_local_reads(const std::vector<TensorPlan>& tensors, size_t t, const ShardSpec& want,
                                            const std::vector<int>& server, const LocalFileOffsets& offsets,
                                            int region = -1);

}  // namespace h5ckpt::planner
