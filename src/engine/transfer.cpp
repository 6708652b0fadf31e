// StateTransfer: the plan / checksums / exchange phases of engine/transfer.h.
#include "engine/transfer.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <deque>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "comm/comm.h"
#include "comm/deadline.h"
#include "comm/transport.h"
#include "device/staging.h"
#include "engine/engine.h"
#include "engine/memory_budget.h"
#include "engine/pieces.h"
#include "engine/wire.h"
#include "h5ckpt/transfer.h"
#include "logging/log.h"
#include "metrics/report.h"
#include "planner/box_math.h"
#include "planner/transfer_planner.h"
#include "storage/verify_blocks.h"
#include "util/bytes.h"
#include "util/checked_math.h"
#include "util/dtype_convert.h"
#include "util/phase.h"
#include "util/work_pool.h"

namespace h5ckpt {

namespace engine {
namespace {
std::mutex fault_mu;
int fault_rank = -1;
std::string fault_key;
std::atomic<double> backup_delay_s{0};
}  // namespace

void set_transfer_fault_for_testing(int src_rank, const std::string& key) {
  std::lock_guard<std::mutex> lock(fault_mu);
  fault_rank = key.empty() ? -1 : src_rank;
  fault_key = key;
}

void set_transfer_backup_delay_for_testing(double seconds) { backup_delay_s = seconds; }
}  // namespace engine

namespace {

using logging::now_s;
using planner::TransferPiece;

constexpr int kSumTag = 0x7101;
constexpr int kDataTag = 0x7102;
constexpr int kDeviceTag = 0x7103;  // pieces on the device transport (its MPI stand-in shares the world)
constexpr int kCoordinator = 0;
// Work handed to the pool's threads at a time: a few verification blocks (about 1 MiB each).
constexpr uint64_t kBlocksPerJob = 8;
constexpr uint64_t kCopyJobBytes = 8ull << 20;  // rows copied into the destination per job

bool fault_armed(int rank, const std::string& key) {
  std::lock_guard<std::mutex> lock(engine::fault_mu);
  return engine::fault_rank == rank && engine::fault_key == key;
}

// ---- Piece geometry: a piece's stream is its box in row-major order; blocks are whole rows ----

int64_t rows_of(const Box& b) { return b.shape.empty() ? 1 : b.shape[0]; }
uint64_t row_bytes(const Box& b, DType t) {
  return static_cast<uint64_t>(b.volume() / std::max<int64_t>(rows_of(b), 1)) * dtype_size(t);
}
Box sub_rows(const Box& b, int64_t r0, int64_t r1) {
  if (b.shape.empty()) return b;
  Box s = b;
  s.offset[0] += r0;
  s.shape[0] = r1 - r0;
  return s;
}

// What both ends of a piece derive from the plan alone.
struct PieceGeometry {
  uint64_t identity = 0;     // seeds the block checksums: key, source dtype and shape, the box
  uint64_t block_bytes = 0;  // whole rows, about storage::kVerifyBlockTarget
  uint64_t blocks = 0;
  uint64_t row = 0;  // bytes of one row of the box
};

PieceGeometry geometry_of(const std::string& key, const TransferPiece& p) {
  PieceGeometry g;
  const ShardSpec spec = ShardSpec::box_of(p.box.offset, p.box.shape);
  g.identity = storage::region_identity(key, p.src_dtype, p.src_shape, spec);
  g.row = row_bytes(p.box, p.src_dtype);
  g.block_bytes = std::max<uint64_t>(g.row, storage::choose_block_bytes(spec, p.src_dtype) / g.row * g.row);
  g.blocks = storage::block_count(p.bytes, g.block_bytes);
  return g;
}

// Byte range [begin, end) of a piece's stream, for consecutive moving blocks.
struct Run {
  uint64_t begin, end;
};

std::vector<Run> moving_runs(const std::vector<char>& moving, const PieceGeometry& g, uint64_t bytes) {
  std::vector<Run> runs;
  for (uint64_t b = 0; b < g.blocks; ++b) {
    if (!moving[b]) continue;
    const uint64_t lo = b * g.block_bytes, hi = std::min(bytes, lo + g.block_bytes);
    if (!runs.empty() && runs.back().end == lo) runs.back().end = hi;
    else runs.push_back({lo, hi});
  }
  return runs;
}

// Copies rows [r0, r1) of a piece out of a source item into `out` (stream order).
void gather_rows(const StateItem& src, const Box& box, int64_t r0, int64_t r1, char* out) {
  const Box sub = sub_rows(box, r0, r1);
  const uint64_t es = dtype_size(src.dtype);
  const char* base = static_cast<const char*>(src.data);
  planner::for_each_run(sub, planner::frame_of(src.shard), planner::Frame{sub, 0},
                        [&](int64_t si, int64_t di, int64_t n) { std::memcpy(out + di * es, base + si * es, n * es); });
}

// Writes rows [r0, r1) of a piece held in `in` (source dtype) into a destination item.
void scatter_rows(StateItem& dst, DType src_dtype, const Box& box, int64_t r0, int64_t r1, const char* in) {
  const Box sub = sub_rows(box, r0, r1);
  const uint64_t ses = dtype_size(src_dtype), des = dtype_size(dst.dtype);
  char* base = static_cast<char*>(dst.data);
  planner::for_each_run(
      sub, planner::Frame{sub, 0}, planner::frame_of(dst.shard), [&](int64_t si, int64_t di, int64_t n) {
        if (src_dtype == dst.dtype) std::memcpy(base + di * des, in + si * ses, n * des);  // any dtype
        else detail::convert_elements(in + si * ses, src_dtype, base + di * des, dst.dtype, static_cast<size_t>(n));
      });
}

// Where a box's row-major stream starts in a shard's buffer (in elements) when it is one
// contiguous run there, else -1: geometry only, so it serves device buffers and the coordinator.
int64_t one_run_start(const ShardSpec& shard, const Box& box) {
  int runs = 0;
  int64_t first = -1;
  planner::for_each_run(box, planner::frame_of(shard), planner::Frame{box, 0}, [&](int64_t si, int64_t, int64_t) {
    if (runs++ == 0) first = si;
  });
  return runs == 1 ? first : -1;
}

// The piece's start in the source buffer when its whole stream is one contiguous run there.
const char* contiguous_start(const StateItem& src, const Box& box) {
  const int64_t first = one_run_start(src.shard, box);
  return first >= 0 ? static_cast<const char*>(src.data) + first * dtype_size(src.dtype) : nullptr;
}

// Where a piece's stream starts in a destination buffer of the same dtype when the whole stream is
// one contiguous run there (it can then be received in place), else null.
char* contiguous_in(StateItem& dst, const TransferPiece& p) {
  if (p.src_dtype != dst.dtype) return nullptr;
  const int64_t first = one_run_start(dst.shard, p.box);
  return first >= 0 ? static_cast<char*>(dst.data) + first * dtype_size(dst.dtype) : nullptr;
}

// ---- Device buffers: pieces move through host memory (sums are computed and checked there) ----

// Starts the copies of a piece's stream (its box, row-major) from a device source item into
// `host`; complete once a marker recorded after them has been waited for.
Status copy_piece_to_host(device::Staging& staging, const StateItem& src, const Box& box, char* host) {
  const uint64_t es = dtype_size(src.dtype);
  const char* base = static_cast<const char*>(src.data);
  Status st;
  planner::for_each_run(box, planner::frame_of(src.shard), planner::Frame{box, 0},
                        [&](int64_t si, int64_t di, int64_t n) {
                          if (st.ok()) st = staging.copy_to_host(host + di * es, base + si * es, n * es);
                        });
  return st;
}

// A host item that holds exactly one piece's stream: the source side of every step below.
StateItem host_view(const StateItem& src, const TransferPiece& p, char* host) {
  StateItem v;
  v.key = src.key;
  v.dtype = src.dtype;
  v.global_shape = src.global_shape;
  v.shard = ShardSpec::box_of(p.box.offset, p.box.shape);
  v.data = host;
  return v;
}

// scatter_rows into a device item: the runs go up from `in` (converted first into a buffer added
// to `converted` when the dtypes differ; `in` and those buffers must live until the copies complete).
Status scatter_rows_to_device(device::Staging& staging, StateItem& dst, DType src_dtype, const Box& box, int64_t r0,
                              int64_t r1, const char* in, std::deque<std::vector<char>>& converted) {
  const Box sub = sub_rows(box, r0, r1);
  const uint64_t des = dtype_size(dst.dtype);
  if (src_dtype != dst.dtype) {
    converted.emplace_back(static_cast<size_t>(sub.volume()) * des);
    detail::convert_elements(in, src_dtype, converted.back().data(), dst.dtype, static_cast<size_t>(sub.volume()));
    in = converted.back().data();
  }
  char* base = static_cast<char*>(dst.data);
  Status st;
  planner::for_each_run(sub, planner::Frame{sub, 0}, planner::frame_of(dst.shard),
                        [&](int64_t si, int64_t di, int64_t n) {
                          if (st.ok()) st = staging.copy_to_device(base + di * des, in + si * des, n * des);
                        });
  return st;
}

// The sums of blocks [b0, b1) of a piece, from a host source item: each block on its own (its
// seed names it), so block ranges hash on different threads.
void hash_blocks(const StateItem& src, const TransferPiece& p, const PieceGeometry& g, uint64_t b0, uint64_t b1,
                 uint64_t* out) {
  const uint64_t es = dtype_size(src.dtype);
  const char* base = static_cast<const char*>(src.data);
  for (uint64_t b = b0; b < b1; ++b) {
    const uint64_t lo = b * g.block_bytes, hi = std::min(p.bytes, lo + g.block_bytes);
    const Box sub = sub_rows(p.box, static_cast<int64_t>(lo / g.row), static_cast<int64_t>(hi / g.row));
    storage::BlockHasher h(storage::block_seed(g.identity, b), g.block_bytes, hi - lo);
    planner::for_each_run(sub, planner::frame_of(src.shard), planner::Frame{sub, 0},
                          [&](int64_t si, int64_t, int64_t n) { h.update(base + si * es, n * es); });
    out[b] = h.finish()[0];
  }
}

// Queues the sums of a piece's blocks on `pool` into `out` (sized here), kBlocksPerJob at a time.
void submit_hashes(detail::WorkPool& pool, const std::shared_ptr<detail::WorkPool::Group>& group, const StateItem& src,
                   const TransferPiece& p, const PieceGeometry& g, std::vector<uint64_t>& out) {
  out.assign(g.blocks, 0);
  for (uint64_t b0 = 0; b0 < g.blocks; b0 += kBlocksPerJob)
    pool.submit(group, [&src, &p, &g, &out, b0] {
      hash_blocks(src, p, g, b0, std::min(g.blocks, b0 + kBlocksPerJob), out.data());
      return Status::Ok();
    });
}

// ---- Plan messages ----

void put_desc(ByteWriter& w, const planner::ItemDesc& d) {
  w.put_string(d.key);
  w.put<uint8_t>(static_cast<uint8_t>(d.dtype));
  w.put_vec(d.global_shape);
  engine::wire::put_shard(w, d.shard);
}
planner::ItemDesc get_desc(ByteReader& r) {
  planner::ItemDesc d;
  d.key = r.get_string();
  d.dtype = static_cast<DType>(r.get<uint8_t>());
  d.global_shape = r.get_vec();
  d.shard = engine::wire::get_shard(r);
  return d;
}

std::string encode_items(const StateDict* src, const StateDict* dst) {
  ByteWriter w;
  w.put<uint64_t>(src ? src->size() : 0);
  if (src)
    for (const auto& it : src->items()) {
      put_desc(w, {it.key, it.dtype, it.global_shape, it.shard});
      w.put<uint8_t>(device::is_device_item(it));
    }
  w.put<uint64_t>(dst ? dst->size() : 0);
  if (dst)
    for (const auto& it : dst->items()) {
      put_desc(w, {it.key, it.dtype, it.global_shape, it.shard});
      w.put<uint8_t>(it.allow_shape_mismatch);
      w.put<uint8_t>(device::is_device_item(it));
    }
  return std::move(w.str());
}

// One rank's items, and which of them are device buffers.
struct RankItems {
  std::vector<planner::ItemDesc> src;
  std::vector<planner::TransferWant> dst;
  std::vector<char> src_device, dst_device;
};

Status decode_items(const std::string& bytes, RankItems* out) {
  ByteReader r(bytes);
  const uint64_t ns = r.get_count(16);
  for (uint64_t i = 0; i < ns && r.ok(); ++i) {
    out->src.push_back(get_desc(r));
    out->src_device.push_back(r.get<uint8_t>() != 0);
  }
  const uint64_t nd = r.get_count(16);
  for (uint64_t i = 0; i < nd && r.ok(); ++i) {
    planner::TransferWant w{get_desc(r), false};
    w.pad = r.get<uint8_t>() != 0;
    out->dst.push_back(std::move(w));
    out->dst_device.push_back(r.get<uint8_t>() != 0);
  }
  if (!r.ok() || !r.at_end()) return Status(ErrorCode::kInternal, "malformed transfer request message");
  return Status::Ok();
}

// This rank's part of the plan: the pieces it sends or receives, its skipped items and their
// sources' rows, the number of rounds.
struct RankPlan {
  std::vector<TransferPiece> pieces;
  // Per piece: device buffer to device buffer, one contiguous run at both ends, same dtype,
  // between two ranks: it may go over the device transport (unhashed transfers).
  std::vector<char> device_ok;
  bool any_device_ok = false;  // on any rank: the device transport is worth setting up
  std::vector<int> skipped;
  std::vector<int64_t> source_rows;
  int rounds = 1;
};

std::string encode_rank_plan(const planner::TransferPlan& plan, int rank, const std::vector<size_t>& mine,
                             const std::vector<char>& device_ok) {
  ByteWriter w;
  w.put<int32_t>(plan.rounds);
  w.put<uint8_t>(std::count(device_ok.begin(), device_ok.end(), 1) > 0);
  w.put<uint64_t>(mine.size());
  for (size_t k : mine) {
    const TransferPiece& p = plan.pieces[k];
    for (int32_t v : {p.src_rank, p.src_item, p.dst_rank, p.dst_item, p.round}) w.put<int32_t>(v);
    w.put_vec(p.box.offset);
    w.put_vec(p.box.shape);
    w.put<uint8_t>(static_cast<uint8_t>(p.src_dtype));
    w.put_vec(p.src_shape);
    w.put<uint64_t>(p.bytes);
    w.put<uint8_t>(device_ok[k]);
  }
  w.put<uint64_t>(plan.skipped[rank].size());
  for (int s : plan.skipped[rank]) w.put<int32_t>(s);
  w.put_vec(plan.source_rows[rank]);
  return std::move(w.str());
}

Result<RankPlan> decode_rank_plan(const std::string& bytes) {
  RankPlan rp;
  ByteReader r(bytes);
  rp.rounds = r.get<int32_t>();
  rp.any_device_ok = r.get<uint8_t>() != 0;
  const uint64_t n = r.get_count(20);
  for (uint64_t k = 0; k < n && r.ok(); ++k) {
    TransferPiece p;
    p.src_rank = r.get<int32_t>();
    p.src_item = r.get<int32_t>();
    p.dst_rank = r.get<int32_t>();
    p.dst_item = r.get<int32_t>();
    p.round = r.get<int32_t>();
    p.box.offset = r.get_vec();
    p.box.shape = r.get_vec();
    p.src_dtype = static_cast<DType>(r.get<uint8_t>());
    p.src_shape = r.get_vec();
    p.bytes = r.get<uint64_t>();
    rp.pieces.push_back(std::move(p));
    rp.device_ok.push_back(r.get<uint8_t>() != 0);
  }
  const uint64_t ns = r.get_count(4);
  for (uint64_t k = 0; k < ns && r.ok(); ++k) rp.skipped.push_back(r.get<int32_t>());
  rp.source_rows = r.get_vec();
  if (!r.ok() || !r.at_end() || rp.rounds < 1) return Status(ErrorCode::kInternal, "malformed transfer plan message");
  return rp;
}

Status check_side(const StateDict* state, const engine::ExpandedState* expanded, const char* side) {
  if (!state) return Status::Ok();
  if (!expanded->status().ok()) return expanded->status().with_context(std::string(side) + " state");
  for (size_t i = 0; i < state->items().size(); ++i) {
    const StateItem& it = state->items()[i];
    const std::string ctx = std::string(side) + " " + expanded->context(i);
    if (Status st = engine::check_item_buffer(it); !st.ok()) return st.with_context(ctx);
  }
  return Status::Ok();
}

uint64_t local_signature(const StateDict* src, const StateDict* dst, const TransferOptions& o) {
  uint64_t v[7] = {src ? engine::structure_signature(*src) : 0,
                   dst ? engine::structure_signature(*dst) : 0,
                   static_cast<uint64_t>(src != nullptr) | static_cast<uint64_t>(dst != nullptr) << 1,
                   static_cast<uint64_t>(o.strict) | static_cast<uint64_t>(o.convert_dtype) << 1,
                   o.memory_bytes,
                   0,
                   0};
  if (dst) {
    std::string pads;
    for (const auto& it : dst->items()) pads.push_back(it.allow_shape_mismatch ? '1' : '0');
    v[5] = XXH3_64bits(pads.data(), pads.size());
  }
  return XXH3_64bits(v, sizeof v);
}

}  // namespace

struct StateTransfer::Impl {
  comm::Comm world;
  Status init;
  // The cached plan and the structure it was made for.
  bool planned = false;
  uint64_t signature = 0;
  RankPlan plan;
  // The last committed version and its block sums, per piece of `plan` (empty: not hashed).
  bool have_version = false;
  int64_t version = -1;
  std::vector<std::vector<uint64_t>> sums;
  // Staging reused between calls; `from_device`: device source pieces copied to host.
  std::vector<char> stage, pack, from_device;
  // Device buffer to device buffer without host staging (NCCL; made once, when a plan first has
  // such pieces, on every rank or none).
  std::unique_ptr<comm::Transport> device_link;
  bool device_tried = false;
  // Threads that hash, check and copy beside the thread driving MPI (made on first use).
  int ranks_here = 1;
  std::unique_ptr<detail::WorkPool> pool;
  detail::WorkPool& workers(int requested) {
    const int n = detail::default_threads(requested, ranks_here);
    if (!pool || pool->threads() != n) pool = std::make_unique<detail::WorkPool>(n, 1 << 20);  // submit never blocks
    return *pool;
  }

