// Global step, LR scheduler and per-rank RNG as checkpoint items (see extra_states.h).
#include "extras/extra_states.h"

#include <algorithm>
#include <cmath>

#include "extras/splitmix.h"
#include "loader/loader_internal.h"

namespace h5ckpt::extras {

using loader::detail::corrupt;
using loader::detail::Reader;
using loader::detail::Writer;

namespace {

constexpr uint64_t kLrMagic = 0x3144454843524C48ull;  // "HLRCHED1"
constexpr uint64_t kRngMagic = 0x31474E52444C48ull;   // "HLDRNG1"

}  // namespace

uint64_t RngState::next_u64() {
  ++draws;
  state += kSplitmixGamma;
  return splitmix64_mix(state);
}

RngState derive_rank_rng(uint64_t seed, int64_t step, RankCoords c) {
  RngState r;
  r.state = hash4(seed ^ 0x52A4D0ull, static_cast<uint64_t>(step),
                  (static_cast<uint64_t>(static_cast<uint32_t>(c.tp)) << 32) | static_cast<uint32_t>(c.dp),
                  (static_cast<uint64_t>(static_cast<uint32_t>(c.cp)) << 32) | static_cast<uint32_t>(c.pp));
  r.draws = 0;
  return r;
}

std::string rng_key(RankCoords c) {
  // CP rank 0 keeps the name of a job without context parallelism.
  return "extra/rng/tp" + std::to_string(c.tp) + (c.cp != 0 ? "_cp" + std::to_string(c.cp) : std::string()) + "_dp" +
         std::to_string(c.dp) + "_pp" + std::to_string(c.pp);
}

float LrSchedulerState::lr(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps)
    return static_cast<float>(base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps));
  if (decay_steps > 0) {
    double p = std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps));
    return static_cast<float>(min_lr + 0.5 * (base_lr - min_lr) * (1.0 + std::cos(3.14159265358979323846 * p)));
  }
  return static_cast<float>(base_lr);
}

void ExtraStates::stage_save(StateDict& sd, RankCoords coords) {
  step_buf_ = global_step;
  sd.add_replicated("extra/global_step", DType::kI64, {1}, &step_buf_);
  Writer w;
  w.put(kLrMagic);
  w.put(scheduler.base_lr);
  w.put(scheduler.min_lr);
  w.put(scheduler.warmup_steps);
  w.put(scheduler.decay_steps);
  w.put(scheduler.last_step);
  sched_buf_ = std::move(w.buf);
  sd.add_bytes("extra/lr_scheduler", sched_buf_.data(), sched_buf_.size());
  Writer r;
  r.put(kRngMagic);
  r.put(rng.state);
  r.put(rng.draws);
  rng_buf_ = std::move(r.buf);
  sd.add_bytes(rng_key(coords), rng_buf_.data(), rng_buf_.size());
}

Status ExtraStates::stage_load(StateDict& sd, const CheckpointInfo& info, RankCoords coords) {
  const TensorInfo* step = info.find("extra/global_step");
  const TensorInfo* sched = info.find("extra/lr_scheduler");
  if (!step || !sched) return Status(ErrorCode::kNotFound, "checkpoint has no extra/global_step or extra/lr_scheduler");
  if (step->dtype != DType::kI64 || step->shape != Shape{1}) return corrupt("extra/global_step is not int64[1]");
  if (sched->shape.size() != 1) return corrupt("extra/lr_scheduler is not a byte blob");
  sd.add_replicated("extra/global_step", DType::kI64, {1}, &step_buf_);
  sched_buf_.assign(static_cast<size_t>(sched->shape[0]), 0);
  sd.add_bytes("extra/lr_scheduler", sched_buf_.data(), sched_buf_.size());
  const TensorInfo* rng_item = info.find(rng_key(coords));
  rng_staged_ = rng_item && rng_item->shape.size() == 1;
  if (rng_staged_) {
    rng_buf_.assign(static_cast<size_t>(rng_item->shape[0]), 0);
    sd.add_bytes(rng_key(coords), rng_buf_.data(), rng_buf_.size());
  }
  return Status::Ok();
}

Result<bool> ExtraStates::finish_load(uint64_t seed, RankCoords coords) {
  global_step = step_buf_;
  Reader s(sched_buf_.data(), sched_buf_.size());
  if (s.get<uint64_t>() != kLrMagic) return corrupt("extra/lr_scheduler: bad magic");
  LrSchedulerState st;
  st.base_lr = s.get<double>();
  st.min_lr = s.get<double>();
  st.warmup_steps = s.get<int64_t>();
  st.decay_steps = s.get<int64_t>();
  st.last_step = s.get<int64_t>();
  if (!s.ok() || !s.at_end()) return corrupt("extra/lr_scheduler: truncated");
  scheduler = st;
  if (!rng_staged_) {
    rng = derive_rank_rng(seed, global_step, coords);
    return false;
  }
  Reader r(rng_buf_.data(), rng_buf_.size());
  if (r.get<uint64_t>() != kRngMagic) return corrupt(rng_key(coords) + ": bad magic");
  rng.state = r.get<uint64_t>();
  rng.draws = r.get<uint64_t>();
  if (!r.ok() || !r.at_end()) return corrupt(rng_key(coords) + ": truncated");
  return true;
}

}  // namespace h5ckpt::extras
