// The synthetic GPT workload shared by the trainer, tests and benchmarks: Megatron-style
// tensors, an elementwise Adam (plain or ZeRO/distributed), a data loader and extra states,
// all registered with h5ckpt under layout-independent keys. See docs/trainer.md.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "extras/extra_states.h"
#include "h5ckpt/checkpointer.h"
#include "h5ckpt/loader_state.h"
#include "h5ckpt/state.h"
#include "h5ckpt/topology.h"

namespace h5ckpt::workload {

struct ModelConfig {
  int layers = 4;
  int hidden = 512;
  int heads = 8;
  int kv_heads = 4;
  int ffn = 1536;
  int vocab = 5120;
  DType dtype = DType::kBF16;  ///< model params: kBF16 or kF32
  bool tie_embeddings = false;
  int experts = 0;      ///< experts per MoE layer (0: no MoE)
  int moe_every = 0;    ///< layer L is MoE when (L + 1) % moe_every == 0 (needs experts > 0)
  bool swiglu = false;  ///< fused gate/up fc1 ([2F, H]; a TP rank holds [gate_t; up_t])
  /// True when global layer `layer` has a MoE MLP (router + experts).
  bool is_moe_layer(int layer) const { return experts > 0 && moe_every > 0 && (layer + 1) % moe_every == 0; }
};

struct TrainConfig {
  ModelConfig model;
  ParallelSizes sizes;  ///< tp, dp, pp, cp, ep (world = tp * cp * dp * pp)
  /// Distributed optimizer: master, m, v of dense tensors split over DP x CP, of expert tensors
  /// over the expert-data-parallel group.
  bool zero = false;
  uint64_t seed = 1234;
  int loader_workers = 2;  ///< read workers per DP rank
  int64_t context_len = 2048;

  /// Checks the options against each other and a world size; the message says what to change.
  Status validate(int world_size) const;
  /// "tp2.pp2.dp2.zero" style tag for reports (".cp2", ".ep4" follow dp when not 1).
  std::string layout_tag() const;
};

/// One tensor of the model as the checkpoint sees it.
struct TensorDesc {
  std::string fqn;          ///< Megatron name, e.g. "decoder.layers.0.mlp.linear_fc1.weight"
  Shape shape;              ///< global shape (vocabulary padded to a multiple of tp)
  int split_dim = -1;       ///< TP split dimension; -1: replicated over TP
  std::vector<int> stages;  ///< PP stages holding it (two for a tied embedding with pp > 1)
  int64_t valid_rows = -1;  ///< rows >= valid_rows are vocabulary padding (frozen at zero)
  bool expert = false;      ///< dim 0 indexes experts, split over EP (contiguous blocks of E / ep)
  /// Fused SwiGLU: split_dim holds [gate; up] halves and TP rank t holds [gate_t; up_t] (the rows
  /// t of each half) in one buffer; for an expert tensor, [gate_t; up_t] per local expert.
  bool fused_glu = false;
};

/// The boxes of `d` that the rank at (tp_rank, ep_rank) holds, in buffer order (one box unless
/// fused_glu). `tp` and `ep` are the TP and EP sizes.
std::vector<Box> local_boxes(const TensorDesc& d, int tp, int tp_rank, int ep, int ep_rank);

/// Every tensor of the model under `tp` x `pp` (the names and, except for the vocabulary
/// padding, the shapes do not depend on the layout).
std::vector<TensorDesc> model_tensors(const ModelConfig& m, int tp, int pp);
/// The same with `layers_per_stage[s]` layers on stage s (they must add up to m.layers).
std::vector<TensorDesc> model_tensors(const ModelConfig& m, int tp, const std::vector<int>& layers_per_stage);
/// The trainer's split of layers over stages: the first (layers % pp) stages get one more.
std::vector<int> even_stage_layers(int layers, int pp);
/// The flat slice [begin, end) of a TP shard of `numel` elements that DP rank `dp_rank` of
/// `dp` owns under the distributed optimizer (ZeRO): even, the remainder spread by rounding.
std::pair<int64_t, int64_t> zero_slice(int64_t numel, int dp_rank, int dp);
/// Vocabulary padded up to a multiple of tp.
int64_t padded_vocab(int vocab, int tp);

/// FNV-1a 32-bit hash of a string's bytes.
uint32_t fnv1a32(const std::string& s);
/// Initial value of element `i` of the tensor whose key hashes to `h` (h = fnv1a32(key) % 251).
float initial_value(int64_t i, uint32_t h);
/// Target of element `i`: ((3i + h) mod 17) / 16.
float target_value(int64_t i, uint32_t h);

/// bf16 with round-to-nearest-even (NaN stays NaN).
uint16_t to_bf16(float v);
float from_bf16(uint16_t b);

/// One rank's part of the training state.
class Workload {
 public:
  /// Builds this rank's shards with their initial values and a fresh loader.
  Workload(const TrainConfig& cfg, const Topology& topo);

