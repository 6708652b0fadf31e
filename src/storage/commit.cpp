#include "storage/commit.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "logging/log.h"
#include "storage/format.h"
#include "storage/fs_traits.h"
#include "storage/posix_io.h"
#include "storage/region_reader.h"
#include "util/test_points.h"

namespace h5ckpt::storage {

namespace fs = std::filesystem;

namespace {

[[maybe_unused]] Status errno_status(const std::string& what, int err) {
  return Status(ErrorCode::kIo, what + ": " + std::strerror(err));
}

std::string parent_of(const std::string& p) {
  fs::path parent = fs::path(p).lexically_normal().parent_path();
  return parent.empty() ? "." : parent.string();
}

std::string base_of(const std::string& p) {
  fs::path n = fs::path(p).lexically_normal();
  if (n.filename().empty()) n = n.parent_path();
  return n.filename().string();
}

constexpr const char* kTempMarker = ".inprogress-";

}  // namespace

std::string temp_dir_for(const std::string& final_dir, const std::string& nonce) {
  return (fs::path(parent_of(final_dir)) / ("." + base_of(final_dir) + kTempMarker + nonce)).string();
}

bool is_temp_name(const std::string& dir) {
  const std::string b = base_of(dir);
  return !b.empty() && b[0] == '.' && b.find(kTempMarker) != std::string::npos;
}

Status make_dir(const std::string& dir) {
  if (io::mkdir(dir, 0755) != 0) return io::error("mkdir", dir, errno);
  return Status::Ok();
}

Status make_checkpoint_dir(const std::string& dir) {
  H5CKPT_RETURN_IF_ERROR(make_dir(dir));
  return make_dir((fs::path(dir) / kCheckpointMarkerDir).string());
}

bool has_checkpoint_marker(const std::string& dir) {
  struct stat sb {};
  return ::lstat((fs::path(dir) / kCheckpointMarkerDir).c_str(), &sb) == 0 && S_ISDIR(sb.st_mode);
}

Status fsync_path(const std::string& path) {
  int fd = io::open(path, O_RDONLY);
  if (fd < 0) return io::error("open", path, errno);
  int rc = io::fsync(fd);
  int err = errno;
  io::close(fd);
  // Some file systems refuse fsync on directories (EINVAL); that is not a data-loss risk.
  if (rc != 0 && err != EINVAL) return io::error("fsync", path, err);
  return Status::Ok();
}

Status write_file_atomic(const std::string& path, const std::string& content, const std::string& tmp_name) {
  const std::string tmp = tmp_name.empty() ? path + ".tmp" : tmp_name;
  int fd = io::open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return io::error("open", tmp, errno);
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = io::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      io::close(fd);
      io::unlink(tmp);
      return io::error("write", tmp, err);
    }
    done += static_cast<size_t>(n);
  }
  if (io::fsync(fd) != 0) {
    int err = errno;
    io::close(fd);
    io::unlink(tmp);
    return io::error("fsync", tmp, err);
  }
  if (io::close(fd) != 0) {
    int err = errno;
    io::unlink(tmp);
    return io::error("close", tmp, err);
  }
  if (io::rename(tmp, path) != 0) {
    int err = errno;
    io::unlink(tmp);
    return io::error("rename", tmp + "' to '" + path, err);
  }
  return fsync_path(parent_of(path));
}

Result<std::string> read_whole_file(const std::string& path, uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO planted as metadata.json or latest must not wait for a writer.
  int fd = io::open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return io::error("open", path, err, err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo);
  }
  struct stat sb {};
  if (io::fstat(fd, &sb) != 0) {
    const int err = errno;
    io::close(fd);
    return io::error("fstat", path, err);
  }
  if (!S_ISREG(sb.st_mode)) {
    io::close(fd);
    return Status(ErrorCode::kCorrupt, "'" + path + "' is not a regular file");
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    ssize_t n = io::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      io::close(fd);
      return io::error("read", path, err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      io::close(fd);
      return Status(ErrorCode::kCorrupt, "'" + path + "' is larger than " + std::to_string(max_bytes) + " bytes");
    }
  }
  io::close(fd);
  return out;
}

