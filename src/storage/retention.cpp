#include "storage/retention.h"

#include "h5ckpt/metrics_schema.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <optional>
#include <set>

#include "h5ckpt/checkpoint_info.h"
#include "logging/log.h"
#include "storage/commit.h"
#include "storage/posix_io.h"

namespace h5ckpt::storage {

namespace fs = std::filesystem;

std::vector<std::string> select_for_deletion(std::vector<RetentionEntry> entries, int64_t keep_last, int64_t keep_every,
                                             const std::string& latest_name, const std::vector<std::string>& protect) {
  if (keep_last <= 0) return {};
  std::sort(entries.begin(), entries.end(), [](const RetentionEntry& a, const RetentionEntry& b) {
    return a.step != b.step ? a.step > b.step : a.name > b.name;
  });
  std::set<std::string> keep(protect.begin(), protect.end());
  if (!latest_name.empty()) keep.insert(latest_name);
  std::vector<std::string> out;
  for (size_t i = 0; i < entries.size(); ++i) {
    const RetentionEntry& e = entries[i];
    const bool newest = static_cast<int64_t>(i) < keep_last;
    const bool milestone = keep_every > 0 && e.step >= 0 && e.step % keep_every == 0;
    if (!newest && !milestone && !keep.count(e.name)) out.push_back(e.name);
  }
  std::reverse(out.begin(), out.end());  // oldest first
  // A name listed twice (impossible in one directory) must not be deleted when one copy is kept.
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Result<RetentionOutcome> apply_retention(const std::string& root, int64_t keep_last, int64_t keep_every,
                                         const std::vector<std::string>& protect, bool dry_run) {
  RetentionOutcome outcome;
  const std::vector<CommittedCheckpoint> found = committed_checkpoints(root);
  std::vector<RetentionEntry> entries;
  for (const auto& c : found) entries.push_back({c.name, c.step});
  std::vector<std::string> keep = protect;
  // Never the checkpoint `latest` names, nor the one a load would pick if `latest` is broken.
  const std::string latest = read_latest_name(root);
  if (auto selected = resolve_checkpoint_dir(root); selected.ok())
    keep.push_back(fs::path(*selected).filename().string());
  const std::vector<std::string> doomed = select_for_deletion(entries, keep_last, keep_every, latest, keep);
  for (const auto& c : found)
    if (std::find(doomed.begin(), doomed.end(), c.name) == doomed.end()) outcome.kept.push_back(c.name);
  if (dry_run) {
    outcome.deleted = doomed;
    return outcome;
  }
  test_crash_point("retention");
  Status first;
  for (const std::string& name : doomed) {
    const std::string dir = (fs::path(root) / name).string();
    // A temporary name first: a crash while removing leaves litter, never a half checkpoint
    // that looks committed (leftover cleanup or the next prune removes it).
    const std::string doomed_dir = temp_dir_for(dir, "deleting-" + std::to_string(::getpid()));
    Status st;
    if (io::rename(dir, doomed_dir) != 0) st = io::error("rename", dir + "' to '" + doomed_dir, errno);
    if (st.ok()) st = remove_tree(doomed_dir);
    if (st.ok()) {
      // The per-save/load metrics written beside it go with it (a metrics_dir elsewhere is the
      // user's to manage).
      for (const char* op : {"save", "load"}) {
        std::error_code ec;
        fs::remove(metrics_schema::metrics_path(dir, op, ""), ec);
      }
      outcome.deleted.push_back(name);
      continue;
    }
    logging::log().warn("retention: could not delete '{}': {}", dir, st.to_string());
    if (first.ok()) first = st.with_context("deleting old checkpoint '" + dir + "'");
  }
  if (!outcome.deleted.empty()) (void)fsync_path(root);
  if (!first.ok() && outcome.deleted.empty()) return first;
  if (!outcome.deleted.empty())
    logging::log().info("retention in '{}': deleted {} old checkpoint(s), {} kept", root, outcome.deleted.size(),
                        outcome.kept.size());
  return outcome;
}

void retain_after_save(const std::string& saved_dir, int64_t keep_last, int64_t keep_every) {
  if (keep_last <= 0) return;
  fs::path dir = fs::path(saved_dir).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();
  const std::string root = dir.parent_path().empty() ? "." : dir.parent_path().string();
  auto done = apply_retention(root, keep_last, keep_every, {dir.filename().string()}, false);
  if (!done.ok()) logging::log().warn("retention after saving '{}': {}", saved_dir, done.status().to_string());
}

}  // namespace h5ckpt::storage

namespace h5ckpt {

namespace fs = std::filesystem;

Result<PruneResult> prune_checkpoints(const std::string& root, const PruneOptions& options) {
  if (options.keep_last < 1)
    return Status(ErrorCode::kInvalidArgument, "keep_last must be at least 1 (the newest checkpoint is always kept)");
  if (options.keep_every < 0) return Status(ErrorCode::kInvalidArgument, "keep_every must be >= 0");
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    return Status(ErrorCode::kNotFound, "'" + root + "' does not exist or is not a directory");
  if (is_checkpoint_dir(root))
    return Status(ErrorCode::kInvalidArgument,
                  "'" + root + "' is one checkpoint; prune takes the directory that holds checkpoints");
  std::optional<storage::ScopedDirLock> lock;  // a save in progress there must not race the deletions
  if (!options.dry_run) {
    H5CKPT_ASSIGN_OR_RETURN(storage::ScopedDirLock l, storage::ScopedDirLock::acquire(root));
    lock.emplace(std::move(l));
  }
  H5CKPT_ASSIGN_OR_RETURN(storage::RetentionOutcome o,
                          storage::apply_retention(root, options.keep_last, options.keep_every, {}, options.dry_run));
  return PruneResult{std::move(o.deleted), std::move(o.kept)};
}

}  // namespace h5ckpt
