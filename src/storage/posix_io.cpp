#include "storage/posix_io.h"

#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "util/phase.h"

namespace h5ckpt::storage::io {

namespace {

enum Op {
  kOpen,
  kClose,
  kRead,
  kPread,
  kWrite,
  kPwrite,
  kFsync,
  kFstat,
  kFallocate,
  kRename,
  kMkdir,
  kUnlink,
  kRemove,
  kFtruncate,
  kOpCount
};
constexpr const char* kOpNames[kOpCount] = {"open",  "close",     "read",   "pread", "write",  "pwrite", "fsync",
                                            "fstat", "fallocate", "rename", "mkdir", "unlink", "remove", "ftruncate"};

struct Fault {
  int op = -1;
  int rank = -1;  // -1: any
  uint64_t nth = 1;
  std::string phase;  // empty: any
  int err = 0;        // effect: fail with this errno
  bool half = false;  // effect: transfer half the bytes
  int delay_ms = 0;   // effect: sleep, then proceed
  uint64_t seen = 0;  // matching calls so far on this rank
};

struct FaultTable {
  std::once_flag loaded;
  std::mutex mu;
  std::vector<Fault> faults;
  std::atomic<bool> any{false};  // lets the common case (no faults) skip the lock
};

FaultTable& table() {
  static FaultTable t;
  return t;
}

// The call number of the calling thread's last call of each op when it failed by injection (0:
// not injected), so error() can say so even after other calls (close, unlink) came in between.
thread_local uint64_t injected_call[kOpCount] = {};

int world_rank() {
  static std::atomic<int> cached{-1};
  if (int r = cached.load(std::memory_order_relaxed); r >= 0) return r;
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return 0;  // a process without MPI is the only rank
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  cached.store(r, std::memory_order_relaxed);
  return r;
}

int errno_by_name(const std::string& s) {
  static const std::pair<const char*, int> kNames[] = {
      {"ENOSPC", ENOSPC}, {"EIO", EIO},       {"EDQUOT", EDQUOT},       {"EACCES", EACCES},
      {"EPERM", EPERM},   {"EROFS", EROFS},   {"ENOENT", ENOENT},       {"EEXIST", EEXIST},
      {"EINTR", EINTR},   {"EAGAIN", EAGAIN}, {"EBADF", EBADF},         {"EINVAL", EINVAL},
      {"EFBIG", EFBIG},   {"EMFILE", EMFILE}, {"ENFILE", ENFILE},       {"ENOTDIR", ENOTDIR},
      {"EISDIR", EISDIR}, {"EXDEV", EXDEV},   {"ESTALE", ESTALE},       {"ETIMEDOUT", ETIMEDOUT},
      {"ENOMEM", ENOMEM}, {"EBUSY", EBUSY},   {"ENOTEMPTY", ENOTEMPTY}, {"EOPNOTSUPP", EOPNOTSUPP},
      {"ENOSYS", ENOSYS}};
  for (const auto& [name, value] : kNames)
    if (s == name) return value;
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  return !s.empty() && *end == 0 && v > 0 && v < 4096 ? static_cast<int>(v) : 0;
}

bool parse_uint(const std::string& s, uint64_t* out) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 18) return false;
  *out = std::stoull(s);
  return true;
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\n"), b = s.find_last_not_of(" \t\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

Result<Fault> parse_fault(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return Status(ErrorCode::kInvalidArgument, "H5CKPT_FAULT: " + why + " in '" + text + "'");
  };
  Fault f;
  int effects = 0;
  size_t at = 0;
  while (at <= text.size()) {
    size_t comma = text.find(',', at);
    if (comma == std::string::npos) comma = text.size();
    const std::string field = trim(text.substr(at, comma - at));
    at = comma + 1;
    if (field.empty()) continue;
    const size_t eq = field.find('=');
    const std::string key = trim(field.substr(0, eq)),
                      value = eq == std::string::npos ? "" : trim(field.substr(eq + 1));
    uint64_t n = 0;
    if (key == "op") {
      for (int o = 0; o < kOpCount; ++o)
        if (value == kOpNames[o]) f.op = o;
      if (f.op < 0) return bad("unknown op '" + value + "'");
    } else if (key == "rank") {
      if (!parse_uint(value, &n) || n > 1u << 30) return bad("bad rank '" + value + "'");
      f.rank = static_cast<int>(n);
    } else if (key == "nth") {
      if (!parse_uint(value, &n) || n == 0) return bad("bad nth '" + value + "' (1 is the first call)");
      f.nth = n;
    } else if (key == "phase") {
      f.phase = value;
    } else if (key == "errno") {
      f.err = errno_by_name(value);
      if (!f.err) return bad("unknown errno '" + value + "'");
      ++effects;
    } else if (key == "short" && (value.empty() || value == "1")) {
      f.half = true;
      ++effects;
    } else if (key == "delay_ms") {
      if (!parse_uint(value, &n) || n > 3600000) return bad("bad delay_ms '" + value + "'");
      f.delay_ms = static_cast<int>(n);
      ++effects;
    } else {
      return bad("unknown field '" + field + "'");
    }
  }
  if (f.op < 0) return bad("no op");
  if (effects != 1) return bad("exactly one of errno=, short, delay_ms= is needed");
  if (f.half && f.op != kRead && f.op != kPread && f.op != kWrite && f.op != kPwrite)
    return bad("short applies to read, pread, write and pwrite only");
  return f;
}

