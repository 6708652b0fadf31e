// h5ckpt-scale: the planning work of a save and of a resharding load at the scale of a 405B model
// on 8,960 ranks, in one process and without MPI: the coordinator's plans, each rank's own share
// of them, and the size of the checkpoint index. Prints one JSON line (docs/performance.md).
//
// The state is the synthetic trainer's (src/trainer/workload.h: tensor names and shapes,
// Megatron TP splits, ZeRO flat slices, loader and extra items), described as the planner sees
// it; no tensor memory is allocated.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "engine/wire.h"
#include "extras/extra_states.h"
#include "extras/synthetic_loader.h"
#include "h5ckpt/loader_state.h"
#include "planner/load_planner.h"
#include "planner/region_index.h"
#include "planner/save_planner.h"
#include "storage/checkpoint_commit.h"
#include "storage/format.h"
#include "storage/meta_v2.h"
#include "storage/region_lookup.h"
#include "storage/verify_blocks.h"
#include "workload.h"

using namespace h5ckpt;
using nlohmann::json;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "h5ckpt-scale: %s\n", msg.c_str());
  std::exit(1);
}

template <class T>
T check(Result<T> r, const char* what) {
  if (!r.ok()) die(std::string(what) + ": " + r.status().to_string());
  return std::move(r).value();
}

// CPU time of this process: on a shared host, what a phase cost without the time it waited for a core.
double cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// CPU time of the calling thread: a rank's own planning, timed without the waits for a core that
// dominate wall times on a loaded 2-core VM.
double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Kernel CPU seconds and minor page faults of the process so far: what fresh pages cost a phase.
std::pair<double, long> kernel_s_and_faults() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return {static_cast<double>(ru.ru_stime.tv_sec) + static_cast<double>(ru.ru_stime.tv_usec) * 1e-6, ru.ru_minflt};
}

double peak_rss_mb() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // kilobytes on Linux
}

// ---- the job: layouts, the model per layout, every rank's items ---------------------------

struct Layout {
  int tp = 1, dp = 1, pp = 1;
  int world() const { return tp * dp * pp; }
  // Megatron order, as comm/topology: TP fastest, then DP, then PP.
  RankCoords coords_of(int rank) const { return {rank % tp, (rank / tp) % dp, rank / (tp * dp)}; }
  int rank_of(int t, int d, int p) const { return t + tp * (d + dp * p); }
  std::string tag() const {
    return "tp" + std::to_string(tp) + ".dp" + std::to_string(dp) + ".pp" + std::to_string(pp);
  }
};

struct Options {
  workload::ModelConfig model;
  Layout save{8, 70, 16}, load{8, 35, 32};
  bool extras = true;  // optimizer step, loader and extra items, as the trainer saves them
  int loader_workers = 2;
  bool all_ranks = false;
  int repeats = 3;  // a rank's own planning is timed this many times, the fastest kept (a busy host's noise)
  std::string metadata = "json";
  std::string preset = "405b";
};

// Llama 3's split: every stage the same number of layers except the first and the last, which
// hold one fewer (they also hold the embedding and the output layer). Layer counts that do not
// fall that way get the trainer's even split.
std::vector<int> stage_layers(int layers, int pp, std::string* how) {
  if (pp >= 2 && (layers + 2) % pp == 0 && (layers + 2) / pp >= 2) {
    std::vector<int> per(static_cast<size_t>(pp), (layers + 2) / pp);
    per.front() -= 1;
    per.back() -= 1;
    *how = "first-and-last-one-fewer";
    return per;
  }
  *how = "even";
  return workload::even_stage_layers(layers, pp);
}

// The model as one layout shards it.
struct ModelLayout {
  Layout layout;
  std::vector<workload::TensorDesc> tensors;
  std::vector<std::vector<const workload::TensorDesc*>> by_stage;
  std::string stage_split;
  std::vector<std::vector<uint64_t>> loader_shard_bytes;  // [dp rank][worker]
  uint64_t loader_replicated_bytes = 0;
};

ModelLayout make_layout(const Options& o, const Layout& l) {
  ModelLayout m;
  m.layout = l;
  m.tensors = workload::model_tensors(o.model, l.tp, stage_layers(o.model.layers, l.pp, &m.stage_split));
  m.by_stage.resize(static_cast<size_t>(l.pp));
  for (const auto& d : m.tensors)
    for (int s : d.stages) m.by_stage[static_cast<size_t>(s)].push_back(&d);
  // The loader's blobs as the trainer serializes them (sizes only; they are planned, not written).
  const auto cfg = extras::default_loader_config(1234, o.loader_workers, 2048);
  for (int d = 0; d < l.dp && o.extras; ++d) {
    const loader::RankLoader fresh = loader::RankLoader::fresh(cfg, l.dp, d);
    m.loader_replicated_bytes = loader::serialize(fresh.replicated).size();
    auto& sizes = m.loader_shard_bytes.emplace_back();
    for (const auto& s : fresh.shards) sizes.push_back(loader::serialize(s).size());
  }
  return m;
}