Status remove_tree(const std::string& dir) {
  if (io::remove_all(dir) != 0) return io::error("remove", dir, errno);
  return Status::Ok();
}

namespace {

// Tests force the two-rename fallback with H5CKPT_TEST_NO_RENAME_EXCHANGE.
bool exchange_allowed() { return std::getenv("H5CKPT_TEST_NO_RENAME_EXCHANGE") == nullptr; }

// Errors with which a file system says it cannot exchange two names.
bool exchange_unsupported(int err) { return err == EINVAL || err == ENOSYS || err == ENOTSUP || err == EOPNOTSUPP; }

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

}  // namespace

void test_crash_point(const char* point) {
  // "POINT::N": the N-th pass in this process (a job that must commit some saves first).
  if (!util::test_point_armed("H5CKPT_TEST_CRASH_AT", point, -1)) return;
  std::fprintf(stderr, "h5ckpt: H5CKPT_TEST_CRASH_AT=%s: exiting as a crash would\n",
               std::getenv("H5CKPT_TEST_CRASH_AT"));
  std::fflush(stderr);
  ::_exit(1);
}

Status publish_dir(const std::string& temp, const std::string& final_dir, bool overwrite) {
  const std::string parent = parent_of(final_dir);
  struct stat sb {};
  if (::lstat(final_dir.c_str(), &sb) != 0) {
    if (errno != ENOENT) return io::error("lstat", final_dir, errno);
    if (io::rename(temp, final_dir) != 0) return io::error("rename", temp + "' to '" + final_dir, errno);
    return fsync_path(parent);
  }
  if (!overwrite)
    return Status(ErrorCode::kAlreadyExists,
                  "checkpoint '" + final_dir + "' already exists (pass overwrite to replace it)");
  // Swap the two names in one step: `final_dir` is a complete checkpoint at every instant, and
  // `temp` then holds the old one until it is removed.
  if (exchange_allowed()) {
    if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
      test_crash_point("publish");
      H5CKPT_RETURN_IF_ERROR(fsync_path(parent));
      // The new checkpoint is in place; a leftover old copy is only litter (removed by a later save).
      if (Status st = remove_tree(temp); !st.ok())
        logging::log().warn("overwrote '{}', but the old copy stays: {}", final_dir, st.to_string());
      return Status::Ok();
    }
    if (!exchange_unsupported(errno))
      return io::error("renameat2", temp + "' to '" + final_dir, errno)
          .with_context("exchanging with the old checkpoint");
  }
  // No exchange here: move the old one aside, then rename. A crash in between leaves no
  // `final_dir`; loads of the parent then select the newest other checkpoint that validates.
  const std::string aside = temp + ".old";
  if (io::rename(final_dir, aside) != 0)
    return io::error("rename", final_dir + "' to '" + aside, errno).with_context("moving the old checkpoint aside");
  test_crash_point("publish");
  if (io::rename(temp, final_dir) != 0) {
    const int err = errno;
    io::rename(aside, final_dir);  // put the old one back
    return io::error("rename", temp + "' to '" + final_dir, err);
  }
  H5CKPT_RETURN_IF_ERROR(fsync_path(parent));
  if (Status st = remove_tree(aside); !st.ok())
    logging::log().warn("overwrote '{}', but the old copy stays: {}", final_dir, st.to_string());
  return Status::Ok();
}

Status update_latest(const std::string& dir) {
  test_crash_point("latest");
  static std::atomic<uint64_t> seq{0};
  const std::string latest = (fs::path(parent_of(dir)) / kLatestFileName).string();
  // A name of its own per writer: two jobs (or nodes with equal pids) never write one temp file.
  const std::string tmp =
      latest + ".tmp." + host_name() + "." + std::to_string(::getpid()) + "." + std::to_string(seq.fetch_add(1));
  return write_file_atomic(latest, base_of(dir) + "\n", tmp);
}

