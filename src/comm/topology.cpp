#include <algorithm>
#include <cstdlib>

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
  H5CKPT_RETURN_IF_ERROR(impl->setup_nodes());
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

Status Topology::Impl::setup_nodes() {
  const int rank = world.rank();
  const int key = rank == coordinator ? -1 : rank;  // the coordinator leads its node
  MPI_Comm shared = MPI_COMM_NULL, part = MPI_COMM_NULL, lead = MPI_COMM_NULL;
  {
    const comm::BlockingGuard guard("topology set-up (node communicators)", world.get());  // blocking collectives
    H5CKPT_RETURN_IF_ERROR(comm::mpi_status(
        MPI_Comm_split_type(world.get(), MPI_COMM_TYPE_SHARED, key, MPI_INFO_NULL, &shared), "MPI_Comm_split_type"));
    // Simulated nodes on one machine (tests): consecutive ranks of a real node, R at a time.
    int per_node = 0;
    if (const char* e = std::getenv("H5CKPT_RANKS_PER_NODE")) per_node = std::atoi(e);
    if (per_node > 0) {
      int srank = 0;
      MPI_Comm_rank(shared, &srank);
      Status st = comm::mpi_status(MPI_Comm_split(shared, srank / per_node, key, &part), "MPI_Comm_split(node)");
      MPI_Comm_free(&shared);
      H5CKPT_RETURN_IF_ERROR(st);
      shared = part;
    }
    int nrank = 0;
    MPI_Comm_rank(shared, &nrank);
    Status st = comm::mpi_status(MPI_Comm_split(world.get(), nrank == 0 ? 0 : MPI_UNDEFINED, key, &lead),
                                 "MPI_Comm_split(leaders)");
    if (!st.ok()) MPI_Comm_free(&shared);
    H5CKPT_RETURN_IF_ERROR(st);
  }
  auto dup_node = comm::Comm::duplicate(shared);
  MPI_Comm_free(&shared);
  H5CKPT_RETURN_IF_ERROR(dup_node.status());
  node = std::move(dup_node).value();
  if (lead != MPI_COMM_NULL) {
    auto dup_lead = comm::Comm::duplicate(lead);
    MPI_Comm_free(&lead);
    H5CKPT_RETURN_IF_ERROR(dup_lead.status());
    leaders = std::move(dup_lead).value();
  }
  // Who is on my node, and (coordinator) on every node.
  node_ranks.assign(static_cast<size_t>(node.size()), -1);
  MPI_Request req;
  H5CKPT_RETURN_IF_ERROR(comm::mpi_status(
      MPI_Iallgather(&rank, 1, MPI_INT, node_ranks.data(), 1, MPI_INT, node.get(), &req), "MPI_Iallgather(node)"));
  H5CKPT_RETURN_IF_ERROR(comm::wait_asleep(1, &req, 50, "topology set-up (node members)", node.get()));
  int lead_flag = leader() ? 1 : 0;
  H5CKPT_RETURN_IF_ERROR(comm::mpi_status(
      MPI_Iallreduce(&lead_flag, &nodes, 1, MPI_INT, MPI_SUM, world.get(), &req), "MPI_Iallreduce(nodes)"));
  H5CKPT_RETURN_IF_ERROR(comm::wait_asleep(1, &req, 50, "topology set-up (node count)", world.get()));
  if (leader()) {
    ByteWriter w;
    for (int r : node_ranks) w.put<int32_t>(r);
    H5CKPT_ASSIGN_OR_RETURN(auto lists, comm::gather_bytes(w.str(), 0, leaders.get()));
    if (rank == coordinator) {
      if (leaders.rank() != 0) return Status(ErrorCode::kInternal, "the coordinator does not lead the node leaders");
      for (const std::string& l : lists) {
        std::vector<int> members(l.size() / sizeof(int32_t));
        ByteReader rd(l);
        for (int& m : members) m = rd.get<int32_t>();
        node_members.push_back(std::move(members));
      }
    }
  }
  return Status::Ok();
}

