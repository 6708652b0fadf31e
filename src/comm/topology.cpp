#include <algorithm>

#include "comm/deadline.h"
#include "comm/topology_impl.h"
#include "util/bytes.h"

namespace h5ckpt {

namespace {

Result<std::unique_ptr<Topology::Impl>> finish(std::unique_ptr<Topology::Impl> impl) {
  const int size = impl->world.size();
  int mine[3] = {impl->coords.tp, impl->coords.dp, impl->coords.pp};
  std::vector<int> all(3 * size);
  MPI_Request req;
  H5CKPT_RETURN_IF_ERROR(comm::mpi_status(
      MPI_Iallgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, impl->world.get(), &req), "MPI_Iallgather(coords)"));
  H5CKPT_RETURN_IF_ERROR(comm::wait_asleep(1, &req, 50, "topology set-up (coordinates)", impl->world.get()));
  impl->all_coords.resize(size);
  std::vector<char> seen(size, 0);
  Status bad;
  for (int r = 0; r < size; ++r) {
    RankCoords c{all[3 * r], all[3 * r + 1], all[3 * r + 2]};
    impl->all_coords[r] = c;
    const int idx = (c.pp * impl->sizes.dp + c.dp) * impl->sizes.tp + c.tp;
    if (idx < 0 || idx >= size || seen[idx]) {
      bad = Status(ErrorCode::kInvalidArgument, "the TP/DP/PP communicators do not form a grid: rank " +
                                                    std::to_string(r) + " has duplicate or invalid coordinates");
      break;
    }
    seen[idx] = 1;
    if (c.tp == 0 && c.dp == 0 && c.pp == 0) impl->coordinator = r;
  }
  if (!bad.ok()) return bad;
  return impl;
}

}  // namespace

Result<Topology> Topology::create(MPI_Comm world, ParallelSizes sizes) {
  auto impl = std::make_unique<Impl>();
  H5CKPT_ASSIGN_OR_RETURN(impl->world, comm::Comm::duplicate(world));
  const int size = impl->world.size(), rank = impl->world.rank();
  if (sizes.tp < 1 || sizes.dp < 1 || sizes.pp < 1 || static_cast<int64_t>(sizes.tp) * sizes.dp * sizes.pp != size)
    return Status(ErrorCode::kInvalidArgument, "topology tp=" + std::to_string(sizes.tp) + " dp=" +
                                                   std::to_string(sizes.dp) + " pp=" + std::to_string(sizes.pp) +
                                                   " needs " + std::to_string(int64_t(sizes.tp) * sizes.dp * sizes.pp) +
                                                   " ranks, world has " + std::to_string(size));
  impl->sizes = sizes;
  // Megatron order: TP fastest, then DP, then PP.
  impl->coords = RankCoords{rank % sizes.tp, (rank / sizes.tp) % sizes.dp, rank / (sizes.tp * sizes.dp)};
  const auto& c = impl->coords;
  MPI_Comm tmp;
  auto split = [&](int color, int key, comm::Comm& out) -> Status {
    const comm::BlockingGuard guard("topology set-up (MPI_Comm_split)", impl->world.get());  // collective, blocking
    H5CKPT_RETURN_IF_ERROR(comm::mpi_status(MPI_Comm_split(impl->world.get(), color, key, &tmp), "MPI_Comm_split"));
    auto dup = comm::Comm::duplicate(tmp);
    MPI_Comm_free(&tmp);
    if (!dup.ok()) return dup.status();
    out = std::move(dup).value();
    return Status::Ok();
  };
  H5CKPT_RETURN_IF_ERROR(split(c.pp * sizes.dp + c.dp, c.tp, impl->tp));
  H5CKPT_RETURN_IF_ERROR(split(c.pp * sizes.tp + c.tp, c.dp, impl->dp));
  H5CKPT_RETURN_IF_ERROR(split(c.dp * sizes.tp + c.tp, c.pp, impl->pp));
  H5CKPT_ASSIGN_OR_RETURN(auto done, finish(std::move(impl)));
  return Topology(std::move(done));
}

Result<Topology> Topology::from_comms(MPI_Comm world, MPI_Comm tp, MPI_Comm dp, MPI_Comm pp) {
  auto impl = std::make_unique<Impl>();
  H5CKPT_ASSIGN_OR_RETURN(impl->world, comm::Comm::duplicate(world));
  H5CKPT_ASSIGN_OR_RETURN(impl->tp, comm::Comm::duplicate(tp));
  H5CKPT_ASSIGN_OR_RETURN(impl->dp, comm::Comm::duplicate(dp));
  H5CKPT_ASSIGN_OR_RETURN(impl->pp, comm::Comm::duplicate(pp));
  impl->sizes = ParallelSizes{impl->tp.size(), impl->dp.size(), impl->pp.size()};
  impl->coords = RankCoords{impl->tp.rank(), impl->dp.rank(), impl->pp.rank()};
  Status local;
  if (static_cast<int64_t>(impl->sizes.tp) * impl->sizes.dp * impl->sizes.pp != impl->world.size())
    local = Status(ErrorCode::kInvalidArgument, "tp*dp*pp communicator sizes differ from the world size");
  H5CKPT_RETURN_IF_ERROR(comm::agree(local, impl->world.get()));
  H5CKPT_ASSIGN_OR_RETURN(auto done, finish(std::move(impl)));
  return Topology(std::move(done));
}

Result<std::vector<std::string>> Topology::Impl::tree_gather(const std::string& mine) const {
  // Each level forwards (world rank, bytes) records; leaders of one level join the next.
  ByteWriter w;
  w.put<int32_t>(world.rank());
  w.put_string(mine);
  std::string bundle = std::move(w.str());
  const comm::Comm* levels[3] = {&tp, &dp, &pp};
  bool leader = true;
  for (const comm::Comm* level : levels) {
    if (!leader) break;
    H5CKPT_ASSIGN_OR_RETURN(auto parts, comm::gather_bytes(bundle, 0, level->get()));
    if (level->rank() != 0) {
      leader = false;
      break;
    }
    bundle.clear();
    for (auto& p : parts) bundle += p;
  }
  std::vector<std::string> out;
  if (world.rank() != coordinator) return out;
  out.resize(world.size());
  ByteReader rd(bundle);
  while (!rd.at_end()) {
    const int32_t r = rd.get<int32_t>();
    std::string bytes = rd.get_string();
    if (!rd.ok() || r < 0 || r >= world.size()) return Status(ErrorCode::kInternal, "malformed tree gather");
    out[r] = std::move(bytes);
  }
  return out;
}

Topology::Topology(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Topology::Topology(Topology&&) noexcept = default;
Topology& Topology::operator=(Topology&&) noexcept = default;
Topology::~Topology() = default;

int Topology::rank() const { return impl_->world.rank(); }
int Topology::size() const { return impl_->world.size(); }
ParallelSizes Topology::sizes() const { return impl_->sizes; }
RankCoords Topology::coords() const { return impl_->coords; }
const std::vector<RankCoords>& Topology::all_coords() const { return impl_->all_coords; }
MPI_Comm Topology::world() const { return impl_->world.get(); }
MPI_Comm Topology::tp_comm() const { return impl_->tp.get(); }
MPI_Comm Topology::dp_comm() const { return impl_->dp.get(); }
MPI_Comm Topology::pp_comm() const { return impl_->pp.get(); }

}  // namespace h5ckpt