// Extra-state blob sizes as extras::ExtraStates serializes them: magic + state + draws for the
// RNG, magic + two doubles + three counters for the LR scheduler.
constexpr int64_t kRngBytes = 24, kSchedulerBytes = 48;
const char* const kOptimizerStates[] = {"fp32_param", "exp_avg", "exp_avg_sq"};

ShardSpec tp_shard_of(const workload::TensorDesc& d, const Layout& l, int tp_rank) {
  return d.split_dim < 0 ? ShardSpec::whole(d.shape) : ShardSpec::split(d.shape, d.split_dim, l.tp, tp_rank);
}

planner::ItemDesc blob(std::string key, int64_t bytes) {
  return {std::move(key), DType::kU8, Shape{bytes}, ShardSpec::whole(Shape{bytes})};
}

// What a rank registers for a save, in the trainer's order (workload::Workload::stage_save).
std::vector<planner::ItemDesc> save_items(const Options& o, const ModelLayout& m, int rank) {
  const Layout& l = m.layout;
  const RankCoords c = l.coords_of(rank);
  std::vector<planner::ItemDesc> items;
  for (const workload::TensorDesc* d : m.by_stage[static_cast<size_t>(c.pp)]) {
    const ShardSpec tp_shard = tp_shard_of(*d, l, c.tp);
    items.push_back({"model/" + d->fqn, o.model.dtype, d->shape, tp_shard});
    const auto [begin, end] = workload::zero_slice(tp_shard.numel(), c.dp, l.dp);
    if (begin == end) continue;  // a tiny tensor may leave a DP rank nothing
    const ShardSpec slice = ShardSpec::flat_range(tp_shard.box, begin, end);
    for (const char* s : kOptimizerStates)
      items.push_back({std::string("optimizer/") + s + "/" + d->fqn, DType::kF32, d->shape, slice});
  }
  items.push_back({"optimizer/step", DType::kI64, Shape{1}, ShardSpec::whole(Shape{1})});
  if (o.extras) {
    items.push_back(blob(loader::replicated_key(), static_cast<int64_t>(m.loader_replicated_bytes)));
    const auto& shards = m.loader_shard_bytes[static_cast<size_t>(c.dp)];
    for (size_t w = 0; w < shards.size(); ++w)
      items.push_back(blob(loader::shard_key(c.dp, static_cast<int64_t>(w)), static_cast<int64_t>(shards[w])));
    items.push_back({"extra/global_step", DType::kI64, Shape{1}, ShardSpec::whole(Shape{1})});
    items.push_back(blob("extra/lr_scheduler", kSchedulerBytes));
    items.push_back(blob(extras::rng_key(c), kRngBytes));
  }
  return items;
}

// The loader's items in a checkpoint: every loading rank reads them all and reshards them.
std::vector<const TensorInfo*> loader_blobs_of(const CheckpointInfo& info) {
  std::vector<const TensorInfo*> blobs;
  for (const TensorInfo& t : info.tensors)
    if (t.key == loader::replicated_key() || t.key.rfind("loader/shard/", 0) == 0) blobs.push_back(&t);
  return blobs;
}

// What a rank asks for in a load (workload::Workload::stage_load): the same tensors in its own
// layout, a vocabulary padded for another TP accepted as padding, every loader blob of the
// checkpoint, the extras, and its RNG only when the saving layout had a rank at its coordinates.
std::vector<planner::LoadWant> load_wants(const Options& o, const ModelLayout& m, const CheckpointInfo& info,
                                          const std::vector<const TensorInfo*>& loader_blobs, int rank) {
  const Layout& l = m.layout;
  const RankCoords c = l.coords_of(rank);
  std::vector<planner::LoadWant> wants;
  auto want = [&](planner::ItemDesc d, bool pad = false) { wants.push_back({std::move(d), false, pad, false}); };
  for (const workload::TensorDesc* d : m.by_stage[static_cast<size_t>(c.pp)]) {
    const ShardSpec tp_shard = tp_shard_of(*d, l, c.tp);
    const std::string model_key = "model/" + d->fqn;
    const TensorInfo* stored = info.find(model_key);
    const bool pad = d->valid_rows >= 0 && stored && stored->shape != d->shape;
    want({model_key, o.model.dtype, d->shape, tp_shard}, pad);
    const auto [begin, end] = workload::zero_slice(tp_shard.numel(), c.dp, l.dp);
    if (begin == end) continue;
    const ShardSpec slice = ShardSpec::flat_range(tp_shard.box, begin, end);
    for (const char* s : kOptimizerStates)
      want({std::string("optimizer/") + s + "/" + d->fqn, DType::kF32, d->shape, slice}, pad);
  }
  want({"optimizer/step", DType::kI64, Shape{1}, ShardSpec::whole(Shape{1})});
  if (o.extras) {
    for (const TensorInfo* t : loader_blobs) want(blob(t->key, t->shape[0]));
    want({"extra/global_step", DType::kI64, Shape{1}, ShardSpec::whole(Shape{1})});
    want(blob("extra/lr_scheduler", kSchedulerBytes));
    if (const TensorInfo* rng = info.find(extras::rng_key(c))) want(blob(rng->key, rng->shape[0]));
  }
  for (auto& w : wants)
    if (!info.find(w.desc.key)) die("load wants '" + w.desc.key + "', which the checkpoint does not hold");
  return wants;
}

