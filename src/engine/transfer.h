// The transfer engine behind h5ckpt::StateTransfer (include/h5ckpt/transfer.h): live state moves
// between ranks without storage. Phases, each ending in one agreement (comm::agree):
//   plan      local checks; unless every rank's structure is the cached one, every rank's source
//             and destination items go to the coordinator, which plans (planner/transfer_planner)
//             and scatters each rank the pieces it sends and receives
//   checksums each source hashes the pieces it sends into the verification blocks of a save
//             (storage/verify_blocks: block_checksum seeded with region_identity of the piece)
//             and sends the block sums ahead; with a delta, both sides compare them with the
//             previous version's and move only the blocks that changed
//   exchange  per round: receive into staging, check every block, agree, then commit (copy out
//             into the destination buffers, converting dtypes) — so a corrupted block leaves the
//             destination untouched
#pragma once

#include <string>

namespace h5ckpt::engine {

/// Test hook (fault injection): every piece of `key` that world rank `src_rank` sends has one
/// byte flipped after its checksums were computed, as a link corrupting it in flight would.
/// An empty key turns it off.
void set_transfer_fault_for_testing(int src_rank, const std::string& key);

/// Test hook: every copy that keeps an in-place piece's previous bytes (keep_previous) waits this
/// long first, so the piece's sums surely arrive before its data receives are posted. 0: off.
void set_transfer_backup_delay_for_testing(double seconds);

}  // namespace h5ckpt::engine