// ---- choosing what to load ------------------------------------------------------------------

namespace {

constexpr uint64_t kMaxLatestBytes = 4096;

// The step a checkpoint's metadata records, without validating it (ordering only); false when
// the metadata cannot be read or parsed.
bool read_step(const std::string& dir, int64_t* step) {
  auto text = read_whole_file((fs::path(dir) / kMetadataFileName).string());
  if (!text.ok()) return false;
  using nlohmann::json;
  // Every top-level member but `step` is dropped while parsing (tensors can be large).
  json::parser_callback_t keep_step = [](int depth, json::parse_event_t event, json& parsed) {
    return !(event == json::parse_event_t::key && depth == 1 && parsed != "step");
  };
  json j = json::parse(*text, keep_step, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return false;
  auto it = j.find("step");
  *step = it != j.end() && it->is_number_integer() ? it->get<int64_t>() : -1;
  return true;
}

// A short printable excerpt of untrusted text for a message.
std::string excerpt(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < 40; ++i)
    out += std::isprint(static_cast<unsigned char>(text[i])) ? text[i] : '?';
  return text.size() > 40 ? out + "..." : out;
}

bool plausible_name(const std::string& name) {
  if (name.empty() || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return c != '/' && std::isprint(static_cast<unsigned char>(c)); });
}

}  // namespace

namespace {

// The inode number under which `name` is listed in `dir`, 0 when it is not listed. A directory
// listing is fetched from the server (FUSE and NFS clients do not answer it from the name cache),
// so it tells whether the cached name still leads to the current file; a FUSE listing with
// attributes (READDIRPLUS) also refreshes the cached names, so the next lookup is usually right.
ino_t listed_inode(const std::string& dir, const char* name) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  ino_t ino = 0;
  while (const dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, name) == 0) {
      ino = e->d_ino;
      break;
    }
  }
  ::closedir(d);
  return ino;
}

}  // namespace

std::string read_latest_name(const std::string& root, std::string* problem) {
  auto fail = [&](const std::string& why) {
    if (problem) *problem = why;
    return std::string();
  };
  const std::string path = (fs::path(root) / kLatestFileName).string();
  const bool revalidate = names_cached_per_client(root);
  std::string name;
  for (int waited_ms = 0;; waited_ms += kClientCacheStepMs) {
    struct stat sb {};
    if (::lstat(path.c_str(), &sb) != 0)
      return fail(errno == ENOENT ? "there is no 'latest'"
                                  : "'latest' cannot be examined: " + std::string(std::strerror(errno)));
    if (S_ISLNK(sb.st_mode)) return fail("'latest' is a symbolic link (never followed)");
    if (!S_ISREG(sb.st_mode)) return fail("'latest' is not a regular file");
    // Read through one descriptor, so that the inode checked below is the one whose bytes were read.
    int fd = io::open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return fail("'latest' cannot be read: " + std::string(std::strerror(errno)));
    struct stat fsb {};
    std::string why;
    name.clear();
    if (io::fstat(fd, &fsb) != 0 || !S_ISREG(fsb.st_mode)) why = "not a regular file";
    // From this descriptor (not reopened by name or /proc: on a network file system the file may
    // be gone from the server by now, and a new open says ESTALE).
    for (char buf[512]; why.empty();) {
      const ssize_t n = io::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) why = std::strerror(errno);
      if (n <= 0) break;
      name.append(buf, static_cast<size_t>(n));
      if (name.size() > kMaxLatestBytes) why = "larger than " + std::to_string(kMaxLatestBytes) + " bytes";
    }
    io::close(fd);
    if (!why.empty()) return fail("'latest' cannot be read: " + why);
    // Another client's rename may not have reached this client's name cache yet: then `latest`
    // still leads to the file it replaced (an older checkpoint's name). The server's listing says
    // which file the name holds now; wait until the cache agrees (or the timeout passes).
    if (!revalidate || listed_inode(root, kLatestFileName) == fsb.st_ino) break;
    if (waited_ms >= kClientCacheWaitMs) {
      logging::log().warn(
          "'{}': the client's cached 'latest' still differs from the server's listing after {} ms; "
          "using what it reads",
          path, waited_ms);
      break;
    }
    ::usleep(kClientCacheStepMs * 1000);
  }
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) name.pop_back();
  if (!plausible_name(name)) return fail("'latest' does not hold a checkpoint name (\"" + excerpt(name) + "\")");
  if (is_temp_name(name)) return fail("'latest' names '" + name + "', a save that never committed");
  return name;
}

