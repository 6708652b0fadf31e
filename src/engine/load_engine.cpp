// The load pipeline: resolve_metadata -> plan_reads -> [verify_regions] -> execute_reads. The
// coordinator resolves the metadata and every rank gets the same view; identical requests are
// grouped so one rank reads them and sends them to the others (zero-redundancy loading); each
// reader reads exactly the boxes it wants at recorded offsets. Each phase ends in one agreement.
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack (request_hash)
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "comm/transport.h"
#include "device/staging.h"
#include "engine/aggregated_read.h"
#include "engine/engine.h"
#include "engine/memory_budget.h"
#include "engine/pieces.h"
#include "logging/log.h"
#include "metrics/report.h"
#include "planner/box_math.h"
#include "planner/bulk_allocator.h"
#include "storage/commit.h"
#include "storage/meta_v2.h"
#include "storage/format.h"
#include "storage/fs_traits.h"
#include "storage/meta_v1.h"
#include "storage/region_reader.h"
#include "storage/verify_blocks.h"
#include "util/checked_math.h"
#include "util/dtype_convert.h"
#include "util/phase.h"
#include "util/work_pool.h"

namespace h5ckpt::engine {

namespace fs = std::filesystem;
using logging::now_s;
using planner::ReadItem;
using planner::Role;

namespace {

// MPI tags are at most 32767 everywhere: groups past that share tags, and then only the order of
// messages between two ranks tells them apart (both sides walk groups in ascending order).
constexpr int kTagSpace = 0x8000;
int tag_of(int group) { return group % kTagSpace; }

// Device items are staged at this alignment in the pool.
constexpr uint64_t kStagingAlign = 64;
uint64_t align_up(uint64_t n) { return (n + kStagingAlign - 1) / kStagingAlign * kStagingAlign; }

// One load from the metadata to the final agreement; each phase fills in its part.
struct LoadRun {
  LoadRun(const Topology::Impl& t, StateDict& s, const LoadOptions& o, const CheckpointerOptions& c, LoadPlanCache& lc,
          StagingPool& p, DeviceLink& l)
      : topo(t), state(s), options(o), copts(c), cache(lc), pool(p), link(l), t0(now_s()) {}
  const Topology::Impl& topo;
  StateDict& state;
  const LoadOptions& options;
  const CheckpointerOptions& copts;
  LoadPlanCache& cache;
  StagingPool& pool;
  DeviceLink& link;
  LoadReport report;
  double t0 = 0;
  std::string where;  // "load '<checkpoint dir>'", the context of every error
  std::string data_file;
  std::optional<storage::RegionReader> reader;
  std::vector<planner::LoadWant> wants;
  // `state` with multi-piece items expanded into one item per piece (the caller's own state when
  // it has none): names the pieces in errors and holds the pieces' own check.
  const ExpandedState* pieces = nullptr;

