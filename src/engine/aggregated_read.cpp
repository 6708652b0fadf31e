#include "engine/aggregated_read.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "comm/comm.h"
#include "engine/staging_pool.h"
#include "engine/two_phase.h"
#include "storage/region_reader.h"

namespace h5ckpt::engine {

namespace {

constexpr int kTag = 29;                        // the only point-to-point traffic of such a load
constexpr uint64_t kDomainAlign = 1u << 20;     // domains start on MiB boundaries (blocks, stripes)
constexpr uint64_t kReadThroughGap = 1u << 20;  // a smaller hole costs less to read than a 2nd pread
constexpr uint64_t kMinWindow = 4096;
constexpr uint64_t kMinBoundedWindow = 64;   // windows of a memory budget (caller's slots)
constexpr uint64_t kMaxWindow = 1ull << 30;  // keeps every piece length below INT_MAX
constexpr int kSlots = 2;                    // one window is read while the previous one is sent
constexpr int kPollMicros = 50;

using two_phase::Geometry;

// A piece cut at domain and window boundaries: it comes from aggregator `agg`'s window `window`.
struct Cut {
  int agg;
  uint64_t window;
  uint64_t offset, length;
  char* dst;
  bool joins = false;  // its destination follows the previous cut's in memory, for the same window
};

std::vector<Cut> cut_pieces(const Geometry& g, const std::vector<ReadPiece>& pieces) {
  std::vector<Cut> cuts;
  for (const ReadPiece& p : pieces) {
    for (uint64_t off = p.offset, end = p.offset + p.length; off < end;) {
      const uint64_t stop = std::min(end, g.next_cut(off));
      cuts.push_back({g.owner(off), g.window_index(off), off, stop - off, p.dst + (off - p.offset)});
      off = stop;
    }
  }
  // Offset order puts each (aggregator, window) together, the order both sides build messages in.
  std::stable_sort(cuts.begin(), cuts.end(), [](const Cut& a, const Cut& b) { return a.offset < b.offset; });
  two_phase::mark_joins(cuts, [](const Cut& c) { return c.dst; });
  return cuts;
}

using two_phase::Message;  // sent from the window where it is one run, else packed first

Status post(bool send, char* base, const two_phase::Blocks& blocks, int peer, MPI_Comm comm,
            std::vector<MPI_Request>& reqs) {
  return two_phase::post(send, base, blocks, peer, kTag, comm, reqs);
}

// What an aggregator does with one window of its domain.
struct WindowPlan {
  uint64_t begin = 0;                                                  // file offset of buffer byte 0
  std::vector<std::pair<uint64_t, uint64_t>> spans;                    // preads: file offset, length
  std::map<int, std::vector<Message>> sends;                           // rank -> its messages, in order
  std::vector<std::pair<uint64_t, std::pair<char*, uint64_t>>> local;  // buffer offset -> my dst
};

// Reads windows into the slots ahead of the sender, never more than kSlots windows ahead of the
// windows whose sends completed.
class WindowReader {
 public:
  WindowReader(storage::RegionReader& file, const std::vector<WindowPlan>& plans, char* slots, uint64_t slot_bytes)
      : file_(file), plans_(plans), slots_(slots), slot_bytes_(slot_bytes), thread_([this] { run(); }) {}
  ~WindowReader() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  char* slot(size_t j) const { return slots_ + (j % kSlots) * slot_bytes_; }
  // Waits until window j is in its slot, letting MPI progress in between.
  void wait_ready(size_t j, MPI_Comm comm) {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::microseconds(kPollMicros), [&] { return ready_ > j; })) {
      lock.unlock();
      int flag = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, kTag, comm, &flag, MPI_STATUS_IGNORE);  // progress only
      lock.lock();
    }
  }
  // The sends of every window before `j` completed: their slots may be refilled.
  void release_before(size_t j) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = j;
    }
    cv_.notify_all();
  }
  Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }

 private:
  void run() {
    for (size_t j = 0; j < plans_.size(); ++j) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || j < released_ + kSlots; });
        if (stop_) return;
      }
      Status st = status();
      for (const auto& [off, len] : plans_[j].spans) {
        if (!st.ok()) break;  // keep going: the sender still sends, so no receiver waits forever
        st = file_.read_bytes(slot(j) + (off - plans_[j].begin), len, off);
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (status_.ok()) status_ = st;
        ready_ = j + 1;
      }
      cv_.notify_all();
    }
  }
  storage::RegionReader& file_;
  const std::vector<WindowPlan>& plans_;
  char* slots_;
  uint64_t slot_bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t ready_ = 0, released_ = 0;
  bool stop_ = false;
  Status status_;
  std::thread thread_;  // last: starts after the members it uses
};

