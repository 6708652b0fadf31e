// h5ckpt-train: a synthetic GPT training job that checkpoints with h5ckpt and resumes under any
// layout. Also two checking modes used by the tests and the main job:
//   --verify-ledger FILE --ckpt-dir DIR   every sample consumed exactly once (ledger + loader state)
//   --compare A B                          model and optimizer datasets bit-identical (1 rank)
// Checkpointer settings come from --config FILE / $H5CKPT_CONFIG and H5CKPT_* variables
// (docs/configuration.md). SIGUSR1 asks for a checkpoint at the next step boundary and a clean
// stop (Slurm's --signal=B:USR1@T before the time limit; see slurm/README.md).
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "extras/synthetic_loader.h"
#include "h5ckpt/config.h"
#include "h5ckpt/h5ckpt.hpp"
#include "h5ckpt/loader_state.h"
#include "ledger.h"
#include "workload.h"

using namespace h5ckpt;
using namespace h5ckpt::workload;

namespace {

struct Options {
  TrainConfig cfg;
  std::string dtype = "bf16";
  int64_t steps = 20;
  int64_t save_every = 5;
  std::string ckpt_dir;
  std::string ledger;
  std::string report;
  std::string verify_ledger;
  std::vector<std::string> compare;
  bool quiet = false;
  bool start_fresh = false;  // --start-fresh: train from step 0 when no checkpoint there validates
  std::string config_file;
  int64_t keep_last = -1, keep_every = -1;          // retention flags; -1: as configured
  double timeout_s = -1;                            // --timeout-s; -1: as configured
  std::string memory_bytes;                         // --memory-bytes; empty: as configured
  std::string local_dir;                            // --local-dir; empty: as configured
  int64_t persist_every = -1, local_replicas = -1;  // -1: as configured
  Config ck;                                        // resolved checkpointer, save and load settings
};

int g_rank = 0;

// Set by SIGUSR1; ranks agree on it once per step (a signal may reach only some of them).
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int) { g_stop_signal = 1; }

bool stop_requested() {
  int mine = g_stop_signal ? 1 : 0, any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any != 0;
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void say(const Options& o, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void say(const Options& o, const char* fmt, ...) {
  if (g_rank != 0 || o.quiet) return;
  va_list ap;
  va_start(ap, fmt);
  std::printf("[h5ckpt-train] ");
  std::vprintf(fmt, ap);
  std::printf("\n");
  std::fflush(stdout);
  va_end(ap);
}

void error(const std::string& msg) {
  if (g_rank != 0) return;
  // Control bytes (a NUL from a damaged key would cut the line, an escape would act on the
  // terminal) are shown as \xNN; the whole message is printed.
  std::string shown;
  for (const char ch : msg) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7F) {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      shown += hex;
    } else {
      shown += ch;
    }
  }
  std::fprintf(stderr, "h5ckpt-train: error: %s\n", shown.c_str());
}

