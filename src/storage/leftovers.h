// Cleanup of temporary directories that failed or crashed saves left next to their targets.
#pragma once

#include <string>

#include "h5ckpt/status.h"

namespace h5ckpt::storage {

/// Removes the leftover temporary directories (storage::is_temp_name) in the parent of
/// `committed_dir`, a checkpoint that was just committed. Called under the save lock
/// (acquire_save_lock: one save per directory at a time), so any `.NAME.inprogress-*` there is a
/// leftover; `.NAME.inprogress-*.old` (a checkpoint moved aside by an overwrite) goes only when
/// NAME exists again. Best effort: failures are logged, the number removed is returned.
int remove_leftover_temps(const std::string& committed_dir);

}  // namespace h5ckpt::storage