  MPI_Comm world() const { return topo.world.get(); }
  bool coordinator() const { return topo.world.rank() == topo.coordinator; }
};

std::vector<planner::LoadWant> describe_wants(const StateDict& state) {
  std::vector<planner::LoadWant> wants;
  wants.reserve(state.size());
  for (const auto& it : state.items())
    wants.push_back(
        {{it.key, it.dtype, it.global_shape, it.shard}, device::is_device_item(it), it.allow_shape_mismatch, false});
  return wants;
}

// Everything that changes validation or the plan: every request (key, dtype, shapes, shard, where
// the buffer lives, padding) and the load options.
uint64_t request_hash(const std::vector<planner::LoadWant>& wants, const LoadOptions& options) {
  XXH3_state_t h;
  XXH3_64bits_reset(&h);
  for (const auto& w : wants) {
    const std::string sig = planner::make_request(w).signature;
    const uint64_t n = sig.size();
    XXH3_64bits_update(&h, &n, sizeof n);
    XXH3_64bits_update(&h, sig.data(), sig.size());
  }
  // verify_checksums too: a load that verifies every region needs the metadata of all tensors,
  // where the cached one may hold only this rank's.
  const uint8_t flags[6] = {options.strict,           options.convert_dtype,
                            options.zero_redundancy,  options.aggregate_reads,
                            options.verify_checksums, static_cast<uint8_t>(options.strictness)};
  XXH3_64bits_update(&h, flags, sizeof flags);
  return XXH3_64bits_digest(&h);
}

// The effective strictness: `strict = false` is kAllowMissing whatever `strictness` says.
LoadStrictness strictness_of(const LoadOptions& o) { return o.strict ? o.strictness : LoadStrictness::kAllowMissing; }

planner::StoredTensor stored_of(const CheckpointInfo& info, const std::string& key) {
  const TensorInfo* t = info.find(key);
  return t ? planner::StoredTensor{t->dtype, t->shape, t->file_offset} : planner::StoredTensor{};
}

// ---- Phase 1: metadata --------------------------------------------------------------------

// The coordinator's view of a checkpoint: its directory and the text of metadata.json (format v2:
// its summary checked). The index image is read later, and only when some rank must build its
// metadata (read_index_image).
Result<std::string> read_metadata_message(const std::string& path) {
  H5CKPT_ASSIGN_OR_RETURN(std::string dir, storage::resolve_checkpoint_dir(path));
  H5CKPT_ASSIGN_OR_RETURN(std::string text,
                          storage::read_whole_file((fs::path(dir) / storage::kMetadataFileName).string()));
  if (storage::declared_format_version(text) == static_cast<uint64_t>(storage::v2::kFormatVersion))
    H5CKPT_RETURN_IF_ERROR(storage::v2::parse_summary(text).status());
  return wire::encode_pair(dir, text);
}

// The coordinator, format v2: the index image the summary names, read from the data file and
// validated there, once for all ranks. Its own reader: these bytes are not the load's tensor
// reads (LoadReport::bytes_read).
Result<std::vector<char>> read_index_image(const storage::v2::Summary& summary, const std::string& data_file) {
  H5CKPT_ASSIGN_OR_RETURN(auto reader, storage::RegionReader::open(data_file));
  H5CKPT_ASSIGN_OR_RETURN(std::vector<char> image, storage::v2::read_image(summary, reader));
  H5CKPT_RETURN_IF_ERROR(
      storage::v2::Index::open(summary, image.data(), image.size(), reader.file_size(), /*validate=*/true).status());
  return image;
}

// This rank's CheckpointInfo: for format v2 only the tensors it loads (all of them when every
// region is verified, which splits all regions over the ranks), read in place from its node's one
// copy of the image the coordinator read and validated (comm::NodeShared, freed before returning;
// the coordinator's read errors reach every rank through the sharing step's agreement); format
// v1 parses and validates the whole JSON. Runs only when some rank must build (resolve_metadata):
// for format v2 collective (the node's shared memory), every rank takes part, also one that
// builds nothing (`build` false: its plan is cached).
// With `build`, `*keys` receives every key of the checkpoint, sorted (the load contract names the
// keys nobody asked for). `*agreed` tells an error every rank already has (the sharing step's)
// from one of this rank alone.
Result<CheckpointInfo> rank_metadata(LoadRun& run, const std::string& text, bool build, std::vector<std::string>* keys,
                                     bool* agreed) {
  if (storage::declared_format_version(text) != static_cast<uint64_t>(storage::v2::kFormatVersion)) {
    if (!build) return CheckpointInfo{};
    auto info = storage::metadata_from_json(text, run.reader ? run.reader->file_size() : 0);
    if (info.ok()) {
      for (const auto& t : info->tensors) keys->push_back(t.key);
      std::sort(keys->begin(), keys->end());
    }
    return info;
  }
  // Same text on every rank: every rank takes this path, and fails here alike.
  H5CKPT_ASSIGN_OR_RETURN(storage::v2::Summary summary, storage::v2::parse_summary(text));
  const uint64_t size = summary.image_bytes();
  auto shared = run.topo.share_with_nodes(size, [&](char* out) {
    auto image = read_index_image(summary, run.data_file);
    if (!image.ok()) return image.status();
    if (image->size() != size)
      return Status(ErrorCode::kInternal,
                    "index image of " + std::to_string(image->size()) + " bytes, summary says " + std::to_string(size));
    std::memcpy(out, image->data(), size);
    return Status::Ok();
  });
  if (!shared.ok()) {
    *agreed = true;
    return shared.status();
  }
  run.report.index_shared = true;
  auto index = storage::v2::Index::open(summary, shared->data(), size, 0, /*validate=*/false);
  Result<CheckpointInfo> info = index.status();
  if (!build) {
    info = CheckpointInfo{};
  } else if (index.ok()) {
    keys->reserve(index->tensor_count());
    for (size_t t = 0; t < index->tensor_count(); ++t) keys->emplace_back(index->key(t));
    std::sort(keys->begin(), keys->end());  // the index keeps them sorted; cheap when it does
    if (run.options.verify_checksums) {
      info = index->to_info();
    } else {
      std::vector<std::string> keys;
      keys.reserve(run.wants.size());
      for (const auto& w : run.wants) keys.push_back(w.desc.key);
      info = index->to_info(&keys);
    }
  }
  // Nobody frees the node's copy (collective) while another rank of the node still reads it.
  Status read_done = shared->sync(run.topo.node.get());
  if (!read_done.ok() && info.ok()) info = read_done;
  return info;
}

// Merges every rank's load contract so that every rank holds the same one (cache.contract): the
// keys any rank loads (a bitwise OR over the checkpoint's sorted keys) name the unexpected ones,
// and the coordinator merges the problem lists and broadcasts them. Collective; every rank
// returns the same outcome (the merged bytes come from one broadcast).
Status settle_contract(LoadRun& run) {
  LoadPlanCache& cache = run.cache;
  std::vector<unsigned char> any(cache.requested.size(), 0);
  MPI_Request req = MPI_REQUEST_NULL;
  Status st = comm::mpi_status(MPI_Iallreduce(cache.requested.data(), any.data(), static_cast<int>(any.size()),
                                              MPI_UNSIGNED_CHAR, MPI_BOR, run.world(), &req),
                               "load contract (MPI_Iallreduce)");
  if (st.ok()) st = comm::wait_asleep(1, &req, 200, "load contract (MPI_Iallreduce)", run.world());
  H5CKPT_RETURN_IF_ERROR(st.with_context(run.where));
  auto gathered = run.topo.gather(planner::encode_contract(cache.contract_mine));
  Result<std::string> merged = std::string();
  if (run.coordinator()) {
    planner::LoadContract all;
    if (!gathered.ok()) merged = gathered.status();
    for (size_t r = 0; gathered.ok() && merged.ok() && r < gathered->size(); ++r) {
      auto part = planner::decode_contract((*gathered)[r]);
      if (part.ok()) planner::merge_contract(all, *part);
      else merged = part.status().with_context("from rank " + std::to_string(r));
    }
    const std::vector<std::string>& keys = *cache.ckpt_keys;
    for (size_t k = 0; k < keys.size(); ++k)
      if (!(any[k / 8] >> (k % 8) & 1u)) all.unexpected.push_back(keys[k]);
    if (merged.ok()) merged = planner::encode_contract(all);
  }
  auto msg = bcast_outcome(merged, run.topo);
  if (!msg.ok()) return msg.status().with_context(run.where);
  H5CKPT_ASSIGN_OR_RETURN(cache.contract, planner::decode_contract(*msg));
  return Status::Ok();
}

// The coordinator resolves `latest` and reads metadata.json; every rank receives the same bytes,
// opens the data file and says whether its plan for exactly this checkpoint and request set is
// cached. One agreement settles that before anything else is read: when every rank's is, the
// phase ends there (no index image read, validated or shared). Otherwise the coordinator reads
// and validates the index image, every node gets one copy, each rank whose plan is not cached
// builds the metadata of the tensors it loads and checks its items against it, and a second
// agreement ends the phase. `*replan` says whether the plan must be made again.
Status resolve_metadata(LoadRun& run, const std::string& path, bool* replan, bool* host_only) {
  PhaseScope scope("load", "metadata");
  Result<std::string> text = std::string();
  if (run.coordinator()) text = read_metadata_message(path);
  auto msg = bcast_outcome(text, run.topo);
  if (!msg.ok()) return msg.status().with_context("load '" + path + "'");
  H5CKPT_ASSIGN_OR_RETURN(auto dir_meta, wire::decode_pair(*msg));
  const std::string& json = dir_meta.second;
  run.report.path = dir_meta.first;
  run.where = "load '" + run.report.path + "'";
  run.data_file = (fs::path(run.report.path) / storage::kDataFileName).string();

  Status local;
  auto r = storage::RegionReader::open(run.data_file);
  if (r.ok()) {
    run.reader.emplace(std::move(r).value());
    run.reader->set_verify(run.options.verify);
  } else {
    local = r.status();
  }
  run.report.open_s = now_s() - run.t0;
  if (local.ok() && run.pieces) local = run.pieces->status();  // an invalid multi-piece item
  run.wants = describe_wants(run.state);
  // The cache key (docs/design.md, "Plan caches"): the text of metadata.json (a v2
  // summary carries its own checksum and each index table's, so it covers the image too), this
  // rank's requests and load options, and the data file as this rank opened it (device, inode,
  // size, modification and change times): a data file written or replaced since the plan was made
  // could hold another index than the summary names, so it goes the full way and is validated.
  const uint64_t meta_hash = XXH3_64bits(json.data(), json.size());
  const uint64_t req_hash = request_hash(run.wants, run.options);
  LoadPlanCache& cache = run.cache;
  int flags[2] = {0, 1};  // {every rank planned this already, no device buffer anywhere}
  flags[0] = local.ok() && cache.info && cache.meta_hash == meta_hash && cache.request_hash == req_hash &&
             cache.data_identity == run.reader->identity();
  flags[1] = std::none_of(run.wants.begin(), run.wants.end(), [](const auto& w) { return w.on_device; });
  const bool mine_cached = flags[0] != 0;
  if (!mine_cached) cache = LoadPlanCache{};
  // Every rank takes the same path: one that skipped the index alone would leave the others in
  // the node-sharing collective.
  H5CKPT_RETURN_IF_ERROR(comm::agree(local, run.world(), flags, 2).with_context(run.where));
  *replan = flags[0] == 0;
  *host_only = flags[1] != 0;
  if (!*replan) return Status::Ok();

  auto keys = std::make_shared<std::vector<std::string>>();
  bool agreed = false;
  auto parsed = rank_metadata(run, json, !mine_cached, keys.get(), &agreed);
  if (agreed) return parsed.status().with_context(run.where);  // e.g. the coordinator's read of the index
  if (!parsed.ok()) {
    local = parsed.status();
  } else if (!mine_cached) {
    cache.info = std::make_shared<const CheckpointInfo>(std::move(parsed).value());
    // Every item is checked before any transfer, so no rank waits for bytes that never come: a
    // malformed item fails here; what the checkpoint cannot give goes into the contract, which
    // settle_contract merges over the ranks.
    cache.requested.assign((keys->size() + 7) / 8, 0);
    cache.skips.assign(run.wants.size(), 0);
    for (size_t i = 0; i < run.wants.size() && local.ok(); ++i) {
      const StateItem& it = run.state.items()[i];
      local = check_item_buffer(it);
      if (!local.ok()) {
        local = local.with_context(run.pieces ? run.pieces->context(i) : "key '" + it.key + "'");
        break;
      }
      const TensorInfo* t = cache.info->find(it.key);
      const planner::StoredTensor stored = t ? stored_of(*cache.info, it.key) : planner::StoredTensor{};
      const bool found = planner::check_contract_item(t ? &stored : nullptr,
                                                      {it.key, it.dtype, it.global_shape, it.allow_shape_mismatch},
                                                      run.options.convert_dtype, &cache.contract_mine);
      run.wants[i].skip = !found;
      cache.skips[i] = !found;
      if (!found) continue;
      const size_t at = static_cast<size_t>(std::lower_bound(keys->begin(), keys->end(), it.key) - keys->begin());
      if (at < keys->size() && (*keys)[at] == it.key)
        cache.requested[at / 8] |= static_cast<unsigned char>(1u << (at % 8));
    }
    planner::normalize_contract(cache.contract_mine);
    cache.ckpt_keys = std::move(keys);
    if (local.ok()) {
      cache.meta_hash = meta_hash;
      cache.request_hash = req_hash;
      cache.data_identity = run.reader->identity();
    }
  }
  H5CKPT_RETURN_IF_ERROR(comm::agree(local, run.world()).with_context(run.where));
  // A rank whose own request was cached checked it last time: its skips come from the cache.
  for (size_t i = 0; i < run.wants.size() && i < cache.skips.size(); ++i) run.wants[i].skip = cache.skips[i] != 0;
  if (Status settled = settle_contract(run); !settled.ok()) {
    cache = LoadPlanCache{};  // never reused with a contract that was not settled
    return settled;
  }
  return Status::Ok();
}

// ---- Phase 2: the plan --------------------------------------------------------------------

// The coordinator gathers every rank's requests up the tree, plans, and scatters each rank its
// roles and whether any rank has device items or device replicas to move. One agreement.
Result<std::vector<planner::ItemRole>> plan_roles(LoadRun& run, int device_flags[2], bool zero_redundancy) {
  std::vector<wire::LoadRequestEntry> mine(run.wants.size());
  for (size_t i = 0; i < run.wants.size(); ++i) {
    mine[i].skip = run.wants[i].skip;
    mine[i].on_device = run.wants[i].on_device;
    if (!mine[i].skip) mine[i].request = planner::make_request(run.wants[i]);
  }
  H5CKPT_ASSIGN_OR_RETURN(auto gathered, run.topo.gather(wire::encode_requests(mine)));
  std::vector<std::string> parts;
  if (run.coordinator()) {
    const size_t world = gathered.size();
    const Result<wire::GatheredRequests> in = wire::decode_gathered_requests(gathered);  // views into `gathered`
    const bool decoded = in.ok();
    planner::LoadPlan plan;
    planner::RoleTable roles;
    int flags[2] = {0, 0};
    if (decoded) {
      plan = planner::plan_load(in->requests, zero_redundancy);
      roles = planner::assign_roles(plan, in->item_of, in->items);
      for (size_t r = 0; r < world; ++r)
        for (size_t i = 0; i < roles.items(r); ++i)
          if (const int32_t g = roles.group(r, i); g >= 0 && in->on_device[r][i]) {
            flags[0] = 1;
            if (plan.crosses_ranks(static_cast<size_t>(g))) flags[1] = 1;  // a replica to send or receive
          }
    }
    for (size_t r = 0; r < world; ++r) {
      // A rank whose requests did not decode gets no roles: its own check below fails the load.
      std::string part = decoded ? wire::encode_roles(plan, roles, r) : std::string();
      part.push_back(static_cast<char>(flags[0]));
      part.push_back(static_cast<char>(flags[1]));
      parts.push_back(std::move(part));
    }
  }
  H5CKPT_ASSIGN_OR_RETURN(std::string down, run.topo.scatter(parts));
  Result<std::vector<planner::ItemRole>> roles = Status(ErrorCode::kInternal, "malformed load plan message");
  if (down.size() >= 2) {
    device_flags[0] = down[down.size() - 2];
    device_flags[1] = down[down.size() - 1];
    down.resize(down.size() - 2);
    roles = wire::decode_roles(down);
  }
  Status ok = !roles.ok()                         ? roles.status()
              : roles->size() != run.wants.size() ? Status(ErrorCode::kInternal, "load plan does not match the state")
                                                  : Status::Ok();
  H5CKPT_RETURN_IF_ERROR(comm::agree(ok, run.world()).with_context(run.where));  // no rank leaves alone
  return roles;
}

// Collective, the first time any rank has device replicas to move: makes the device transport.
// Every rank ends with one or none does (device replicas then go over MPI via host staging).
Status link_devices(LoadRun& run) {
  DeviceLink& link = run.link;
  if (!link.tried) {
    link.tried = true;
    std::string why;
    link.transport = device::make_device_transport(run.world(), device::staging(), &why);
    int have = link.transport != nullptr;
    H5CKPT_RETURN_IF_ERROR(comm::agree(Status::Ok(), run.world(), &have));
    if (!have) {
      link.transport.reset();
      if (run.coordinator())
        logging::log().warn("no device transport ({}): device replicas are exchanged over MPI through host memory",
                            why.empty() ? "another rank has none" : why);
    }
  }
  run.cache.device_transport = link.transport != nullptr;
  return Status::Ok();
}

// The plan of this rank: roles from the coordinator, or, for two-phase reads, every wanted item
// read by this rank (the aggregation reads each byte once).
Status plan_reads(LoadRun& run, bool host_only) {
  PhaseScope scope("load", "plan");
  LoadPlanCache& cache = run.cache;
  const CheckpointInfo& info = *cache.info;
  std::vector<planner::StoredTensor> stored(run.wants.size());
  for (size_t i = 0; i < run.wants.size(); ++i)
    if (!run.wants[i].skip) stored[i] = stored_of(info, run.wants[i].desc.key);
  cache.aggregated = run.options.aggregate_reads && host_only && run.topo.world.size() > 1;
  std::vector<planner::ItemRole> roles(run.wants.size());
  if (cache.aggregated) {
    for (size_t i = 0; i < roles.size(); ++i)
      if (!run.wants[i].skip) roles[i].role = Role::kRead;
  } else {
    int device_flags[2] = {0, 0};  // {device items anywhere, device replicas to move anywhere}
    H5CKPT_ASSIGN_OR_RETURN(roles, plan_roles(run, device_flags, run.options.zero_redundancy));
    cache.any_device = device_flags[0] != 0;
    if (device_flags[1]) H5CKPT_RETURN_IF_ERROR(link_devices(run));
    // Under a memory budget, device replicas moved over MPI would have to be staged whole in host
    // memory on both sides: without a device transport every rank reads its own device items
    // instead (same decision on every rank: the budget and the link outcome are the same).
    if (device_flags[1] && run.copts.memory_bytes && !run.link.transport) {
      H5CKPT_ASSIGN_OR_RETURN(roles, plan_roles(run, device_flags, /*zero_redundancy=*/false));
      cache.any_device = device_flags[0] != 0;
    }
  }
  // File order needs tags that tell the groups apart; a device transport matches by order only.
  int groups = 0;
  for (const auto& r : roles) groups = std::max(groups, r.group + 1);
  const bool file_order = groups <= kTagSpace && !cache.device_transport;
  cache.plan = planner::plan_rank_load(roles, run.wants, stored, file_order);
  return Status::Ok();
}

// ---- Phase 3 (optional): re-read and check every saved region's checksum -------------------

Status verify_regions(LoadRun& run) {
  PhaseScope scope("load", "verify");
  CheckpointInfo located = *run.cache.info;
  located.data_file = run.data_file;
  Status local = verify_checkpoint(located, run.topo.world.rank(), run.topo.world.size());
  return comm::agree(local, run.world()).with_context(run.where);
}

// ---- Phase 4: execute -----------------------------------------------------------------------

uint64_t item_bytes(const StateItem& it) { return static_cast<uint64_t>(it.shard.numel()) * dtype_size(it.dtype); }

// Reads one kRead item's boxes into `dst` (laid out as the item's shard, in its dtype).
Status read_boxes(const CheckpointInfo& info, storage::RegionReader& reader, const StateItem& item, const ReadItem& r,
                  void* dst) {
  const TensorInfo* t = info.find(item.key);
  if (r.zero_fill) std::memset(dst, 0, item_bytes(item));
  const planner::Frame frame = planner::frame_of(item.shard);
  for (const Box& box : r.boxes) H5CKPT_RETURN_IF_ERROR(reader.read(*t, box, frame, item.dtype, dst));
  return Status::Ok();
}

// Under a memory budget: reads one kRead device item through two host slots of `slot_bytes`,
// a window of the item's buffer at a time (a flat element range of its layout, so any budget that
// holds one element progresses): window k is read into slot k % 2 while window k - 1 goes up to
// the device. Returns once every copy of the item has completed.
Status stream_to_device(const CheckpointInfo& info, storage::RegionReader& reader, const StateItem& item,
                        const ReadItem& r, char* slots, uint64_t slot_bytes, device::Staging& dev) {
  const TensorInfo* t = info.find(item.key);
  const uint64_t es = dtype_size(item.dtype);
  const int64_t n = item.shard.numel();
  const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(slot_bytes / es));
  const int64_t base = item.shard.flat ? item.shard.flat->first : 0;
  uint64_t marker[2] = {0, 0};
  int s = 0;
  for (int64_t a = 0; a < n; a += per, s ^= 1) {
    const int64_t b = std::min(n, a + per);
    const uint64_t bytes = static_cast<uint64_t>(b - a) * es;
    H5CKPT_RETURN_IF_ERROR(dev.wait(marker[s]));  // the slot's previous window is on the device
    char* buf = slots + s * slot_bytes;
    if (r.zero_fill) std::memset(buf, 0, bytes);
    const ShardSpec window = ShardSpec::flat_range(item.shard.box, base + a, base + b);
    const planner::Frame frame = planner::frame_of(window);
    for (const Box& piece : planner::shard_boxes(window))
      for (const Box& box : r.boxes)
        if (auto p = planner::intersect(piece, box))
          H5CKPT_RETURN_IF_ERROR(reader.read(*t, *p, frame, item.dtype, buf));
    H5CKPT_RETURN_IF_ERROR(dev.copy_to_device(static_cast<char*>(item.data) + a * es, buf, bytes));
    marker[s] = dev.record();
  }
  return dev.wait(std::max(marker[0], marker[1]));
}

// Two-phase reads of every item: the file pieces each item wants go to aggregated_read; items
// stored in another dtype land in a buffer of the stored dtype first and are converted after;
// verified spans land in a buffer of whole blocks, are checked, then copied out. Those buffers
// ("units") are scratch memory: without a memory budget all of them exist at once and one
// aggregated read fills them; under a budget the read's window buffers take at most half of it,
// the rest holds units, and the units are read in rounds that fit it (verified spans split
// into whole blocks), every rank taking part in as many rounds as the rank that needs most.
// The steps, in order: collect_units, pack_rounds, allocate_scratch, then per round read_round,
// convert_round and check_round.
struct AggregatedLoad {
  // A scratch buffer of one round: a whole item in its stored dtype (converted after the read),
  // or one checked span (checked, then copied out).
  struct Unit {
    int item;
    const ReadItem* read;
    const TensorInfo* tensor;
    bool convert;  // a whole item in its stored dtype (else a checked span)
    storage::CheckedSpan span;
    Box want;
    uint64_t bytes;  // scratch bytes
    char* buf = nullptr;
  };