// ---- the checkpoint index -------------------------------------------------------------------

// The metadata a save of `plan` commits: file offsets of contiguous datasets aligned as the
// writer aligns them, and one (dummy) checksum per verification block of every region.
// The commit's encoding of the index, timed (CPU) as the save's coordinator runs it, and a
// digest of its image, which must equal that of encoding `info` (the tables from a CheckpointInfo).
struct CommitCost {
  double encode_cpu_s = 0;
  std::string image_digest;
};

std::string image_digest(const std::vector<char>& image) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(storage::checksum_bytes(image.data(), image.size())));
  return hex;
}

CheckpointInfo checkpoint_info(const std::vector<planner::TensorPlan>& tensors, const Options& o, uint64_t* blocks,
                               CommitCost* commit) {
  constexpr uint64_t kAlignment = 1ull << 20;  // CheckpointerOptions::alignment
  storage::SavedCheckpoint saved;
  saved.tensors = &tensors;
  saved.step = 1000;
  saved.sizes = ParallelSizes{o.save.tp, o.save.dp, o.save.pp};
  for (int r = 0; r < o.save.world(); ++r) saved.coords.push_back(o.save.coords_of(r));
  saved.attributes = {{"trainer.vocab", std::to_string(o.model.vocab)}, {"trainer.layout", o.save.tag() + ".zero"}};
  uint64_t end = 0, sum = 0x9e3779b97f4a7c15ull;
  *blocks = 0;
  saved.blocks.resize(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    const planner::TensorPlan& tp = tensors[t];
    const uint64_t nbytes = tp.nbytes();
    if (nbytes == 0) {
      saved.offsets.push_back(-1);
    } else {
      end = (end + kAlignment - 1) / kAlignment * kAlignment;
      saved.offsets.push_back(static_cast<int64_t>(end));
      end += nbytes;
    }
    for (size_t r = 0; r < tp.regions.size(); ++r) {
      auto& b = saved.blocks[t].emplace_back();
      b.block_bytes = storage::choose_block_bytes(tp.shard(r), tp.dtype);
      const uint64_t region_bytes = static_cast<uint64_t>(tp.regions[r].numel()) * dtype_size(tp.dtype);
      b.sums.resize(storage::block_count(region_bytes, b.block_bytes));
      for (uint64_t& s : b.sums) s = sum += 0x9e3779b97f4a7c15ull;  // varied, never 0
      *blocks += b.sums.size();
    }
  }
  const double c0 = cpu_s();
  auto encoded = storage::encode_saved(saved);  // as the commit does
  commit->encode_cpu_s = cpu_s() - c0;
  if (!encoded.ok()) die("the commit's encoding failed: " + encoded.status().to_string());
  commit->image_digest = image_digest(encoded->image());
  return storage::assemble_info(saved);
}

// The size of the checkpoint index of `info`, in the encoding kIndexEncoding names (printed as
// metadata_encoding): format v2's /meta tables (docs/format.md), what a save adds to the data file.
constexpr const char* kIndexEncoding = "v2-tables";
uint64_t index_bytes(const CheckpointInfo& info) {
  auto bytes = storage::v2::encoded_bytes(info);
  if (!bytes.ok()) {
    std::fprintf(stderr, "h5ckpt-scale: encoding the index failed: %s\n", bytes.status().to_string().c_str());
    std::exit(1);
  }
  return *bytes;
}

// What a load that is not served from every rank's plan cache costs at this scale before any
// rank plans: the coordinator opens the index image with full validation (docs/format.md §6; its
// read from the data file is not simulated here) and every node gets a copy of the image in
// shared memory (timed as one memcpy into fresh memory, what one node's copy costs). A load whose
// every rank's plan is cached skips both (docs/design.md, the load's phases).
struct IndexCost {
  uint64_t image_bytes = 0;
  std::string image_digest;   ///< xxh3 of the image: two builds' encoders compared without storing it
  double validate_cpu_s = 0;  ///< Index::open with validation, best of `repeats`, process CPU time
  double open_cpu_s = 0;      ///< each rank's Index::open of its node's copy (structure checks only)
  double copy_s = 0;          ///< the node's copy, best of `repeats`, wall
};
IndexCost index_cost(const CheckpointInfo& info, int repeats) {
  const storage::v2::Encoded enc = check(storage::v2::encode(info), "encoding the index");
  // The tables after the tensors, as a save lays them out.
  uint64_t end = 0;
  for (const TensorInfo& t : info.tensors)
    if (t.file_offset >= 0) end = std::max(end, static_cast<uint64_t>(t.file_offset) + t.nbytes);
  std::array<int64_t, storage::v2::kTableCount> offsets{};
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (enc.tables[i].empty()) {
      offsets[i] = -1;
      continue;
    }
    end = (end + 7) / 8 * 8;
    offsets[i] = static_cast<int64_t>(end);
    end += enc.tables[i].size();
  }
  const storage::v2::Summary summary =
      check(storage::v2::parse_summary(enc.summary_json(offsets)), "the summary of the index");
  const std::vector<char> image = enc.image();
  IndexCost cost;
  cost.image_bytes = image.size();
  cost.image_digest = image_digest(image);
  for (int k = 0; k < repeats; ++k) {
    const double c0 = cpu_s();
    check(storage::v2::Index::open(summary, image.data(), image.size(), end, /*validate=*/true),
          "validating the index");
    const double dt = cpu_s() - c0;
    cost.validate_cpu_s = k == 0 ? dt : std::min(cost.validate_cpu_s, dt);
    const double o0 = cpu_s();
    check(storage::v2::Index::open(summary, image.data(), image.size(), end, /*validate=*/false), "opening the index");
    const double dopen = cpu_s() - o0;
    cost.open_cpu_s = k == 0 ? dopen : std::min(cost.open_cpu_s, dopen);
    const double t0 = now_s();
    std::vector<char> node_copy(image.size());
    std::memcpy(node_copy.data(), image.data(), image.size());
    const double dc = now_s() - t0;
    cost.copy_s = k == 0 ? dc : std::min(cost.copy_s, dc);
  }
  return cost;
}

