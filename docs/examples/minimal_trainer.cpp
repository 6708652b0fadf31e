// A minimal trainer that checkpoints with h5ckpt and resumes under any parallel layout.
//
//   mpiexec -n 4 minimal_trainer --tp 2 --dp 2 --steps 6 CKPT_DIR      # trains, saves steps 3 and 6
//   mpiexec -n 2 minimal_trainer --pp 2 --steps 9 CKPT_DIR             # resumes at step 6 as PP2
//
// Options: --tp N --dp N --pp N (default: tp 1, pp 1, dp = world / (tp * pp)), --steps N (train up
// to global step N, default 6), --save-every K (default 3; the last step is always saved),
// --expect-start S (fail unless the run starts at step S: 0 = fresh; used by the test).
//
// The model: kLayers layers split over the pipeline stages, each with a column-parallel weight
// (split on dim 0 over TP), a row-parallel weight (split on dim 1 over TP) and a replicated norm;
// one optimizer state per parameter (think Adam's exp_avg) held as a ZeRO flat range: the
// row-major flattening of the rank's TP shard, split evenly over DP. A loader cursor and the
// trainer's own counters are saved as byte items.
//
// Self-check: every value is a pure function of (tensor, global element index, step). After a
// resume every loaded element is compared with that formula, and so is every element at the end;
// any mismatch makes the program exit 1 (on every rank). Exit 2: bad arguments.
#include <mpi.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <h5ckpt/h5ckpt.hpp>
#include <optional>
#include <string>
#include <vector>

namespace {

constexpr int64_t kLayers = 4;
constexpr int64_t kHidden = 12;
constexpr int64_t kFfn = 30;            // not a multiple of 4: uneven TP splits work too
constexpr int64_t kSamplesPerStep = 8;  // global batch, for the loader cursor

int g_rank = 0;

// ---- the values: a pure function of (tensor seed h, global index i, step) --------------------
// Small integers stored as float: every sum below is exact, so the check can demand equality.
float initial_value(uint32_t h, int64_t i) { return static_cast<float>((i * 7 + h) % 251) - 125.0f; }
float step_delta(uint32_t h, int64_t i, int64_t step) { return static_cast<float>((i * 3 + h + step) % 5) - 2.0f; }
float expected_value(uint32_t h, int64_t i, int64_t step) {
  float v = initial_value(h, i);
  for (int64_t k = 1; k <= step; ++k) v += step_delta(h, i, k);
  return v;
}

uint32_t fnv1a(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h % 1000;
}

// ---- this rank's tensors -------------------------------------------------------------------

struct Tensor {
  std::string key;          // layout-independent name
  h5ckpt::Shape shape;      // global shape
  h5ckpt::ShardSpec shard;  // the part this rank holds
  uint32_t h = 0;           // seed of the value formula
  std::vector<float> data;  // shard.numel() elements, contiguous

  // Global row-major index of element j of this rank's buffer (box or flat range of a box).
  int64_t global_index(int64_t j) const {
    const h5ckpt::Box& b = shard.box;
    int64_t f = (shard.flat ? shard.flat->first : 0) + j;  // position in the box's flattening
    int64_t index = 0, stride = 1;
    for (size_t d = b.shape.size(); d-- > 0;) {
      const int64_t coord = b.offset[d] + f % b.shape[d];
      f /= b.shape[d];
      index += coord * stride;
      stride *= shape[d];
    }
    return index;
  }
};

// Byte items: trivially copyable, fixed layout, saved as opaque blobs.
struct LoaderState {
  uint64_t next_sample = 0;  // the next global sample index to read
  uint64_t seed = 1234;
};
struct TrainerState {
  int64_t step = 0;  // last completed global step
  double lr = 1e-3;
};
static_assert(sizeof(LoaderState) == 16 && sizeof(TrainerState) == 16);

struct Model {
  std::vector<Tensor> tensors;
  LoaderState loader;
  TrainerState trainer;

