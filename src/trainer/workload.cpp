// The synthetic workload: tensors, initial values, the elementwise Adam step, checkpoint items.
#include "workload.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <sstream>
#include <tuple>

#include "extras/synthetic_loader.h"
#include "util/checked_math.h"

namespace h5ckpt::workload {

// ---- numerics ------------------------------------------------------------------------------

uint32_t fnv1a32(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

float initial_value(int64_t i, uint32_t h) {
  // Integers in [-125, 125] over 128: at most 8 significant bits, so exact in bf16.
  return static_cast<float>((i * 7 + static_cast<int64_t>(h)) % 251 - 125) / 128.0f;
}

float target_value(int64_t i, uint32_t h) { return static_cast<float>((i * 3 + static_cast<int64_t>(h)) % 17) / 16.0f; }

uint16_t to_bf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit, then truncate.
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float from_bf16(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

// ---- configuration -------------------------------------------------------------------------

Status TrainConfig::validate(int world_size) const {
  auto bad = [](const std::string& m) { return Status(ErrorCode::kInvalidArgument, m); };
  const auto& m = model;
  if (sizes.tp < 1 || sizes.pp < 1 || sizes.dp < 1 || sizes.cp < 1 || sizes.ep < 1)
    return bad("--tp, --pp, --dp, --cp and --ep must be >= 1");
  // In 64 bits and checked: --tp 65536 --dp 65536 wrapped to 0 in int ("launch with mpiexec -n 0").
  int64_t want = 0;
  const bool cp = sizes.cp != 1;
  const std::string names = cp ? "tp*cp*pp*dp" : "tp*pp*dp";
  const std::string product = std::to_string(sizes.tp) + "*" + (cp ? std::to_string(sizes.cp) + "*" : "") +
                              std::to_string(sizes.pp) + "*" + std::to_string(sizes.dp);
  if (__builtin_mul_overflow(int64_t{sizes.tp}, int64_t{sizes.pp}, &want) ||
      __builtin_mul_overflow(want, int64_t{sizes.dp}, &want) ||
      __builtin_mul_overflow(want, int64_t{sizes.cp}, &want) || want > INT32_MAX)
    return bad(names + " = " + product + " is more ranks than MPI can address (at most 2^31-1)");
  if (world_size != want)
    return bad("world size " + std::to_string(world_size) + " != " + names + " = " + product + " = " +
               std::to_string(want) + " (launch with mpiexec -n " + std::to_string(want) + ")");
  // Mixture of experts and expert parallelism.
  if (m.experts < 0) return bad("--experts must be >= 0");
  if (m.moe_every < 0) return bad("--moe-every must be >= 0");
  if (m.experts > 0 && m.moe_every == 0)
    return bad("--experts " + std::to_string(m.experts) + " needs --moe-every K (every K-th layer is MoE)");
  if (m.experts == 0 && m.moe_every > 0) return bad("--moe-every needs --experts E (experts per MoE layer)");
  if (m.moe_every > m.layers)
    return bad("--moe-every " + std::to_string(m.moe_every) + " > --layers " + std::to_string(m.layers) +
               ": no layer would be MoE");
  if (sizes.ep > 1 && m.experts == 0) return bad("--ep " + std::to_string(sizes.ep) + " needs --experts");
  if ((int64_t{sizes.dp} * sizes.cp) % sizes.ep != 0)
    return bad("--ep " + std::to_string(sizes.ep) + " must divide dp*cp = " +
               std::to_string(int64_t{sizes.dp} * sizes.cp) + " (experts are split inside the DP x CP ranks)");
  if (m.experts > 0 && m.experts % sizes.ep != 0)
    return bad("--ep " + std::to_string(sizes.ep) + " must divide --experts " + std::to_string(m.experts) +
               " (every EP rank holds the same number of experts)");
  if (m.layers < 1 || m.hidden < 1 || m.heads < 1 || m.kv_heads < 1 || m.ffn < 1 || m.vocab < 1)
    return bad("--layers, --hidden, --heads, --kv-heads, --ffn and --vocab must be >= 1");
  if (m.hidden % m.heads != 0) return bad("--hidden must be a multiple of --heads");
  if (m.heads % m.kv_heads != 0) return bad("--heads must be a multiple of --kv-heads (GQA groups)");
  if (m.kv_heads % sizes.tp != 0) return bad("--kv-heads must be a multiple of --tp (TP splits whole KV groups)");
  if (m.ffn % sizes.tp != 0) return bad("--ffn must be a multiple of --tp");
  if (m.layers < sizes.pp) return bad("--layers must be >= --pp (every stage needs a layer)");
  if (m.dtype != DType::kBF16 && m.dtype != DType::kF32) return bad("--dtype must be bf16 or f32");
  if (loader_workers < 1) return bad("--loader-workers must be >= 1");
  if (context_len < 1) return bad("--seq-len must be >= 1");
  // Element counts (times dp for the ZeRO slice bounds) and byte sizes of the largest tensors
  // must fit in 64 bits; a model that fits but not in memory fails later, as a clean bad_alloc.
  const int64_t head_dim = m.hidden / m.heads, qkv = (int64_t{m.heads} + 2 * int64_t{m.kv_heads}) * head_dim;
  // Expert tensors: E * 2F rows (fc1 with SwiGLU) of H; the ZeRO bound uses dp * cp >= expert dp.
  const int64_t expert_rows = int64_t{m.experts} * m.ffn * 2;
  for (int64_t rows : {padded_vocab(m.vocab, sizes.tp), qkv, int64_t{m.ffn} * 2, int64_t{m.heads} * head_dim,
                       expert_rows, int64_t{m.experts}}) {
    int64_t n = 0;
    if (__builtin_mul_overflow(rows, int64_t{m.hidden}, &n) ||
        __builtin_mul_overflow(n, int64_t{sizes.dp} * sizes.cp, &n) ||
        __builtin_mul_overflow(n, int64_t{16}, &n))  // 16: param + master + two moments, bytes per element
      return bad("the model is too large: a tensor of " + std::to_string(rows) + " x " + std::to_string(m.hidden) +
                 " elements overflows 64-bit sizes");
  }
  return Status::Ok();
}

std::string TrainConfig::layout_tag() const {
  return "tp" + std::to_string(sizes.tp) + ".pp" + std::to_string(sizes.pp) + ".dp" + std::to_string(sizes.dp) +
         (sizes.cp != 1 ? ".cp" + std::to_string(sizes.cp) : "") +
         (sizes.ep != 1 ? ".ep" + std::to_string(sizes.ep) : "") + (zero ? ".zero" : "");
}

int64_t padded_vocab(int vocab, int tp) { return (static_cast<int64_t>(vocab) + tp - 1) / tp * tp; }

std::vector<int> even_stage_layers(int layers, int pp) {
  std::vector<int> per(static_cast<size_t>(pp), layers / pp);
  for (int s = 0; s < layers % pp; ++s) ++per[static_cast<size_t>(s)];
  return per;
}

std::pair<int64_t, int64_t> zero_slice(int64_t numel, int dp_rank, int dp) {
  return {numel * dp_rank / dp, numel * (dp_rank + 1) / dp};
}

std::vector<TensorDesc> model_tensors(const ModelConfig& m, int tp, int pp) {
  return model_tensors(m, tp, even_stage_layers(m.layers, pp));
}

std::vector<TensorDesc> model_tensors(const ModelConfig& m, int tp, const std::vector<int>& layers_per_stage) {
  const int pp = static_cast<int>(layers_per_stage.size());
  const int64_t H = m.hidden, F = m.ffn, V = padded_vocab(m.vocab, tp);
  const int64_t d = m.hidden / m.heads;
  // QKV rows are grouped by KV head: [q of the group's heads, k, v] per group, so a split of
  // dim 0 into tp parts (kv_heads % tp == 0) gives each rank whole groups.
  const int64_t qkv = (int64_t{m.heads} + 2 * int64_t{m.kv_heads}) * d;  // int would overflow
  std::vector<TensorDesc> out;
  std::vector<int> emb_stages{0};
  if (m.tie_embeddings && pp > 1) emb_stages.push_back(pp - 1);
  out.push_back({"embedding.word_embeddings.weight", {V, H}, 0, emb_stages, m.vocab});
  int layer = 0;
  for (int s = 0; s < pp; ++s) {
    for (int k = 0; k < layers_per_stage[static_cast<size_t>(s)]; ++k, ++layer) {
      std::string p = "decoder.layers." + std::to_string(layer) + ".";
      auto add = [&](const std::string& name, Shape shape, int split) {
        out.push_back({p + name, std::move(shape), split, {s}, -1});
      };
      add("input_layernorm.weight", {H}, -1);
      add("input_layernorm.bias", {H}, -1);
      add("self_attention.linear_qkv.weight", {qkv, H}, 0);  // column-parallel
      add("self_attention.linear_qkv.bias", {qkv}, 0);
      add("self_attention.linear_proj.weight", {H, m.heads * d}, 1);  // row-parallel
      add("self_attention.linear_proj.bias", {H}, -1);
      add("pre_mlp_layernorm.weight", {H}, -1);
      add("pre_mlp_layernorm.bias", {H}, -1);
      const int64_t fc1 = m.swiglu ? 2 * F : F;  // SwiGLU: [gate; up] fused
      if (m.is_moe_layer(layer)) {
        // The MLP becomes E experts (no biases) and a router; experts split over EP along dim 0.
        const int64_t E = m.experts;
        add("mlp.router.weight", {E, H}, -1);  // replicated over TP (and EP)
        out.push_back({p + "mlp.experts.linear_fc1.weight", {E, fc1, H}, 1, {s}, -1, true, m.swiglu});
        out.push_back({p + "mlp.experts.linear_fc2.weight", {E, H, F}, 2, {s}, -1, true, false});
      } else {
        out.push_back({p + "mlp.linear_fc1.weight", {fc1, H}, 0, {s}, -1, false, m.swiglu});  // column-parallel
        out.push_back({p + "mlp.linear_fc1.bias", {fc1}, 0, {s}, -1, false, m.swiglu});
        add("mlp.linear_fc2.weight", {H, F}, 1);  // row-parallel
        add("mlp.linear_fc2.bias", {H}, -1);
      }
    }
  }
  out.push_back({"decoder.final_layernorm.weight", {H}, -1, {pp - 1}, -1});
  out.push_back({"decoder.final_layernorm.bias", {H}, -1, {pp - 1}, -1});
  if (!m.tie_embeddings) out.push_back({"output_layer.weight", {V, H}, 0, {pp - 1}, m.vocab});
  return out;
}

std::vector<Box> local_boxes(const TensorDesc& d, int tp, int tp_rank, int ep, int ep_rank) {
  Box b{Shape(d.shape.size(), 0), d.shape};
  if (d.expert) {  // contiguous blocks of E / ep experts
    const int64_t per = d.shape[0] / ep;
    b.offset[0] = per * ep_rank;
    b.shape[0] = per;
  }
  if (d.split_dim < 0) return {b};
  const auto k = static_cast<size_t>(d.split_dim);
  if (!d.fused_glu || tp == 1) {  // one TP rank of a fused tensor holds it whole: one box
    const ShardSpec sp = ShardSpec::split(d.shape, d.split_dim, tp, tp_rank);
    b.offset[k] = sp.box.offset[k];
    b.shape[k] = sp.box.shape[k];
    return {b};
  }
  // Fused SwiGLU: rows t of the gate half, then rows t of the up half (per local expert).
  const int64_t half = d.shape[k] / 2, per = half / tp;
  const int64_t n_experts = d.expert ? b.shape[0] : 1;
  std::vector<Box> out;
  for (int64_t j = 0; j < n_experts; ++j)
    for (int64_t u = 0; u < 2; ++u) {
      Box g = b;
      if (d.expert) {
        g.offset[0] = b.offset[0] + j;
        g.shape[0] = 1;
      }
      g.offset[k] = u * half + tp_rank * per;
      g.shape[k] = per;
      out.push_back(std::move(g));
    }
  return out;
}

// ---- the rank's state ----------------------------------------------------------------------

int64_t Workload::Local::global_index(int64_t j) const {
  if (boxes.size() == 1 && tp_shard.box.shape.size() <= 2) {
    const Box& b = tp_shard.box;
    if (b.shape.size() == 1) return b.offset[0] + j;
    const int64_t cols = desc->shape[1];
    return (b.offset[0] + j / b.shape[1]) * cols + b.offset[1] + j % b.shape[1];
  }
  // The box holding local element j, then j's row-major position in it, then in the tensor.
  const size_t k = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), j) - starts.begin()) - 1;
  const Box& b = boxes[k];
  int64_t r = j - starts[k], idx = 0, stride = 1;
  for (size_t d = b.shape.size(); d-- > 0;) {
    idx += (b.offset[d] + r % b.shape[d]) * stride;
    r /= b.shape[d];
    stride *= desc->shape[d];
  }
  return idx;
}