// ---- plan digests: the same plans before and after an optimization ---------------------------

// FNV-1a over the plans' fields, printed so that two builds' plans of the 405B case can be
// compared without storing them (the unit tests compare small plans field by field).
struct Digest {
  uint64_t h = 0xcbf29ce484222325ull;
  void bytes(const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 0x100000001b3ull;
  }
  void i64(int64_t v) { bytes(&v, sizeof v); }
  void str(const std::string& s) {
    i64(static_cast<int64_t>(s.size()));
    bytes(s.data(), s.size());
  }
  void shape(const Shape& s) {
    i64(static_cast<int64_t>(s.size()));
    for (int64_t v : s) i64(v);
  }
  void box(const Box& b) {
    shape(b.offset);
    shape(b.shape);
  }
  std::string hex() const {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return buf;
  }
};

std::string save_plan_digest(const planner::SavePlan& plan) {
  Digest d;
  for (const auto& t : plan.tensors) {
    d.str(t.key);
    d.i64(static_cast<int64_t>(t.dtype));
    d.shape(t.shape);
    d.i64(static_cast<int64_t>(t.regions.size()));
    for (const auto& r : t.regions) {  // its ShardSpec's fields: box, whether flat, the range
      d.box(t.boxes[r.box]);
      d.i64(r.flat);
      if (r.flat) {
        d.i64(r.begin);
        d.i64(r.end);
      }
      d.i64(r.writer);
    }
  }
  for (uint64_t b : plan.bytes_by_rank) d.i64(static_cast<int64_t>(b));
  return d.hex();
}

std::string roles_digest(const planner::LoadPlan& plan, const planner::RoleTable& roles) {
  Digest d;
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    d.i64(plan.groups[g].reader);
    d.i64(static_cast<int64_t>(plan.groups[g].bytes));
    for (const auto& m : plan.members_of(g)) {
      d.i64(m.rank);
      d.i64(m.item);
    }
  }
  for (uint64_t b : plan.read_bytes_by_rank) d.i64(static_cast<int64_t>(b));
  for (size_t rank = 0; rank < roles.ranks(); ++rank)
    for (const auto& r : roles.roles_of(plan, rank)) {
      d.i64(static_cast<int64_t>(r.role));
      d.i64(r.group);
      d.i64(r.peer);
      for (int32_t t : r.targets) d.i64(t);
    }
  return d.hex();
}

// ---- per-rank timings -------------------------------------------------------------------------

// Ranks to time one by one: for every (TP, PP) position the DP replica with the most work of the
// kind measured (`work[rank]`), and the first and last ranks; or every rank.
std::vector<int> rank_sample(const Layout& l, const std::vector<size_t>& work, bool all, std::string* how) {
  std::vector<int> ranks;
  if (all) {
    *how = "all ranks";
    for (int r = 0; r < l.world(); ++r) ranks.push_back(r);
    return ranks;
  }
  *how = "per (tp,pp) the dp replica with the most work, and the first and last rank";
  std::set<int> chosen{0, l.world() - 1};
  for (int p = 0; p < l.pp; ++p)
    for (int t = 0; t < l.tp; ++t) {
      int best = l.rank_of(t, 0, p);
      for (int d = 1; d < l.dp; ++d)
        if (work[static_cast<size_t>(l.rank_of(t, d, p))] > work[static_cast<size_t>(best)]) best = l.rank_of(t, d, p);
      chosen.insert(best);
    }
  return {chosen.begin(), chosen.end()};
}

struct Slowest {
  double ms = 0;
  int rank = -1;
  std::vector<double> all;
  void add(int r, double s) {
    all.push_back(s * 1e3);
    if (s * 1e3 > ms) {
      ms = s * 1e3;
      rank = r;
    }
  }
  double median() {
    if (all.empty()) return 0;
    std::sort(all.begin(), all.end());
    return all[all.size() / 2];
  }
};