  explicit Model(const h5ckpt::Topology& topo) {
    const h5ckpt::ParallelSizes n = topo.sizes();
    const h5ckpt::RankCoords me = topo.coords();
    // Pipeline stage me.pp owns a contiguous block of layers (near-equal split of [0, kLayers)).
    const h5ckpt::ShardSpec stage = h5ckpt::ShardSpec::split({kLayers}, 0, n.pp, me.pp);
    for (int64_t l = stage.box.offset[0]; l < stage.box.offset[0] + stage.box.shape[0]; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      const h5ckpt::Shape fc1{kFfn, kHidden}, fc2{kHidden, kFfn}, norm{kHidden};
      add_param(topo, p + "mlp.fc1.weight", fc1, h5ckpt::ShardSpec::split(fc1, 0, n.tp, me.tp));  // column-parallel
      add_param(topo, p + "mlp.fc2.weight", fc2, h5ckpt::ShardSpec::split(fc2, 1, n.tp, me.tp));  // row-parallel
      add_param(topo, p + "norm.weight", norm, h5ckpt::ShardSpec::whole(norm));                   // replicated
    }
  }

  void add_param(const h5ckpt::Topology& topo, const std::string& name, const h5ckpt::Shape& shape,
                 const h5ckpt::ShardSpec& tp_shard) {
    add("model/" + name, shape, tp_shard);
    // ZeRO: DP rank d owns elements [numel*d/DP, numel*(d+1)/DP) of the flattened TP shard.
    const int64_t numel = tp_shard.numel(), dp = topo.sizes().dp, d = topo.coords().dp;
    add("optimizer/exp_avg/" + name, shape,
        h5ckpt::ShardSpec::flat_range(tp_shard.box, numel * d / dp, numel * (d + 1) / dp));
  }

  void add(const std::string& key, const h5ckpt::Shape& shape, const h5ckpt::ShardSpec& shard) {
    Tensor t{key, shape, shard, fnv1a(key), {}};
    t.data.resize(static_cast<size_t>(shard.numel()));
    for (int64_t j = 0; j < shard.numel(); ++j) t.data[j] = initial_value(t.h, t.global_index(j));
    tensors.push_back(std::move(t));
  }

  // What h5ckpt saves and loads: references to the buffers above, never copies.
  h5ckpt::StateDict state() {
    h5ckpt::StateDict sd;
    for (Tensor& t : tensors) sd.add(t.key, h5ckpt::DType::kF32, t.shape, t.shard, t.data.data());
    // Every rank adds the same replicated blobs; h5ckpt writes each of them once.
    sd.add_bytes("loader/state", &loader, sizeof loader);
    sd.add_bytes("extra/trainer_state", &trainer, sizeof trainer);
    return sd;
  }

  // One "training step": an elementwise update of every value this rank owns.
  void train_step() {
    const int64_t step = trainer.step + 1;
    for (Tensor& t : tensors)
      for (int64_t j = 0; j < t.shard.numel(); ++j) t.data[j] += step_delta(t.h, t.global_index(j), step);
    loader.next_sample += kSamplesPerStep;
    trainer.step = step;
  }

