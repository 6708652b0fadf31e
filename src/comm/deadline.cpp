#include "comm/deadline.h"

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "logging/log.h"
#include "util/phase.h"

namespace h5ckpt::comm {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kReportTag = 1;                                // the only traffic on a side channel
constexpr int kCollectors = 8;                               // ranks that hear from everyone (everyone hears from them)
constexpr auto kGrace = std::chrono::milliseconds(1500);     // for the reports of the others
constexpr auto kPrintLead = std::chrono::milliseconds(300);  // lets peers print before the abort
constexpr auto kProbeEvery = std::chrono::milliseconds(10);  // look for peers' reports while waiting
constexpr size_t kMaxListed = 32;

std::atomic<double> g_timeout{600.0};
std::atomic<bool> g_expiring{false};
const int g_here = 1;  // the report's payload: "this rank is waiting too"

std::mutex g_mu;
std::map<MPI_Comm, MPI_Comm> g_side;  // communicator -> its side channel

MPI_Comm side_of(MPI_Comm c) {
  if (c == MPI_COMM_NULL) return MPI_COMM_NULL;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_side.find(c);
  return it == g_side.end() ? MPI_COMM_NULL : it->second;
}

// A report arrived on the side channel: some peer's deadline passed.
bool peer_expired(MPI_Comm side) {
  int flag = 0;
  MPI_Iprobe(MPI_ANY_SOURCE, kReportTag, side, &flag, MPI_STATUS_IGNORE);
  return flag != 0;
}

// Ranks of `comm` as world ranks, listed.
std::string world_ranks(MPI_Comm comm, const std::vector<int>& ranks) {
  std::vector<int> world(ranks.size(), MPI_UNDEFINED);
  MPI_Group g = MPI_GROUP_NULL, w = MPI_GROUP_NULL;
  if (MPI_Comm_group(comm, &g) == MPI_SUCCESS && MPI_Comm_group(MPI_COMM_WORLD, &w) == MPI_SUCCESS)
    MPI_Group_translate_ranks(g, static_cast<int>(ranks.size()), ranks.data(), w, world.data());
  if (g != MPI_GROUP_NULL) MPI_Group_free(&g);
  if (w != MPI_GROUP_NULL) MPI_Group_free(&w);
  std::string out;
  for (size_t i = 0; i < world.size() && i < kMaxListed; ++i)
    out += (i ? "," : "") + (world[i] == MPI_UNDEFINED ? "?" : std::to_string(world[i]));
  if (world.size() > kMaxListed) out += ",... (" + std::to_string(world.size()) + " ranks)";
  return out;
}

// Tells the peers of `side` that this rank is here and, for the grace time, listens for theirs.
// Collectors (the first kCollectors ranks) tell and hear everyone, the others tell and hear only
// the collectors, so reports stay O(ranks). Never blocks: sends are eager and never waited for.
std::string absent_ranks(MPI_Comm side) {
  int rank = 0, size = 1;
  MPI_Comm_rank(side, &rank);
  MPI_Comm_size(side, &size);
  const bool collector = rank < kCollectors;
  for (int r = 0; r < size; ++r) {
    if (r == rank || !(collector || r < kCollectors)) continue;
    MPI_Request req = MPI_REQUEST_NULL;
    if (MPI_Isend(&g_here, 1, MPI_INT, r, kReportTag, side, &req) == MPI_SUCCESS) MPI_Request_free(&req);
  }
  std::vector<char> heard(size, 0);
  heard[rank] = 1;
  for (const auto end = Clock::now() + kGrace; Clock::now() < end;) {
    int flag = 0, payload = 0;
    MPI_Message msg;
    MPI_Status st;
    if (MPI_Improbe(MPI_ANY_SOURCE, kReportTag, side, &flag, &msg, &st) != MPI_SUCCESS) break;
    if (!flag) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    MPI_Mrecv(&payload, 1, MPI_INT, &msg, MPI_STATUS_IGNORE);
    if (st.MPI_SOURCE >= 0 && st.MPI_SOURCE < size) heard[st.MPI_SOURCE] = 1;
  }
  if (!collector) return "unknown on this rank (ranks 0-" + std::to_string(kCollectors - 1) + " list them)";
  std::vector<int> absent;
  for (int r = 0; r < size; ++r)
    if (!heard[r]) absent.push_back(r);
  return absent.empty() ? std::string("none (all arrived late)") : world_ranks(side, absent);
}

// The watchdog of BlockingGuards: one thread, started on first use, never destroyed (it may
// still wait while static objects are destroyed at exit).
struct Watchdog {
  struct Entry {
    Deadline deadline;
    const char* what;
    MPI_Comm comm;
    PhaseName phase;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, Entry> guards;
  uint64_t next_id = 1;

  static Watchdog& get() {
    static Watchdog* w = [] {
      auto* dog = new Watchdog;
      std::thread([dog] { dog->run(); }).detach();
      return dog;
    }();
    return *w;
  }