// The aggregator's windows from every rank's pieces in its domain (pairs of offset, length per
// rank), plus its own pieces' destinations.
std::vector<WindowPlan> plan_windows(const Geometry& g, int me, const std::vector<std::vector<uint64_t>>& asked,
                                     const std::vector<Cut>& mine) {
  std::map<uint64_t, WindowPlan> by_window;
  std::map<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>> extents;
  for (size_t r = 0; r < asked.size(); ++r)
    for (size_t i = 0; i + 1 < asked[r].size(); i += 2) {
      const uint64_t off = asked[r][i], len = asked[r][i + 1] & ~two_phase::kJoinsBit;
      const uint64_t k = g.window_index(off);
      WindowPlan& w = by_window[k];
      w.begin = g.window_begin(me, k);
      extents[k].push_back({off, off + len});
      if (static_cast<int>(r) != me) two_phase::add_span(w.sends[static_cast<int>(r)], off - w.begin, asked[r][i + 1]);
    }
  for (const Cut& c : mine)
    if (c.agg == me) by_window[c.window].local.push_back({c.offset - by_window[c.window].begin, {c.dst, c.length}});
  std::vector<WindowPlan> plans;
  for (auto& [k, w] : by_window) {
    auto& ex = extents[k];
    std::sort(ex.begin(), ex.end());
    for (const auto& [b, e] : ex) {
      if (!w.spans.empty() && b <= w.spans.back().first + w.spans.back().second + kReadThroughGap) {
        auto& last = w.spans.back();
        last.second = std::max(last.second, e - last.first);
      } else {
        w.spans.push_back({b, e - b});
      }
    }
    plans.push_back(std::move(w));
  }
  return plans;
}

// Sends window `w` (read into `buf`) to the ranks that asked: a message of one run straight from
// the window, one of several runs packed into `packed` (`window` bytes) first; what does not fit
// there, with requests of several ranks overlapping, goes as a type of many blocks.
Status send_window(const WindowPlan& w, char* buf, char* packed, uint64_t window, MPI_Comm comm,
                   std::vector<MPI_Request>& sends, AggregatedReadReport& report) {
  Status first;
  uint64_t fill = 0;
  for (const auto& [rank, messages] : w.sends)
    for (const Message& m : messages) {
      Status st;
      if (m.runs.size() == 1) {
        st = post(true, buf + m.runs[0].first, {{0, m.bytes}}, rank, comm, sends);
      } else if (fill + m.bytes <= window) {
        char* to = packed + fill;
        for (const auto& [at, len] : m.runs) std::memcpy(to, buf + at, len), to += len;
        st = post(true, packed + fill, {{0, m.bytes}}, rank, comm, sends);
        fill += m.bytes;
      } else {
        two_phase::Blocks blocks;
        for (const auto& [at, len] : m.runs) blocks.push_back({static_cast<MPI_Aint>(at), len});
        st = post(true, buf, blocks, rank, comm, sends);
      }
      if (first.ok() && !st.ok()) first = st;
      report.bytes_sent += m.bytes;
    }
  return first;
}

}  // namespace