  MPI_Comm w() const { return world.get(); }
  int rank() const { return world.rank(); }

  Status make_plan(const StateDict* src, const StateDict* dst, const TransferOptions& options);
  Result<TransferReport> run(const StateDict* src, StateDict* dst, const TransferOptions& options);

  struct Call;
  struct Round;
};

Status StateTransfer::Impl::make_plan(const StateDict* src, const StateDict* dst, const TransferOptions& options) {
  PhaseScope scope("transfer", "plan");
  H5CKPT_ASSIGN_OR_RETURN(auto gathered, comm::gather_bytes(encode_items(src, dst), kCoordinator, w()));
  std::vector<std::string> parts;
  if (rank() == kCoordinator) {
    const size_t n = gathered.size();
    std::vector<RankItems> items(n);
    Status decoded;
    for (size_t r = 0; r < n && decoded.ok(); ++r) decoded = decode_items(gathered[r], &items[r]);
    std::vector<std::vector<planner::ItemDesc>> sources(n);
    std::vector<std::vector<planner::TransferWant>> dests(n);
    for (size_t r = 0; r < n; ++r) sources[r] = items[r].src, dests[r] = items[r].dst;
    planner::TransferPlanOptions po;
    po.strict = options.strict;
    po.convert_dtype = options.convert_dtype;
    po.round_bytes = options.memory_bytes;
    Result<planner::TransferPlan> plan = decoded;
    if (decoded.ok()) plan = planner::plan_transfer(sources, dests, po);
    std::vector<std::vector<size_t>> mine(n);
    std::vector<char> device_ok;
    if (plan.ok())
      for (size_t k = 0; k < plan->pieces.size(); ++k) {
        const TransferPiece& p = plan->pieces[k];
        mine[p.src_rank].push_back(k);
        if (p.dst_rank != p.src_rank) mine[p.dst_rank].push_back(k);
        const planner::ItemDesc& from = sources[p.src_rank][p.src_item];
        const planner::ItemDesc& to = dests[p.dst_rank][p.dst_item].desc;
        device_ok.push_back(p.src_rank != p.dst_rank && items[p.src_rank].src_device[p.src_item] &&
                            items[p.dst_rank].dst_device[p.dst_item] && from.dtype == to.dtype &&
                            one_run_start(from.shard, p.box) >= 0 && one_run_start(to.shard, p.box) >= 0);
      }
    for (size_t r = 0; r < n; ++r) {
      Result<std::string> part =
          plan.ok() ? Result<std::string>(encode_rank_plan(*plan, static_cast<int>(r), mine[r], device_ok))
                    : Result<std::string>(plan.status());
      parts.push_back(engine::wire::encode_outcome(part));
    }
  }
  H5CKPT_ASSIGN_OR_RETURN(std::string down, comm::scatter_bytes(parts, kCoordinator, w()));
  auto outcome = engine::wire::decode_outcome(down);
  Result<RankPlan> rp = outcome.ok() ? decode_rank_plan(*outcome) : Result<RankPlan>(outcome.status());
  Status local = rp.status();
  if (rp.ok() && rp->source_rows.size() != (dst ? dst->size() : 0))
    local = Status(ErrorCode::kInternal, "transfer plan does not match the destination state");
  H5CKPT_RETURN_IF_ERROR(comm::agree(local, w()));
  plan = std::move(rp).value();
  return Status::Ok();
}

// One transfer() call, in steps: plan (cached, agreed), agree_delta, checksums_first (deltas
// only), choose_moving_blocks, then per round exchange_round (place, post, check, agree, commit),
// zero_padding and finish.
struct StateTransfer::Impl::Call {
  Call(Impl& i, const StateDict* src_in, StateDict* dst_in, const TransferOptions& o, double start)
      : impl(i), options(o), t0(start), me(i.rank()) {
    // Multi-piece items move as one item per piece (the source is only read).
    if (src_in) src_holder.emplace(const_cast<StateDict&>(*src_in));
    if (dst_in) dst_holder.emplace(*dst_in);
    src = src_in ? &src_holder->state() : nullptr;
    dst = dst_in ? &dst_holder->state() : nullptr;
    report.version = options.version;
  }