// All ranks learn whether any failed; the first failing rank's message is printed by rank 0.
bool all_ok(const Status& st, const std::string& what) {
  int mine = st.ok() ? 0 : 1, any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (!any) return true;
  int first = mine ? g_rank : INT32_MAX, who = 0;
  MPI_Allreduce(&first, &who, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  std::string msg = st.to_string();
  int len = static_cast<int>(msg.size());
  MPI_Bcast(&len, 1, MPI_INT, who, MPI_COMM_WORLD);
  msg.resize(static_cast<size_t>(len));
  MPI_Bcast(msg.data(), len, MPI_CHAR, who, MPI_COMM_WORLD);
  error(what + " failed (rank " + std::to_string(who) + "): " + msg);
  return false;
}

double max_over_ranks(double v) {
  double m = 0;
  MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}
uint64_t sum_over_ranks(uint64_t v) {
  uint64_t s = 0;
  MPI_Allreduce(&v, &s, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return s;
}

// `io_threads`: a load's most reader threads on any rank (LoadReport::io_threads); -1: not a load.
void append_report(const Options& o, const std::string& op, int64_t step, double seconds, uint64_t bytes,
                   const std::string& path, int io_threads = -1) {
  if (g_rank != 0 || o.report.empty()) return;
  std::FILE* f = std::fopen(o.report.c_str(), "a");
  if (!f) return;
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::fprintf(f,
               "{\"op\":\"%s\",\"step\":%" PRId64
               ",\"layout\":\"%s\",\"world\":%d,\"seconds\":%.6f,"
               "\"bytes\":%" PRIu64 ",\"path\":\"%s\"%s}\n",
               op.c_str(), step, o.cfg.layout_tag().c_str(), world, seconds, bytes, path.c_str(),
               io_threads < 0 ? "" : (",\"io_threads\":" + std::to_string(io_threads)).c_str());
  std::fclose(f);
}

std::string step_dir(const std::string& root, int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08" PRId64, step);
  return (std::filesystem::path(root) / buf).string();
}

// ---- training ------------------------------------------------------------------------------

// A model too large for this rank's memory throws while its buffers are sized (no collective
// runs in there); every rank learns of it and returns null instead of aborting.
std::unique_ptr<Workload> build_workload(const Options& o, const Topology& topo) {
  std::unique_ptr<Workload> built;
  Status mem;
  try {
    built = std::make_unique<Workload>(o.cfg, topo);
  } catch (const std::bad_alloc&) {
    mem = Status(ErrorCode::kInvalidArgument, "out of memory building the model (layout " + o.cfg.layout_tag() +
                                                  "): use a smaller model or more ranks");
  } catch (const std::length_error&) {
    mem = Status(ErrorCode::kInvalidArgument, "the model's shards exceed the largest possible buffer");
  }
  if (!all_ok(mem, "building the model")) return nullptr;
  return built;
}

// Loads the checkpoint found (collectively) and reports it.
bool load_found(const Options& o, int world, Checkpointer& ck, Workload& w, const CheckpointInfo& info) {
  StateDict sd;
  if (!all_ok(w.stage_load(sd, info), "preparing the load")) return false;
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now_s();
  auto rep = ck.load(sd, o.ckpt_dir, o.ck.load);
  if (!all_ok(rep.status(), "load")) return false;
  if (!all_ok(w.finish_load(), "restoring loader/extra state")) return false;
  double secs = max_over_ranks(now_s() - t0);
  uint64_t bytes = sum_over_ranks(rep->bytes_read);
  int restored = w.rng_restored() ? 1 : 0, n_restored = 0;
  MPI_Allreduce(&restored, &n_restored, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  say(o,
      "resumed %s at step %" PRId64
      " (saved as tp%d.pp%d.dp%d%s) as %s: %.1f MB read in %.3f s; "
      "RNG restored on %d/%d ranks, derived on the others",
      rep->path.c_str(), w.global_step(), info.saved_sizes.tp, info.saved_sizes.pp, info.saved_sizes.dp,
      ((info.saved_sizes.cp != 1 ? ".cp" + std::to_string(info.saved_sizes.cp) : std::string()) +
       (info.saved_sizes.ep != 1 ? ".ep" + std::to_string(info.saved_sizes.ep) : std::string()))
          .c_str(),
      o.cfg.layout_tag().c_str(), bytes / 1e6, secs, n_restored, world);
  int io_threads = 0;
  MPI_Allreduce(&rep->io_threads, &io_threads, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  append_report(o, "load", w.global_step(), secs, bytes, rep->path, io_threads);
  return true;
}

// Resumes from --ckpt-dir's newest checkpoint, or starts from step 0 where there is none (or,
// with --start-fresh, where none validates). False after an agreed, printed error.
bool resume(const Options& o, int world, Checkpointer& ck, Workload& w) {
  Status mk;
  if (g_rank == 0) {
    std::error_code ec;
    std::filesystem::create_directories(o.ckpt_dir, ec);
    if (ec) mk = Status(ErrorCode::kIo, "cannot create '" + o.ckpt_dir + "': " + ec.message());
  }
  if (!all_ok(mk, "creating the checkpoint directory")) return false;
  // With a local level the newest servable checkpoint may be node-local (resolve is collective).
  Result<CheckpointInfo> info = Status(ErrorCode::kNotFound, "");
  if (!o.ck.checkpointer.local_dir.empty()) {
    auto r = ck.resolve(o.ckpt_dir);
    info = r.ok() ? Result<CheckpointInfo>(r->info) : Result<CheckpointInfo>(r.status());
    if (r.ok()) say(o, "resuming from the %s level: %s", r->level.c_str(), r->reason.c_str());
  } else {
    info = read_checkpoint_info(o.ckpt_dir);
  }
  // 0: resume; 1: the directory is empty (start fresh); 2: it holds checkpoints of which none
  // validates (or reading failed otherwise): an error, unless --start-fresh says to train from
  // step 0 anyway; the saves then never overwrite what could not be read.
  int code = info.ok() ? 0 : info.status().code() == ErrorCode::kNotFound ? 1 : 2;
  int lo = 0, hi = 0;
  MPI_Allreduce(&code, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&code, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  const bool fresh_over_damage = hi == 2 && lo == 2 && o.start_fresh;
  if ((hi == 2 || lo != hi) && !fresh_over_damage) {
    all_ok(code == 0 ? Status::Ok() : info.status(),
           "reading checkpoint '" + o.ckpt_dir + "'" +
               (hi == 2 && lo == 2 ? " (nothing was changed; --start-fresh trains from step 0 and keeps them)" : ""));
    return false;
  }
  if (fresh_over_damage) {
    say(o, "no checkpoint in '%s' validates (%s); --start-fresh: starting from step 0, keeping them",
        o.ckpt_dir.c_str(), info.status().message().c_str());
  } else if (code == 0) {
    if (!load_found(o, world, ck, w, *info)) return false;
  } else {
    say(o, "no checkpoint in '%s': starting from step 0", o.ckpt_dir.c_str());
  }
  // Steps past the one this run starts from (a resume from an older level after a lost local
  // checkpoint, or from 0 before any checkpoint) are re-run: the ledger says so.
  Status marked = g_rank == 0 && !o.ledger.empty() && std::filesystem::exists(o.ledger)
                      ? mark_resume(o.ledger, w.global_step())
                      : Status::Ok();
  return all_ok(marked, "marking the resume in the ledger");
}

// The training loop's saves. An asynchronous save in flight is reported once committed (before
// the next save or at the end), and its ledger rows written with it.
class Saver {
 public:
  Saver(const Options& o, Checkpointer& ck) : o_(o), ck_(ck) {}

  bool finish_pending() {
    if (!pending_) return true;
    Pending p = std::move(*pending_);
    pending_.reset();
    auto rep = p.handle.wait();
    if (!all_ok(rep.status(), "save at step " + std::to_string(p.step))) return false;
    const double secs = max_over_ranks(rep->total_s);
    say(o_, "saved step %" PRId64 " -> %s%s%s: %.1f MB in %.3f s (async; training blocked %.3f s)", p.step,
        rep->path.c_str(), rep->persisted.empty() ? "" : " and ", rep->persisted.c_str(), rep->bytes_total / 1e6, secs,
        p.blocked_s);
    append_report(o_, "save", p.step, secs, rep->bytes_total, rep->path);
    return o_.ledger.empty() || all_ok(p.rows.flush(MPI_COMM_WORLD, o_.ledger), "writing the ledger");
  }

  // Saves step `step`; `ledger` holds the rows consumed since the last save and is emptied.
  bool save(Workload& w, int64_t step, Ledger& ledger) {
    StateDict sd;
    w.stage_save(sd);
    SaveOptions so = o_.ck.save;
    so.step = step;
    // A step directory past the one this run resumed from was committed by a run that died
    // before `latest` named it: this run's timeline replaces it (else every restart would fail).
    so.overwrite = true;
    // The ledger's rows go out before the save: once a checkpoint may be selected at a restart
    // (a local one can be, before this rank hears of its commit), what it consumed is on
    // record; a resume from an older checkpoint marks the rows it re-runs (mark_resume).
    if (!o_.ledger.empty() && !all_ok(ledger.flush(MPI_COMM_WORLD, o_.ledger), "writing the ledger")) return false;
    if (!all_ok(keep_unreadable(step), "save at step " + std::to_string(step))) return false;
    MPI_Barrier(MPI_COMM_WORLD);
    double t1 = now_s();
    const std::string dir = step_dir(o_.ckpt_dir, step);
    if (o_.ck.checkpointer.async) {
      // Report the previous save first: save_async would wait for it anyway.
      if (!finish_pending()) return false;
      auto h = ck_.save_async(sd, dir, so);
      if (!all_ok(h.status(), "save at step " + std::to_string(step))) return false;
      pending_ = Pending{*h, step, max_over_ranks(now_s() - t1), std::move(ledger)};
      ledger = Ledger{};
      return true;
    }
    auto rep = ck_.save(sd, dir, so);
    if (!all_ok(rep.status(), "save at step " + std::to_string(step))) return false;
    double secs = max_over_ranks(now_s() - t1);
    say(o_, "saved step %" PRId64 " -> %s: %.1f MB in %.3f s", step, rep->path.c_str(), rep->bytes_total / 1e6, secs);
    append_report(o_, "save", step, secs, rep->bytes_total, rep->path);
    return true;
  }

 private:
  struct Pending {
    SaveHandle handle;
    int64_t step = 0;
    double blocked_s = 0;
    Ledger rows;  // empty: the rows were written before the save started
  };

  // ... but never overwrite one that cannot be read: a damaged checkpoint is the evidence of what
  // went wrong, and overwriting it would lose it. Rank 0 checks; the caller agrees on the result.
  Status keep_unreadable(int64_t step) const {
    if (g_rank != 0) return Status::Ok();
    const std::string target = step_dir(o_.ckpt_dir, step);
    std::error_code ec;
    if (!std::filesystem::exists(target, ec)) return Status::Ok();
    auto old = read_checkpoint_info(target);
    if (old.ok()) return Status::Ok();
    return Status(ErrorCode::kAlreadyExists, "refusing to overwrite '" + target + "', which could not be read (" +
                                                 old.status().message() +
                                                 "); it is kept as evidence: move it away to go on");
  }

  const Options& o_;
  Checkpointer& ck_;
  std::optional<Pending> pending_;
};

int train(Options& o, int world) {
  const Status valid = o.cfg.validate(world);
  if (!valid.ok()) {
    error(valid.message());
    return 2;
  }
  auto topo = Topology::create(MPI_COMM_WORLD, o.cfg.sizes);
  if (!all_ok(topo.status(), "topology")) return 1;
  const RankCoords me = topo->coords();
  std::unique_ptr<Workload> built = build_workload(o, *topo);
  if (!built) return 1;
  Workload& w = *built;
  Checkpointer ck(*topo, o.ck.checkpointer);
  ck.set_attribute("trainer.layout", o.cfg.layout_tag());
  ck.set_attribute("trainer.vocab", std::to_string(o.cfg.model.vocab));  // checked when resuming
  Ledger ledger;
  // One ledger row set per DP rank: its TP, PP and CP ranks consume the same data.
  const bool record = !o.ledger.empty() && me.tp == 0 && me.pp == 0 && me.cp == 0;
  if (!o.ckpt_dir.empty() && !resume(o, world, ck, w)) return 1;

  const uint64_t state_bytes = sum_over_ranks(w.local_state_bytes());
  say(o, "layout %s, world %d, %.1f MB of model+optimizer state over all ranks, training to step %" PRId64,
      o.cfg.layout_tag().c_str(), world, state_bytes / 1e6, o.steps);
  double train_s = 0;
  int64_t trained = 0;
  Saver saver(o, ck);
  bool stopped = false;
  for (int64_t step = w.global_step() + 1; step <= o.steps; ++step) {
    double t0 = now_s();
    auto pieces = w.train_step();
    train_s += now_s() - t0;
    if (o.cfg.sizes.cp > 1 && !all_ok(w.data_status(), "the data stream check of the CP ranks")) return 1;
    ++trained;
    if (record) ledger.record(step, me.dp, pieces);
    stopped = stop_requested();
    bool save = !o.ckpt_dir.empty() && ((o.save_every > 0 && step % o.save_every == 0) || step == o.steps || stopped);
    if (save && !saver.save(w, step, ledger)) return 1;
    if (stopped) break;
  }
  if (!saver.finish_pending()) return 1;
  if (stopped)
    say(o, "stop requested (SIGUSR1) at step %" PRId64 ": %s", w.global_step(),
        o.ckpt_dir.empty() ? "no --ckpt-dir, nothing saved" : "checkpoint committed, stopping early");
  if (!o.ledger.empty() && o.ckpt_dir.empty() && !all_ok(ledger.flush(MPI_COMM_WORLD, o.ledger), "writing the ledger"))
    return 1;
  say(o, "done: step %" PRId64 ", %" PRId64 " steps in %.3f s of compute (rank 0)", w.global_step(), trained, train_s);
  return 0;
}

// ---- checks --------------------------------------------------------------------------------

int verify_ledger(Options& o, int world) {
  if (o.ckpt_dir.empty()) {
    error("--verify-ledger needs --ckpt-dir (the checkpoint the ledger ends at)");
    return 2;
  }
  o.cfg.sizes = {1, world, 1};  // any layout can read the loader items; the model is not needed
  auto topo = Topology::create(MPI_COMM_WORLD, o.cfg.sizes);
  if (!all_ok(topo.status(), "topology")) return 1;
  auto info = read_checkpoint_info(o.ckpt_dir);
  if (!all_ok(info.status(), "reading checkpoint '" + o.ckpt_dir + "'")) return 1;
  loader::LoaderCheckpoint lc;
  StateDict sd;
  if (!all_ok(lc.stage_load(sd, *info), "preparing the loader load")) return 1;
  Checkpointer ck(*topo, o.ck.checkpointer);
  auto rep = ck.load(sd, o.ckpt_dir, o.ck.load);
  if (!all_ok(rep.status(), "load")) return 1;
  Status st;
  extras::VerifySummary sum;
  size_t n_pieces = 0;
  if (g_rank == 0) {
    auto lr = lc.saved_replicated();
    auto shards = lc.saved_shards();
    auto entries = read_ledger(o.verify_ledger, info->step);
    if (!lr.ok()) st = lr.status();
    else if (!shards.ok()) st = shards.status();
    else if (!entries.ok()) st = entries.status();
    else {
      std::vector<loader::Piece> pieces;
      for (const auto& e : *entries) pieces.push_back(e.piece);
      n_pieces = pieces.size();
      st = extras::verify_exactly_once(*lr, *shards, pieces, &sum);
    }
  }
  if (!all_ok(st, "exactly-once check of '" + o.verify_ledger + "' against " + info->path)) return 1;
  say(o,
      "exactly-once OK up to step %" PRId64 ": %zu pieces, %" PRId64 " tokens; %" PRId64
      " samples fully consumed, %" PRId64 " partly consumed (rest buffered), %" PRId64 " pending",
      info->step, n_pieces, sum.tokens_consumed, sum.samples_complete, sum.samples_partial, sum.samples_pending);
  return 0;
}

bool compared_key(const std::string& k) {
  return k.rfind("model/", 0) == 0 || k.rfind("optimizer/", 0) == 0 || k == "extra/global_step";
}

int compare(Options& o, int world) {
  if (o.compare.size() != 2) {
    error("--compare needs two checkpoint paths");
    return 2;
  }
  if (world != 1) {
    error("--compare runs on one rank (mpiexec -n 1)");
    return 2;
  }
  auto topo = Topology::create(MPI_COMM_WORLD, {1, 1, 1});
  if (!topo.ok()) return error(topo.status().to_string()), 1;
  Result<CheckpointInfo> info[2] = {read_checkpoint_info(o.compare[0]), read_checkpoint_info(o.compare[1])};
  for (auto& i : info)
    if (!i.ok()) return error(i.status().to_string()), 1;
  std::map<std::string, const TensorInfo*> t[2];
  for (int s = 0; s < 2; ++s)
    for (const auto& ti : info[s]->tensors)
      if (compared_key(ti.key)) t[s][ti.key] = &ti;
  int bad = 0;
  for (int s = 0; s < 2; ++s)
    for (const auto& [k, ti] : t[s])
      if (!t[1 - s].count(k)) {
        std::printf("MISSING %s: only in %s\n", k.c_str(), info[s]->path.c_str());
        ++bad;
      }
  // Load both checkpoints whole, tensor by tensor in one load per checkpoint.
  std::map<std::string, std::vector<uint8_t>> data[2];
  Checkpointer ck(*topo, o.ck.checkpointer);
  for (int s = 0; s < 2; ++s) {
    StateDict sd;
    for (const auto& [k, ti] : t[s]) {
      auto& buf = data[s][k];
      int64_t n = 1;
      for (auto d : ti->shape) n *= d;
      buf.resize(static_cast<size_t>(n) * dtype_size(ti->dtype));
      sd.add_replicated(k, ti->dtype, ti->shape, buf.data());
    }
    auto r = ck.load(sd, info[s]->path, o.ck.load);
    if (!r.ok()) return error("loading " + info[s]->path + ": " + r.status().to_string()), 1;
  }
  uint64_t bytes = 0;
  size_t same = 0;
  for (const auto& [k, a] : t[0]) {
    auto it = t[1].find(k);
    if (it == t[1].end()) continue;
    const TensorInfo* b = it->second;
    if (a->dtype != b->dtype) {
      std::printf("DTYPE %s: %s vs %s\n", k.c_str(), dtype_name(a->dtype), dtype_name(b->dtype));
      ++bad;
      continue;
    }
    const auto& da = data[0][k];
    const auto& db = data[1][k];
    size_t common = std::min(da.size(), db.size());
    bool shape_ok = a->shape == b->shape;
    if (!shape_ok) {
      // Only a vocabulary padded to another multiple is acceptable: rows differ, the surplus
      // rows must be zero, the common rows identical.
      bool rows_only = a->shape.size() == 2 && b->shape.size() == 2 && a->shape[1] == b->shape[1];
      const auto& longer = da.size() > db.size() ? da : db;
      bool zero_tail =
          std::all_of(longer.begin() + static_cast<long>(common), longer.end(), [](uint8_t x) { return x == 0; });
      if (!rows_only || !zero_tail) {
        std::printf("SHAPE %s differs beyond vocabulary padding\n", k.c_str());
        ++bad;
        continue;
      }
    }
    if (std::memcmp(da.data(), db.data(), common) != 0) {
      size_t i = 0;
      while (da[i] == db[i]) ++i;
      size_t es = dtype_size(a->dtype);
      std::printf("DIFF %s: first differing element %zu\n", k.c_str(), i / es);
      ++bad;
      continue;
    }
    ++same;
    bytes += common;
  }
  if (bad) {
    std::printf("compare: %d mismatching datasets (%zu identical)\n", bad, same);
    return 1;
  }
  std::printf("compare: %zu datasets (model/, optimizer/, extra/global_step), %.1f MB: bit-identical\n", same,
              bytes / 1e6);
  return 0;
}

// The command line, into `o` (CLI11 keeps references to its fields).
void add_options(CLI::App& app, Options& o) {
  auto& c = o.cfg;
  auto& m = c.model;
  // A later occurrence of an option overrides an earlier one (scripts append overrides).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--tp", c.sizes.tp, "tensor-parallel size")->capture_default_str();
  app.add_option("--pp", c.sizes.pp, "pipeline-parallel size")->capture_default_str();
  app.add_option("--dp", c.sizes.dp, "data-parallel size (world size must be tp*pp*dp)")->capture_default_str();
  app.add_flag("--zero", c.zero,
               "distributed optimizer: fp32 master, Adam m and v flattened and split over DP x CP (experts: over "
               "expert DP)");
  app.add_option("--cp", c.sizes.cp, "context-parallel size (world size must be tp*cp*pp*dp)")->capture_default_str();
  app.add_option("--ep", c.sizes.ep, "expert-parallel size (divides dp*cp and --experts)")->capture_default_str();
  app.add_option("--experts", m.experts, "experts per MoE layer (0: dense model)")->capture_default_str();
  app.add_option("--moe-every", m.moe_every, "every K-th layer (layer L with (L+1) % K == 0) is MoE")
      ->capture_default_str();
  app.add_flag("--swiglu", m.swiglu, "fused SwiGLU fc1: [gate; up] in one [2*ffn, hidden] weight");
  app.add_option("--layers", m.layers, "transformer layers (split over PP stages)")->capture_default_str();
  app.add_option("--hidden", m.hidden, "hidden size")->capture_default_str();
  app.add_option("--heads", m.heads, "attention heads")->capture_default_str();
  app.add_option("--kv-heads", m.kv_heads, "KV heads (GQA groups; a multiple of tp)")->capture_default_str();
  app.add_option("--ffn", m.ffn, "MLP hidden size")->capture_default_str();
  app.add_option("--vocab", m.vocab, "vocabulary size (padded up to a multiple of tp)")->capture_default_str();
  app.add_option("--dtype", o.dtype, "model parameter dtype")
      ->check(CLI::IsMember({"bf16", "f32"}))
      ->capture_default_str();
  app.add_option("--steps", o.steps, "train until global step N")->capture_default_str();
  app.add_option("--save-every", o.save_every, "save every K steps (and at the last step); 0: last step only")
      ->capture_default_str();
  app.add_option("--ckpt-dir", o.ckpt_dir, "checkpoint directory: resume from its latest checkpoint, save there");
  app.add_option("--seed", c.seed, "seed of the data loader and the RNG states")->capture_default_str();
  app.add_flag("--tie-embeddings", m.tie_embeddings, "output layer shares the word embedding (no output_layer.weight)");
  app.add_option("--loader-workers", c.loader_workers, "data-loader read workers per DP rank")->capture_default_str();
  app.add_option("--seq-len", c.context_len, "tokens per window (one window per DP rank per step)")
      ->capture_default_str();
  app.add_option("--ledger", o.ledger, "append every consumed sample piece (step dp source record begin end) to FILE");
  app.add_option("--report", o.report, "append one JSON line per save/load (seconds, bytes) to FILE");
  app.add_option("--verify-ledger", o.verify_ledger,
                 "check mode: every sample in FILE plus --ckpt-dir's loader state consumed exactly once");
  app.add_option("--compare", o.compare,
                 "check mode (1 rank): checkpoints A and B have bit-identical "
                 "model/ and optimizer/ datasets")
      ->expected(2)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_flag("--quiet", o.quiet, "print errors only");
  app.add_flag("--start-fresh", o.start_fresh,
               "train from step 0 when --ckpt-dir holds checkpoints of which none validates (without it, that is an "
               "error); unreadable checkpoints are never overwritten");
  app.add_option("--keep-last", o.keep_last,
                 "after each save keep the N newest checkpoints in --ckpt-dir, delete older ones (0: keep all; "
                 "default: checkpointer.keep_last)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--keep-every", o.keep_every,
                 "with --keep-last: also keep every checkpoint whose step is a multiple of K (default: "
                 "checkpointer.keep_every)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--timeout-s", o.timeout_s,
                 "deadline in seconds of every wait of a save/load for other ranks; past it the job aborts "
                 "(0: none; default: checkpointer.timeout_s, 600)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--local-dir", o.local_dir,
                 "node-local checkpoint directory ({node}: the node's index): save there every --save-every "
                 "steps with partner copies, persist to --ckpt-dir every --persist-every steps (default: "
                 "checkpointer.local_dir)");
  app.add_option("--persist-every", o.persist_every,
                 "with --local-dir: steps that are multiples of K are also saved to --ckpt-dir (default: "
                 "checkpointer.persist_every)");
  app.add_option("--local-replicas", o.local_replicas,
                 "with --local-dir: copies of each node's files on the next N nodes (default: "
                 "checkpointer.local_replicas)");
  app.add_option("--memory-bytes", o.memory_bytes,
                 "bound of the memory h5ckpt takes for a save or load beyond the state (e.g. 512MiB; 0: none; "
                 "default: checkpointer.memory_bytes)");
  app.add_option("--config", o.config_file,
                 "h5ckpt settings (TOML, see config/h5ckpt.toml); default $H5CKPT_CONFIG; H5CKPT_* "
                 "environment variables override the file");
}

// Settings from the file and environment, then the flags that override them. Every rank reads the
// same file and environment, so all agree on the outcome.
Status resolve_settings(Options& o) {
  o.cfg.model.dtype = o.dtype == "f32" ? DType::kF32 : DType::kBF16;
  auto resolved = resolve_config(o.config_file);
  if (!resolved.ok()) return resolved.status();
  o.ck = std::move(resolved).value();
  if (o.keep_last >= 0) o.ck.checkpointer.keep_last = o.keep_last;  // flags override file and environment
  if (o.keep_every >= 0) o.ck.checkpointer.keep_every = o.keep_every;
  if (o.timeout_s >= 0) o.ck.checkpointer.timeout_s = o.timeout_s;
  if (!o.local_dir.empty()) o.ck.checkpointer.local_dir = o.local_dir;
  if (o.persist_every >= 0) o.ck.checkpointer.persist_every = o.persist_every;
  if (o.local_replicas >= 0) o.ck.checkpointer.local_replicas = static_cast<int>(o.local_replicas);
  if (!o.memory_bytes.empty()) {
    auto bytes = parse_byte_size(o.memory_bytes);
    if (!bytes.ok()) return Status(bytes.status().code(), "--memory-bytes: " + bytes.status().message());
    o.ck.checkpointer.memory_bytes = *bytes;
  }
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);

  Options o;
  CLI::App app{
      "Synthetic GPT trainer for h5ckpt: Megatron-style TP/PP/DP layouts, elementwise Adam, "
      "a data loader with token buffers; checkpoints with h5ckpt and resumes bit-exactly under "
      "any layout. Launch with mpiexec -n tp*pp*dp.",
      "h5ckpt-train"};
  add_options(app, o);
  int rc = 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Every rank parses the same arguments, so all take this path; rank 0 prints.
    if (g_rank == 0) rc = app.exit(e);
    else rc = e.get_exit_code();
    MPI_Finalize();
    return rc;
  }
  if (const Status st = resolve_settings(o); !st.ok()) {
    error(st.message());
    MPI_Finalize();
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
  if (!o.compare.empty()) rc = compare(o, world);
  else if (!o.verify_ledger.empty()) rc = verify_ledger(o, world);
  else rc = train(o, world);
  MPI_Finalize();
  return rc;
}