  explicit AggregatedLoad(LoadRun& r)
      : run(r),
        info(*r.cache.info),
        budget(r.copts.memory_bytes),
        // Under a budget: the window buffers take at most half of it, the rest for units.
        window(budget ? std::max<uint64_t>(64, std::min(r.options.read_window_bytes, budget / (2 * kReadWindowBuffers)))
                      : r.options.read_window_bytes),
        room(budget ? budget - kReadWindowBuffers * window : UINT64_MAX) {}

  LoadRun& run;
  const CheckpointInfo& info;
  const uint64_t budget;
  const uint64_t window;         // bytes of each read window
  const uint64_t room;           // scratch bytes for the units of one round
  std::vector<ReadPiece> plain;  // straight into the caller's buffers (read in the first round)
  std::vector<Unit> units;
  std::vector<size_t> round_end;  // units [round_end[k-1], round_end[k]) form round k
  uint64_t most = 0;              // scratch bytes of the largest round
  Status prep;                    // a span that could not be computed while collecting
  Status local;
  // The scratch without a budget: uninitialized (a checked span is read whole, a converted item
  // zeroed first) and, when large, in huge pages (planner::BulkBuffer). It is about the rank's
  // share of the checkpoint: zero-filled 4 KiB pages (a std::vector) took 3.7-4.2 s per rank for
  // 273 MB at 4 ranks on the 2-core VM, longer than the read (docs/performance.md).
  planner::BulkBuffer heap;
  MemoryBudget::Lease heap_lease;
  char* scratch = nullptr;
  char* slots = nullptr;
  std::optional<detail::WorkPool> checks;  // made for the first round with checked spans
  std::atomic<uint64_t> check_ns{0};