  Impl& impl;
  const TransferOptions& options;
  const double t0;
  const int me;
  std::optional<engine::ExpandedState> src_holder, dst_holder;
  const StateDict* src = nullptr;
  StateDict* dst = nullptr;
  TransferReport report;
  const std::vector<TransferPiece>* pieces = nullptr;  // impl.plan.pieces, once planned
  size_t np = 0;
  std::vector<PieceGeometry> geo;
  bool hashed = false;      // sums are computed: to check the blocks (verify) or as the next delta's base
  bool sums_first = false;  // a delta: the sums move before the data (they decide which blocks move)
  std::vector<std::vector<uint64_t>> fresh;  // this version's sums, per piece
  std::vector<std::vector<Run>> runs;        // the moving byte runs, per piece
  double commit_s = 0;
  // Device buffers, per item: their pieces go through host memory.
  device::Staging& staging = device::staging();
  std::vector<char> src_on_device, dst_on_device;
  bool device_ordered = false;    // the caller's device work waited for (once, before the first read)
  bool commits_can_fail = false;  // some rank writes device buffers: commits are agreed too

  const StateItem& src_item(const TransferPiece& p) const { return src->items()[p.src_item]; }
  bool src_device(const TransferPiece& p) const { return src_on_device[p.src_item] != 0; }
  // Pieces received in place keep the bytes they overwrite, to put back on failure.
  bool keeps_previous() const { return options.verify && options.in_place && options.keep_previous; }
  bool dst_device(const TransferPiece& p) const { return dst_on_device[p.dst_item] != 0; }