// One rank's load plan, as the engine computes it for itself once the coordinator has sent its
// roles: its requests, the stored tensor of each item, plan_rank_load, and for every box it reads
// the verification spans of the saved regions holding its elements (storage::checked_spans, the
// regions found through storage::RegionLookup's index of each tensor, built on first use).
struct RankLoadWork {
  size_t read_items = 0, region_hits = 0;
  std::vector<std::vector<storage::CheckedSpan>> spans;  // per box read, in plan order
  // Where the time goes (seconds): requests, stored-tensor lookups, plan_rank_load, indexing the
  // regions of the tensors read, and the lookups of the boxes read.
  double requests_s = 0, stored_s = 0, plan_s = 0, index_s = 0, lookup_s = 0;
  double total_s() const { return requests_s + stored_s + plan_s + index_s + lookup_s; }
  json breakdown_ms() const {
    return {{"requests", requests_s * 1e3},
            {"stored", stored_s * 1e3},
            {"plan_rank_load", plan_s * 1e3},
            {"region_index", index_s * 1e3},
            {"region_lookup", lookup_s * 1e3}};
  }
};
RankLoadWork plan_one_rank_load(const CheckpointInfo& info, const std::vector<planner::LoadWant>& wants,
                                const std::vector<planner::ItemRole>& roles) {
  RankLoadWork work;
  double t0 = thread_cpu_s();
  std::vector<planner::LoadRequest> requests;
  requests.reserve(wants.size());
  for (const auto& w : wants) requests.push_back(planner::make_request(w));
  double t1 = thread_cpu_s();
  work.requests_s = t1 - t0;
  std::vector<planner::StoredTensor> stored(wants.size());
  std::vector<const TensorInfo*> tensor_of(wants.size());
  for (size_t i = 0; i < wants.size(); ++i) {
    tensor_of[i] = info.find(wants[i].desc.key);
    stored[i] = {tensor_of[i]->dtype, tensor_of[i]->shape, tensor_of[i]->file_offset};
  }
  t0 = thread_cpu_s();
  work.stored_s = t0 - t1;
  const planner::RankLoadPlan plan = planner::plan_rank_load(roles, wants, stored, /*file_order=*/true);
  t1 = thread_cpu_s();
  work.plan_s = t1 - t0;
  storage::RegionLookup lookup(info);
  std::set<const TensorInfo*> indexed;
  for (const planner::ReadItem& r : plan.items) {
    if (r.role != planner::Role::kRead) continue;
    ++work.read_items;
    const TensorInfo* t = tensor_of[static_cast<size_t>(r.item)];
    t0 = thread_cpu_s();
    const planner::RegionIndex* index = lookup.of(*t);
    t1 = thread_cpu_s();
    if (indexed.insert(t).second) work.index_s += t1 - t0;
    else work.lookup_s += t1 - t0;
    t0 = thread_cpu_s();
    for (const Box& box : r.boxes) {
      work.spans.push_back(check(storage::checked_spans(*t, box, index), "checked_spans"));
      work.region_hits += work.spans.back().size();
    }
    t1 = thread_cpu_s();
    work.lookup_s += t1 - t0;
  }
  return work;
}