  // Number of values on this rank that differ from the formula at trainer.step.
  int64_t count_mismatches(const char* when) const {
    int64_t bad = 0;
    for (const Tensor& t : tensors)
      for (int64_t j = 0; j < t.shard.numel(); ++j) {
        const int64_t i = t.global_index(j);
        const float want = expected_value(t.h, i, trainer.step);
        if (t.data[j] != want && bad++ < 5)
          std::fprintf(stderr, "rank %d: %s: '%s' element %" PRId64 " is %g, expected %g\n", g_rank, when,
                       t.key.c_str(), i, t.data[j], want);
      }
    if (loader.next_sample != static_cast<uint64_t>(trainer.step * kSamplesPerStep) || loader.seed != 1234) {
      std::fprintf(stderr, "rank %d: %s: loader state (next_sample %" PRIu64 ") does not match step %" PRId64 "\n",
                   g_rank, when, loader.next_sample, trainer.step);
      ++bad;
    }
    return bad;
  }
};

// ---- helpers -------------------------------------------------------------------------------

// h5ckpt calls are collective and return the same Status on every rank: rank 0 alone prints.
bool ok(const h5ckpt::Status& st, const std::string& what) {
  if (st.ok()) return true;
  if (g_rank == 0) std::fprintf(stderr, "minimal_trainer: %s failed: %s\n", what.c_str(), st.to_string().c_str());
  return false;
}

int64_t sum_over_ranks(int64_t v) {
  int64_t s = 0;
  MPI_Allreduce(&v, &s, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return s;
}

std::string step_dir(const std::string& root, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08" PRId64, step);
  return (std::filesystem::path(root) / name).string();
}

struct Args {
  h5ckpt::ParallelSizes sizes{1, 0, 1};  // dp 0: world / (tp * pp)
  int64_t steps = 6, save_every = 3, expect_start = -1;
  std::string ckpt_dir;
};

std::optional<Args> parse_args(int argc, char** argv, int world) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto value = [&]() -> int64_t { return i + 1 < argc ? std::atoll(argv[++i]) : -1; };
    if (s == "--tp") a.sizes.tp = static_cast<int>(value());
    else if (s == "--dp") a.sizes.dp = static_cast<int>(value());
    else if (s == "--pp") a.sizes.pp = static_cast<int>(value());
    else if (s == "--steps") a.steps = value();
    else if (s == "--save-every") a.save_every = value();
    else if (s == "--expect-start") a.expect_start = value();
    else if (!s.empty() && s[0] != '-' && a.ckpt_dir.empty()) a.ckpt_dir = s;
    else return std::nullopt;
  }
  if (a.sizes.dp == 0 && a.sizes.tp > 0 && a.sizes.pp > 0) a.sizes.dp = world / (a.sizes.tp * a.sizes.pp);
  if (a.ckpt_dir.empty() || a.steps < 0 || a.save_every < 0) return std::nullopt;
  return a;  // a layout that does not match the world size is reported by Topology::create
}

// ---- the run -------------------------------------------------------------------------------