  // Once per call, before the first device read: after the caller's work on device_stream.
  Status order_device_reads() {
    if (device_ordered) return Status::Ok();
    device_ordered = true;
    return staging.order_after(options.device_stream);
  }
  // Copies a device source piece's whole stream into `host` and waits for it.
  Status piece_from_device(const TransferPiece& p, char* host) {
    H5CKPT_RETURN_IF_ERROR(order_device_reads());
    H5CKPT_RETURN_IF_ERROR(copy_piece_to_host(staging, src_item(p), p.box, host));
    return staging.synchronize();
  }
  StateItem& dst_item(const TransferPiece& p) const { return dst->items()[p.dst_item]; }
  const std::string& key_of(const TransferPiece& p) const {
    return p.src_rank == me ? src_item(p).key : dst_item(p).key;
  }
  MPI_Comm w() const { return impl.w(); }

  // Both sides checked, then the cached plan reused or a new one made (one agreement).
  Status plan() {
    PhaseScope scope("transfer", "plan");
    Status local = engine::check_memory_bytes(options.memory_bytes);
    if (local.ok()) local = check_side(src, src ? &*src_holder : nullptr, "source");
    if (local.ok()) local = check_side(dst, dst ? &*dst_holder : nullptr, "destination");
    const uint64_t sig = local.ok() ? local_signature(src, dst, options) : 0;
    if (src)
      for (const StateItem& it : src->items()) src_on_device.push_back(device::is_device_item(it));
    if (dst)
      for (const StateItem& it : dst->items()) dst_on_device.push_back(device::is_device_item(it));
    // {plan cached on every rank, no device destination on any rank}
    int flags[2] = {local.ok() && impl.planned && impl.signature == sig,
                    std::count(dst_on_device.begin(), dst_on_device.end(), 1) == 0};
    H5CKPT_RETURN_IF_ERROR(comm::agree(local, w(), flags, 2).with_context("transfer"));
    const int cached = flags[0];
    commits_can_fail = flags[1] == 0;
    if (!cached) {
      impl.planned = false;
      impl.have_version = false;
      impl.sums.clear();
      H5CKPT_RETURN_IF_ERROR(impl.make_plan(src, dst, options).with_context("transfer"));
      impl.planned = true;
      impl.signature = sig;
    }
    report.plan_cached = cached != 0;
    if (impl.plan.any_device_ok) H5CKPT_RETURN_IF_ERROR(link_devices().with_context("transfer"));
    report.transport = impl.device_link ? std::string("mpi+") + impl.device_link->name() : "mpi";
    for (int s : impl.plan.skipped) report.missing_keys.push_back(dst->items()[s].key);
    report.rounds = impl.plan.rounds;
    pieces = &impl.plan.pieces;
    np = pieces->size();
    return Status::Ok();
  }

  // Collective, once: the device transport, on every rank or none (then device pieces go through
  // host memory over MPI, as verified ones always do).
  Status link_devices() {
    if (impl.device_tried) return Status::Ok();
    impl.device_tried = true;
    int have = staging.has_device();  // every rank must take part in the set-up, or none
    H5CKPT_RETURN_IF_ERROR(comm::agree(Status::Ok(), w(), &have));
    std::string why = "a rank has no GPU runtime";
    std::unique_ptr<comm::Transport> link;
    if (have) link = device::make_device_transport(w(), staging, &why);
    int linked = link != nullptr;
    H5CKPT_RETURN_IF_ERROR(comm::agree(Status::Ok(), w(), &linked));
    if (linked) impl.device_link = std::move(link);
    else if (me == 0)
      logging::log().warn("transfer: no device transport ({}): device pieces go through host memory over MPI",
                          why.empty() ? "another rank has none" : why);
    return Status::Ok();
  }
  // Piece k goes over the device transport: an unhashed transfer of a device-to-device piece.
  bool linked(size_t k) const { return impl.device_link && !hashed && impl.plan.device_ok[k]; }

  // A delta needs the same previous version, hashed, on every rank (and the plan unchanged).
  Status agree_delta() {
    PhaseScope scope("transfer", "plan");
    int64_t v[2] = {impl.have_version ? impl.version : LLONG_MIN, impl.have_version ? -impl.version : LLONG_MIN};
    int64_t all[2];
    MPI_Request req;
    H5CKPT_RETURN_IF_ERROR(
        comm::mpi_status(MPI_Iallreduce(v, all, 2, MPI_INT64_T, MPI_MIN, w(), &req), "MPI_Iallreduce"));
    H5CKPT_RETURN_IF_ERROR(comm::wait_asleep(1, &req, 100, "transfer version agreement", w()));
    report.delta =
        options.delta && all[0] != LLONG_MIN && all[1] != LLONG_MIN && all[0] == -all[1] && impl.sums.size() == np;
    return Status::Ok();
  }