std::tuple<MPI_Comm, int, int> Workload::zero_group(const TensorDesc& d) const {
  const ParallelSizes& z = cfg_.sizes;
  if (d.expert) return {topo_->expert_dp_comm(), coords_.edp, z.edp()};
  if (z.cp > 1) return {topo_->dp_cp_comm(), coords_.dp * z.cp + coords_.cp, z.dp * z.cp};
  return {topo_->dp_comm(), coords_.dp, z.dp};
}

Workload::Workload(const TrainConfig& cfg, const Topology& topo) : cfg_(cfg), topo_(&topo), coords_(topo.coords()) {
  descs_ = model_tensors(cfg.model, cfg.sizes.tp, cfg.sizes.pp);
  const size_t es = dtype_size(cfg.model.dtype);
  for (const auto& d : descs_) {
    bool mine = false;
    for (int s : d.stages) mine |= s == coords_.pp;
    if (!mine) continue;
    Local t;
    t.desc = &d;
    t.key = "model/" + d.fqn;
    t.h = fnv1a32(t.key) % 251;
    t.boxes = local_boxes(d, cfg.sizes.tp, coords_.tp, cfg.sizes.ep, coords_.ep);
    t.tp_shard = ShardSpec::box_of(t.boxes[0].offset, t.boxes[0].shape);
    t.numel = 0;
    for (const Box& b : t.boxes) {
      t.starts.push_back(t.numel);
      t.numel += b.volume();
    }
    if (cfg.zero) {  // the distributed optimizer owns an even flat slice of the TP shard
      const auto [group, index, size] = zero_group(d);
      (void)group;
      std::tie(t.opt_begin, t.opt_end) = zero_slice(t.numel, index, size);
    } else {
      t.opt_begin = 0;
      t.opt_end = t.numel;
    }
    t.param.resize(static_cast<size_t>(t.numel) * es);
    const int64_t n_opt = t.opt_end - t.opt_begin;
    t.master.resize(static_cast<size_t>(n_opt));
    t.exp_avg.assign(static_cast<size_t>(n_opt), 0.0f);
    t.exp_avg_sq.assign(static_cast<size_t>(n_opt), 0.0f);
    const int64_t cols = d.shape.size() == 2 ? d.shape[1] : 1;
    for (int64_t j = 0; j < t.numel; ++j) {
      int64_t i = t.global_index(j);
      bool pad = d.valid_rows >= 0 && i / cols >= d.valid_rows;
      float v = pad ? 0.0f : initial_value(i, t.h);
      if (cfg.model.dtype == DType::kBF16) reinterpret_cast<uint16_t*>(t.param.data())[j] = to_bf16(v);
      else reinterpret_cast<float*>(t.param.data())[j] = v;
      if (j >= t.opt_begin && j < t.opt_end) t.master[static_cast<size_t>(j - t.opt_begin)] = v;
    }
    locals_.push_back(std::move(t));
  }
  loader_ = loader::RankLoader::fresh(extras::default_loader_config(cfg.seed, cfg.loader_workers, cfg.context_len),
                                      cfg.sizes.dp, coords_.dp);
  extras_.global_step = 0;
  extras_.scheduler = extras::LrSchedulerState{1e-2, 1e-2, 0, 0, 0};
  extras_.rng = extras::derive_rank_rng(cfg.seed, 0, coords_);
}