int run(const Args& args) {
  // 1. The parallel layout (Megatron rank order: TP fastest, then DP, then PP).
  auto topo = h5ckpt::Topology::create(MPI_COMM_WORLD, args.sizes);
  if (!ok(topo.status(), "Topology::create")) return 2;
  const h5ckpt::ParallelSizes n = topo->sizes();
  const std::string layout = "tp" + std::to_string(n.tp) + ".dp" + std::to_string(n.dp) + ".pp" + std::to_string(n.pp);

  Model model(*topo);
  h5ckpt::Checkpointer ckpt(*topo);  // default CheckpointerOptions; see checkpointer.h
  ckpt.set_attribute("example.layout", layout);

  // 2. The checkpoint root must exist: h5ckpt creates the step directories, not their parent.
  if (g_rank == 0) std::filesystem::create_directories(args.ckpt_dir);
  MPI_Barrier(MPI_COMM_WORLD);

  // 3. Resume from `latest` (or the newest checkpoint that validates), whatever layout wrote it.
  //    Only an empty directory (kNotFound) means "start fresh": a directory whose checkpoints all
  //    fail validation is an error, so a damaged checkpoint is never trained over and overwritten.
  auto found = h5ckpt::read_checkpoint_info(args.ckpt_dir);  // metadata only, no MPI
  int have = found.ok() ? 1 : found.status().code() == h5ckpt::ErrorCode::kNotFound ? 0 : 2, any = 0;
  MPI_Allreduce(&have, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);  // all ranks take the same branch
  if (any == 2) {
    if (!ok(found.ok() ? h5ckpt::Status(h5ckpt::ErrorCode::kRemote, "another rank could not read it") : found.status(),
            "reading '" + args.ckpt_dir + "'"))
      return 1;
  }
  if (any == 1) {
    h5ckpt::StateDict sd = model.state();
    auto loaded = ckpt.load(sd, args.ckpt_dir);  // follows CKPT_DIR/latest
    if (!ok(loaded.status(), "load from '" + args.ckpt_dir + "'")) return 1;
    if (g_rank == 0) {
      auto info = h5ckpt::read_checkpoint_info(loaded->path);  // metadata only, no MPI
      if (info.ok())
        std::printf("resumed %s (step %" PRId64 ", saved as tp%d.dp%d.pp%d) as %s\n", loaded->path.c_str(), info->step,
                    info->saved_sizes.tp, info->saved_sizes.dp, info->saved_sizes.pp, layout.c_str());
    }
    const int64_t bad = sum_over_ranks(model.count_mismatches("after load"));
    if (bad != 0) {
      if (g_rank == 0) std::fprintf(stderr, "minimal_trainer: %" PRId64 " loaded values are wrong\n", bad);
      return 1;
    }
    if (g_rank == 0) std::printf("checked every loaded element: OK\n");
  } else if (g_rank == 0) {
    std::printf("no checkpoint in %s: starting at step 0 as %s\n", args.ckpt_dir.c_str(), layout.c_str());
  }
  if (args.expect_start >= 0 && model.trainer.step != args.expect_start) {
    if (g_rank == 0)
      std::fprintf(stderr, "minimal_trainer: started at step %" PRId64 ", expected %" PRId64 "\n", model.trainer.step,
                   args.expect_start);
    return 1;
  }

  // 4. Train, saving asynchronously. At most one save is in flight: wait for the previous one
  //    (and check how it ended) before starting the next.
  std::optional<h5ckpt::SaveHandle> pending;
  auto finish_pending = [&]() -> bool {
    if (!pending) return true;
    auto done = pending->wait();  // blocks until committed or failed; same outcome on every rank
    pending.reset();
    if (!ok(done.status(), "asynchronous save")) return false;
    if (g_rank == 0)
      std::printf("committed %s: %" PRIu64 " bytes in %.3f s (snapshot %.3f s)\n", done->path.c_str(),
                  done->bytes_total, done->total_s, done->snapshot_s);
    return true;
  };
  for (int64_t step = model.trainer.step + 1; step <= args.steps; ++step) {
    model.train_step();
    if (step == args.steps || (args.save_every > 0 && step % args.save_every == 0)) {
      if (!finish_pending()) return 1;
      h5ckpt::StateDict sd = model.state();
      h5ckpt::SaveOptions options;
      options.step = step;
      auto handle = ckpt.save_async(sd, step_dir(args.ckpt_dir, step), options);
      if (!ok(handle.status(), "save_async at step " + std::to_string(step))) return 1;
      pending = *handle;  // the state is snapshotted: training may modify the buffers now
    }
  }
  if (!finish_pending()) return 1;

  // 5. The final values must follow the formula too (the update continued the loaded state).
  const int64_t bad = sum_over_ranks(model.count_mismatches("at the end"));
  if (bad != 0) {
    if (g_rank == 0) std::fprintf(stderr, "minimal_trainer: %" PRId64 " final values are wrong\n", bad);
    return 1;
  }
  if (g_rank == 0)
    std::printf("done at step %" PRId64 " as %s: every value checked OK\n", model.trainer.step, layout.c_str());
  // Returning destroys the Checkpointer (which waits for a save in flight) and then the
  // Topology (which frees its communicators): both before main() calls MPI_Finalize.
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // save_async writes on a background thread that makes MPI calls: it needs MPI_THREAD_MULTIPLE.
  // With less, save_async logs a warning once and saves synchronously (same files).
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (g_rank == 0 && provided < MPI_THREAD_MULTIPLE)
    std::printf("note: MPI_THREAD_MULTIPLE not available, saves will be synchronous\n");

  int rc = 2;
  if (auto args = parse_args(argc, argv, world)) {
    rc = run(*args);
  } else if (g_rank == 0) {
    std::fprintf(stderr,
                 "usage: minimal_trainer [--tp N] [--dp N] [--pp N] [--steps N] [--save-every K] "
                 "[--expect-start S] CKPT_DIR\n");
  }
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