  // A delta's sums before the data: each source hashes its pieces and sends the sums (one
  // agreement). A full transfer sends them after the data of each round, hashing while it moves.
  Status checksums_first() {
    geo.resize(np);
    for (size_t k = 0; k < np; ++k) geo[k] = geometry_of(key_of((*pieces)[k]), (*pieces)[k]);
    hashed = options.verify || options.delta;
    sums_first = hashed && report.delta;
    fresh.resize(np);
    if (!sums_first) return Status::Ok();
    PhaseScope scope("transfer", "checksums");
    auto mpi = comm::make_mpi_transport(w());
    Status local, copied;  // a failed device copy is agreed after the sums moved (no rank waits)
    detail::WorkPool& pool = impl.workers(options.threads);
    auto host_sums = pool.group();
    for (size_t k = 0; k < np; ++k) {
      const TransferPiece& p = (*pieces)[k];
      if (p.src_rank != me) fresh[k].resize(geo[k].blocks);
      else if (!src_device(p)) submit_hashes(pool, host_sums, src_item(p), p, geo[k], fresh[k]);
    }
    pool.seal(host_sums);
    for (size_t k = 0; k < np; ++k) {  // device pieces one at a time through host memory
      const TransferPiece& p = (*pieces)[k];
      if (p.src_rank != me || !src_device(p)) continue;
      if (impl.from_device.size() < p.bytes) impl.from_device.resize(p.bytes);
      if (copied.ok()) copied = piece_from_device(p, impl.from_device.data());
      const StateItem view = host_view(src_item(p), p, impl.from_device.data());
      auto one = pool.group();
      submit_hashes(pool, one, view, p, geo[k], fresh[k]);
      pool.seal(one);
      (void)pool.wait(one);
    }
    (void)pool.wait(host_sums);
    for (size_t k = 0; k < np && local.ok(); ++k) {
      const TransferPiece& p = (*pieces)[k];
      if (p.src_rank == p.dst_rank) continue;
      const uint64_t bytes = geo[k].blocks * sizeof(uint64_t);
      local = p.src_rank == me ? mpi->post_send(p.dst_rank, fresh[k].data(), bytes, kSumTag)
                               : mpi->post_recv(p.src_rank, fresh[k].data(), bytes, kSumTag);
    }
    Status done = mpi->wait_all();
    if (local.ok()) local = done;
    if (local.ok()) local = copied;
    return comm::agree(local, w()).with_context("transfer");
  }

  // Which blocks move: all of them, or with a delta those whose sum changed.
  void choose_moving_blocks() {
    runs.resize(np);
    for (size_t k = 0; k < np; ++k) {
      const TransferPiece& p = (*pieces)[k];
      std::vector<char> moving(geo[k].blocks, 1);
      if (report.delta)
        for (uint64_t b = 0; b < geo[k].blocks; ++b) moving[b] = fresh[k][b] != impl.sums[k][b];
      runs[k] = moving_runs(moving, geo[k], p.bytes);
      uint64_t moved = 0, blocks = 0;
      for (const Run& r : runs[k]) moved += r.end - r.begin;
      for (char m : moving) blocks += m != 0;
      if (p.src_rank == me) report.bytes_sent += moved, report.blocks_sent += blocks;
      if (p.dst_rank == me) {
        report.bytes_received += moved, report.blocks_received += blocks;
        report.bytes_total += p.bytes, report.blocks_total += geo[k].blocks;
      }
    }
  }

  Status exchange_round(int round);
  int plan_rounds() const { return impl.plan.rounds; }

  // A padded destination: rows past the sources' shape are zero.
  Status zero_padding() {
    if (!dst) return Status::Ok();
    std::vector<char> zeros;  // the source of device buffers' zeros
    Status st;
    for (size_t i = 0; i < dst->size() && st.ok(); ++i) {
      StateItem& it = dst->items()[i];
      const int64_t rows = impl.plan.source_rows[i];
      if (rows < 0 || it.global_shape.empty() || it.global_shape[0] <= rows) continue;
      const uint64_t es = dtype_size(it.dtype);
      for (const Box& b : planner::shard_boxes(it.shard)) {
        if (b.offset[0] + b.shape[0] <= rows) continue;
        const int64_t r0 = std::max<int64_t>(0, rows - b.offset[0]);
        const Box tail = sub_rows(b, r0, b.shape[0]);
        char* base = static_cast<char*>(it.data);
        if (dst_on_device[i]) zeros.resize(std::max<size_t>(zeros.size(), tail.volume() * es));
        planner::for_each_run(tail, planner::Frame{tail, 0}, planner::frame_of(it.shard),
                              [&](int64_t, int64_t di, int64_t n) {
                                if (!dst_on_device[i]) std::memset(base + di * es, 0, n * es);
                                else if (st.ok()) st = staging.copy_to_device(base + di * es, zeros.data(), n * es);
                              });
      }
    }
    if (zeros.empty()) return st;
    Status done = staging.synchronize();
    return st.ok() ? done : st;
  }

  // The new version's sums become the base of the next delta.
  TransferReport finish() {
    if (hashed) {
      impl.sums = std::move(fresh);
      impl.have_version = true;
    } else {
      impl.sums.clear();
      impl.have_version = false;
    }
    impl.version = options.version;
    report.total_s = now_s() - t0;
    logging::log().debug("transfer version {}: sent {} bytes, received {} of {} ({} of {} blocks){}", options.version,
                         report.bytes_sent, report.bytes_received, report.bytes_total, report.blocks_received,
                         report.blocks_total, report.delta ? " (delta)" : "");
    return std::move(report);
  }
};

// One round of the exchange: where each piece's bytes are staged, sent from and received into.
struct StateTransfer::Impl::Round {
  Round(Call& c, int r)
      : call(c),
        round(r),
        stage_at(c.np, 0),
        backup_at(c.np, kNone),
        backed_up(new std::atomic<bool>[c.np]()),
        pack_at(c.np, UINT64_MAX),
        send_from(c.np, nullptr),
        direct(c.np, nullptr),
        pending(c.np, 0) {}

  Call& call;
  const int round;
  static constexpr uint64_t kNone = UINT64_MAX;
  // Staging: received runs (and a piece sent to itself) in `stage`; sends that are not one
  // contiguous run of the source buffer (or that the fault hook corrupts) packed in `pack`.
  std::vector<uint64_t> stage_at;
  // In-place pieces with TransferOptions::keep_previous: where in `stage` the bytes they overwrite
  // are kept (kNone: not kept), and whether that copy is done (their receives wait for it).
  std::vector<uint64_t> backup_at;
  std::unique_ptr<std::atomic<bool>[]> backed_up;
  std::shared_ptr<detail::WorkPool::Group> backups;
  size_t next_recv = 0;  // receives are posted in piece order, up to the first piece not backed up
  std::vector<uint64_t> pack_at;
  std::vector<const char*> send_from;
  // Unverified and in-place transfers receive straight into the destination where a piece is one
  // contiguous run of it in the source dtype (no staging, no copy after the check).
  std::vector<char*> direct;
  // Device source pieces of this round, copied into impl.from_device: host items of their stream.
  std::vector<std::optional<StateItem>> views;
  uint64_t from_device_bytes = 0;
  // A failed device copy fails the round at its agreement; every message is still posted, so no
  // rank waits for one that never comes.
  Status copied;
  // The round's messages, each with the piece whose arrival it completes (-1: a send); a piece's
  // blocks are checked as soon as its data and sums are in, while the rest still moves.
  std::vector<MPI_Request> requests;
  std::vector<int64_t> request_piece;
  std::vector<int> pending;  // per piece: receives not yet complete
  Status local;