  /// One optimizer step to global step `step` (= global_step + 1): loader window, elementwise
  /// Adam, ZeRO all-gather of the params over DP. Collective over the DP group with ZeRO.
  /// Returns the pieces this rank's DP group consumed (every rank of the group gets them).
  std::vector<loader::Piece> train_step();

  /// Registers every item this rank holds with `sd` (buffers owned by this object).
  void stage_save(StateDict& sd);
  /// Registers what to load from a checkpoint described by `info`.
  Status stage_load(StateDict& sd, const CheckpointInfo& info);
  /// After a successful Checkpointer::load: reshards the loader, restores extras.
  Status finish_load();

  int64_t global_step() const { return extras_.global_step; }
  bool rng_restored() const { return rng_restored_; }
  /// Not OK when the CP ranks of a DP rank consumed different data in a step (they share one stream).
  const Status& data_status() const { return data_status_; }
  const loader::RankLoader& data_loader() const { return loader_; }
  const TrainConfig& config() const { return cfg_; }
  /// Bytes of model + optimizer state this rank holds.
  uint64_t local_state_bytes() const;

 private:
  struct Local {
    const TensorDesc* desc = nullptr;
    std::string key;                                 ///< "model/<fqn>"
    uint32_t h = 0;                                  ///< fnv1a32(key) % 251
    ShardSpec tp_shard;                              ///< this rank's TP (and EP) box (the first if several)
    std::vector<Box> boxes;                          ///< every box, in buffer order (fused SwiGLU: several)
    std::vector<int64_t> starts;                     ///< local element index where each box starts
    int64_t numel = 0;                               ///< elements of the TP box
    int64_t opt_begin = 0, opt_end = 0;              ///< the part of the box this rank's optimizer owns
    std::vector<uint8_t> param;                      ///< numel * dtype_size
    std::vector<float> master, exp_avg, exp_avg_sq;  ///< opt_end - opt_begin each
    int64_t global_index(int64_t j) const;           ///< flat global index of local element j
  };
  void update(Local& t, float lr, float bc1, float bc2);
  void allgather_params(Local& t);
  /// The distributed optimizer's group of a tensor: (communicator, my index, size).
  std::tuple<MPI_Comm, int, int> zero_group(const TensorDesc& d) const;
  /// Adds an item for `t`'s local boxes (or the flat slice [b, e) of them) with `data`.
  void add_item(StateDict& sd, const std::string& key, DType dtype, const Local& t, int64_t b, int64_t e, bool flat,
                void* data) const;

  TrainConfig cfg_;
  const Topology* topo_;
  RankCoords coords_;
  std::vector<TensorDesc> descs_;
  std::vector<Local> locals_;
  loader::RankLoader loader_;
  loader::LoaderCheckpoint loader_ckpt_;
  extras::ExtraStates extras_;
  int64_t opt_step_ = 0;
  bool rng_restored_ = false;
  Status data_status_;
};

}  // namespace h5ckpt::workload
