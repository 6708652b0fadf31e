// Retention of a directory of checkpoints: keep the newest N and every K-th step, delete the rest
// (CheckpointerOptions::keep_last / keep_every, `h5ckpt prune`). See docs/format.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "h5ckpt/status.h"

namespace h5ckpt::storage {

/// A committed checkpoint of the directory: its name and the step its metadata records (-1: none).
struct RetentionEntry {
  std::string name;
  int64_t step = -1;
};

/// The names to delete, oldest first. Kept: with keep_last == 0 everything; otherwise the
/// keep_last newest (by step, then name, as committed_checkpoints orders them), every entry whose
/// step is a multiple of keep_every (> 0; steps < 0 never match), `latest_name`, and every name
/// in `protect`. Pure: no file-system access.
std::vector<std::string> select_for_deletion(std::vector<RetentionEntry> entries, int64_t keep_last, int64_t keep_every,
                                             const std::string& latest_name,
                                             const std::vector<std::string>& protect = {});

/// What apply_retention did (or, dry, would do).
struct RetentionOutcome {
  std::vector<std::string> deleted;  ///< names, oldest first
  std::vector<std::string> kept;     ///< names, newest first
};

/// Applies retention to the committed checkpoints directly under `root` (see
/// committed_checkpoints: temporary and unreadable directories are never touched). Besides
/// `protect`, keeps what `latest` names and what a load of `root` would select. A checkpoint is
/// first renamed to a temporary name (so a crash mid-delete never leaves a half-deleted checkpoint
/// that looks committed), then removed. The caller holds the directory's save lock.
Result<RetentionOutcome> apply_retention(const std::string& root, int64_t keep_last, int64_t keep_every,
                                         const std::vector<std::string>& protect, bool dry_run);

/// After a committed save of `saved_dir` (coordinator, under the save lock): apply_retention to
/// its parent, keeping `saved_dir`; a failure is logged, never the save's failure. No-op when
/// keep_last is 0.
void retain_after_save(const std::string& saved_dir, int64_t keep_last, int64_t keep_every);

}  // namespace h5ckpt::storage