  void post(bool send, int peer, const char* data, uint64_t bytes, int tag, int64_t k) {
    for (uint64_t off = 0; off < bytes && local.ok(); off += comm::chunk_limit()) {
      const int n = static_cast<int>(std::min(comm::chunk_limit(), bytes - off));
      MPI_Request req;
      local = send ? comm::mpi_status(MPI_Isend(data + off, n, MPI_BYTE, peer, tag, call.w(), &req), "MPI_Isend")
                   : comm::mpi_status(MPI_Irecv(const_cast<char*>(data) + off, n, MPI_BYTE, peer, tag, call.w(), &req),
                                      "MPI_Irecv");
      if (!local.ok()) break;
      requests.push_back(req);
      request_piece.push_back(send ? -1 : k);
      if (!send) ++pending[k];
    }
  }

  bool in_round(size_t k) const { return (*call.pieces)[k].round == round; }
  const StateItem& source(size_t k) const { return views[k] ? *views[k] : call.src_item((*call.pieces)[k]); }

  // This round's device source pieces that move, whole, into host memory (counted as staging,
  // as packed sends are in the plan's rounds).
  // A device source piece of this round that moves through host memory.
  bool copied_down(size_t k) const {
    const TransferPiece& p = (*call.pieces)[k];
    return in_round(k) && p.src_rank == call.me && !call.runs[k].empty() && call.src_device(p) && !call.linked(k);
  }
  void copy_device_sources() {
    views.resize(call.np);
    uint64_t bytes = 0;
    std::vector<uint64_t> at(call.np, 0);
    for (size_t k = 0; k < call.np; ++k) {
      const TransferPiece& p = (*call.pieces)[k];
      if (!copied_down(k)) continue;
      at[k] = bytes;
      bytes += p.bytes;
    }
    from_device_bytes = bytes;
    if (bytes == 0) return;
    if (call.impl.from_device.size() < bytes) call.impl.from_device.resize(bytes);
    copied = call.order_device_reads();
    for (size_t k = 0; k < call.np; ++k) {
      const TransferPiece& p = (*call.pieces)[k];
      if (!copied_down(k)) continue;
      char* host = call.impl.from_device.data() + at[k];
      views[k] = host_view(call.src_item(p), p, host);  // never the device buffer, even after a failure
      if (copied.ok()) copied = copy_piece_to_host(call.staging, call.src_item(p), p.box, host);
    }
    Status done = call.staging.synchronize();
    if (copied.ok()) copied = done;
  }
  char* landing(size_t k, uint64_t stage_offset, uint64_t run_begin) {
    return direct[k] ? direct[k] + run_begin : call.impl.stage.data() + stage_offset;
  }

  void place() {
    const int me = call.me;
    uint64_t stage_bytes = 0, pack_bytes = 0;
    for (size_t k = 0; k < call.np; ++k) {
      const TransferPiece& p = (*call.pieces)[k];
      if (!in_round(k) || call.runs[k].empty() || call.linked(k)) continue;
      if (p.dst_rank == me && (!call.options.verify || call.options.in_place) && !call.dst_device(p))
        direct[k] = contiguous_in(call.dst_item(p), p);
      if (p.dst_rank == me && !direct[k]) {
        stage_at[k] = stage_bytes;
        for (const Run& r : call.runs[k]) stage_bytes += r.end - r.begin;
      }
      if (p.dst_rank == me && direct[k] && call.keeps_previous()) {
        backup_at[k] = stage_bytes;
        for (const Run& r : call.runs[k]) stage_bytes += r.end - r.begin;
      }
      if (p.src_rank == me && p.dst_rank != me) {
        send_from[k] = fault_armed(me, call.src_item(p).key) ? nullptr : contiguous_start(source(k), p.box);
        if (!send_from[k]) {
          pack_at[k] = pack_bytes;
          pack_bytes += p.bytes;
        }
      }
    }
    if (call.impl.stage.size() < stage_bytes) call.impl.stage.resize(stage_bytes);
    if (call.impl.pack.size() < pack_bytes) call.impl.pack.resize(pack_bytes);
    call.report.memory_peak_bytes =
        std::max(call.report.memory_peak_bytes, stage_bytes + pack_bytes + from_device_bytes);
  }

  // Piece k's previous bytes (its moving runs, in place) into `stage`, or back (`restore`).
  void copy_backup(size_t k, bool restore) {
    uint64_t at = backup_at[k];
    for (const Run& r : call.runs[k]) {
      char* kept = call.impl.stage.data() + at;
      char* held = direct[k] + r.begin;
      if (restore) std::memcpy(held, kept, r.end - r.begin);
      else std::memcpy(kept, held, r.end - r.begin);
      at += r.end - r.begin;
    }
  }
  bool waits_for_backup(size_t k) const {
    const TransferPiece& p = (*call.pieces)[k];
    return backup_at[k] != kNone && p.src_rank != call.me && !backed_up[k].load();
  }
  // After a failed round (every backup job done): the pieces received in place get their
  // previous bytes back.
  void restore_previous() {
    for (size_t k = 0; k < call.np; ++k)
      if (backup_at[k] != kNone && backed_up[k].load()) copy_backup(k, true);
  }

  // Receives first (sums sent after their data, then the data), then this rank's sends. The
  // backups of in-place pieces run on the pool while earlier pieces are on the wire.
  void post_receives(bool sums_after) {
    for (size_t k = 0; k < call.np && local.ok() && sums_after; ++k) {
      const TransferPiece& p = (*call.pieces)[k];
      if (!receives(k)) continue;
      call.fresh[k].resize(call.geo[k].blocks);
      post(false, p.src_rank, reinterpret_cast<const char*>(call.fresh[k].data()),
           call.geo[k].blocks * sizeof(uint64_t), kSumTag, static_cast<int64_t>(k));
    }
    // Every piece this rank receives over MPI is held (one pending count more) until its data
    // receives are posted: a piece waiting behind an undo copy must not look complete on its sums.
    for (size_t k = 0; k < call.np; ++k)
      if (receives_data(k)) ++pending[k];
    detail::WorkPool& pool = call.impl.workers(call.options.threads);
    backups = pool.group();
    for (size_t k = 0; k < call.np; ++k) {
      if (backup_at[k] == kNone || (*call.pieces)[k].src_rank == call.me) continue;
      pool.submit(backups, [this, k] {
        if (const double d = engine::backup_delay_s.load(); d > 0)
          std::this_thread::sleep_for(std::chrono::duration<double>(d));
        copy_backup(k, false);
        backed_up[k] = true;  // after the copy: its receives may be posted now
        return Status::Ok();
      });
    }
    pool.seal(backups);
    post_ready_receives();
  }

