// Every message format the engine sends between ranks, in one place. Decoders are bounded: a
// count the message cannot hold, a trailing byte or a short message is an error, never a
// truncation or a huge allocation.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "h5ckpt/status.h"
#include "planner/bulk_allocator.h"
#include "planner/load_planner.h"
#include "planner/save_planner.h"
#include "storage/local_store.h"
#include "util/bytes.h"

namespace h5ckpt::engine::wire {

/// Save planning, up the tree: one rank's item descriptors.
/// One ShardSpec (box, optional flat range) in the messages below and in local-level requests.
void put_shard(ByteWriter& w, const ShardSpec& s);
ShardSpec get_shard(ByteReader& r);

std::string encode_items(const std::vector<planner::ItemDesc>& items);
Result<std::vector<planner::ItemDesc>> decode_items(std::string_view bytes);
/// Every rank's items message as the coordinator plans them: keys and extents viewed in
/// `messages`, which must outlive them, and every view in one array (no allocation or copy per
/// item or rank; huge pages where they pay, planner::huge_pages_pay). An item whose key or
/// extents equal those of the previous rank's item at its position shares that item's.
struct GatheredItems {
  planner::BulkVector<planner::ItemView> views;           ///< rank by rank
  planner::BulkVector<int64_t> dims;                      ///< copies of extents a message held unaligned
  std::vector<std::span<const planner::ItemView>> items;  ///< per rank: its views
};
Result<GatheredItems> decode_gathered_items(const std::vector<std::string>& messages);

/// Save planning, down from the coordinator: the global plan's datasets and their regions.
std::string encode_tensors(const std::vector<planner::TensorPlan>& tensors);
Result<std::vector<planner::TensorPlan>> decode_tensors(const std::string& bytes);

/// Load planning, up the tree: one request per item of a rank (skipped items hold a place).
struct LoadRequestEntry {
  bool skip = false;
  bool on_device = false;  ///< the destination is device memory (the signature is opaque)
  planner::LoadRequest request;
};
std::string encode_requests(const std::vector<LoadRequestEntry>& requests);
Result<std::vector<LoadRequestEntry>> decode_requests(const std::string& bytes);
/// Every rank's requests message as the coordinator plans them (signatures viewed in `messages`).
struct GatheredRequests {
  std::vector<std::vector<planner::RequestView>> requests;  ///< per rank; skipped items make none
  std::vector<std::vector<int>> item_of;                    ///< per rank: each request's item index
  std::vector<std::vector<char>> on_device;                 ///< per rank and item
  std::vector<size_t> items;                                ///< per rank: its item count
};
Result<GatheredRequests> decode_gathered_requests(const std::vector<std::string>& messages);

/// Load planning, down from the coordinator: one role per item of a rank.
std::string encode_roles(const std::vector<planner::ItemRole>& roles);
/// The same message for rank `rank`, from the coordinator's table without expanding its roles.
std::string encode_roles(const planner::LoadPlan& plan, const planner::RoleTable& table, size_t rank);
Result<std::vector<planner::ItemRole>> decode_roles(const std::string& bytes);

/// Save commit, up to the coordinator: the verification blocks of every region a rank wrote.
struct RegionChecksum {
  int32_t tensor = -1;
  int32_t region = -1;
  uint64_t block_bytes = 0;      ///< 0: saved without checksums
  std::vector<uint64_t> blocks;  ///< xxh3 of each block (storage/verify_blocks.h)
};
std::string encode_checksums(const std::vector<RegionChecksum>& sums);
Result<std::vector<RegionChecksum>> decode_checksums(const std::string& bytes);

/// Two strings in one message (e.g. a checkpoint directory and its metadata text).
std::string encode_pair(const std::string& first, const std::string& second);
Result<std::pair<std::string, std::string>> decode_pair(const std::string& bytes);

/// Local-level resolution, up to the coordinator: one node's committed local checkpoints for a
/// path (name, manifest id, step, saved world, the saved ranks whose file it holds, the node that
/// saved each rank). `dir` is not sent.
std::string encode_listing(const std::vector<storage::LocalEntry>& entries);
Result<std::vector<storage::LocalEntry>> decode_listing(const std::string& bytes);

/// Local-level resolution, down from the coordinator: which level a load reads. Local: the
/// checkpoint's name and manifest id, a rank holding its manifest, and the live rank serving each
/// saved rank's file. Shared: the shared checkpoint's path (`name`).
struct LevelChoice {
  bool local = false;
  std::string reason;
  std::string name;
  uint64_t manifest_id = 0;
  int manifest_root = -1;
  std::vector<int> server;
};
std::string encode_choice(const LevelChoice& c);
Result<LevelChoice> decode_choice(const std::string& bytes);

/// A local load's requests, from a requester to one server: for each saved region it wants part
/// of, (tensor, region, the wanted shard). Both sides plan the same pieces from it
/// (planner/local_reads.h).
struct LocalRequest {
  uint64_t tensor = 0, region = 0;
  ShardSpec want;
};
void put_local_request(ByteWriter& w, const LocalRequest& q);
Result<std::vector<LocalRequest>> decode_local_requests(const std::string& bytes);

/// The root's outcome reaches every rank: each returns the root's error, or its payload.
/// `on_root` is read on the root only. Collective over `comm`.
Result<std::string> bcast_outcome(const Result<std::string>& on_root, int root, MPI_Comm comm);
/// The message bcast_outcome sends, for callers that broadcast it their own way (node leaders).
std::string encode_outcome(const Result<std::string>& on_root);
Result<std::string> decode_outcome(const std::string& msg);

}  // namespace h5ckpt::engine::wire
