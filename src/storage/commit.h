// Directory-level commit protocol: temporary name, fsync, atomic rename, `latest` pointer.
#pragma once

#include <string>

#include "h5ckpt/status.h"

namespace h5ckpt::storage {

/// Temporary sibling of `final_dir` used while a save is in flight, e.g.
/// "/ckpt/.step-10.inprogress-<nonce>". Never loadable.
std::string temp_dir_for(const std::string& final_dir, const std::string& nonce);
/// True for names made by temp_dir_for.
bool is_temp_name(const std::string& dir);

Status make_dir(const std::string& dir);
/// fsync of a file or directory.
Status fsync_path(const std::string& path);
/// Writes `content` to `path` via path.tmp + fsync + rename + fsync of the directory.
Status write_file_atomic(const std::string& path, const std::string& content);
Result<std::string> read_whole_file(const std::string& path);
/// Removes a directory tree (best effort; the first error is returned).
Status remove_tree(const std::string& dir);

/// Makes `temp` visible as `final_dir` by rename. With `overwrite` an existing checkpoint is
/// moved aside first and removed only after the rename succeeded. fsyncs the parent.
Status publish_dir(const std::string& temp, const std::string& final_dir, bool overwrite);

/// Points `<parent of dir>/latest` at dir's base name, atomically.
Status update_latest(const std::string& dir);

/// Resolves what a load was given: a committed checkpoint directory, or a directory whose
/// `latest` names one. Uncommitted or temporary directories are refused with kNotCommitted.
Result<std::string> resolve_checkpoint_dir(const std::string& path);

}  // namespace h5ckpt::storage