uint64_t Workload::local_state_bytes() const {
  uint64_t b = 0;
  for (const auto& t : locals_) b += t.param.size() + 12 * t.master.size();
  return b;
}

void Workload::update(Local& t, float lr, float bc1, float bc2) {
  const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  const bool bf16 = cfg_.model.dtype == DType::kBF16;
  const int64_t cols = t.desc->shape.size() == 2 ? t.desc->shape[1] : 1;
  auto* p16 = reinterpret_cast<uint16_t*>(t.param.data());
  auto* p32 = reinterpret_cast<float*>(t.param.data());
  for (int64_t j = t.opt_begin; j < t.opt_end; ++j) {
    const int64_t i = t.global_index(j);
    // Vocabulary padding rows get no gradient: they stay exactly zero, as do their m and v.
    if (t.desc->valid_rows >= 0 && i / cols >= t.desc->valid_rows) continue;
    const size_t o = static_cast<size_t>(j - t.opt_begin);
    const float p = bf16 ? from_bf16(p16[j]) : p32[j];
    const float g = p - target_value(i, t.h);
    float& m = t.exp_avg[o];
    float& v = t.exp_avg_sq[o];
    m = b1 * m + (1.0f - b1) * g;
    v = b2 * v + (1.0f - b2) * (g * g);
    const float mhat = m / bc1;
    const float vhat = v / bc2;
    float& w = t.master[o];
    w = w - lr * mhat / (std::sqrt(vhat) + eps);
    if (bf16) p16[j] = to_bf16(w);
    else p32[j] = w;
  }
}