  // Piece k comes from another rank in this round (over MPI or the device link).
  bool receives(size_t k) const {
    const TransferPiece& p = (*call.pieces)[k];
    return in_round(k) && p.dst_rank == call.me && p.src_rank != call.me;
  }
  bool receives_data(size_t k) const { return receives(k) && !call.linked(k); }  // over MPI, counted in pending

  // Data receives in piece order (MPI matches one source's messages of a tag in posting order),
  // stopping at a piece whose backup is not done yet; called again as backups finish.
  void post_ready_receives() {
    for (; next_recv < call.np && local.ok() && !waits_for_backup(next_recv); ++next_recv) {
      const size_t k = next_recv;
      const TransferPiece& p = (*call.pieces)[k];
      if (!receives(k)) continue;
      if (call.linked(k)) {                             // device to device: straight into the destination's run
        char* to = contiguous_in(call.dst_item(p), p);  // pointer arithmetic only: marked by the plan
        for (const Run& r : call.runs[k])
          if (local.ok())
            local = call.impl.device_link->post_recv(p.src_rank, to + r.begin, r.end - r.begin, kDeviceTag);
        continue;
      }
      uint64_t at = stage_at[k];
      for (const Run& r : call.runs[k]) {
        post(false, p.src_rank, landing(k, at, r.begin), r.end - r.begin, kDataTag, static_cast<int64_t>(k));
        at += r.end - r.begin;
        if (!local.ok()) break;
      }
      --pending[k];  // the hold of post_receives (its data receives count now)
    }
  }
  bool receives_posted() const { return next_recv == call.np || !local.ok(); }

  void post_sends() {
    std::vector<char>& stage = call.impl.stage;
    for (size_t k = 0; k < call.np && local.ok(); ++k) {
      const TransferPiece& p = (*call.pieces)[k];
      const std::vector<Run>& runs = call.runs[k];
      if (!in_round(k) || p.src_rank != call.me || runs.empty()) continue;
      if (call.linked(k)) {                                            // device to device, from the source's run
        const char* from = contiguous_start(call.src_item(p), p.box);  // as for `to` in post_receives
        for (const Run& r : runs) {
          if (local.ok())
            local = call.impl.device_link->post_send(p.dst_rank, from + r.begin, r.end - r.begin, kDeviceTag);
          call.report.bytes_sent_device += r.end - r.begin;
        }
        continue;
      }
      const bool corrupt = fault_armed(call.me, call.src_item(p).key);
      if (p.dst_rank == call.me) {  // to itself: straight into staging (or the destination)
        if (backup_at[k] != kNone) {
          copy_backup(k, false);
          backed_up[k] = true;
        }
        uint64_t at = stage_at[k];
        for (const Run& r : runs) {
          gather_rows(source(k), p.box, r.begin / call.geo[k].row, r.end / call.geo[k].row, landing(k, at, r.begin));
          at += r.end - r.begin;
        }
        if (corrupt) (direct[k] ? direct[k][runs.front().begin] : stage[stage_at[k]]) ^= 0x01;
        continue;
      }
      const char* base = send_from[k];
      if (!base) {
        char* out = call.impl.pack.data() + pack_at[k];
        gather_rows(source(k), p.box, 0, rows_of(p.box), out);
        if (corrupt) out[runs.front().begin] ^= 0x01;
        base = out;
      }
      for (const Run& r : runs) {
        post(true, p.dst_rank, base + r.begin, r.end - r.begin, kDataTag, -1);
        if (!local.ok()) break;
      }
    }
  }

  // Until every message of the round is done: the pool's threads hash this rank's source pieces
  // (sums sent after their data) and check each received piece once its data and sums are in,
  // while this thread keeps MPI moving (bulk bytes advance only inside MPI calls).
  void drive(bool sums_after) {
    detail::WorkPool& pool = call.impl.workers(call.options.threads);
    // Each source piece's sums go out as soon as its own blocks are hashed, in piece order (the
    // order its destination posted the receives in), so the destination checks a piece while the
    // next ones are still hashed, rather than after the last.
    std::vector<size_t> hashing;  // this round's source pieces, in piece order
    std::unique_ptr<std::atomic<bool>[]> hashed(new std::atomic<bool>[call.np]());
    std::vector<std::shared_ptr<detail::WorkPool::Group>> hash_groups;
    for (size_t k = 0; k < call.np && sums_after; ++k) {
      const TransferPiece& p = (*call.pieces)[k];
      if (!in_round(k) || p.src_rank != call.me) continue;
      std::atomic<bool>* flag = &hashed[k];
      hash_groups.push_back(pool.group([flag](const Status&) { *flag = true; }));
      submit_hashes(pool, hash_groups.back(), source(k), p, call.geo[k], call.fresh[k]);
      pool.seal(hash_groups.back());
      hashing.push_back(k);
    }
    auto checks = pool.group();
    auto arrived = [&](size_t k) {  // all of piece k is here and its sums are known
      if (call.options.verify && local.ok()) submit_checks(pool, checks, k);
    };
    auto own_pieces_arrived = [&] {  // sent to itself: ready once hashed
      for (size_t k = 0; k < call.np; ++k) {
        const TransferPiece& p = (*call.pieces)[k];
        if (in_round(k) && p.dst_rank == call.me && p.src_rank == call.me) arrived(k);
      }
    };
    if (!sums_after) own_pieces_arrived();  // their sums came first (a delta): ready now
    size_t next_sums = 0;                   // hashing[next_sums] is the next piece whose sums go out
    const comm::Deadline deadline;
    std::vector<int> done;
    while (true) {
      if (!receives_posted()) post_ready_receives();
      for (; next_sums < hashing.size() && hashed[hashing[next_sums]].load(); ++next_sums) {
        const size_t k = hashing[next_sums];
        const TransferPiece& p = (*call.pieces)[k];
        if (p.dst_rank == call.me) {
          arrived(k);
        } else if (local.ok()) {
          post(true, p.dst_rank, reinterpret_cast<const char*>(call.fresh[k].data()),
               call.geo[k].blocks * sizeof(uint64_t), kSumTag, -1);
        }
      }
      int count = MPI_UNDEFINED;
      if (!requests.empty()) {
        done.resize(requests.size());
        Status st = comm::mpi_status(
            MPI_Testsome(static_cast<int>(requests.size()), requests.data(), &count, done.data(), MPI_STATUSES_IGNORE),
            "MPI_Testsome");
        if (!st.ok()) {
          if (local.ok()) local = st;
          break;
        }
      }
      for (int i = 0; i < count && count != MPI_UNDEFINED; ++i) {
        const int64_t k = request_piece[done[i]];
        if (k >= 0 && --pending[k] == 0) arrived(static_cast<size_t>(k));
      }
      // every message done, every sum out, every receive posted
      if (count == MPI_UNDEFINED && next_sums == hashing.size() && receives_posted()) break;
      comm::check_deadline(deadline, "transfer (exchange)", call.w());
      std::this_thread::yield();
    }
    for (const auto& g : hash_groups) (void)pool.wait(g);  // they write into call.fresh: done before it goes
    (void)pool.wait(backups);                              // restore_previous reads what they kept
    pool.seal(checks);
    Status checked = pool.wait(checks);
    if (local.ok()) local = checked;
  }