  static void want_pieces(std::vector<ReadPiece>& out, const ReadItem& r, const Box& box, const planner::Frame& to,
                          char* base) {
    const uint64_t es = dtype_size(r.stored.dtype);
    const planner::Frame src{Box{Shape(r.stored.shape.size(), 0), r.stored.shape}, 0};
    planner::for_each_run(box, src, to, [&](int64_t si, int64_t di, int64_t count) {
      out.push_back({static_cast<uint64_t>(r.stored.file_offset) + static_cast<uint64_t>(si) * es,
                     static_cast<uint64_t>(count) * es, base + static_cast<uint64_t>(di) * es});
    });
  }

  // The pieces of item `r` that land in its buffer `dst` (the caller's, or a conversion unit's):
  // every box unverified, or the parts of unverified spans; verified spans become units when
  // `add_checked`.
  void item_pieces(std::vector<ReadPiece>& out, const ReadItem& r, char* dst, bool add_checked) {
    const StateItem& it = run.state.items()[r.item];
    const planner::Frame frame = planner::frame_of(it.shard);
    const TensorInfo* t = info.find(it.key);
    const uint64_t es = dtype_size(r.stored.dtype);
    for (const Box& box : r.boxes) {
      if (!run.options.verify) {
        if (dst) want_pieces(out, r, box, frame, dst);
        continue;
      }
      auto spans = storage::checked_spans(*t, box);
      if (!spans.ok()) {  // still take part in the collective reads below
        if (prep.ok()) prep = spans.status().with_context("key '" + it.key + "'");
        continue;
      }
      for (const auto& span : *spans) {
        if (!span.verified) {
          for (const Box& piece : storage::span_boxes(*t, span))
            if (auto p = planner::intersect(piece, box); p && dst) want_pieces(out, r, *p, frame, dst);
          continue;
        }
        if (add_checked) add_checked_span(r, t, span, box, es);
      }
    }
  }

