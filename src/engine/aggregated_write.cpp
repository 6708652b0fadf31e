#include "engine/aggregated_write.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>

#include "comm/comm.h"
#include "engine/two_phase.h"
#include "util/test_points.h"

namespace h5ckpt::engine {

namespace {

constexpr int kTag = 31;                     // the only point-to-point traffic of the write phase
constexpr uint64_t kDomainAlign = 1u << 20;  // domains start on MiB boundaries (blocks, stripes)
constexpr uint64_t kMinWindow = 64;
constexpr uint64_t kMaxWindow = 1ull << 30;  // keeps every block length below INT_MAX
constexpr int kSlots = 2;                    // one window is received while the previous one is written
constexpr int kPollMicros = 50;

// A piece cut at domain and window boundaries: it goes to aggregator `agg`'s window `window`.
struct Cut {
  int agg;
  uint64_t window;
  uint64_t offset, length;
  const char* src;
  bool joins = false;  // its bytes follow the previous cut's in memory, for the same window
};

std::vector<Cut> cut_pieces(const two_phase::Geometry& g, const std::vector<WritePiece>& pieces) {
  std::vector<Cut> cuts;
  for (const WritePiece& p : pieces)
    for (uint64_t off = p.offset, end = p.offset + p.length; off < end;) {
      const uint64_t stop = std::min(end, g.next_cut(off));
      cuts.push_back({g.owner(off), g.window_index(off), off, stop - off, p.src + (off - p.offset)});
      off = stop;
    }
  // Offset order puts each (aggregator, window) together, the order both sides build messages in.
  std::stable_sort(cuts.begin(), cuts.end(), [](const Cut& a, const Cut& b) { return a.offset < b.offset; });
  two_phase::mark_joins(cuts, [](const Cut& c) { return c.src; });
  return cuts;
}

using two_phase::Message;  // into the window where it is one run, else through the landing area

// What an aggregator does with one window of its domain.
struct WindowPlan {
  uint64_t begin = 0;                                  // file offset of buffer byte 0
  std::map<int, std::vector<Message>> receives;        // rank -> its messages, in its send order
  std::vector<std::pair<uint64_t, uint64_t>> extents;  // file offset, length of every piece
  std::vector<std::pair<uint64_t, const Cut*>> local;  // buffer offset -> my own cut
  std::vector<std::pair<uint64_t, uint64_t>> spans;    // writes: file offset, length
};

std::vector<WindowPlan> plan_windows(const two_phase::Geometry& g, int me,
                                     const std::vector<std::vector<uint64_t>>& sent, const std::vector<Cut>& mine) {
  std::map<uint64_t, WindowPlan> by_window;
  auto window = [&](uint64_t off) -> WindowPlan& {
    const uint64_t k = g.window_index(off);
    WindowPlan& w = by_window[k];
    w.begin = g.window_begin(me, k);
    return w;
  };
  for (size_t r = 0; r < sent.size(); ++r) {
    if (static_cast<int>(r) == me) continue;
    for (size_t i = 0; i + 1 < sent[r].size(); i += 2) {
      const uint64_t off = sent[r][i], len = sent[r][i + 1] & ~two_phase::kJoinsBit;
      WindowPlan& w = window(off);
      two_phase::add_span(w.receives[static_cast<int>(r)], off - w.begin, sent[r][i + 1]);
      w.extents.push_back({off, len});
    }
  }
  for (const Cut& c : mine)
    if (c.agg == me) {
      WindowPlan& w = window(c.offset);
      w.local.push_back({c.offset - w.begin, &c});
      w.extents.push_back({c.offset, c.length});
    }
  std::vector<WindowPlan> plans;
  for (auto& [k, w] : by_window) {
    // Only pieces that touch are merged: a hole belongs to a write outside the aggregation.
    std::sort(w.extents.begin(), w.extents.end());
    for (const auto& [off, len] : w.extents) {
      if (!w.spans.empty() && w.spans.back().first + w.spans.back().second == off) w.spans.back().second += len;
      else w.spans.push_back({off, len});
    }
    plans.push_back(std::move(w));
  }
  return plans;
}

void keep_first(Status& local, const Status& st) {
  if (local.ok() && !st.ok()) local = st;
}

}  // namespace

Result<AggregatedWriteReport> aggregated_write(MPI_Comm comm, std::vector<WritePiece> pieces, uint64_t window_bytes,
                                               char* slots, const WriteBytes& write) {
  AggregatedWriteReport report;
  int me = 0, n = 1;
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(comm, &n);
  pieces.erase(std::remove_if(pieces.begin(), pieces.end(), [](const WritePiece& p) { return p.length == 0; }),
               pieces.end());
  std::sort(pieces.begin(), pieces.end(), [](const WritePiece& a, const WritePiece& b) { return a.offset < b.offset; });

  // The span every rank writes, cut into n domains.
  constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();
  uint64_t ext[2] = {pieces.empty() ? 0 : kNone - pieces.front().offset, 0};  // max of (kNone - lo) = min lo
  for (const WritePiece& p : pieces) ext[1] = std::max(ext[1], p.offset + p.length);
  uint64_t all[2] = {0, 0};
  MPI_Request req;
  H5CKPT_RETURN_IF_ERROR(
      comm::mpi_status(MPI_Iallreduce(ext, all, 2, MPI_UINT64_T, MPI_MAX, comm, &req), "MPI_Iallreduce"));
  H5CKPT_RETURN_IF_ERROR(comm::wait_asleep(1, &req, kPollMicros, "aggregated write (extent)", comm));
  if (all[1] == 0) return report;  // nobody writes anything
  const two_phase::Geometry g = two_phase::make_geometry(
      kNone - all[0], all[1], n, std::clamp<uint64_t>(window_bytes, kMinWindow, kMaxWindow), kDomainAlign);

  // Tell each aggregator which file bytes of its domain this rank sends.
  const std::vector<Cut> cuts = cut_pieces(g, pieces);
  H5CKPT_ASSIGN_OR_RETURN(const auto sent,
                          two_phase::exchange_cuts(cuts, n, comm, kPollMicros, "aggregated write (pieces)",
                                                   [&](size_t i) { return cuts[i].joins; }));
  const std::vector<WindowPlan> plans = plan_windows(g, me, sent, cuts);

  // Every send goes out now, straight from the sources, in (aggregator, window) order: each
  // aggregator receives its windows in that order, and MPI keeps messages between two ranks in
  // order. One message per run of cuts that lie back to back in memory (a shard's rows are, where
  // the file interleaves them with another rank's): a contiguous message moves in one copy between
  // processes, where one of many blocks is packed and unpacked in small fragments, each needing
  // both sides in MPI. The sources stay valid until this call returns.
  Status local;
  std::vector<MPI_Request> sends;
  two_phase::for_each_message(cuts, [&](const Cut& c, uint64_t bytes) {
    if (c.agg == me) return;
    keep_first(local, two_phase::post(true, const_cast<char*>(c.src), {{0, bytes}}, c.agg, kTag, comm, sends));
    report.bytes_sent += bytes;
    ++report.messages;
  });

  util::test_point("aggregate_exchange", me);  // tests: a rank stopped or killed mid-exchange

  // Receive window j + 1 while window j is written. A message of several runs lands in the
  // landing area (the third buffer) and is copied to its runs once window j's receives are done.
  char* landing = slots ? slots + kSlots * g.window : nullptr;
  std::vector<MPI_Request> receives[kSlots];
  std::vector<std::pair<uint64_t, const Message*>> landed;  // landing offset, message
  auto post_receives = [&](size_t j) {
    char* slot = slots + (j % kSlots) * g.window;
    uint64_t at = 0;
    landed.clear();
    for (const auto& [rank, messages] : plans[j].receives)
      for (const Message& m : messages) {
        const bool direct = m.runs.size() == 1;
        char* to = direct ? slot + m.runs[0].first : landing + at;
        keep_first(local, two_phase::post(false, to, {{0, m.bytes}}, rank, kTag, comm, receives[j % kSlots]));
        if (!direct) landed.push_back({at, &m}), at += m.bytes;
        report.bytes_received += m.bytes;
      }
  };
  if (!plans.empty() && !slots) keep_first(local, Status(ErrorCode::kInternal, "no write window buffers"));
  if (!plans.empty() && slots) post_receives(0);
  for (size_t j = 0; j < plans.size() && slots; ++j) {
    auto& mine = receives[j % kSlots];
    keep_first(local, comm::wait_asleep(static_cast<int>(mine.size()), mine.data(), kPollMicros,
                                        "aggregated write (window receives)", comm));
    mine.clear();
    char* slot = slots + (j % kSlots) * g.window;
    for (const auto& [at, m] : landed) {
      const char* from = landing + at;
      for (const auto& [to, len] : m->runs) std::memcpy(slot + to, from, len), from += len;
    }
    if (j + 1 < plans.size()) post_receives(j + 1);
    for (const auto& [at, cut] : plans[j].local) std::memcpy(slot + at, cut->src, cut->length);
    for (const auto& [off, len] : plans[j].spans) {
      if (!local.ok()) break;  // keep receiving: the senders still send, so nobody waits forever
      local = write(slot + (off - plans[j].begin), len, off);
      report.bytes_written += len;
      ++report.spans;
    }
    ++report.windows;
  }
  keep_first(local, comm::wait_asleep(static_cast<int>(sends.size()), sends.data(), kPollMicros,
                                      "aggregated write (sends)", comm));
  if (!local.ok()) return local;
  return report;
}

}  // namespace h5ckpt::engine