void Workload::allgather_params(Local& t) {
  const auto [group, index, dp] = zero_group(*t.desc);
  (void)index;
  if (dp == 1) return;
  const int es = static_cast<int>(dtype_size(cfg_.model.dtype));
  std::vector<int> counts(static_cast<size_t>(dp)), displs(static_cast<size_t>(dp));
  for (int d = 0; d < dp; ++d) {
    const auto [b, e] = zero_slice(t.numel, d, dp);
    counts[static_cast<size_t>(d)] = static_cast<int>((e - b) * es);
    displs[static_cast<size_t>(d)] = static_cast<int>(b * es);
  }
  MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, t.param.data(), counts.data(), displs.data(), MPI_BYTE, group);
}

std::vector<loader::Piece> Workload::train_step() {
  const int64_t step = extras_.global_step + 1;
  const int workers = static_cast<int>(loader_.shards.size());
  std::vector<loader::Piece> pieces = extras::next_window(loader_, static_cast<int>((step - 1) % workers));
  if (cfg_.sizes.cp > 1) {
    // The CP ranks of a DP rank split one sequence: they must have taken the same window.
    uint64_t hash[2] = {1469598103934665603ull, 0};
    for (const auto& p : pieces)
      for (int64_t v : {int64_t{p.id.source}, int64_t{p.id.record}, p.begin, p.end})
        hash[0] = (hash[0] ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    hash[1] = ~hash[0];
    uint64_t lo[2] = {0, 0};
    MPI_Allreduce(hash, lo, 2, MPI_UINT64_T, MPI_MIN, topo_->cp_comm());  // min of h and of ~h = ~max of h
    if (lo[0] != ~lo[1] && data_status_.ok())
      data_status_ = Status(ErrorCode::kInternal, "step " + std::to_string(step) + ": the CP ranks of DP rank " +
                                                      std::to_string(coords_.dp) + " consumed different data");
  }
  extras_.rng.next_u64();  // e.g. a dropout seed; the elementwise update does not use it
  const float lr = extras_.scheduler.lr(step - 1);
  extras_.scheduler.last_step = step;
  opt_step_ += 1;
  // Bias corrections computed once per step in double, rounded once: identical on every rank.
  const float bc1 = static_cast<float>(1.0 - std::pow(0.9, static_cast<double>(opt_step_)));
  const float bc2 = static_cast<float>(1.0 - std::pow(0.999, static_cast<double>(opt_step_)));
  for (auto& t : locals_) {
    update(t, lr, bc1, bc2);
    if (cfg_.zero) allgather_params(t);  // over the tensor's optimizer group (no-op for one rank)
  }
  extras_.global_step = step;
  return pieces;
}

// ---- checkpoint items ----------------------------------------------------------------------

void Workload::add_item(StateDict& sd, const std::string& key, DType dtype, const Local& t, int64_t b, int64_t e,
                        bool flat, void* data) const {
  if (t.boxes.size() == 1) {
    sd.add(key, dtype, t.desc->shape, flat ? ShardSpec::flat_range(t.tp_shard.box, b, e) : t.tp_shard, data);
    return;
  }
  // Several boxes in one buffer (fused SwiGLU): the part of each box inside [b, e), at its offset.
  std::vector<ShardPiece> pieces;
  const size_t es = dtype_size(dtype);
  for (size_t k = 0; k < t.boxes.size(); ++k) {
    const int64_t s0 = t.starts[k], s1 = s0 + t.boxes[k].volume();
    const int64_t lo = std::max(b, s0), hi = std::min(e, s1);
    if (lo >= hi) continue;
    ShardSpec sp = lo == s0 && hi == s1 ? ShardSpec::box_of(t.boxes[k].offset, t.boxes[k].shape)
                                        : ShardSpec::flat_range(t.boxes[k], lo - s0, hi - s0);
    pieces.push_back({std::move(sp), static_cast<uint64_t>(lo - b) * es});
  }
  if (pieces.size() == 1) sd.add(key, dtype, t.desc->shape, pieces[0].shard, data);
  else sd.add_pieces(key, dtype, t.desc->shape, std::move(pieces), data);
}

void Workload::stage_save(StateDict& sd) {
  for (auto& t : locals_) {
    add_item(sd, t.key, cfg_.model.dtype, t, 0, t.numel, false, t.param.data());
    if (t.opt_end == t.opt_begin) continue;  // a tiny tensor may leave a DP rank nothing
    for (auto [name, buf] : {std::pair{"optimizer/fp32_param/", &t.master}, std::pair{"optimizer/exp_avg/", &t.exp_avg},
                             std::pair{"optimizer/exp_avg_sq/", &t.exp_avg_sq}})
      add_item(sd, name + t.desc->fqn, DType::kF32, t, t.opt_begin, t.opt_end, cfg_.zero, buf->data());
  }
  sd.add_replicated("optimizer/step", DType::kI64, {1}, &opt_step_);
  // The CP ranks of a DP rank share its data stream: CP rank 0 saves it (all load it).
  if (coords_.cp == 0) loader_ckpt_.stage_save(sd, loader_, coords_.dp);
  extras_.stage_save(sd, coords_);
}

Status Workload::stage_load(StateDict& sd, const CheckpointInfo& info) {
  stage_save(sd);  // the same items, now as load targets...
  // ...except the loader and extras, whose saved items depend on the saving layout.
  auto& items = sd.items();
  std::erase_if(items,
                [](const StateItem& it) { return it.key.rfind("loader/", 0) == 0 || it.key.rfind("extra/", 0) == 0; });
  // A vocabulary padded for another tp: keep the common rows (padding rows are zero anyway).
  // Only padding may differ: the same vocabulary (when the checkpoint records it), the same
  // hidden size, and at least every real row stored.
  auto vocab = info.attributes.find("trainer.vocab");
  if (vocab != info.attributes.end() && vocab->second != std::to_string(cfg_.model.vocab))
    return Status(ErrorCode::kShapeMismatch, "the checkpoint was trained with a vocabulary of " + vocab->second +
                                                 " tokens, this run has " + std::to_string(cfg_.model.vocab));
  for (const auto& t : locals_) {
    if (t.desc->valid_rows < 0) continue;
    if (const TensorInfo* stored = info.find(t.key);
        stored && stored->shape != t.desc->shape &&
        (stored->shape.size() != 2 || stored->shape[1] != t.desc->shape[1] || stored->shape[0] < t.desc->valid_rows))
      return Status(ErrorCode::kShapeMismatch, "key '" + t.key + "': the checkpoint's shape " +
                                                   to_string_shape(stored->shape) + " is not the " +
                                                   std::to_string(t.desc->valid_rows) + "-token vocabulary of " +
                                                   to_string_shape(t.desc->shape) + " padded to another multiple");
    const std::string& f = t.desc->fqn;
    for (auto& it : items)
      if (it.key == t.key || it.key == "optimizer/fp32_param/" + f || it.key == "optimizer/exp_avg/" + f ||
          it.key == "optimizer/exp_avg_sq/" + f)
        it.allow_shape_mismatch = true;
  }
  H5CKPT_RETURN_IF_ERROR(loader_ckpt_.stage_load(sd, info));
  H5CKPT_RETURN_IF_ERROR(extras_.stage_load(sd, info, coords_));
  return Status::Ok();
}

Status Workload::finish_load() {
  H5CKPT_ASSIGN_OR_RETURN(loader_, loader_ckpt_.finish_load(cfg_.sizes.dp, coords_.dp, cfg_.loader_workers));
  H5CKPT_ASSIGN_OR_RETURN(rng_restored_, extras_.finish_load(loader_.replicated.config.seed, coords_));
  if (opt_step_ != extras_.global_step)
    return Status(ErrorCode::kCorrupt, "optimizer/step " + std::to_string(opt_step_) + " != extra/global_step " +
                                           std::to_string(extras_.global_step));
  return Status::Ok();
}

}  // namespace h5ckpt::workload