  // A verified span as units: under a budget cut into runs of whole blocks that fit the scratch.
  void add_checked_span(const ReadItem& r, const TensorInfo* t, const storage::CheckedSpan& span, const Box& box,
                        uint64_t es) {
    const storage::RegionBlocks rb = storage::region_blocks(*t, t->regions[span.region]);
    const int64_t be = std::max<int64_t>(1, static_cast<int64_t>(rb.block_bytes / es));
    const int64_t step = budget ? std::max<int64_t>(1, static_cast<int64_t>((room - kStagingAlign) /
                                                                            std::max<uint64_t>(rb.block_bytes, 1))) *
                                      be
                                : span.end - span.begin;
    for (int64_t c0 = span.begin; c0 < span.end; c0 += step) {
      const storage::CheckedSpan chunk{span.region, c0, std::min(span.end, c0 + step), true, 0};
      units.push_back({r.item, &r, t, false, chunk, box, static_cast<uint64_t>(chunk.end - chunk.begin) * es});
    }
  }

  // Every planned item: its plain pieces, or a conversion unit, and its checked spans as units.
  void collect_units() {
    for (const ReadItem& r : run.cache.plan.items) {
      StateItem& it = run.state.items()[r.item];
      if (r.stored.file_offset < 0) continue;  // empty tensor
      if (r.stored.dtype != it.dtype) {        // the conversion unit comes before the item's checked spans
        units.push_back({r.item,
                         &r,
                         info.find(it.key),
                         true,
                         {},
                         {},
                         static_cast<uint64_t>(it.shard.numel()) * dtype_size(r.stored.dtype)});
        item_pieces(plain, r, nullptr, /*add_checked=*/true);  // only the checked units now
      } else {
        if (r.zero_fill) std::memset(it.data, 0, item_bytes(it));
        item_pieces(plain, r, static_cast<char*>(it.data), /*add_checked=*/true);
      }
    }
  }

  // Scratch: units packed in order into rounds of at most `room` bytes (units of one item stay in
  // order, so an item's conversion always precedes the copy-out of its checked spans). Each unit's
  // buf holds its offset in the scratch until allocate_scratch places it.
  void pack_rounds() {
    auto aligned = [](uint64_t n) { return align_up(std::max<uint64_t>(n, 1)); };
    uint64_t fill = 0;
    local = prep;
    for (size_t u = 0; u < units.size() && local.ok(); ++u) {
      const uint64_t need = aligned(units[u].bytes);
      if (need > room) {
        const StateItem& it = run.state.items()[units[u].item];
        local =
            Status(ErrorCode::kInvalidArgument,
                   "key '" + it.key + "': a two-phase read needs " + std::to_string(need) + " bytes at once (" +
                       (units[u].convert ? "its shard in the stored dtype, for conversion" : "one verification block") +
                       "), more than the " + std::to_string(room) + " bytes memory_bytes = " + std::to_string(budget) +
                       " leaves beside the read windows");
        break;
      }
      if (fill + need > room) {
        round_end.push_back(u);
        fill = 0;
      }
      units[u].buf = reinterpret_cast<char*>(static_cast<uintptr_t>(fill));  // an offset until placed
      fill += need;
      most = std::max(most, fill);
    }
    if (!units.empty()) round_end.push_back(units.size());
  }