namespace {

// `pool` set: the window buffers come from it (reserved here); else from `slots`, which holds
// kReadWindowBuffers windows of `window_bytes` (windows then may be as small as kMinBoundedWindow).
Result<AggregatedReadReport> run_aggregated_read(MPI_Comm comm, const std::string& data_file,
                                                 std::vector<ReadPiece> pieces, uint64_t window_bytes,
                                                 StagingPool* pool, char* slots) {
  AggregatedReadReport report;
  int me = 0, n = 1;
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(comm, &n);
  pieces.erase(std::remove_if(pieces.begin(), pieces.end(), [](const ReadPiece& p) { return p.length == 0; }),
               pieces.end());
  std::sort(pieces.begin(), pieces.end(), [](const ReadPiece& a, const ReadPiece& b) { return a.offset < b.offset; });

  // The span every rank wants, cut into n domains.
  constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();
  uint64_t ext[2] = {pieces.empty() ? 0 : kNone - pieces.front().offset, 0};  // max of (kNone - lo) = min lo
  for (const ReadPiece& p : pieces) ext[1] = std::max(ext[1], p.offset + p.length);
  uint64_t all[2] = {0, 0};
  MPI_Request req;
  H5CKPT_RETURN_IF_ERROR(
      comm::mpi_status(MPI_Iallreduce(ext, all, 2, MPI_UINT64_T, MPI_MAX, comm, &req), "MPI_Iallreduce"));
  H5CKPT_RETURN_IF_ERROR(comm::wait_asleep(1, &req, kPollMicros, "aggregated read (extent)", comm));
  if (all[1] == 0) return report;  // nobody reads anything
  const Geometry g = two_phase::make_geometry(
      kNone - all[0], all[1], n, std::clamp<uint64_t>(window_bytes, pool ? kMinWindow : kMinBoundedWindow, kMaxWindow),
      kDomainAlign);

  // Tell each aggregator what this rank wants from its domain.
  const std::vector<Cut> cuts = cut_pieces(g, pieces);
  H5CKPT_ASSIGN_OR_RETURN(const auto asked,
                          two_phase::exchange_cuts(cuts, n, comm, kPollMicros, "aggregated read (requests)",
                                                   [&](size_t i) { return cuts[i].joins; }));
  const std::vector<WindowPlan> plans = plan_windows(g, me, asked, cuts);

  // Every receive goes up first, straight into the destinations, in (aggregator, window) order:
  // each aggregator sends its windows in that order, and MPI keeps messages between two ranks
  // in order. One contiguous receive per run of pieces back to back in memory (a shard's rows,
  // which the file interleaves with other ranks' rows): such a message moves in one copy between
  // processes, where one of many blocks is packed and unpacked in small fragments.
  Status local;
  std::vector<MPI_Request> recvs;
  two_phase::for_each_message(cuts, [&](const Cut& c, uint64_t bytes) {
    if (c.agg == me) return;
    Status st = post(false, c.dst, {{0, bytes}}, c.agg, comm, recvs);
    if (local.ok() && !st.ok()) local = st;
    report.bytes_received += bytes;
    ++report.messages;
  });

  // Read the windows on a helper thread while this one sends them out.
  std::optional<storage::RegionReader> file;
  if (!plans.empty()) {
    auto f = storage::RegionReader::open(data_file);
    if (f.ok()) file.emplace(std::move(f).value());
    else local = f.status();
  }
  if (!plans.empty() && file && pool) {
    pool->reserve(kReadWindowBuffers * g.window);
    if (pool->capacity() < kReadWindowBuffers * g.window)
      local = Status(ErrorCode::kIo,
                     "could not allocate " + std::to_string(kReadWindowBuffers * g.window) + " bytes of read windows");
    slots = pool->base();
  }
  if (!plans.empty() && file && !slots && local.ok()) local = Status(ErrorCode::kInternal, "no read window buffers");
  std::vector<MPI_Request> sends[kSlots];
  if (file && local.ok()) {
    WindowReader reader(*file, plans, slots, g.window);
    for (size_t j = 0; j < plans.size(); ++j) {
      reader.wait_ready(j, comm);
      char* buf = reader.slot(j);
      for (const auto& [at, to] : plans[j].local) std::memcpy(to.first, buf + at, to.second);
      sends[j % kSlots].clear();
      // The slot's packing area is free again: its previous sends completed before the slot was
      // read into.
      Status st = send_window(plans[j], buf, slots + (kSlots + j % kSlots) * g.window, g.window, comm,
                              sends[j % kSlots], report);
      if (local.ok() && !st.ok()) local = st;
      if (j + 1 >= kSlots) {  // the oldest slot's sends must finish before it is read into again
        auto& done = sends[(j + 1) % kSlots];
        Status st =
            comm::wait_asleep(static_cast<int>(done.size()), done.data(), kPollMicros, "read window sends", comm);
        if (local.ok() && !st.ok()) local = st;
        reader.release_before(j + 2 - kSlots);
      }
    }
    if (local.ok()) local = reader.status();
    report.windows = plans.size();
  } else {
    // No file or no memory: send zeros so the receivers complete; the caller's agreement fails.
    std::vector<char> zeros;
    for (const WindowPlan& w : plans)
      for (const auto& [rank, messages] : w.sends)
        for (const Message& m : messages) {
          if (zeros.size() < m.bytes) zeros.assign(m.bytes, 0);
          (void)post(true, zeros.data(), {{0, m.bytes}}, rank, comm, sends[0]);
          (void)comm::wait_asleep(static_cast<int>(sends[0].size()), sends[0].data(), kPollMicros, "sends", comm);
          sends[0].clear();
        }
  }
  for (auto& s : sends) {
    Status st = comm::wait_asleep(static_cast<int>(s.size()), s.data(), kPollMicros, "read window sends", comm);
    if (local.ok() && !st.ok()) local = st;
  }
  Status st =
      comm::wait_asleep(static_cast<int>(recvs.size()), recvs.data(), kPollMicros, "read window receives", comm);
  if (local.ok() && !st.ok()) local = st;
  if (file) {
    report.bytes_read = file->bytes_read();
    report.io_s = file->io_s();
  }
  if (!local.ok()) return local;
  return report;
}

}  // namespace

Result<AggregatedReadReport> aggregated_read(MPI_Comm comm, const std::string& data_file, std::vector<ReadPiece> pieces,
                                             uint64_t window_bytes, StagingPool& pool) {
  return run_aggregated_read(comm, data_file, std::move(pieces), window_bytes, &pool, nullptr);
}

Result<AggregatedReadReport> aggregated_read(MPI_Comm comm, const std::string& data_file, std::vector<ReadPiece> pieces,
                                             uint64_t window_bytes, char* slots) {
  return run_aggregated_read(comm, data_file, std::move(pieces), window_bytes, nullptr, slots);
}

}  // namespace h5ckpt::engine
