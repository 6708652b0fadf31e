// A load from the node-local level (engine/local_level.h, load_local). The planner
// (planner/local_reads.h) says which pieces of which saved rank's file each wanted shard needs and
// which live rank serves that file; requesters send each server their (tensor, region, shard)
// requests, and both sides plan the same pieces from them. The bytes then move in rounds through
// a bounded window (the staging pool under memory_bytes): every (server, requester) pair's
// pieces form one stream, cut into chunks at whole elements that both sides compute alike, and
// every server checks each file block the first time it reads it (storage/local_files.h).
#include <algorithm>
#include <cstring>
#include <map>

#include "comm/deadline.h"
#include "comm/transport.h"
#include "device/staging.h"
#include "engine/local_level.h"
#include "engine/memory_budget.h"
#include "engine/pieces.h"
#include "engine/wire.h"
#include "logging/log.h"
#include "planner/local_reads.h"
#include "storage/local_files.h"
#include "util/dtype_convert.h"
#include "util/phase.h"

namespace h5ckpt::engine::local {

using logging::now_s;

namespace {

constexpr int kServeTag = 0x4c53;
// The smallest chunk: above any element, a multiple of every element size.
constexpr int64_t kMinChunk = 64;
// The window of a load without a memory budget.
constexpr uint64_t kUnboundedWindow = 256ull << 20;

// One wanted item and where its bytes land.
struct Dest {
  size_t item;
  size_t tensor;
  char* landing;               // the item's buffer, or `staging`
  uint64_t staging_bytes = 0;  // a device item's host staging, in the item's dtype
  char* staging = nullptr;     // in the load's arena
  bool convert = false;        // stored in another dtype: converted run by run as it lands
};

// A piece at the requester: into element `dst` of dests[dest]'s landing buffer.
struct LandingRun {
  size_t dest;
  uint64_t dst, bytes, esize;
};
using ServedRun = planner::LocalReadItem;  // at the server: `bytes` at `file_offset` of `writer`'s file

struct RunCursor {
  size_t run = 0;
  uint64_t within = 0;  // bytes of runs[run] already done
};

// The next piece of a chunk that has `room` bytes left: the rest of the run, or as many of its
// whole elements as fit (0: the chunk ends here). Both sides of a stream cut with this alone.
template <class Run>
uint64_t next_piece(const Run& run, uint64_t within, uint64_t room) {
  const uint64_t left = run.bytes - within;
  return left <= room ? left : room / run.esize * run.esize;
}

// The byte sizes of the chunks a stream of `runs` is cut into (none for an empty stream).
template <class Run>
std::vector<uint64_t> cut_chunks(const std::vector<Run>& runs, uint64_t chunk) {
  std::vector<uint64_t> out;
  RunCursor c;
  while (c.run < runs.size()) {
    uint64_t n = 0;
    while (c.run < runs.size()) {
      const uint64_t p = next_piece(runs[c.run], c.within, chunk - n);
      if (!p) break;
      n += p, c.within += p;
      if (c.within == runs[c.run].bytes) ++c.run, c.within = 0;
    }
    out.push_back(n);
  }
  return out;
}

// Reads the next `n` bytes of a server's stream into `out`, advancing `at`.
Status fill_chunk(const std::vector<ServedRun>& runs, RunCursor& at, char* out, uint64_t n,
                  storage::LocalFileReader& files) {
  Status st;
  for (uint64_t done = 0; done < n;) {
    const ServedRun& r = runs[at.run];
    const uint64_t p = next_piece(r, at.within, n - done);
    if (st.ok()) st = files.read(r.writer, out + done, p, r.file_offset + at.within);
    done += p, at.within += p;
    if (at.within == r.bytes) ++at.run, at.within = 0;
  }
  return st;
}

// Hands the next `n` bytes of a requester's stream to put(run, bytes of it done, data, bytes).
template <class Put>
void drain_chunk(const std::vector<LandingRun>& runs, RunCursor& at, const char* in, uint64_t n, Put&& put) {
  for (uint64_t done = 0; done < n;) {
    const LandingRun& r = runs[at.run];
    const uint64_t p = next_piece(r, at.within, n - done);
    put(r, at.within, in + done, p);
    done += p, at.within += p;
    if (at.within == r.bytes) ++at.run, at.within = 0;
  }
}

// MPI_MAX over int64 values on every rank, bounded by the deadline.
Status allreduce_max(int64_t* values, int n, const char* what, MPI_Comm world) {
  std::vector<int64_t> in(values, values + n);
  MPI_Request req;
  const int rc = MPI_Iallreduce(in.data(), values, n, MPI_INT64_T, MPI_MAX, world, &req);
  if (rc != MPI_SUCCESS) return comm::mpi_status(rc, "MPI_Iallreduce");
  return comm::wait_asleep(1, &req, 100, what, world);
}

// Everything one local load runs on.
struct LocalLoad {
  const Topology::Impl& topo;
  const Resolution& res;
  const LoadOptions& options;
  StagingPool& pool;
  ExpandedState expanded;
  LoadReport report;
  std::vector<Dest> dests;
  std::vector<std::vector<LandingRun>> land;  // per server: pieces landing here, in stream order
  std::vector<std::vector<ServedRun>> serve;  // per requester: pieces read here, in stream order
  std::vector<std::vector<uint64_t>> out_chunks, in_chunks;
  std::vector<char*> out_slot, in_slot;
  char* cache = nullptr;  // the file reader's block cache
  uint64_t cache_bytes = 0;
  int me, size;
  MPI_Comm world;
  LocalLoad(const Topology::Impl& t, StateDict& state, const Resolution& r, const LoadOptions& o, StagingPool& p)
      : topo(t),
        res(r),
        options(o),
        pool(p),
        expanded(state),
        me(t.world.rank()),
        size(t.world.size()),
        world(t.world.get()) {}
  StateDict& items() { return expanded.state(); }
};

// Local checks of every item: where its bytes land and whether they are converted.
Status plan_dests(LocalLoad& L) {
  std::map<std::string, size_t> by_key;
  for (size_t t = 0; t < L.res.tensors.size(); ++t) by_key[L.res.tensors[t].key] = t;
  Status st = L.expanded.status();
  for (size_t i = 0; i < L.items().size() && st.ok(); ++i) {
    StateItem& it = L.items().items()[i];
    const std::string ctx = L.expanded.context(i);
    auto found = by_key.find(it.key);
    if (found == by_key.end()) {
      // LoadStrictness: only the allow-missing modes skip (the shared level's load contract, with
      // its merged lists and unexpected keys, is not applied to local checkpoints yet).
      if (L.options.strict && L.options.strictness != LoadStrictness::kAllowMissing)
        st = Status(ErrorCode::kNotFound, ctx + " is not in the checkpoint");
      else if (std::find(L.report.missing_keys.begin(), L.report.missing_keys.end(), it.key) ==
               L.report.missing_keys.end())
        L.report.missing_keys.push_back(it.key);
      continue;
    }
    const planner::TensorPlan& t = L.res.tensors[found->second];
    st = check_item_buffer(it).with_context(ctx);
    if (st.ok() && t.shape != it.global_shape && !(it.allow_shape_mismatch && t.shape.size() == it.global_shape.size()))
      st = Status(ErrorCode::kShapeMismatch, ctx + ": the checkpoint's global shape differs");
    const bool convert = st.ok() && t.dtype != it.dtype;
    if (convert && !(L.options.convert_dtype && dtype_is_float(t.dtype) && dtype_is_float(it.dtype)))
      st = Status(ErrorCode::kDtypeMismatch,
                  ctx + ": saved as " + dtype_name(t.dtype) + ", wanted as " + dtype_name(it.dtype));
    if (!st.ok()) break;
    Dest d{i, found->second, static_cast<char*>(it.data), 0, nullptr, convert};
    const uint64_t n = static_cast<uint64_t>(it.shard.numel());
    if (device::is_device_item(it)) {  // host staging in the item's dtype (conversions land converted)
      d.staging_bytes = n * dtype_size(it.dtype);
    } else if (t.shape != it.global_shape && n) {
      std::memset(it.data, 0, n * dtype_size(it.dtype));  // the part outside the stored shape stays zero
    }
    L.dests.push_back(std::move(d));
  }
  return st;
}

// Bytes of every peer's message, after an all-to-all of their sizes.
Result<std::vector<std::string>> all_to_all(const std::vector<std::string>& to, const char* what, MPI_Comm world) {
  const int size = static_cast<int>(to.size());
  std::vector<int> send_counts(size), recv_counts(size), sdispl(size), rdispl(size);
  std::string sendbuf;
  for (int q = 0; q < size; ++q) {
    sdispl[q] = static_cast<int>(sendbuf.size());
    send_counts[q] = static_cast<int>(to[q].size());
    sendbuf += to[q];
  }
  MPI_Request req;
  int rc = MPI_Ialltoall(send_counts.data(), 1, MPI_INT, recv_counts.data(), 1, MPI_INT, world, &req);
  if (rc != MPI_SUCCESS) return comm::mpi_status(rc, "MPI_Ialltoall");
  H5CKPT_RETURN_IF_ERROR(comm::wait_asleep(1, &req, 100, what, world));
  int total = 0;
  for (int q = 0; q < size; ++q) rdispl[q] = total, total += recv_counts[q];
  std::string recvbuf(static_cast<size_t>(total), '\0');
  rc = MPI_Ialltoallv(sendbuf.data(), send_counts.data(), sdispl.data(), MPI_BYTE, recvbuf.data(), recv_counts.data(),
                      rdispl.data(), MPI_BYTE, world, &req);
  if (rc != MPI_SUCCESS) return comm::mpi_status(rc, "MPI_Ialltoallv");
  H5CKPT_RETURN_IF_ERROR(comm::wait_asleep(1, &req, 100, what, world));
  std::vector<std::string> out(size);
  for (int q = 0; q < size; ++q)
    out[q] = recvbuf.substr(static_cast<size_t>(rdispl[q]), static_cast<size_t>(recv_counts[q]));
  return out;
}

// The planner's pieces of every wanted item, by server: the landing runs here, and the requests
// each server receives (which tell it the same pieces). Every rank reaches the exchange; the
// caller agrees on the outcome.
Status plan_and_request(LocalLoad& L, const planner::LocalFileOffsets& offsets) {
  std::vector<ByteWriter> to(L.size);
  L.land.assign(L.size, {});
  Status st;
  for (size_t di = 0; di < L.dests.size(); ++di) {
    const Dest& d = L.dests[di];
    const ShardSpec& want = L.items().items()[d.item].shard;
    const auto pieces = planner::plan_local_reads(L.res.tensors, d.tensor, want, L.res.server, offsets);
    for (size_t k = 0; k < pieces.size(); ++k) {
      const planner::LocalReadItem& p = pieces[k];
      if (p.server < 0 || p.server >= L.size) {
        st = Status(ErrorCode::kInternal, "no server for saved rank " + std::to_string(p.writer));
        continue;
      }
      if (k == 0 || pieces[k - 1].region != p.region) wire::put_local_request(to[p.server], {d.tensor, p.region, want});
      L.land[p.server].push_back({di, p.dst_element, p.bytes, p.esize});
    }
  }
  std::vector<std::string> msgs(L.size);
  for (int q = 0; q < L.size; ++q) msgs[q] = to[q].str();
  H5CKPT_ASSIGN_OR_RETURN(auto received, all_to_all(msgs, "exchanging local-level requests", L.world));
  H5CKPT_RETURN_IF_ERROR(st);
  // The same pieces at each server, from the requests it received.
  L.serve.assign(L.size, {});
  for (int q = 0; q < L.size; ++q) {
    auto reqs = wire::decode_local_requests(received[q]);
    Status bad = reqs.status();
    for (size_t i = 0; bad.ok() && i < reqs->size(); ++i) {
      const wire::LocalRequest& r = (*reqs)[i];
      if (r.tensor >= L.res.tensors.size() || r.region >= L.res.tensors[r.tensor].regions.size()) {
        bad = Status(ErrorCode::kInternal, "a request for a region the plan lacks");
        break;
      }
      for (const auto& p : planner::plan_local_reads(L.res.tensors, r.tensor, r.want, L.res.server, offsets,
                                                     static_cast<int>(r.region))) {
        if (p.server != L.me) bad = Status(ErrorCode::kInternal, "a request for a file served elsewhere");
        L.serve[q].push_back(p);
      }
    }
    // A bug: the sizes the requester expects are unknown here, so its wait ends at the deadline.
    if (!bad.ok()) return bad.with_context("local-level request from rank " + std::to_string(q));
  }
  return Status::Ok();
}

// The chunk every stream is cut at (the smallest any rank proposes) and the arena: a send and a
// receive slot per peer (each as large as its stream's largest chunk), the file reader's block
// cache and the device items' staging. The arena is the staging pool (under a budget its capacity
// is leased from it); without a budget, where the pool cannot grow, `own`, a buffer of this load's
// own (counted).
Status layout_window(LocalLoad& L, std::unique_ptr<char[]>& own, MemoryBudget::Lease& lease) {
  MemoryBudget* budget = L.pool.budget();
  const bool bounded = budget && budget->bounded();
  uint64_t staging = 0, block = 0;
  for (const Dest& d : L.dests) staging += d.staging_bytes;
  for (const auto& f : L.res.manifest.files) block = std::max(block, f.block_bytes);
  uint64_t window = bounded ? budget->limit() : kUnboundedWindow;
  window -= std::min(window, staging);
  // A block is checked through the cache: whole when it fits (then it serves the block's reads),
  // else in pieces of the cache's size. Under a budget it takes at most a quarter of the window.
  L.cache_bytes = block == 0 ? 0
                  : bounded  ? std::min<uint64_t>(block, std::max<uint64_t>(kMinChunk, window / 4))
                             : block;
  window -= std::min(window, L.cache_bytes);
  int64_t chunk = static_cast<int64_t>(std::min<uint64_t>(window / (2 * static_cast<uint64_t>(L.size)),
                                                          std::min<uint64_t>(comm::chunk_limit(), 1ull << 30)));
  chunk = std::max<int64_t>(kMinChunk, chunk & ~int64_t{15});
  int64_t smallest = -chunk;
  H5CKPT_RETURN_IF_ERROR(allreduce_max(&smallest, 1, "agreeing on the local-level load window", L.world));
  chunk = -smallest;
  L.out_chunks.assign(L.size, {});
  L.in_chunks.assign(L.size, {});
  for (int q = 0; q < L.size; ++q) {
    L.out_chunks[q] = cut_chunks(L.serve[q], static_cast<uint64_t>(chunk));
    L.in_chunks[q] = cut_chunks(L.land[q], static_cast<uint64_t>(chunk));
  }
  auto largest = [](const std::vector<uint64_t>& c) { return c.empty() ? 0 : *std::max_element(c.begin(), c.end()); };
  uint64_t need = staging + L.cache_bytes;
  for (int q = 0; q < L.size; ++q) need += largest(L.out_chunks[q]) + (q != L.me ? largest(L.in_chunks[q]) : 0);
  char* arena = nullptr;
  Status st;
  if (bounded) {
    L.pool.reserve(need);
    if (L.pool.capacity() >= need) arena = L.pool.base();
    else
      st = Status(ErrorCode::kInvalidArgument, "the local-level load needs " + std::to_string(need) +
                                                   " bytes of staging (device items: " + std::to_string(staging) +
                                                   "), more than memory_bytes = " + std::to_string(budget->limit()) +
                                                   " holds: raise memory_bytes (H5CKPT_MEMORY_BYTES)");
  } else if (need) {
    // The pool outlives this load (its pages are touched once, not on every load: a fresh buffer's
    // first-touch faults cost more than the reads here); a buffer of its own where it cannot grow.
    L.pool.reserve(need);
    if (L.pool.capacity() >= need) {
      arena = L.pool.base();
    } else {
      own.reset(new char[need]);  // not zeroed: slots are filled before use, staging zeroed below
      arena = own.get();
      if (budget) lease = MemoryBudget::Lease(budget, budget->try_reserve(need) ? need : 0);
    }
  }
  H5CKPT_RETURN_IF_ERROR(comm::agree(st, L.world));
  for (Dest& d : L.dests) {
    if (!d.staging_bytes) continue;
    d.staging = d.landing = arena;
    std::memset(arena, 0, d.staging_bytes);  // the part outside the stored shape stays zero
    arena += d.staging_bytes;
  }
  L.cache = L.cache_bytes ? arena : nullptr;
  arena += L.cache_bytes;
  L.out_slot.assign(L.size, nullptr);
  L.in_slot.assign(L.size, nullptr);
  for (int q = 0; q < L.size; ++q) {
    L.out_slot[q] = arena, arena += largest(L.out_chunks[q]);
    if (q != L.me) L.in_slot[q] = arena, arena += largest(L.in_chunks[q]);
  }
  return Status::Ok();
}

// One stream's chunk landing here: copied (or converted) into the wanted buffers.
void land_chunk(LocalLoad& L, std::vector<RunCursor>& in_at, int s, const char* in, uint64_t n, Status& st) {
  drain_chunk(L.land[s], in_at[s], in, n, [&](const LandingRun& run, uint64_t within, const char* p, uint64_t bytes) {
    Dest& d = L.dests[run.dest];
    const StateItem& it = L.items().items()[d.item];
    if (d.convert) {  // straight into the item's dtype (or its device staging), element by element
      const uint64_t isize = dtype_size(it.dtype);
      char* to = (d.staging ? d.staging : static_cast<char*>(it.data)) + (run.dst + within / run.esize) * isize;
      if (!detail::convert_elements(p, L.res.tensors[d.tensor].dtype, to, it.dtype, bytes / run.esize) && st.ok())
        st = Status(ErrorCode::kDtypeMismatch, L.expanded.context(d.item) + ": no conversion");
    } else {
      std::memcpy(d.landing + run.dst * run.esize + within, p, bytes);
    }
  });
}

// The rounds: each rank reads its next chunk for every requester and sends it, and receives its
// next chunk from every server. Both sides of a pair cut its stream alike, so they agree on every
// chunk's size; the k-th message between two ranks is chunk k (a transport keeps their order). A
// rank runs as many rounds as its longest stream needs. A failed read still sends (garbage), so
// every rank finishes its rounds; the agreement after them fails the load.
Status serve_rounds(LocalLoad& L, storage::LocalFileReader& files) {
  int64_t rounds = 0;
  for (int q = 0; q < L.size; ++q)
    rounds = std::max<int64_t>(rounds, static_cast<int64_t>(std::max(L.out_chunks[q].size(), L.in_chunks[q].size())));
  auto transport = comm::make_mpi_transport(L.world, 0);  // bulk bytes: polled without sleeping
  std::vector<RunCursor> out_at(L.size), in_at(L.size);
  Status st;
  for (int64_t k = 0; k < rounds; ++k) {
    const size_t kk = static_cast<size_t>(k);
    Status posted;
    for (int s = 0; s < L.size && posted.ok(); ++s)
      if (s != L.me && kk < L.in_chunks[s].size())
        posted = transport->post_recv(s, L.in_slot[s], L.in_chunks[s][kk], kServeTag);
    for (int q = 0; q < L.size; ++q) {
      if (kk >= L.out_chunks[q].size()) continue;
      Status read = fill_chunk(L.serve[q], out_at[q], L.out_slot[q], L.out_chunks[q][kk], files);
      if (st.ok()) st = read;
      L.report.bytes_read += L.out_chunks[q][kk];
      if (q == L.me) {
        land_chunk(L, in_at, L.me, L.out_slot[q], L.out_chunks[q][kk], st);
      } else {
        L.report.bytes_sent += L.out_chunks[q][kk];
        if (posted.ok()) posted = transport->post_send(q, L.out_slot[q], L.out_chunks[q][kk], kServeTag);
      }
    }
    Status waited = transport->wait_all();
    if (st.ok()) st = posted;
    if (st.ok()) st = waited;
    if (!waited.ok() || !posted.ok()) break;  // the deadline or MPI failed: the agreement says so
    for (int s = 0; s < L.size; ++s) {
      if (s == L.me || kk >= L.in_chunks[s].size()) continue;
      land_chunk(L, in_at, s, L.in_slot[s], L.in_chunks[s][kk], st);
      L.report.bytes_received += L.in_chunks[s][kk];
    }
  }
  return st;
}

// Device copies of items staged on the host (converted already).
Status copy_staged_to_device(LocalLoad& L) {
  for (Dest& d : L.dests) {
    if (!d.staging) continue;
    const StateItem& it = L.items().items()[d.item];
    const size_t n = static_cast<size_t>(it.shard.numel());
    H5CKPT_RETURN_IF_ERROR(device::staging().copy_to_device(it.data, d.staging, n * dtype_size(it.dtype)));
    H5CKPT_RETURN_IF_ERROR(device::staging().synchronize());
  }
  return Status::Ok();
}

}  // namespace

Result<LoadReport> load_local(const Topology::Impl& topo, StateDict& state, const Resolution& res,
                              const LoadOptions& options, StagingPool& pool, bool* retry) {
  PhaseScope scope("load", "local");
  const double t0 = now_s();
  *retry = false;
  LocalLoad L(topo, state, res, options, pool);
  L.report.path = res.dir;
  L.report.transport = "mpi-local";
  auto fail = [&](const Status& s) { return s.with_context("load from local checkpoint '" + res.dir + "'"); };
  if (Status a = comm::agree(plan_dests(L), L.world); !a.ok()) return fail(a);
  const auto offsets = planner::local_file_offsets(res.tensors, res.manifest.files.size());
  if (Status a = comm::agree(plan_and_request(L, offsets), L.world); !a.ok()) return fail(a);
  L.report.plan_s = now_s() - t0;

  const double t_read = now_s();
  std::unique_ptr<char[]> own;
  MemoryBudget::Lease lease;
  if (Status a = layout_window(L, own, lease); !a.ok()) return fail(a);
  storage::LocalFileReader files(res.dir, res.manifest, L.cache, L.cache_bytes);
  Status st = serve_rounds(L, files);
  // A file that failed a block check is moved aside; the caller resolves again and another copy
  // (or level) serves it.
  for (int w : files.corrupt())
    if (Status q = storage::quarantine_local_file(res.dir, w); !q.ok()) logging::log().warn("{}", q.to_string());
  int intact = files.corrupt().empty() ? 1 : 0;
  L.report.read_s = now_s() - t_read;
  if (Status a = comm::agree(st, L.world, &intact); !a.ok()) {
    *retry = intact == 0;
    return fail(a);
  }

  const double t_x = now_s();
  if (Status a = comm::agree(copy_staged_to_device(L), L.world); !a.ok()) return fail(a);
  L.report.exchange_s = now_s() - t_x;
  L.report.total_s = now_s() - t0;
  logging::log().info(
      "loaded from local checkpoint '{}': {} bytes read here, {} received, {:.3f}s (requests "
      "{:.3f}s, reads and transfers {:.3f}s, unpacking {:.3f}s)",
      res.dir, L.report.bytes_read, L.report.bytes_received, L.report.total_s, L.report.plan_s, L.report.read_s,
      L.report.exchange_s);
  return L.report;
}

}  // namespace h5ckpt::engine::local