  // The scratch and, under a budget, the windows: from the pool (its capacity is leased from the
  // budget); without a budget the scratch is one buffer leased for this load only.
  void allocate_scratch() {
    if (!local.ok()) return;
    if (budget) {
      run.pool.reserve(kReadWindowBuffers * window + most);
      if (run.pool.capacity() < kReadWindowBuffers * window + most)
        local = Status(ErrorCode::kIo,
                       "could not allocate " + std::to_string(kReadWindowBuffers * window + most) +
                           " bytes of read windows and buffers within memory_bytes = " + std::to_string(budget));
      slots = run.pool.base();
      scratch = slots + kReadWindowBuffers * window;
    } else if (most) {
      if (MemoryBudget* b = run.pool.budget(); b && b->try_reserve(most)) heap_lease = MemoryBudget::Lease(b, most);
      try {
        heap = planner::BulkBuffer(most);
      } catch (const std::bad_alloc&) {
        local = Status(ErrorCode::kIo, "could not allocate " + std::to_string(most) + " bytes of read scratch");
      }
      scratch = heap.data();
    }
  }

  // Round k's aggregated read (collective: every rank calls it every round, even after a failure):
  // the plain pieces in the first round, then the pieces of units [first, last).
  void read_round(int k, size_t first, size_t last) {
    std::vector<ReadPiece> pieces;
    if (k == 0) pieces = std::move(plain);
    for (size_t u = first; u < last; ++u) {
      Unit& unit = units[u];
      if (unit.convert) {
        std::memset(unit.buf, 0, unit.bytes);  // zero-filled padding rows convert to zeros
        item_pieces(pieces, *unit.read, unit.buf, /*add_checked=*/false);
      } else {
        const planner::Frame to = storage::span_frame(*unit.tensor, unit.span);
        for (const Box& piece : storage::span_boxes(*unit.tensor, unit.span))
          want_pieces(pieces, *unit.read, piece, to, unit.buf);
      }
    }
    auto done = budget ? aggregated_read(run.world(), run.data_file, std::move(pieces), window, slots)
                       : aggregated_read(run.world(), run.data_file, std::move(pieces), window, run.pool);
    if (!done.ok()) {
      if (local.ok()) local = done.status();
    } else {
      run.report.bytes_read += done->bytes_read;
      run.report.io_s += done->io_s;
      run.report.bytes_sent += done->bytes_sent;
      run.report.bytes_received += done->bytes_received;
    }
  }

  // Conversions first: they rewrite whole items.
  void convert_round(size_t first, size_t last) {
    for (size_t u = first; u < last && local.ok(); ++u) {
      const Unit& unit = units[u];
      StateItem& it = run.state.items()[unit.item];
      if (unit.convert && !detail::convert_elements(unit.buf, unit.tensor->dtype, it.data, it.dtype, it.shard.numel()))
        local = Status(ErrorCode::kDtypeMismatch, "key '" + it.key + "': cannot convert its stored dtype");
    }
  }

  // The round's checked spans, each checked and copied out as one job (in parallel: with an
  // authentication key each block's MAC is CPU-bound).
  void check_round(size_t first, size_t last) {
    if (!local.ok() || first >= last) return;
    if (!checks) checks.emplace(detail::default_threads(run.copts.verify_threads, run.topo.node.size()));
    auto group = checks->group();
    for (size_t u = first; u < last; ++u) {
      const Unit& unit = units[u];
      if (unit.convert) continue;
      StateItem& it = run.state.items()[unit.item];
      checks->submit(group, [&unit, &it, this] {
        const double t0 = now_s();
        Status st =
            storage::check_span(*unit.tensor, unit.span, unit.buf).with_context("key '" + unit.tensor->key + "'");
        if (st.ok())
          storage::copy_span_out(*unit.tensor, unit.span, unit.buf, unit.want, planner::frame_of(it.shard), it.dtype,
                                 it.data);
        check_ns += static_cast<uint64_t>((now_s() - t0) * 1e9);
        return st;
      });
    }
    checks->seal(group);
    local = checks->wait(group);
  }

  Status execute() {
    collect_units();
    pack_rounds();
    allocate_scratch();
    // Every rank learns the number of rounds (the most any rank needs) and any failure before any
    // transfer: a budget too small is the same error on every rank, at the start.
    int rounds = -static_cast<int>(round_end.size());  // agree() takes the minimum
    H5CKPT_RETURN_IF_ERROR(comm::agree(local, run.world(), &rounds).with_context(run.where));
    rounds = std::max(1, -rounds);
    for (Unit& u : units) u.buf = scratch + reinterpret_cast<uintptr_t>(u.buf);
    size_t first = 0;
    for (int k = 0; k < rounds; ++k) {
      const size_t last = k < static_cast<int>(round_end.size()) ? round_end[k] : first;
      read_round(k, first, last);
      convert_round(first, last);
      check_round(first, last);
      first = last;
    }
    run.report.verify_s = static_cast<double>(check_ns.load()) * 1e-9;
    run.report.verify_threads = checks ? checks->threads() : 0;
    run.report.io_threads = run.report.bytes_read > 0 ? 1 : 0;  // the aggregators' one reading helper
    run.report.read_s = now_s() - run.t0 - run.report.plan_s;
    return comm::agree(local, run.world()).with_context(run.where);
  }
};

Status execute_aggregated(LoadRun& run) {
  PhaseScope scope("load", "read");
  AggregatedLoad load(run);
  return load.execute();
}

// Per-item reads: post every receive, then read (reader threads, in the plan's read order) and
// send each item to its receivers as soon as it is read, so transfers overlap the next reads.
// Device items land in host staging from the pool and go to the device while later items are
// read; over a device transport, replicas are received straight into device memory.
// The steps, in order: place_landings, stage_device_items (agreed), post_receives, then the
// readers (read_worker) beside send_as_read, and finish_transfers.
struct PerItemLoad {
  explicit PerItemLoad(LoadRun& r)
      : run(r),
        cache(r.cache),
        info(*r.cache.info),
        plan(r.cache.plan.items),
        reads(r.cache.plan.read_order),
        mpi(comm::make_mpi_transport(r.world())),
        dev_transport(r.cache.device_transport ? r.link.transport.get() : nullptr),
        budget(r.copts.memory_bytes),
        staging(device::staging()) {}

  LoadRun& run;
  const LoadPlanCache& cache;
  const CheckpointInfo& info;
  const std::vector<ReadItem>& plan;
  const std::vector<size_t>& reads;  // plan entries in read order
  std::unique_ptr<comm::Transport> mpi;
  comm::Transport* dev_transport;
  const uint64_t budget;
  device::Staging& staging;
  // Where each plan entry's bytes land here: the caller's buffer, or host staging for a device
  // item that is read or received over MPI.
  std::vector<char*> landing;
  Status local;
  uint64_t staged_bytes = 0;
  bool any_streamed = false;
  int threads = 1;          // reader threads
  uint64_t slot_bytes = 0;  // each of a streaming reader's two slots
  // What the readers report, per read (in read order).
  std::vector<Status> read_status;
  std::vector<char> read_done;
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> extra_bytes{0};
  std::atomic<uint64_t> check_ns{0};
  std::atomic<uint64_t> io_ns{0}, copy_ns{0};  // the reader threads' pread and bounce-copy time
  std::optional<detail::WorkPool> checks;

