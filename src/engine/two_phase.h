// What two-phase reads (aggregated_read) and writes (aggregated_write) share: the file span cut
// into one domain per rank and each domain into windows, by the same arithmetic on every rank
// (senders and receivers cut pieces at the same offsets without telling each other), and
// point-to-point messages of many blocks as one MPI datatype.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "comm/comm.h"
#include "h5ckpt/status.h"

namespace h5ckpt::engine::two_phase {

struct Geometry {
  uint64_t lo = 0, domain = 1, window = 1;
  int owner(uint64_t off) const { return static_cast<int>((off - lo) / domain); }
  uint64_t domain_begin(int a) const { return lo + static_cast<uint64_t>(a) * domain; }
  uint64_t window_index(uint64_t off) const { return (off - domain_begin(owner(off))) / window; }
  uint64_t window_begin(int a, uint64_t k) const { return domain_begin(a) + k * window; }
  uint64_t next_cut(uint64_t off) const {
    const int a = owner(off);
    return std::min(domain_begin(a) + domain, window_begin(a, window_index(off)) + window);
  }
};

/// The geometry of the byte span [lo, hi) over `ranks` domains: domains start on multiples of
/// min(align, window) (blocks, stripes), windows are at most a domain.
inline Geometry make_geometry(uint64_t lo, uint64_t hi, int ranks, uint64_t window, uint64_t align) {
  Geometry g;
  g.window = window;
  align = std::min(align, g.window);
  g.lo = lo / align * align;
  const uint64_t share = (hi - g.lo + ranks - 1) / static_cast<uint64_t>(ranks);
  g.domain = std::max<uint64_t>(1, (share + align - 1) / align * align);
  g.window = std::min(g.window, g.domain);
  return g;
}

/// Blocks of a message: (displacement from a base, or an address when the base is null; length).
using Blocks = std::vector<std::pair<MPI_Aint, uint64_t>>;

/// Posts one send or receive of `blocks` on `tag`: plain bytes when it is one block (MPI copies
/// it once between processes), else an hindexed type freed at once (MPI keeps it alive for the
/// request). Every block must be below INT_MAX bytes.
inline Status post(bool send, char* base, const Blocks& blocks, int peer, int tag, MPI_Comm comm,
                   std::vector<MPI_Request>& reqs) {
  void* buf = nullptr;
  int count = 0;
  MPI_Datatype type = MPI_BYTE;
  if (blocks.size() == 1) {
    buf = base ? base + blocks[0].first : reinterpret_cast<char*>(blocks[0].first);
    count = static_cast<int>(blocks[0].second);
  } else {
    std::vector<int> lengths;
    std::vector<MPI_Aint> displs;
    lengths.reserve(blocks.size());
    displs.reserve(blocks.size());
    for (const auto& [d, n] : blocks) {
      displs.push_back(d);
      lengths.push_back(static_cast<int>(n));
    }
    H5CKPT_RETURN_IF_ERROR(comm::mpi_status(
        MPI_Type_create_hindexed(static_cast<int>(blocks.size()), lengths.data(), displs.data(), MPI_BYTE, &type),
        "MPI_Type_create_hindexed"));
    if (Status st = comm::mpi_status(MPI_Type_commit(&type), "MPI_Type_commit"); !st.ok()) {
      MPI_Type_free(&type);
      return st;
    }
    buf = base ? base : MPI_BOTTOM;
    count = 1;
  }
  MPI_Request r = MPI_REQUEST_NULL;
  const int rc =
      send ? MPI_Isend(buf, count, type, peer, tag, comm, &r) : MPI_Irecv(buf, count, type, peer, tag, comm, &r);
  if (type != MPI_BYTE) MPI_Type_free(&type);
  H5CKPT_RETURN_IF_ERROR(comm::mpi_status(rc, send ? "MPI_Isend" : "MPI_Irecv"));
  reqs.push_back(r);
  return Status::Ok();
}

/// Set in a span's length as exchange_cuts sends it when the span's bytes follow the previous
/// span's in the sender's memory, so both sides move them as one contiguous message.
constexpr uint64_t kJoinsBit = 1ull << 63;

/// Marks each cut (sorted by offset) whose bytes follow the previous cut's in memory
/// (`addr(cut)`) for the same (aggregator, window): both sides move such runs as one message.
template <class Cut, class Addr>
void mark_joins(std::vector<Cut>& cuts, Addr addr) {
  for (size_t i = 1; i < cuts.size(); ++i) {
    const Cut& a = cuts[i - 1];
    Cut& b = cuts[i];
    b.joins = a.agg == b.agg && a.window == b.window && addr(a) + a.length == addr(b);
  }
}

/// Calls `fn(first, bytes)` for each message of `cuts` (marked by mark_joins): its first cut and
/// its total length.
template <class Cut, class Fn>
void for_each_message(const std::vector<Cut>& cuts, Fn fn) {
  for (size_t i = 0; i < cuts.size();) {
    size_t j = i + 1;
    uint64_t bytes = cuts[i].length;
    for (; j < cuts.size() && cuts[j].joins; ++j) bytes += cuts[j].length;
    fn(cuts[i], bytes);
    i = j;
  }
}

/// One contiguous message as its owner sees it: the window runs it covers, in order.
struct Message {
  std::vector<std::pair<uint64_t, uint64_t>> runs;  // window offset, length
  uint64_t bytes = 0;
};

/// Adds a span exchange_cuts delivered (`wire_length` with kJoinsBit) at window offset `at`: to
/// the last message when it joins it, else as a new one.
inline void add_span(std::vector<Message>& messages, uint64_t at, uint64_t wire_length) {
  const uint64_t len = wire_length & ~kJoinsBit;
  if (messages.empty() || !(wire_length & kJoinsBit)) messages.emplace_back();
  messages.back().runs.push_back({at, len});
  messages.back().bytes += len;
}

/// Tells each aggregator which (offset, length) spans of its domain this rank reads or writes
/// (`cuts`: any type with agg, offset and length), in one MPI_Ialltoall of counts and one
/// MPI_Ialltoallv of spans; returns, per rank, the flat (offset, length) pairs it sent here.
/// `joins(i)` marks cut i with kJoinsBit on the wire.
template <class Cut, class Joins = bool (*)(size_t)>
Result<std::vector<std::vector<uint64_t>>> exchange_cuts(
    const std::vector<Cut>& cuts, int n, MPI_Comm comm, int poll_us, const char* what,
    Joins joins = [](size_t) { return false; }) {
  std::vector<int> send_counts(n, 0), recv_counts(n, 0), sdispl(n, 0), rdispl(n, 0);
  for (const Cut& c : cuts) send_counts[c.agg] += 2;
  std::vector<uint64_t> sendbuf;
  sendbuf.reserve(cuts.size() * 2);
  for (size_t i = 0; i < cuts.size(); ++i) {
    sendbuf.push_back(cuts[i].offset);
    sendbuf.push_back(cuts[i].length | (joins(i) ? kJoinsBit : 0));
  }
  MPI_Request req;
  H5CKPT_RETURN_IF_ERROR(comm::mpi_status(
      MPI_Ialltoall(send_counts.data(), 1, MPI_INT, recv_counts.data(), 1, MPI_INT, comm, &req), "MPI_Ialltoall"));
  H5CKPT_RETURN_IF_ERROR(comm::wait_asleep(1, &req, poll_us, what, comm));
  for (int r = 1; r < n; ++r) {
    sdispl[r] = sdispl[r - 1] + send_counts[r - 1];
    rdispl[r] = rdispl[r - 1] + recv_counts[r - 1];
  }
  std::vector<uint64_t> recvbuf(static_cast<size_t>(rdispl[n - 1]) + recv_counts[n - 1]);
  H5CKPT_RETURN_IF_ERROR(
      comm::mpi_status(MPI_Ialltoallv(sendbuf.data(), send_counts.data(), sdispl.data(), MPI_UINT64_T, recvbuf.data(),
                                      recv_counts.data(), rdispl.data(), MPI_UINT64_T, comm, &req),
                       "MPI_Ialltoallv"));
  H5CKPT_RETURN_IF_ERROR(comm::wait_asleep(1, &req, poll_us, what, comm));
  std::vector<std::vector<uint64_t>> from(n);
  for (int r = 0; r < n; ++r) from[r].assign(recvbuf.begin() + rdispl[r], recvbuf.begin() + rdispl[r] + recv_counts[r]);
  return from;
}

}  // namespace h5ckpt::engine::two_phase
