// `h5ckpt reshard PATH OUT --tp --pp --dp`: rewrites a checkpoint as if saved by another
// layout. The format is layout-agnostic (every tensor is one global dataset and loads reshard
// automatically), so this is rarely needed; what changes is the recorded saving topology and
// the saved regions (who wrote what), and the data is re-checksummed. See docs/cli.md.
//
// Under mpirun with tp*pp*dp ranks, each rank loads an even share of every tensor and the ranks
// save OUT together through Checkpointer:
//   - dimension 0 split over the world when it has at least `world` rows (contiguous file spans);
//   - otherwise an even split of the row-major flattening (flat ranges), when numel >= world;
//   - otherwise (tiny tensors) the whole tensor on every rank (written once by the library).
// Peak memory per rank is about the checkpoint size / world.
#include <cstdio>
#include <iostream>
#include <memory>

#include "h5ckpt/topology.h"
#include "tools/cli_common.h"

namespace h5ckpt::cli {

namespace {

struct ReshardArgs {
  std::string path, out;
  int tp = 1, pp = 1, dp = 1;
  bool overwrite = false;
  bool update_latest = false;
  bool no_verify = false;
};

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

ShardSpec share_of(const Shape& shape, int world, int rank) {
  const int64_t n = numel_of(shape);
  if (shape[0] >= world) return ShardSpec::split(shape, 0, world, rank);
  if (n >= world) {
    const int64_t b = n * rank / world, e = n * (rank + 1) / world;  // n < 2^63 / world in practice
    return ShardSpec::flat_range(ShardSpec::whole(shape).box, b, e);
  }
  return ShardSpec::whole(shape);
}

int run_reshard(const ReshardArgs& a) {
  MpiSession mpi(/*force=*/true);  // a single process still needs MPI for Checkpointer
  const int world = mpi.size(), rank = mpi.rank();
  auto say_error = [&](const std::string& what, const Status& st) {
    if (rank == 0) print_error(what, st);
  };
  if (a.tp < 1 || a.pp < 1 || a.dp < 1 || static_cast<int64_t>(a.tp) * a.pp * a.dp != world) {
    say_error("reshard",
              Status(ErrorCode::kInvalidArgument,
                     "--tp " + std::to_string(a.tp) + " --pp " + std::to_string(a.pp) + " --dp " +
                         std::to_string(a.dp) + " needs tp*pp*dp ranks, but this run has " + std::to_string(world) +
                         " (use mpirun -n " + std::to_string(static_cast<int64_t>(a.tp) * a.pp * a.dp) + ")"));
    return kExitError;
  }
  // Every rank reads the (small) metadata itself; all see the same outcome.
  auto info = read_checkpoint_info(a.path);
  if (const int rc = mpi.agree_exit(info.ok() ? kExitOk : exit_for(info.status())); rc != kExitOk) {
    say_error("cannot read '" + a.path + "'",
              info.ok() ? Status(ErrorCode::kRemote, "another rank failed") : info.status());
    return rc;
  }
  auto topo = Topology::create(MPI_COMM_WORLD, ParallelSizes{a.tp, a.dp, a.pp});
  if (!topo.ok()) return say_error("reshard", topo.status()), kExitError;

  std::vector<std::vector<char>> buffers;
  buffers.reserve(info->tensors.size());
  StateDict sd;
  uint64_t mine = 0;
  for (const auto& t : info->tensors) {
    ShardSpec spec = share_of(t.shape, world, rank);
    buffers.emplace_back(static_cast<size_t>(spec.numel()) * dtype_size(t.dtype));
    mine += buffers.back().size();
    sd.add(t.key, t.dtype, t.shape, std::move(spec), buffers.back().data());
  }
  int rc = kExitOk;
  {
    Checkpointer ck(*topo);
    LoadOptions lo;
    lo.strict = true;
    lo.convert_dtype = false;
    lo.verify_checksums = !a.no_verify;
    auto loaded = ck.load(sd, info->path, lo);
    if (!loaded.ok()) {
      say_error("loading '" + info->path + "'", loaded.status());
      return exit_for(loaded.status());
    }
    for (const auto& [k, v] : info->attributes) ck.set_attribute(k, v);
    ck.set_attribute("h5ckpt_resharded_from", info->path);
    SaveOptions so;
    so.step = info->step;
    so.overwrite = a.overwrite;
    so.update_latest = a.update_latest;
    auto saved = ck.save(sd, a.out, so);
    if (!saved.ok()) {
      say_error("saving '" + a.out + "'", saved.status());
      rc = exit_for(saved.status());
    } else if (rank == 0) {
      std::cout << "resharded " << info->path << " (tp=" << info->saved_sizes.tp << " dp=" << info->saved_sizes.dp
                << " pp=" << info->saved_sizes.pp << ") -> " << saved->path << " (tp=" << a.tp << " dp=" << a.dp
                << " pp=" << a.pp << "): " << info->tensors.size() << " tensors, " << human_bytes(saved->bytes_total)
                << ", " << world << " ranks (" << human_bytes(mine) << " held by rank 0), load "
                << seconds(loaded->total_s) << ", save " << seconds(saved->total_s) << "\n";
    }
  }
  return rc;
}

}  // namespace

void register_reshard(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ReshardArgs>();
  CLI::App* sub = app.add_subcommand(
      "reshard",
      "Rewrite checkpoint PATH as OUT, saved by a tp x pp x dp layout (run under mpirun -n tp*pp*dp). "
      "Loading already reshards automatically; this only changes the recorded saving topology and regions "
      "and re-checksums the data. Check the result with 'h5ckpt diff PATH OUT'.");
  sub->add_option("PATH", args->path, "source checkpoint")->required();
  sub->add_option("OUT", args->out, "new checkpoint directory")->required();
  sub->add_option("--tp", args->tp, "tensor-parallel size")->required()->check(CLI::PositiveNumber);
  sub->add_option("--pp", args->pp, "pipeline-parallel size")->required()->check(CLI::PositiveNumber);
  sub->add_option("--dp", args->dp, "data-parallel size")->required()->check(CLI::PositiveNumber);
  sub->add_flag("--overwrite", args->overwrite, "replace OUT if it exists");
  sub->add_flag("--update-latest", args->update_latest, "point OUT's parent 'latest' at OUT");
  sub->add_flag("--no-verify", args->no_verify, "skip the checksum check of PATH while loading");
  sub->callback([args, exit_code] {
    try {
      *exit_code = run_reshard(*args);
    } catch (const std::exception& e) {
      std::cerr << "h5ckpt: reshard: " << e.what() << "\n";
      *exit_code = kExitError;
    }
  });
}

}  // namespace h5ckpt::cli