  StateItem& item_of(const ReadItem& r) { return run.state.items()[r.item]; }
  bool over_device(const ReadItem& r) const { return r.on_device && dev_transport != nullptr; }
  comm::Transport& via(const ReadItem& r) { return over_device(r) ? *dev_transport : *mpi; }
  // Under a memory budget, device items this rank reads stream through two slots per reader
  // thread (stream_to_device) instead of being staged whole; the plan (plan_reads) leaves no
  // device bytes to stage for MPI transfers then.
  bool streamed(const ReadItem& r) const { return budget && r.on_device && r.role != Role::kReceive; }
  // A device item whose bytes land whole in host staging first.
  bool staged(const ReadItem& r) const {
    return !streamed(r) && r.on_device && !(r.role == Role::kReceive && dev_transport);
  }

  // Each entry's landing (the caller's buffer unless staged or streamed), and the reader threads
  // and their slots.
  void place_landings() {
    landing.resize(plan.size());
    for (size_t k = 0; k < plan.size(); ++k) {
      landing[k] = static_cast<char*>(item_of(plan[k]).data);
      if (streamed(plan[k])) {
        landing[k] = nullptr;
        any_streamed = any_streamed || plan[k].bytes > 0;
      } else if (staged(plan[k])) {
        staged_bytes += align_up(plan[k].bytes);
      }
    }
    const int wanted = run.copts.io_threads > 0 ? run.copts.io_threads : storage::default_io_threads(run.data_file);
    threads = std::max(1, std::min<int>(wanted, static_cast<int>(reads.size())));
    if (any_streamed) {  // two slots per reader thread, each at least kStagingAlign bytes
      threads = std::max(1, std::min<int>(threads, static_cast<int>(budget / (2 * kStagingAlign))));
      slot_bytes = budget / (2 * static_cast<uint64_t>(threads)) / kStagingAlign * kStagingAlign;
    }
  }

  // The host staging of device items, from the pool. The same on every rank: the staging outcome
  // is agreed before any transfer.
  Status stage_device_items() {
    if (!cache.any_device) return Status::Ok();
    if (budget && staged_bytes) {
      local = Status(ErrorCode::kInternal, "a load under memory_bytes would stage " + std::to_string(staged_bytes) +
                                               " bytes of device items whole");
    } else if (staged_bytes || any_streamed) {
      const uint64_t want = any_streamed ? 2 * threads * slot_bytes : staged_bytes;
      run.pool.reserve(want);
      if (run.pool.capacity() < want)
        local = Status(ErrorCode::kIo, "could not allocate " + std::to_string(want) +
                                           " bytes of host staging for device buffers" +
                                           (budget ? " within memory_bytes = " + std::to_string(budget) : ""));
    }
    H5CKPT_RETURN_IF_ERROR(comm::agree(local, run.world()).with_context(run.where));
    uint64_t off = 0;
    for (size_t k = 0; k < plan.size(); ++k)
      if (staged(plan[k])) {
        landing[k] = run.pool.base() + off;
        off += align_up(plan[k].bytes);
      }
    return Status::Ok();
  }

  void post_receives() {
    for (size_t k = 0; k < plan.size(); ++k) {
      if (plan[k].role != Role::kReceive) continue;
      Status s = via(plan[k]).post_recv(plan[k].reader, landing[k], plan[k].bytes, tag_of(plan[k].group));
      if (local.ok() && !s.ok()) local = s;
      run.report.bytes_received += plan[k].bytes;
    }
  }

  void report_item(size_t n, const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    read_status[n] = s.ok() ? s : s.with_context("key '" + item_of(plan[reads[n]]).key + "'");
    read_done[n] = 1;
    cv.notify_all();
  }

  // Block checks run on a pool while the readers read on (storage::RegionReader::defer_checks):
  // an item counts as read once its checks are done too. Not under a memory budget, whose
  // verification buffers are the reader's one chunk.
  void make_checks() {
    if (!run.options.verify || budget || !local.ok()) return;
    // One landing buffer per checker plus the one being filled: they stay few (and still in cache
    // when checked). Checks of chunks read in place hold no buffer and never hold up the reader.
    // The reader threads keep their cores: a checker beside them on an oversubscribed core slowed
    // a 1-rank load on 2 cores by 7% (verified / unverified 1.07-1.09 against 1.04 with one).
    const int n = detail::default_threads(run.copts.verify_threads, run.topo.node.size(), threads);
    checks.emplace(n, n + 1, /*batch=*/true);  // a woken checker must not take a reader's core
  }

  // A reader thread (`rdr`: the run's reader, or null to open its own file handle) takes the
  // next read of the plan's read order until none is left.
  void read_worker(storage::RegionReader* rdr, int index) {
    char* slots = any_streamed ? run.pool.base() + 2 * static_cast<uint64_t>(index) * slot_bytes : nullptr;
    PhaseScope scope("load", "read");  // a stuck read names its phase in the deadline report
    std::optional<storage::RegionReader> own;
    Status open_st;
    if (!rdr) {
      auto o = storage::RegionReader::open(run.data_file);
      if (o.ok()) {
        own.emplace(std::move(o).value());
        own->set_verify(run.options.verify);
      } else {
        open_st = o.status();
      }
      rdr = own ? &*own : nullptr;
    }
    for (size_t n; (n = next.fetch_add(1)) < reads.size();) {
      const ReadItem& r = plan[reads[n]];
      if (!rdr || streamed(r) || !checks) {  // checked on this thread (streamed: before its slot is reused)
        if (rdr) rdr->defer_checks({});
        report_item(n, !rdr          ? open_st
                       : streamed(r) ? stream_to_device(info, *rdr, item_of(r), r, slots, slot_bytes, staging)
                                     : read_boxes(info, *rdr, item_of(r), r, landing[reads[n]]));
        continue;
      }
      auto group = checks->group([this, n](const Status& s) { report_item(n, s); });
      rdr->defer_checks({&*checks, group, &check_ns});
      checks->seal(group, read_boxes(info, *rdr, item_of(r), r, landing[reads[n]]));
    }
    // Nothing left to read: this thread's core checks what is still queued (the last 64 MiB
    // chunk's jobs took one checker ~11 ms, 3% of a 1-rank load on the 2-core VM).
    if (checks) checks->help();
    if (rdr) {
      rdr->defer_checks({});
      check_ns += static_cast<uint64_t>(rdr->check_s() * 1e9);
      io_ns += static_cast<uint64_t>(rdr->io_s() * 1e9);
      copy_ns += static_cast<uint64_t>(rdr->copy_s() * 1e9);
    }
    if (own) extra_bytes += own->bytes_read();
  }