Status install(const char* spec) {
  std::vector<Fault> faults;
  Status st;
  const std::string text = spec ? spec : "";
  size_t at = 0;
  while (at <= text.size() && st.ok()) {
    size_t semi = text.find(';', at);
    if (semi == std::string::npos) semi = text.size();
    const std::string one = trim(text.substr(at, semi - at));
    at = semi + 1;
    if (one.empty()) continue;
    auto f = parse_fault(one);
    if (f.ok()) faults.push_back(std::move(f).value());
    else st = f.status();
  }
  if (!st.ok()) faults.clear();  // half a specification would test something else than asked
  FaultTable& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  t.faults = std::move(faults);
  t.any.store(!t.faults.empty());
  return st;
}

void load_once() {
  std::call_once(table().loaded, [] {
    Status st = install(std::getenv("H5CKPT_FAULT"));
    if (!st.ok()) std::fprintf(stderr, "h5ckpt: ignoring %s\n", st.message().c_str());
  });
}

struct Decision {
  int err = 0;  // fail with this errno
  bool half = false;
};

// Counts this call against every matching fault and applies the effect of the first that fires.
Decision decide(Op op) {
  injected_call[op] = 0;
  load_once();
  FaultTable& t = table();
  if (!t.any.load(std::memory_order_relaxed)) return {};
  const int rank = world_rank();
  const char* phase = current_phase().phase;
  Decision d;
  int delay_ms = 0;
  bool fired = false;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    for (Fault& f : t.faults) {
      if (f.op != op || (f.rank >= 0 && f.rank != rank) || (!f.phase.empty() && f.phase != phase)) continue;
      if (++f.seen != f.nth || fired) continue;
      fired = true;
      d.err = f.err;
      d.half = f.half;
      delay_ms = f.delay_ms;
      if (f.err) injected_call[op] = f.seen;
    }
  }
  if (delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  return d;
}

// Half of a transfer, at least one byte so the caller always makes progress.
size_t halved(size_t n, const Decision& d) { return d.half && n > 1 ? n / 2 : n; }

}  // namespace

int open(const std::string& path, int flags, mode_t mode) {
  if (Decision d = decide(kOpen); d.err) return errno = d.err, -1;
  return ::open(path.c_str(), flags, mode);
}

int close(int fd) {
  if (Decision d = decide(kClose); d.err) {
    ::close(fd);  // the descriptor is gone either way, as with a real failed close
    return errno = d.err, -1;
  }
  return ::close(fd);
}

ssize_t read(int fd, void* buf, size_t n) {
  const Decision d = decide(kRead);
  if (d.err) return errno = d.err, -1;
  return ::read(fd, buf, halved(n, d));
}

ssize_t pread(int fd, void* buf, size_t n, off_t off) {
  const Decision d = decide(kPread);
  if (d.err) return errno = d.err, -1;
  return ::pread(fd, buf, halved(n, d), off);
}

ssize_t write(int fd, const void* buf, size_t n) {
  const Decision d = decide(kWrite);
  if (d.err) return errno = d.err, -1;
  return ::write(fd, buf, halved(n, d));
}

ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  const Decision d = decide(kPwrite);
  if (d.err) return errno = d.err, -1;
  return ::pwrite(fd, buf, halved(n, d), off);
}

int fsync(int fd) {
  if (Decision d = decide(kFsync); d.err) return errno = d.err, -1;
  return ::fsync(fd);
}

int fstat(int fd, struct stat* st) {
  if (Decision d = decide(kFstat); d.err) return errno = d.err, -1;
  return ::fstat(fd, st);
}

int fallocate(int fd, off_t off, off_t len) {
  if (Decision d = decide(kFallocate); d.err) return d.err;
  return ::posix_fallocate(fd, off, len);
}

int ftruncate(int fd, off_t len) {
  if (Decision d = decide(kFtruncate); d.err) return errno = d.err, -1;
  return ::ftruncate(fd, len);
}

int rename(const std::string& from, const std::string& to) {
  if (Decision d = decide(kRename); d.err) return errno = d.err, -1;
  return ::rename(from.c_str(), to.c_str());
}

int mkdir(const std::string& path, mode_t mode) {
  if (Decision d = decide(kMkdir); d.err) return errno = d.err, -1;
  return ::mkdir(path.c_str(), mode);
}

int unlink(const std::string& path) {
  if (Decision d = decide(kUnlink); d.err) return errno = d.err, -1;
  return ::unlink(path.c_str());
}

int remove_all(const std::string& path) {
  if (Decision d = decide(kRemove); d.err) return errno = d.err, -1;
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return errno = ec.value(), -1;
  return 0;
}

Status error(const char* op, const std::string& path, int err, ErrorCode code) {
  uint64_t call = 0;
  for (int o = 0; o < kOpCount; ++o)
    if (std::strcmp(op, kOpNames[o]) == 0) call = injected_call[o];
  const std::string rank = std::to_string(world_rank());
  const std::string how =
      call ? " (injected fault on rank " + rank + ", call " + std::to_string(call) + ")" : " failed on rank " + rank;
  return Status(code, std::string(op) + " '" + path + "'" + how + ": " + std::strerror(err));
}

Status reload_faults_for_testing() {
  load_once();  // the first read must not come later and replace this one
  return install(std::getenv("H5CKPT_FAULT"));
}

}  // namespace h5ckpt::storage::io
