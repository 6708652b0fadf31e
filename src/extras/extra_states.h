// Extra training states of the synthetic trainer: global step, LR scheduler and a per-rank RNG,
// saved and restored as h5ckpt items. Not part of the installed library (target h5ckpt_extras).
//
// Checkpoint items:
//   extra/global_step             int64[1], replicated
//   extra/lr_scheduler            bytes, replicated
//   extra/rng/tp<t>_dp<d>_pp<p>   bytes, one per rank
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "h5ckpt/checkpoint_info.h"
#include "h5ckpt/state.h"
#include "h5ckpt/status.h"
#include "h5ckpt/topology.h"

namespace h5ckpt::extras {

/// A per-rank random-number generator (splitmix64: a 64-bit state and a draw counter).
struct RngState {
  uint64_t state = 0;
  uint64_t draws = 0;
  uint64_t next_u64();
  bool operator==(const RngState&) const = default;
};

/// The documented rule for a rank whose (tp, cp, dp, pp) coordinate did not exist in the saved
/// layout (and for a fresh run at step 0): the state is a hash of (seed, step, tp, dp, cp, pp)
/// (cp = 0 gives the hash of a job without context parallelism), so it is reproducible and
/// differs between ranks.
RngState derive_rank_rng(uint64_t seed, int64_t step, RankCoords coords);
/// "extra/rng/tp<t>_dp<d>_pp<p>", or "extra/rng/tp<t>_cp<c>_dp<d>_pp<p>" for CP rank c > 0.
std::string rng_key(RankCoords coords);

/// Replicated LR-scheduler state: linear warmup then cosine decay to min_lr (constant when
/// warmup_steps == decay_steps == 0). lr() is a pure function of the state and the step.
struct LrSchedulerState {
  double base_lr = 1e-2;
  double min_lr = 1e-2;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;
  int64_t last_step = 0;  ///< step of the last lr() handed out
  float lr(int64_t step) const;
  bool operator==(const LrSchedulerState&) const = default;
};

/// Global step, LR scheduler and this rank's RNG, saved and restored as h5ckpt items.
class ExtraStates {
 public:
  int64_t global_step = 0;
  LrSchedulerState scheduler;
  RngState rng;

  /// Adds extra/global_step, extra/lr_scheduler (replicated) and this rank's RNG to `sd`,
  /// from copies owned by this object (valid until the next stage_* call).
  void stage_save(StateDict& sd, RankCoords coords);
  /// Adds the items to load: step and scheduler always, the RNG only if the checkpoint has
  /// this rank's coordinate. Call finish_load after Checkpointer::load.
  Status stage_load(StateDict& sd, const CheckpointInfo& info, RankCoords coords);
  /// Decodes the loaded items; a rank whose coordinate was not saved gets
  /// derive_rank_rng(seed, global_step, coords). Returns whether the RNG was restored.
  Result<bool> finish_load(uint64_t seed, RankCoords coords);

 private:
  int64_t step_buf_ = 0;
  std::vector<uint8_t> sched_buf_, rng_buf_;
  bool rng_staged_ = false;
};

}  // namespace h5ckpt::extras