  void run() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      auto first = guards.end();
      for (auto it = guards.begin(); it != guards.end(); ++it)
        if (first == guards.end() || it->second.deadline.at() < first->second.deadline.at()) first = it;
      if (first == guards.end()) {
        cv.wait(lock);
        continue;
      }
      const auto at = first->second.deadline.at();
      if (Clock::now() < at) {
        cv.wait_until(lock, at);
        continue;
      }
      const Entry e = first->second;
      lock.unlock();
      current_phase() = e.phase;  // name the guarded thread's phase, not the watchdog's
      int level = MPI_THREAD_SINGLE;
      MPI_Query_thread(&level);
      expire(e.what, level == MPI_THREAD_MULTIPLE ? e.comm : MPI_COMM_NULL, e.deadline, false);
    }
  }
};

}  // namespace

BlockingGuard::BlockingGuard(const char* what, MPI_Comm comm) {
  const Deadline d;
  if (!d.bounded()) return;
  Watchdog& w = Watchdog::get();
  {
    std::lock_guard<std::mutex> lock(w.mu);
    id_ = w.next_id++;
    w.guards.emplace(id_, Watchdog::Entry{d, what, comm, current_phase()});
  }
  w.cv.notify_all();
}

BlockingGuard::~BlockingGuard() {
  if (!id_) return;
  Watchdog& w = Watchdog::get();
  std::lock_guard<std::mutex> lock(w.mu);
  w.guards.erase(id_);
}

void set_timeout(double seconds) { g_timeout.store(std::isfinite(seconds) && seconds > 0 ? seconds : 0.0); }

double timeout() { return g_timeout.load(); }

Deadline::Deadline() : started_(Clock::now()), seconds_(timeout()), bounded_(seconds_ > 0) {
  at_ = bounded_ ? started_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds_))
                 : Clock::time_point::max();
}

Status wait_until(int n, MPI_Request* requests, int poll_us, const char* what, MPI_Comm comm,
                  const Deadline& deadline) {
  const MPI_Comm side = deadline.bounded() ? side_of(comm) : MPI_COMM_NULL;
  auto next_probe = Clock::now() + kProbeEvery;
  for (int done = 0;;) {
    const int rc = MPI_Testall(n, requests, &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      char msg[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(rc, msg, &len);
      return Status(ErrorCode::kMpi, std::string(what) + " failed: " + std::string(msg, len));
    }
    if (done) return Status::Ok();
    if (deadline.bounded()) {
      const auto now = Clock::now();
      if (deadline.passed(now)) expire(what, comm, deadline, false);
      if (side != MPI_COMM_NULL && now >= next_probe) {
        if (peer_expired(side)) expire(what, comm, deadline, true);
        next_probe = now + kProbeEvery;
      }
    }
    // 0: bulk transfers, whose large messages advance only inside MPI calls: yield, not sleep.
    if (poll_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(poll_us));
    else std::this_thread::yield();
  }
}

void check_deadline(const Deadline& deadline, const char* what, MPI_Comm comm) {
  if (!deadline.bounded()) return;
  if (deadline.passed(Clock::now())) expire(what, comm, deadline, false);
  if (MPI_Comm side = side_of(comm); side != MPI_COMM_NULL && peer_expired(side)) expire(what, comm, deadline, true);
}

void expire(const char* what, MPI_Comm comm, const Deadline& deadline, bool joined) {
  // One report per process: another thread that expires too waits for the abort.
  if (g_expiring.exchange(true))
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  const PhaseName p = current_phase();
  const std::string where = *p.operation ? std::string(p.operation) + "/" + p.phase : std::string("no operation");
  const double waited = std::chrono::duration<double>(Clock::now() - deadline.started()).count();
  const MPI_Comm side = side_of(comm);
  const std::string absent = side != MPI_COMM_NULL ? absent_ranks(side) : std::string("unknown");
  auto& log = logging::log();
  const std::string how = joined ? ": a peer's deadline passed while this rank waited" : " not complete after";
  log.critical("timeout in {}: {}{} {:.1f} s (timeout_s={:g}); rank(s) that did not arrive: {}; aborting the job",
               where, what, how, waited, deadline.seconds(), absent);
  log.flush();
  std::this_thread::sleep_for(kPrintLead);
  MPI_Abort(MPI_COMM_WORLD, kTimeoutExitCode);
  std::_Exit(kTimeoutExitCode);  // MPI_Abort does not return; this is for a broken one
}

Status open_side_channel(MPI_Comm c) {
  MPI_Comm side = MPI_COMM_NULL;
  const int rc = MPI_Comm_dup(c, &side);
  if (rc != MPI_SUCCESS) return Status(ErrorCode::kMpi, "MPI_Comm_dup (timeout side channel) failed");
  MPI_Comm_set_errhandler(side, MPI_ERRORS_RETURN);
  std::lock_guard<std::mutex> lock(g_mu);
  g_side[c] = side;
  return Status::Ok();
}

void close_side_channel(MPI_Comm c) {
  MPI_Comm side = MPI_COMM_NULL;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_side.find(c);
    if (it == g_side.end()) return;
    side = it->second;
    g_side.erase(it);
  }
  MPI_Comm_free(&side);
}

}  // namespace h5ckpt::comm