// The same spans found by testing every region of the tensor (checked_spans without an index, as
// the storage layer did before), for comparison; `spans` receives them.
double scan_lookup_s(const CheckpointInfo& info, const std::vector<planner::LoadWant>& wants,
                     const std::vector<planner::ItemRole>& roles, std::vector<std::vector<storage::CheckedSpan>>* out) {
  std::vector<planner::StoredTensor> stored(wants.size());
  for (size_t i = 0; i < wants.size(); ++i) {
    const TensorInfo* t = info.find(wants[i].desc.key);
    stored[i] = {t->dtype, t->shape, t->file_offset};
  }
  const planner::RankLoadPlan plan = planner::plan_rank_load(roles, wants, stored, true);
  const double t0 = thread_cpu_s();
  size_t spans = 0;
  out->clear();
  for (const planner::ReadItem& r : plan.items) {
    if (r.role != planner::Role::kRead) continue;
    const TensorInfo* t = info.find(wants[static_cast<size_t>(r.item)].desc.key);
    for (const Box& box : r.boxes) {
      out->push_back(check(storage::checked_spans(*t, box), "checked_spans"));
      spans += out->back().size();
    }
  }
  const double dt = thread_cpu_s() - t0;
  if (spans == 0 && !plan.read_order.empty()) die("no regions found for a rank's reads");
  return dt;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.model = workload::ModelConfig{126, 16384, 128, 8, 53248, 128256, DType::kBF16, false};
  for (int i = 1; i < argc; ++i)  // the preset sets the defaults the other flags then change
    if (std::strcmp(argv[i], "--small") == 0) {
      o.preset = "small";
      o.model = workload::ModelConfig{7, 64, 8, 4, 128, 1001, DType::kBF16, false};
      o.save = {2, 3, 3};
      o.load = {4, 2, 2};
    }
  CLI::App app{"h5ckpt-scale: save and resharding-load planning of a large job, in one process"};
  bool small = false, no_extras = false;
  app.add_flag("--small", small, "small preset (a smoke test): 7 layers, 18 ranks saved, 16 loading");
  app.add_option("--tp", o.save.tp, "save layout: tensor parallel size")->capture_default_str();
  app.add_option("--dp", o.save.dp, "save layout: data parallel size")->capture_default_str();
  app.add_option("--pp", o.save.pp, "save layout: pipeline parallel size")->capture_default_str();
  app.add_option("--load-tp", o.load.tp, "load layout: tensor parallel size")->capture_default_str();
  app.add_option("--load-dp", o.load.dp, "load layout: data parallel size")->capture_default_str();
  app.add_option("--load-pp", o.load.pp, "load layout: pipeline parallel size")->capture_default_str();
  app.add_option("--layers", o.model.layers, "model layers")->capture_default_str();
  app.add_option("--hidden", o.model.hidden, "hidden size")->capture_default_str();
  app.add_option("--ffn", o.model.ffn, "FFN size")->capture_default_str();
  app.add_option("--heads", o.model.heads, "attention heads")->capture_default_str();
  app.add_option("--kv-heads", o.model.kv_heads, "KV heads (GQA)")->capture_default_str();
  app.add_option("--vocab", o.model.vocab, "vocabulary (padded to a TP multiple)")->capture_default_str();
  app.add_option("--loader-workers", o.loader_workers, "data loader workers per DP rank")->capture_default_str();
  app.add_flag("--no-extras", no_extras, "model and optimizer tensors only (no step, loader, RNG items)");
  app.add_flag("--all-ranks", o.all_ranks, "time every rank's own planning, not a sample");
  app.add_option("--repeats", o.repeats, "times each rank's own planning is repeated (the fastest is kept)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  o.extras = !no_extras;
  for (const Layout* l : {&o.save, &o.load}) {
    workload::TrainConfig tc;
    tc.model = o.model;
    tc.sizes = ParallelSizes{l->tp, l->dp, l->pp};
    tc.zero = true;
    tc.loader_workers = o.loader_workers;
    if (Status st = tc.validate(l->world()); !st.ok()) die(l->tag() + ": " + st.to_string());
  }
  const double t_start = now_s();
  json out;
  out["preset"] = o.preset;
  out["save_layout"] = o.save.tag();
  out["load_layout"] = o.load.tag();
  out["ranks"] = o.save.world();
  out["load_ranks"] = o.load.world();

  // ---- save: every rank's items, the coordinator's plan, each rank's writes ----
  const ModelLayout saving = make_layout(o, o.save);
  out["save_stage_split"] = saving.stage_split;
  // Every rank's items message, as the ranks send them up the tree (their own work, not timed).
  std::vector<std::string> gathered_items(static_cast<size_t>(o.save.world()));
  size_t nitems = 0;
  for (int r = 0; r < o.save.world(); ++r) {
    const std::vector<planner::ItemDesc> own = save_items(o, saving, r);
    gathered_items[static_cast<size_t>(r)] = engine::wire::encode_items(own);
    nitems += own.size();
  }
  // The coordinator's part, as the engine's (plan_globally): the messages decoded, the plan, the
  // plan's message to every rank.
  double c0 = cpu_s();
  engine::wire::GatheredItems decoded = check(engine::wire::decode_gathered_items(gathered_items), "decode_items");
  const std::vector<std::span<const planner::ItemView>>& items = decoded.items;  // views of gathered_items
  const double decode_items_cpu_s = cpu_s() - c0;
  double t0 = now_s();
  const auto kernel0 = kernel_s_and_faults();
  c0 = cpu_s();
  planner::SavePlan plan = check(planner::plan_save(items), "plan_save");
  const double plan_save_s = now_s() - t0, plan_save_cpu_s = cpu_s() - c0;
  const auto kernel1 = kernel_s_and_faults();
  // Of plan_save's CPU time, the kernel's (page faults of fresh memory; on a VM that hands free
  // memory back to its host each one can cost a trip there) and how many faults.
  out["plan_save_kernel_cpu_s"] = kernel1.first - kernel0.first;
  out["plan_save_minor_faults"] = kernel1.second - kernel0.second;
  c0 = cpu_s();
  const std::string plan_message = engine::wire::encode_tensors(plan.tensors);
  const size_t plan_message_bytes = plan_message.size();
  const double encode_plan_cpu_s = cpu_s() - c0;
  {
    // Every rank's part: the plan's message decoded (each rank derives its writes from the whole
    // plan), with its fresh pages.
    const auto k0 = kernel_s_and_faults();
    c0 = cpu_s();
    const auto decoded_plan = check(engine::wire::decode_tensors(plan_message), "decode_plan");
    out["save_rank_decode_plan_cpu_s"] = cpu_s() - c0;
    const auto k1 = kernel_s_and_faults();
    out["save_rank_decode_plan_minor_faults"] = k1.second - k0.second;
    if (decoded_plan.size() != plan.tensors.size()) die("decode_plan: tensor count differs");
  }
  out["plan_save_cpu_s"] = plan_save_cpu_s;
  out["save_coordinator_cpu_s"] = decode_items_cpu_s + plan_save_cpu_s + encode_plan_cpu_s;
  out["save_coordinator_breakdown_cpu_s"] = {
      {"decode_items", decode_items_cpu_s}, {"plan_save", plan_save_cpu_s}, {"encode_plan", encode_plan_cpu_s}};
  out["save_plan_message_bytes"] = plan_message_bytes;
  out["save_plan_digest"] = save_plan_digest(plan);
  {
    // The floor under the scan, in the same run: one plain pass reading what it reads of every
    // item (key, global shape, box), 3.5 million views into the messages and extents at 405B.
    const double f0 = cpu_s();
    uint64_t sum = 0;
    for (const auto& rank_items : items)
      for (const planner::ItemView& it : rank_items) {
        sum += it.key.size() + (it.key.empty() ? 0 : static_cast<unsigned char>(it.key.back()));
        for (const std::span<const int64_t> v : {it.global_shape(), it.offset(), it.shape()})
          for (int64_t x : v) sum += static_cast<uint64_t>(x);
      }
    const double read_cpu_s = cpu_s() - f0;
    out["items_read_cpu_s"] = read_cpu_s;
    out["items_read_checksum"] = sum;  // printed so that the pass is not optimized away
    out["plan_save_over_items_read"] = plan_save_cpu_s / std::max(read_cpu_s, 1e-9);
  }
  size_t nregions = 0, nboxes = 0;
  for (const auto& t : plan.tensors) {
    nregions += t.regions.size();
    nboxes += t.boxes.size();
  }
  out["items"] = nitems;
  out["tensors"] = plan.tensors.size();
  out["regions"] = nregions;
  out["plan_boxes"] = nboxes;  // the regions' distinct boxes, each held once by its TensorPlan
  out["plan_save_s"] = plan_save_s;

  std::vector<size_t> writes_per_rank(static_cast<size_t>(o.save.world()), 0);  // regions each rank writes
  for (const auto& t : plan.tensors)
    for (const auto& reg : t.regions) ++writes_per_rank[static_cast<size_t>(reg.writer)];
  std::string sample_how;
  const std::vector<int> save_sample = rank_sample(o.save, writes_per_rank, o.all_ranks, &sample_how);
  constexpr uint64_t kMaxPieceBytes = 256ull << 20;  // CheckpointerOptions::max_piece_bytes
  Slowest writes;
  for (int r : save_sample) {
    const std::vector<planner::ItemDesc> own = save_items(o, saving, r);  // what the rank itself holds
    double best = 0;
    for (int k = 0; k < o.repeats; ++k) {
      t0 = thread_cpu_s();
      auto w = check(planner::plan_writes(r, plan.tensors, own, kMaxPieceBytes), "plan_writes");
      const double dt = thread_cpu_s() - t0;
      best = k == 0 ? dt : std::min(best, dt);
      const auto regions_done = std::count_if(w.begin(), w.end(), [](const auto& x) { return x.region_end; });
      if (static_cast<size_t>(regions_done) != writes_per_rank[static_cast<size_t>(r)])
        die("plan_writes of rank " + std::to_string(r) + " lists another number of regions than the plan");
    }
    writes.add(r, best);
  }
  out["save_plan_writes_ms_max"] = writes.ms;
  out["save_plan_writes_ms_median"] = writes.median();
  out["save_plan_writes_slowest_rank"] = writes.rank;
  out["save_ranks_timed"] = save_sample.size();
  out["plan_s"] = plan_save_s + writes.ms / 1e3;
  decoded = {};
  gathered_items = {};

  out["rss_after_save_plan_mb"] = peak_rss_mb();  // every rank's items and the plan, held at once

  // ---- the index the save commits ----
  uint64_t blocks = 0;
  CommitCost commit;
  const CheckpointInfo info = checkpoint_info(plan.tensors, o, &blocks, &commit);
  plan.tensors.clear();
  plan.tensors.shrink_to_fit();
  out["blocks"] = blocks;
  t0 = now_s();
  const double encode_c0 = cpu_s();
  out["metadata_bytes"] = index_bytes(info);
  out["metadata_encoding"] = kIndexEncoding;
  out["metadata_s"] = now_s() - t0;
  out["index_encode_cpu_s"] = cpu_s() - encode_c0;  // from a CheckpointInfo
  // The commit's work on the coordinator before it writes the tables (CPU time).
  out["commit_encode_cpu_s"] = commit.encode_cpu_s;
  {
    const IndexCost cost = index_cost(info, o.repeats);
    out["load_index_image_bytes"] = cost.image_bytes;
    out["index_image_digest"] = cost.image_digest;
    if (commit.image_digest != cost.image_digest)
      die("the commit encoded another index (" + commit.image_digest + ") than the metadata's (" + cost.image_digest +
          ")");
    out["load_index_validate_cpu_s"] = cost.validate_cpu_s;
    out["load_index_rank_open_cpu_s"] = cost.open_cpu_s;
    out["load_index_node_copy_s"] = cost.copy_s;
    // What a load whose every rank's plan is cached no longer spends before its reads.
    out["load_cached_skips_s"] = cost.validate_cpu_s + cost.copy_s;
  }

  // ---- load in another layout: every rank's requests, the coordinator's groups and roles ----
  const ModelLayout loading = make_layout(o, o.load);
  const std::vector<const TensorInfo*> loader_blobs = loader_blobs_of(info);
  out["load_stage_split"] = loading.stage_split;
  const size_t lw = static_cast<size_t>(o.load.world());
  // Every rank's requests message, as the ranks send them up the tree (their own work, not timed).
  std::vector<std::string> gathered(lw);
  size_t nrequests = 0;
  for (size_t r = 0; r < lw; ++r) {
    const auto wants = load_wants(o, loading, info, loader_blobs, static_cast<int>(r));
    std::vector<engine::wire::LoadRequestEntry> entries(wants.size());
    for (size_t i = 0; i < wants.size(); ++i) entries[i].request = planner::make_request(wants[i]);
    gathered[r] = engine::wire::encode_requests(entries);
    nrequests += wants.size();
  }
  // The coordinator's part, as the engine's (plan_roles): the messages decoded (signatures viewed
  // in them), the groups, the roles, and every rank's roles message (their bytes summed, so that
  // the work cannot be left out).
  t0 = now_s();
  const auto load_kernel0 = kernel_s_and_faults();
  c0 = cpu_s();
  engine::wire::GatheredRequests in = check(engine::wire::decode_gathered_requests(gathered), "requests");
  const double c1 = cpu_s();
  const planner::LoadPlan load_plan = planner::plan_load(in.requests, /*deduplicate=*/true);
  const double c2 = cpu_s();
  const planner::RoleTable roles = planner::assign_roles(load_plan, in.item_of, in.items);
  const double c3 = cpu_s();
  uint64_t message_bytes = 0;
  for (size_t r = 0; r < lw; ++r) message_bytes += engine::wire::encode_roles(load_plan, roles, r).size();
  out["load_coordinator_s"] = now_s() - t0;
  out["load_coordinator_cpu_s"] = cpu_s() - c0;
  const auto load_kernel1 = kernel_s_and_faults();
  out["load_coordinator_kernel_cpu_s"] = load_kernel1.first - load_kernel0.first;
  out["load_coordinator_minor_faults"] = load_kernel1.second - load_kernel0.second;
  out["load_coordinator_breakdown_cpu_s"] = {
      {"decode_requests", c1 - c0}, {"plan_load", c2 - c1}, {"assign_roles", c3 - c2}, {"encode_roles", cpu_s() - c3}};
  out["load_roles_message_bytes"] = message_bytes;
  out["load_roles_digest"] = roles_digest(load_plan, roles);
  out["load_requests"] = nrequests;
  out["load_groups"] = load_plan.groups.size();
  in = {};
  gathered = {};

  std::vector<size_t> reads_per_rank(lw, 0);
  for (size_t r = 0; r < lw; ++r)
    for (size_t i = 0; i < roles.items(r); ++i)
      reads_per_rank[r] += roles.role_head(load_plan, r, i).role == planner::Role::kRead;
  const std::vector<int> load_sample = rank_sample(o.load, reads_per_rank, o.all_ranks, &sample_how);
  Slowest loads;
  RankLoadWork slowest_work;
  for (int r : load_sample) {
    const auto wants = load_wants(o, loading, info, loader_blobs, r);  // the rank's state description, not planning
    const std::vector<planner::ItemRole> rank_roles = roles.roles_of(load_plan, static_cast<size_t>(r));  // as received
    RankLoadWork best;
    for (int k = 0; k < o.repeats; ++k) {
      const RankLoadWork work = plan_one_rank_load(info, wants, rank_roles);
      if (k == 0 || work.total_s() < best.total_s()) best = work;
    }
    if (best.total_s() * 1e3 > loads.ms) slowest_work = best;
    loads.add(r, best.total_s());
  }
  out["load_plan_ms_max"] = loads.ms;
  out["load_plan_ms_median"] = loads.median();
  out["load_plan_slowest_rank"] = loads.rank;
  out["load_plan_slowest_read_items"] = slowest_work.read_items;
  out["load_plan_slowest_region_hits"] = slowest_work.region_hits;
  out["load_plan_slowest_breakdown_ms"] = slowest_work.breakdown_ms();
  out["load_ranks_timed"] = load_sample.size();
  out["rank_sample"] = sample_how;
  out["rank_repeats"] = o.repeats;
  out["rank_clock"] = "thread CPU time";
  {
    const auto wants = load_wants(o, loading, info, loader_blobs, loads.rank);
    double best = 0;
    std::vector<std::vector<storage::CheckedSpan>> scanned;
    const std::vector<planner::ItemRole> rank_roles = roles.roles_of(load_plan, static_cast<size_t>(loads.rank));
    for (int k = 0; k < o.repeats; ++k) {
      const double dt = scan_lookup_s(info, wants, rank_roles, &scanned);
      best = k == 0 ? dt : std::min(best, dt);
    }
    out["load_region_scan_ms_slowest_rank"] = best * 1e3;
    // The index must find exactly the spans the scan finds.
    const auto& indexed = slowest_work.spans;
    bool same = indexed.size() == scanned.size();
    for (size_t b = 0; same && b < indexed.size(); ++b) {
      same = indexed[b].size() == scanned[b].size();
      for (size_t k = 0; same && k < indexed[b].size(); ++k) {
        const auto &x = indexed[b][k], &y = scanned[b][k];
        same = x.region == y.region && x.begin == y.begin && x.end == y.end && x.verified == y.verified &&
               x.widened == y.widened;
      }
    }
    if (!same) die("the spans found through the region index differ from the scan's (slowest rank)");
  }
  out["peak_rss_mb"] = peak_rss_mb();
  out["total_s"] = now_s() - t_start;
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
