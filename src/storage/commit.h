// Directory-level commit protocol: temporary name, fsync, atomic rename, `latest` pointer.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "h5ckpt/status.h"

namespace h5ckpt::storage {

/// Temporary sibling of `final_dir` used while a save is in flight, e.g.
/// "/ckpt/.step-10.inprogress-<nonce>". Never loadable.
std::string temp_dir_for(const std::string& final_dir, const std::string& nonce);
/// True for names made by temp_dir_for.
bool is_temp_name(const std::string& dir);

Status make_dir(const std::string& dir);
/// An empty directory inside every checkpoint a save makes. On file systems that place each file on
/// one server and every directory on all of them (GlusterFS's distribute translator), the files of
/// a checkpoint whose server is down are simply absent, with ENOENT; the marker still shows that a
/// checkpoint stood there, so selection reports it as unreadable instead of calling the directory
/// empty (a trainer would start over).
inline constexpr const char* kCheckpointMarkerDir = ".h5ckpt-checkpoint";
/// make_dir of a save's directory and its marker.
Status make_checkpoint_dir(const std::string& dir);
/// True when `dir` holds the marker directory.
bool has_checkpoint_marker(const std::string& dir);
/// fsync of a file or directory.
Status fsync_path(const std::string& path);
/// Writes `content` to `path` via a temporary file (`tmp`, default path.tmp) + fsync + rename +
/// fsync of the directory.
Status write_file_atomic(const std::string& path, const std::string& content, const std::string& tmp = "");
/// Reads a regular file. Opened without blocking (a FIFO or device is refused, never waited on);
/// a file larger than `max_bytes` is refused with kCorrupt.
Result<std::string> read_whole_file(const std::string& path, uint64_t max_bytes = UINT64_MAX);
/// Removes a directory tree (best effort; the first error is returned).
Status remove_tree(const std::string& dir);

/// Makes `temp` visible as `final_dir` by rename. With `overwrite` an existing checkpoint is
/// swapped with `temp` atomically (renameat2 RENAME_EXCHANGE), so `final_dir` names a complete
/// checkpoint at every instant, and the old one is removed afterwards. Where the file system
/// cannot exchange, it is moved aside first (a crash in between leaves `final_dir` missing; loads
/// then fall back to the newest other checkpoint). fsyncs the parent.
Status publish_dir(const std::string& temp, const std::string& final_dir, bool overwrite);

/// Points `<parent of dir>/latest` at dir's base name, atomically, through a temporary file
/// whose name is unique to this process and call (two writers never share it).
Status update_latest(const std::string& dir);

/// Resolves what a load was given. A checkpoint directory (it holds metadata.json or data.h5, or
/// has a temporary name) is returned as is when committed; uncommitted or temporary ones are
/// refused with kNotCommitted, and there is no fallback. A directory of checkpoints resolves to
/// what `latest` names if that is a committed checkpoint of the directory that validates;
/// otherwise (no `latest`, dangling, garbage, a symbolic link, not a regular file, naming a
/// broken checkpoint) to the newest checkpoint of the directory that validates, with a warning
/// in the library log naming both. Symbolic links are never followed out of the directory.
Result<std::string> resolve_checkpoint_dir(const std::string& path);

/// Complete validation of one checkpoint directory without trusting anything in it: regular
/// metadata.json and data.h5, and read_metadata (format v2: the summary, the index tables it
/// points at in the data file and every record; format v1: the JSON index).
Status validate_checkpoint_dir(const std::string& dir);

/// A committed checkpoint directly under a directory of checkpoints, with the step its metadata
/// records (-1: none recorded).
struct CommittedCheckpoint {
  std::string name;
  int64_t step = -1;
};

/// The committed checkpoints directly under `root`: real directories (not symbolic links) whose
/// name is not temporary and that hold a metadata.json whose `step` can be read. Checkpoints
/// whose metadata does not parse are left out. Newest first: by step, then by name.
std::vector<CommittedCheckpoint> committed_checkpoints(const std::string& root);

/// What `<root>/latest` names when it is a regular file holding a plausible checkpoint name;
/// otherwise empty, with `*problem` saying what is wrong (never follows a symbolic link).
std::string read_latest_name(const std::string& root, std::string* problem = nullptr);

/// Exclusive per-directory save lock: `<parent>/.h5ckpt.lock`, locked with flock and holding
/// "host=H pid=P" of the holder. The coordinator takes it for `final_dir` before it makes the
/// temporary directory and keeps it (across threads: it belongs to the process) until the commit
/// and retention end. A second job (or Checkpointer) saving into the same directory fails at once
/// with kAlreadyExists naming the holder. The kernel releases it when the process dies.
Status acquire_save_lock(const std::string& final_dir);
/// Releases the lock this process took for `final_dir`; no-op when it holds none.
void release_save_lock(const std::string& final_dir);

/// The same lock for a scope (h5ckpt prune): released by the destructor.
class ScopedDirLock {
 public:
  ScopedDirLock() = default;
  ~ScopedDirLock();
  ScopedDirLock(ScopedDirLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  ScopedDirLock& operator=(ScopedDirLock&&) = delete;
  /// Locks directory `root` (not a checkpoint's parent: the directory itself).
  static Result<ScopedDirLock> acquire(const std::string& root);

 private:
  int fd_ = -1;
};

inline constexpr const char* kLockFileName = ".h5ckpt.lock";

/// Test hook: when H5CKPT_TEST_CRASH_AT equals `point`, the process exits at once (_exit(1)), as
/// a crash there would. Points: "publish" (mid-overwrite), "latest" (committed, latest not yet
/// updated), "retention" (before deleting old checkpoints); "POINT::N" exits at the N-th pass
/// (the form of util::test_point, without a rank).
void test_crash_point(const char* point);

}  // namespace h5ckpt::storage