Status Topology::Impl::duplicate_nodes_of(const Impl& other) {
  H5CKPT_ASSIGN_OR_RETURN(node, comm::Comm::duplicate(other.node.get()));
  if (other.leader()) {
    H5CKPT_ASSIGN_OR_RETURN(leaders, comm::Comm::duplicate(other.leaders.get()));
  }
  node_ranks = other.node_ranks;
  node_members = other.node_members;
  nodes = other.nodes;
  return Status::Ok();
}

Result<std::vector<std::string>> Topology::Impl::gather(const std::string& mine) const {
  auto on_node = comm::gather_bytes(mine, 0, node.get());
  std::vector<std::string> out;
  if (!leader()) {
    if (!on_node.ok()) return on_node.status();
    return out;
  }
  // A leader forwards its node as (world rank, bytes) records; after a failure it still takes
  // part (the other leaders are in the gather) with a bundle that cannot parse.
  std::string bundle = "!";
  if (on_node.ok()) {
    ByteWriter w;
    for (size_t i = 0; i < on_node->size() && i < node_ranks.size(); ++i) {
      w.put<int32_t>(node_ranks[i]);
      w.put_string((*on_node)[i]);
    }
    bundle = std::move(w.str());
  }
  auto up = comm::gather_bytes(bundle, 0, leaders.get());
  if (!on_node.ok()) return on_node.status();
  if (!up.ok()) return up.status();
  if (world.rank() != coordinator) return out;
  out.resize(static_cast<size_t>(world.size()));
  for (size_t l = 0; l < up->size(); ++l) {
    ByteReader rd((*up)[l]);
    while (!rd.at_end()) {
      const int32_t r = rd.get<int32_t>();
      std::string bytes = rd.get_string();
      if (!rd.ok() || r < 0 || r >= world.size())
        return Status(ErrorCode::kInternal, "node gather: malformed bundle from node leader " + std::to_string(l));
      out[static_cast<size_t>(r)] = std::move(bytes);
    }
  }
  return out;
}

Result<std::string> Topology::Impl::scatter(const std::vector<std::string>& parts) const {
  Status st;
  std::vector<std::string> node_parts;
  if (leader()) {
    std::vector<std::string> bundles;
    if (world.rank() == coordinator) {
      if (parts.size() != static_cast<size_t>(world.size()))
        st = Status(ErrorCode::kInternal, "scatter: " + std::to_string(parts.size()) + " parts for " +
                                              std::to_string(world.size()) + " ranks");
      for (const auto& members : node_members) {
        ByteWriter w;
        for (int r : members) w.put_string(static_cast<size_t>(r) < parts.size() ? parts[r] : std::string());
        bundles.push_back(std::move(w.str()));
      }
    }
    auto mine = comm::scatter_bytes(bundles, 0, leaders.get());
    if (st.ok()) st = mine.status();
    if (st.ok()) {
      ByteReader rd(*mine);
      node_parts.resize(node_ranks.size());
      for (auto& p : node_parts) p = rd.get_string();
      if (!rd.ok() || !rd.at_end()) st = Status(ErrorCode::kInternal, "node scatter: malformed bundle");
    }
    if (!st.ok()) node_parts.assign(node_ranks.size(), std::string());
  }
  auto got = comm::scatter_bytes(node_parts, 0, node.get());
  if (!st.ok()) return st;
  return got;
}

Status Topology::Impl::bcast(std::string& bytes) const {
  Status st;
  if (leader()) st = comm::bcast_bytes(bytes, 0, leaders.get());
  Status in_node = comm::bcast_bytes(bytes, 0, node.get());
  return st.ok() ? in_node : st;
}

Result<comm::NodeShared> Topology::Impl::share_with_nodes(uint64_t size,
                                                          const std::function<Status(char*)>& fill) const {
  auto shared = comm::NodeShared::allocate(size, node.get());
  Status st = shared.status();
  if (st.ok() && world.rank() == coordinator) st = fill(shared->data());
  // Everyone's allocation and the coordinator's bytes first: no leader waits for bytes that never come.
  H5CKPT_RETURN_IF_ERROR(comm::agree(st, world.get()));
  if (leader()) st = comm::bcast_into(shared->data(), size, 0, leaders.get());
  const Status synced = shared->sync(node.get());
  if (st.ok()) st = synced;
  H5CKPT_RETURN_IF_ERROR(comm::agree(st, world.get()));
  return shared;
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