  // Piece k's received blocks, kBlocksPerJob (of one run) per job on the pool.
  void submit_checks(detail::WorkPool& pool, const std::shared_ptr<detail::WorkPool::Group>& checks, size_t k) {
    const PieceGeometry& g = call.geo[k];
    uint64_t at = stage_at[k];
    for (const Run& r : call.runs[k]) {
      for (uint64_t lo = r.begin; lo < r.end; lo += kBlocksPerJob * g.block_bytes) {
        const uint64_t hi = std::min(r.end, lo + kBlocksPerJob * g.block_bytes);
        const char* held = landing(k, at + (lo - r.begin), lo);
        pool.submit(checks, [this, k, lo, hi, held] { return check_blocks(k, lo, hi, held); });
      }
      at += r.end - r.begin;
    }
  }

  // Blocks of piece k's stream in [lo, hi) (whole blocks, or the piece's end), held at `held`.
  Status check_blocks(size_t k, uint64_t lo, uint64_t hi, const char* held) const {
    const TransferPiece& p = (*call.pieces)[k];
    const PieceGeometry& g = call.geo[k];
    for (uint64_t at = lo; at < hi; at += g.block_bytes) {
      const uint64_t b = at / g.block_bytes, n = std::min(hi, at + g.block_bytes) - at;
      if (storage::block_checksum(g.identity, b, held + (at - lo), n) == call.fresh[k][b]) continue;
      return Status(ErrorCode::kCorrupt, "key '" + call.key_of(p) + "': block " + std::to_string(b) +
                                             " of the piece at offset " + to_string_shape(p.box.offset) + " shape " +
                                             to_string_shape(p.box.shape) + " from source rank " +
                                             std::to_string(p.src_rank) + " does not match its checksum on " +
                                             "destination rank " + std::to_string(call.me) +
                                             " (corrupted in flight); the destination keeps its previous version");
    }
    return Status::Ok();
  }

  // The staged bytes into the destination's buffers (converted to its dtype); device buffers'
  // copies complete before it returns.
  Status commit() {
    std::deque<std::vector<char>> converted;
    bool uploads = false;
    Status st;
    detail::WorkPool& pool = call.impl.workers(call.options.threads);
    auto copies = pool.group();  // host destinations: disjoint rows, copied in parallel
    for (size_t k = 0; k < call.np; ++k) {
      const TransferPiece& p = (*call.pieces)[k];
      if (!in_round(k) || p.dst_rank != call.me || direct[k] || call.linked(k)) continue;
      const uint64_t row = call.geo[k].row, rows_per_job = std::max<uint64_t>(1, kCopyJobBytes / row);
      uint64_t at = stage_at[k];
      for (const Run& r : call.runs[k]) {
        const int64_t r0 = r.begin / row, r1 = r.end / row;
        const char* in = call.impl.stage.data() + at;
        if (call.dst_device(p)) {
          if (st.ok())
            st = scatter_rows_to_device(call.staging, call.dst_item(p), p.src_dtype, p.box, r0, r1, in, converted);
          uploads = true;
        } else {
          for (int64_t a = r0; a < r1; a += static_cast<int64_t>(rows_per_job)) {
            const int64_t b = std::min<int64_t>(r1, a + static_cast<int64_t>(rows_per_job));
            pool.submit(copies, [this, &p, a, b, in, r0, row] {
              scatter_rows(call.dst_item(p), p.src_dtype, p.box, a, b, in + static_cast<uint64_t>(a - r0) * row);
              return Status::Ok();
            });
          }
        }
        at += r.end - r.begin;
      }
    }
    pool.seal(copies);
    (void)pool.wait(copies);
    if (!uploads) return st;
    Status done = call.staging.synchronize();
    return st.ok() ? done : st;
  }
};

// One round: stage, send and receive, check, agree, commit.
Status StateTransfer::Impl::Call::exchange_round(int round) {
  PhaseScope scope("transfer", "exchange");
  Round r(*this, round);
  r.copy_device_sources();
  r.place();
  const bool sums_after = hashed && !sums_first;
  r.post_receives(sums_after);
  r.post_sends();
  if (impl.device_link) {  // first, on every rank: its peers wait in it too (NCCL runs the group here)
    Status linked = impl.device_link->wait_all();
    if (r.local.ok()) r.local = linked;
  }
  r.drive(sums_after);
  if (r.local.ok()) r.local = r.copied;
  Status agreed = comm::agree(r.local, w()).with_context("transfer version " + std::to_string(options.version));
  if (!agreed.ok()) {
    // In-place pieces get their previous bytes back where they were kept (keep_previous). Earlier
    // rounds committed, or bytes received in place and not kept: no single version is held.
    r.restore_previous();
    if (round > 0 || (options.in_place && !keeps_previous())) {
      impl.have_version = false;
      impl.sums.clear();
    }
    return agreed;
  }
  const double t_commit = now_s();
  PhaseScope commit_scope("transfer", "commit");
  Status committed = r.commit();
  if (round == plan_rounds() - 1 && committed.ok()) committed = zero_padding();
  if (commits_can_fail) {  // a failed device copy: every rank fails, the destination is partly new
    committed = comm::agree(committed, w())
                    .with_context("transfer version " + std::to_string(options.version) + " (writing device buffers)");
    if (!committed.ok()) {
      impl.have_version = false;
      impl.sums.clear();
    }
  }
  commit_s += now_s() - t_commit;
  return committed;
}

Result<TransferReport> StateTransfer::Impl::run(const StateDict* src_in, StateDict* dst_in,
                                                const TransferOptions& options) {
  const double t0 = now_s();
  comm::set_timeout(options.timeout_s);
  H5CKPT_RETURN_IF_ERROR(init);
  Call call(*this, src_in, dst_in, options, t0);
  H5CKPT_RETURN_IF_ERROR(call.plan());
  H5CKPT_RETURN_IF_ERROR(call.agree_delta());
  call.report.plan_s = now_s() - t0;
  H5CKPT_RETURN_IF_ERROR(call.checksums_first());
  call.report.checksum_s = now_s() - t0 - call.report.plan_s;
  call.choose_moving_blocks();
  const double t_ex = now_s();
  for (int round = 0; round < plan.rounds; ++round) {
    H5CKPT_RETURN_IF_ERROR(call.exchange_round(round));
  }
  call.report.exchange_s = now_s() - t_ex - call.commit_s;
  call.report.commit_s = call.commit_s;
  return call.finish();
}

StateTransfer::StateTransfer(MPI_Comm world) : impl_(std::make_unique<Impl>()) {
  auto c = comm::Comm::duplicate(world);
  if (c.ok()) impl_->world = std::move(c).value();
  else impl_->init = c.status();
  MPI_Comm node = MPI_COMM_NULL;  // ranks sharing this node share its cores
  if (c.ok() && MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
    MPI_Comm_size(node, &impl_->ranks_here);
    MPI_Comm_free(&node);
  }
}
StateTransfer::~StateTransfer() = default;
StateTransfer::StateTransfer(StateTransfer&&) noexcept = default;
StateTransfer& StateTransfer::operator=(StateTransfer&&) noexcept = default;

Result<TransferReport> StateTransfer::transfer(const StateDict* source, StateDict* destination,
                                               const TransferOptions& options) {
  return impl_->run(source, destination, options);
}

int64_t StateTransfer::version() const { return impl_->version; }

}  // namespace h5ckpt