namespace {

// A file descriptor closed on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

namespace {

// validate_checkpoint_dir on the directory `dir` names when it is opened; `*opened` is that
// directory's identity (st_ino 0 when it could not be opened).
Status validate_opened_dir(const std::string& dir, struct stat* opened) {
  const std::string meta = (fs::path(dir) / kMetadataFileName).string();
  const std::string data = (fs::path(dir) / kDataFileName).string();
  // Both files through one handle on the directory: an overwriting save may exchange the
  // directory's name with its replacement at any moment, and metadata.json of one checkpoint
  // checked against data.h5 of the other would fail (format v2 checks the index tables in it).
  *opened = {};
  Fd d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd < 0) return Status(ErrorCode::kNotFound, "'" + dir + "' holds no checkpoint");
  if (::fstat(d.fd, opened) != 0) *opened = {};
  struct stat ms {
  }, ds{};
  const bool has_meta = ::fstatat(d.fd, kMetadataFileName, &ms, AT_SYMLINK_NOFOLLOW) == 0;
  const int meta_errno = has_meta ? 0 : errno;
  const bool has_data = ::fstatat(d.fd, kDataFileName, &ds, 0) == 0;
  const int data_errno = has_data ? 0 : errno;
  // Absent and unreadable differ: a storage server that is down (ENOTCONN, EIO) is named as such,
  // not taken for a save that never committed.
  for (const auto& [file, err] : {std::pair{kMetadataFileName, meta_errno}, std::pair{kDataFileName, data_errno}})
    if (err != 0 && err != ENOENT)
      return Status(ErrorCode::kIo, "cannot examine '" + (fs::path(dir) / file).string() + "': " + std::strerror(err));
  // A committed name with the marker but not its files: damaged, or its files' server is down.
  const bool marked = !is_temp_name(dir) && has_checkpoint_marker(dir);
  const std::string unreachable = " (deleted, or on a storage server that is down)";
  if (!has_meta && !has_data && marked)
    return Status(ErrorCode::kCorrupt, "'" + dir + "' is a checkpoint whose " + kMetadataFileName + " and " +
                                           kDataFileName + " are missing" + unreachable);
  // Data without metadata stays "not committed" (what a save that stopped before its metadata
  // leaves); with the marker the metadata may also have gone with its server, and the message says so.
  if (!has_meta)
    return has_data ? Status(ErrorCode::kNotCommitted,
                             "'" + dir + "' has data but no " + kMetadataFileName + ": it was never committed" +
                                 (marked ? ", or its " + std::string(kMetadataFileName) +
                                               " was deleted or is on a storage server that is down"
                                         : std::string()))
                    : Status(ErrorCode::kNotFound, "'" + dir + "' holds no checkpoint");
  if (!has_data)
    return Status(ErrorCode::kCorrupt,
                  "'" + dir + "' has no " + kDataFileName + (marked ? unreachable : std::string()));
  if (!S_ISREG(ds.st_mode)) return Status(ErrorCode::kCorrupt, "'" + data + "' is not a regular file");
  if (!S_ISREG(ms.st_mode)) return Status(ErrorCode::kCorrupt, "'" + meta + "' is not a regular file");
  // O_NONBLOCK: should it have become a FIFO since the check, opening it must not wait for a writer.
  Fd m{::openat(d.fd, kMetadataFileName, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)};
  if (m.fd < 0) return Status(ErrorCode::kIo, "cannot open '" + meta + "': " + std::strerror(errno));
  Fd f{::openat(d.fd, kDataFileName, O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) return Status(ErrorCode::kIo, "cannot open '" + data + "': " + std::strerror(errno));
  // Each file again by its descriptor: the same inode, whatever the directory's name now names.
  auto json = read_whole_file("/proc/self/fd/" + std::to_string(m.fd));
  if (!json.ok()) return json.status().with_context("'" + meta + "'");
  auto reader = RegionReader::open("/proc/self/fd/" + std::to_string(f.fd));
  if (!reader.ok()) return reader.status().with_context("'" + data + "'");
  // Only validation is wanted here: no tensor is materialized.
  const std::vector<std::string> no_keys;
  return read_metadata(*json, *reader, &no_keys).status().with_context("'" + meta + "'");
}

}  // namespace

Status validate_checkpoint_dir(const std::string& dir) {
  // An overwriting save exchanges the name with its replacement, then removes the old copy: a
  // check that opened the old directory just before sees its files vanish. When the name now
  // names another directory than the one checked, that failure says nothing of what it names:
  // check again (a few times: each retry needs another overwrite in the meantime).
  constexpr int kRetries = 4;
  for (int attempt = 0;; ++attempt) {
    struct stat opened {};
    Status st = validate_opened_dir(dir, &opened);
    if (st.ok() || attempt == kRetries || opened.st_ino == 0) return st;
    struct stat now {};
    if (::stat(dir.c_str(), &now) != 0 || (now.st_dev == opened.st_dev && now.st_ino == opened.st_ino)) return st;
  }
}

std::vector<CommittedCheckpoint> committed_checkpoints(const std::string& root) {
  std::vector<CommittedCheckpoint> out;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (is_temp_name(name) || !plausible_name(name)) continue;
    struct stat sb {};
    if (::lstat(it->path().c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;  // symbolic links too
    CommittedCheckpoint c{name, -1};
    if (read_step(it->path().string(), &c.step)) out.push_back(std::move(c));
  }
  // Newest first: the step the trainer recorded, then the name (for equal or unset steps).
  std::sort(out.begin(), out.end(), [](const CommittedCheckpoint& a, const CommittedCheckpoint& b) {
    return a.step != b.step ? a.step > b.step : a.name > b.name;
  });
  return out;
}

namespace {

// The names of directories under `root` that look like checkpoints (a metadata or data file in a
// real directory with a committed name) but whose metadata gives no step: committed_checkpoints
// leaves them out, and selection must still report them rather than call the directory empty.
std::vector<std::string> unlisted_checkpoint_dirs(const std::string& root,
                                                  const std::vector<CommittedCheckpoint>& listed) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (is_temp_name(name) || !plausible_name(name)) continue;
    struct stat sb {};
    if (::lstat(it->path().c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
    // A file that cannot be examined (a storage server down: ENOTCONN, EIO, ESTALE) or a marker
    // without its files (GlusterFS answers ENOENT for files on a dead brick) may be a checkpoint:
    // reported as unreadable, never taken for an empty directory (a trainer would start over).
    auto present_or_unreadable = [&](const char* file) {
      struct stat fb {};
      return ::lstat((it->path() / file).c_str(), &fb) == 0 || (errno != ENOENT && errno != ENOTDIR);
    };
    const bool looks = present_or_unreadable(kMetadataFileName) || present_or_unreadable(kDataFileName) ||
                       has_checkpoint_marker(it->path().string());
    if (looks &&
        std::none_of(listed.begin(), listed.end(), [&](const CommittedCheckpoint& c) { return c.name == name; }))
      out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A directory of checkpoints: what `latest` names when it validates, else the newest that does.
// "Empty" (no `latest`, nothing that looks like a checkpoint: kNotFound, a trainer may start
// fresh) and "nothing valid" (kCorrupt, naming each checkpoint and why) are different answers:
// a trainer that took the second for the first would start over and overwrite the evidence.
Result<std::string> select_in_directory(const std::string& root) {
  std::string problem;
  const std::string named = read_latest_name(root, &problem);
  const bool has_latest = !(named.empty() && problem == "there is no 'latest'");
  if (!named.empty()) {
    const std::string dir = (fs::path(root) / named).string();
    struct stat sb {};
    Status st;
    if (::lstat(dir.c_str(), &sb) != 0) {
      problem = "'latest' names '" + named + "', which does not exist";
    } else if (S_ISLNK(sb.st_mode)) {
      problem = "'latest' names '" + named + "', a symbolic link (never followed)";
    } else if (!S_ISDIR(sb.st_mode)) {
      problem = "'latest' names '" + named + "', which is not a directory";
    } else if (st = validate_checkpoint_dir(dir); !st.ok()) {
      problem = "'latest' names '" + named + "', which does not validate (" + st.to_string() + ")";
    } else {
      return dir;
    }
  }
  std::string rejected;
  const std::vector<CommittedCheckpoint> listed = committed_checkpoints(root);
  for (const CommittedCheckpoint& c : listed) {
    if (c.name == named) continue;  // examined above
    const std::string dir = (fs::path(root) / c.name).string();
    if (Status st = validate_checkpoint_dir(dir); !st.ok()) {
      rejected += (rejected.empty() ? "" : "; ") + c.name + ": " + st.message();
      continue;
    }
    logging::log().warn("'{}': {}; selected '{}' (step {}), the newest checkpoint there that validates{}", root,
                        problem, c.name, c.step, rejected.empty() ? "" : " (skipped " + rejected + ")");
    return dir;
  }
  for (const std::string& name : unlisted_checkpoint_dirs(root, listed)) {
    if (name == named) continue;
    const Status st = validate_checkpoint_dir((fs::path(root) / name).string());
    rejected += (rejected.empty() ? "" : "; ") + name + ": " +
                (st.ok() ? std::string("its metadata gives no step") : st.message());
  }
  if (!has_latest && rejected.empty())
    return Status(ErrorCode::kNotFound,
                  "'" + root + "' holds no checkpoint (no " + kMetadataFileName + " or " + kLatestFileName + ")");
  return Status(ErrorCode::kCorrupt, "'" + root + "' holds checkpoints but none validates: " +
                                         (has_latest ? problem : std::string("there is no 'latest'")) +
                                         (rejected.empty() ? "" : "; " + rejected) +
                                         " (nothing was selected; nothing was changed)");
}

}  // namespace

Result<std::string> resolve_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec))
    return Status(ErrorCode::kNotFound, "checkpoint '" + path + "' does not exist or is not a directory");
  const fs::path p(path);
  const bool has_meta = fs::exists(fs::symlink_status(p / kMetadataFileName, ec));
  const bool has_data = fs::exists(fs::symlink_status(p / kDataFileName, ec));
  const bool marked = has_checkpoint_marker(path);
  if (!has_meta && !has_data && !is_temp_name(path) && !marked) return select_in_directory(path);
  // One checkpoint, named by the caller: no fallback, whatever is wrong is the answer.
  if (is_temp_name(path))
    return Status(ErrorCode::kNotCommitted, "'" + path + "' is an in-progress save that was never committed");
  if (!has_meta && marked) return validate_checkpoint_dir(path);  // names what is missing
  if (!has_meta)
    return Status(ErrorCode::kNotCommitted,
                  "checkpoint '" + path + "' has data but no " + kMetadataFileName + ": it was never committed");
  // A named checkpoint without its data is damaged, not absent ("not found" reads as "start fresh").
  if (!has_data) return Status(ErrorCode::kCorrupt, "checkpoint '" + path + "' has no " + kDataFileName);
  return path;
}

// ---- the save lock --------------------------------------------------------------------------

namespace {

std::mutex& held_mu() {
  static std::mutex mu;
  return mu;
}
// Lock file path -> descriptor, for the saves of this process (released from any thread).
std::map<std::string, int>& held_locks() {
  static std::map<std::string, int> held;
  return held;
}

// Opens and locks `lock_path` without waiting. On contention the error names the holder, as
// the holder wrote itself into the file.
Result<int> lock_file(const std::string& lock_path, const std::string& dir) {
  int fd = io::open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  // Another user's lock file: flock works on a read-only descriptor too (the holder line stays).
  if (fd < 0 && errno == EACCES) fd = io::open(lock_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return io::error("open", lock_path, errno).with_context("locking '" + dir + "' for a save");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      char buf[256] = {};
      const ssize_t n = io::pread(fd, buf, sizeof buf - 1, 0);
      std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
      while (!holder.empty() && std::isspace(static_cast<unsigned char>(holder.back()))) holder.pop_back();
      io::close(fd);
      return Status(ErrorCode::kAlreadyExists,
                    "another save into '" + dir + "' is in progress (lock '" + lock_path + "' held by " +
                        (holder.empty() ? std::string("an unknown process") : excerpt(holder)) +
                        "); two jobs must not save into one directory at once");
    }
    if (err != ENOLCK && err != EOPNOTSUPP && err != ENOSYS) {
      io::close(fd);
      return io::error("flock", lock_path, err);
    }
    logging::log().warn("'{}': the file system does not support flock ({}); concurrent saves are not detected",
                        lock_path, std::strerror(err));
    return fd;
  }
  const std::string me = "host=" + host_name() + " pid=" + std::to_string(::getpid()) + "\n";
  // Informational only, so a raw call: an injected pwrite fault (H5CKPT_FAULT) is for the data path.
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, me.data(), me.size(), 0);
  return fd;
}