  // On this thread, in read order: waits for each item to be read (when readers run), copies a
  // staged device item up, and posts its sends.
  void send_as_read(bool readers_run) {
    for (size_t n = 0; n < reads.size(); ++n) {
      const size_t k = reads[n];
      const ReadItem& r = plan[k];
      if (readers_run) {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return read_done[n] != 0; });
        if (local.ok() && !read_status[n].ok()) local = read_status[n];
      }
      void* device_ptr = item_of(r).data;
      if (r.on_device && !streamed(r) && local.ok() && r.bytes > 0) {  // to the device while the next items are read
        Status s = staging.copy_to_device(device_ptr, landing[k], r.bytes);
        if (!s.ok()) local = s.with_context("key '" + item_of(r).key + "'");
      }
      // Send even after a failure, so the receivers are not left waiting; the agreement below fails
      // the whole load anyway. A device transport sends from device memory, after the copy above.
      const void* from = over_device(r) ? device_ptr : landing[k];
      for (int peer : r.receivers) {
        Status s = via(r).post_send(peer, from, r.bytes, tag_of(r.group));
        if (local.ok() && !s.ok()) local = s;
        run.report.bytes_sent += r.bytes;
      }
      (void)mpi->progress();
    }
  }

  // Reader threads (own file handles) read ahead in the plan's read order; this thread posts each
  // item's sends as soon as it is complete.
  void read_and_send() {
    read_status.assign(reads.size(), Status());
    read_done.assign(reads.size(), 0);
    make_checks();
    std::vector<std::thread> helpers;
    std::thread main_reader;
    if (local.ok()) {
      for (int t = 1; t < threads; ++t) helpers.emplace_back(&PerItemLoad::read_worker, this, nullptr, t);
      main_reader = std::thread(&PerItemLoad::read_worker, this, &*run.reader, 0);
    }
    const double t_plan = run.t0 + run.report.plan_s;
    send_as_read(main_reader.joinable());
    if (main_reader.joinable()) main_reader.join();
    for (auto& h : helpers) h.join();
    run.report.read_s = now_s() - t_plan;
  }

  // Waits for every transfer; received device items staged in host memory go up now.
  void finish_transfers() {
    Status done = mpi->wait_all();
    if (local.ok()) local = done;
    if (dev_transport) {
      done = dev_transport->wait_all();
      if (local.ok()) local = done;
    }
    if (cache.any_device) {
      for (size_t k = 0; k < plan.size() && local.ok(); ++k)
        if (plan[k].on_device && plan[k].role == Role::kReceive && !dev_transport && plan[k].bytes > 0)
          local = staging.copy_to_device(item_of(plan[k]).data, landing[k], plan[k].bytes);
      done = staging.synchronize();
      if (local.ok()) local = done;
    }
    run.report.bytes_read = (run.reader ? run.reader->bytes_read() : 0) + extra_bytes.load();
    run.report.verify_s = static_cast<double>(check_ns.load()) * 1e-9;
    run.report.io_s = static_cast<double>(io_ns.load()) * 1e-9;
    run.report.copy_s = static_cast<double>(copy_ns.load()) * 1e-9;
    run.report.verify_threads = checks ? checks->threads() : 0;
    run.report.io_threads = reads.empty() ? 0 : threads;
  }

  Status execute() {
    run.report.transport = dev_transport ? std::string(mpi->name()) + "+" + dev_transport->name() : mpi->name();
    place_landings();
    H5CKPT_RETURN_IF_ERROR(stage_device_items());
    post_receives();
    read_and_send();
    finish_transfers();
    return comm::agree(local, run.world()).with_context(run.where);
  }
};

Status execute_per_item(LoadRun& run) {
  PhaseScope scope("load", "read");
  PerItemLoad load(run);
  return load.execute();
}

// Times the end of a load (after its final agreement), records its metrics and logs it.
LoadReport finish(LoadRun& run) {
  LoadReport& report = run.report;
  const double t_end = now_s();
  report.exchange_s = t_end - run.t0 - report.plan_s - report.read_s;
  report.total_s = t_end - run.t0;
  if (run.copts.metrics) {
    const Status st = metrics::write_metrics(run.topo, "load", report.path,
                                             metrics::metrics_path(report.path, "load", run.copts.metrics_dir),
                                             metrics::from_report(report));
    if (!st.ok()) logging::log().warn("could not write load metrics: {}", st.to_string());
  }
  logging::log().info("loaded '{}': read {} bytes, sent {}, received {}: plan {:.3f}s{} read {:.3f}s exchange {:.3f}s",
                      report.path, report.bytes_read, report.bytes_sent, report.bytes_received, report.plan_s,
                      report.plan_cached ? " (cached)" : "", report.read_s, report.exchange_s);
  return std::move(report);
}

}  // namespace

Result<LoadReport> load(const Topology::Impl& topo, StateDict& state, const std::string& path,
                        const LoadOptions& options, const CheckpointerOptions& copts, LoadPlanCache& cache,
                        StagingPool& pool, DeviceLink& link) {
  // Multi-piece items load as one item per piece, each into its part of the caller's buffer.
  ExpandedState expanded(state);
  LoadRun run(topo, expanded.state(), options, copts, cache, pool, link);
  run.pieces = &expanded;
  if (static_cast<int>(options.strictness) > 2)
    return Status(ErrorCode::kInvalidArgument, "LoadOptions::strictness " +
                                                   std::to_string(static_cast<int>(options.strictness)) +
                                                   " is none of kIgnoreUnexpected, kRaiseAll, kAllowMissing")
        .with_context("load '" + path + "'");
  bool replan = true, host_only = true;
  H5CKPT_RETURN_IF_ERROR(resolve_metadata(run, path, &replan, &host_only));
  // The contract is the same on every rank (settle_contract), so is this decision: nothing has
  // been read yet, and a failing load names every problem at once.
  const planner::LoadContract& contract = cache.contract;
  run.report.missing_keys = contract.missing;
  run.report.unexpected_keys = contract.unexpected;
  if (options.check_only) {
    run.report.shape_mismatches = contract.shape;
    run.report.dtype_mismatches = contract.dtype;
    cache = LoadPlanCache{};  // nothing was planned: the next load plans
    run.report.plan_s = run.report.total_s = now_s() - run.t0;
    return std::move(run.report);
  }
  const LoadStrictness mode = strictness_of(options);
  if (Status c =
          planner::contract_status(contract, mode != LoadStrictness::kAllowMissing, mode == LoadStrictness::kRaiseAll);
      !c.ok()) {
    cache = LoadPlanCache{};
    return c.with_context(run.where);
  }
  if (replan) H5CKPT_RETURN_IF_ERROR(plan_reads(run, host_only));
  run.report.plan_cached = !replan;
  if (options.verify_checksums) H5CKPT_RETURN_IF_ERROR(verify_regions(run));
  run.report.plan_s = now_s() - run.t0;
  if (cache.aggregated) {
    run.report.transport = "mpi-aggregated";
    H5CKPT_RETURN_IF_ERROR(execute_aggregated(run));
  } else {
    H5CKPT_RETURN_IF_ERROR(execute_per_item(run));
  }
  return finish(run);
}

}  // namespace h5ckpt::engine