void unlock_file(int fd) {
  ::flock(fd, LOCK_UN);
  io::close(fd);  // the file stays: removing it would let two holders lock different inodes
}

}  // namespace

Status acquire_save_lock(const std::string& final_dir) {
  const std::string parent = parent_of(final_dir);
  const std::string lock_path = (fs::path(parent) / kLockFileName).string();
  std::error_code ec;
  // No parent directory: there is nothing to protect, and making the temporary directory fails next.
  if (!fs::is_directory(parent, ec)) return Status::Ok();
  std::lock_guard<std::mutex> guard(held_mu());
  if (held_locks().count(lock_path))
    return Status(ErrorCode::kAlreadyExists, "another save into '" + parent + "' is in progress in this process (pid " +
                                                 std::to_string(::getpid()) + ")");
  H5CKPT_ASSIGN_OR_RETURN(int fd, lock_file(lock_path, parent));
  held_locks()[lock_path] = fd;
  return Status::Ok();
}

void release_save_lock(const std::string& final_dir) {
  const std::string lock_path = (fs::path(parent_of(final_dir)) / kLockFileName).string();
  std::lock_guard<std::mutex> guard(held_mu());
  auto it = held_locks().find(lock_path);
  if (it == held_locks().end()) return;
  unlock_file(it->second);
  held_locks().erase(it);
}

ScopedDirLock::~ScopedDirLock() {
  if (fd_ >= 0) unlock_file(fd_);
}

Result<ScopedDirLock> ScopedDirLock::acquire(const std::string& root) {
  ScopedDirLock lock;
  H5CKPT_ASSIGN_OR_RETURN(lock.fd_, lock_file((fs::path(root) / kLockFileName).string(), root));
  return lock;
}

}  // namespace h5ckpt::storage
