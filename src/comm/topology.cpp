#include <algorithm>
#include <cstdlib>

#include "comm/deadline.h"
#include "comm/topology_impl.h"
#include "util/bytes.h"

namespace h5ckpt {

namespace {

Result<std::unique_ptr<Topology::Impl>> finish(std::unique_ptr<Topology::Impl> impl) {
  const int size = impl->world.size();
  const ParallelSizes& z = impl->sizes;
  constexpr int kN = 6;
  const RankCoords& me = impl->coords;
  int mine[kN] = {me.tp, me.dp, me.pp, me.cp, me.ep, me.edp};
  std::vector<int> all(static_cast<size_t>(kN) * size);
  MPI_Request req;
  H5CKPT_RETURN_IF_ERROR(comm::mpi_status(
      MPI_Iallgather(mine, kN, MPI_INT, all.data(), kN, MPI_INT, impl->world.get(), &req), "MPI_Iallgather(coords)"));
  H5CKPT_RETURN_IF_ERROR(comm::wait_asleep(1, &req, 50, "topology set-up (coordinates)", impl->world.get()));
  impl->all_coords.resize(size);
  std::vector<char> seen(size, 0), seen_expert(size, 0);
  const int edp_size = z.edp();
  Status bad;
  for (int r = 0; r < size; ++r) {
    const int* a = &all[static_cast<size_t>(kN) * r];
    RankCoords c{a[0], a[1], a[2], a[3], a[4], a[5]};
    impl->all_coords[r] = c;
    // Dense grid: TP fastest, then CP, DP, PP (with cp = 1 the TP/DP/PP index of before).
    const int64_t idx = ((int64_t{c.pp} * z.dp + c.dp) * z.cp + c.cp) * z.tp + c.tp;
    // Expert grid: TP fastest, then EP, expert DP, PP.
    const int64_t eidx = ((int64_t{c.pp} * edp_size + c.edp) * z.ep + c.ep) * z.tp + c.tp;
    const bool in_range = c.tp >= 0 && c.tp < z.tp && c.cp >= 0 && c.cp < z.cp && c.dp >= 0 && c.dp < z.dp &&
                          c.pp >= 0 && c.pp < z.pp && c.ep >= 0 && c.ep < z.ep && c.edp >= 0 && c.edp < edp_size;
    if (!in_range || idx < 0 || idx >= size || seen[idx]) {
      bad = Status(ErrorCode::kInvalidArgument, "the TP/CP/DP/PP communicators do not form a grid: rank " +
                                                    std::to_string(r) + " has duplicate or invalid coordinates");
      break;
    }
    if (eidx < 0 || eidx >= size || seen_expert[eidx]) {
      bad = Status(ErrorCode::kInvalidArgument, "the EP communicators do not form a grid: rank " + std::to_string(r) +
                                                    " has a duplicate (tp, pp, ep, expert-dp) position");
      break;
    }
    seen[idx] = 1;
    seen_expert[eidx] = 1;
    if (c.tp == 0 && c.cp == 0 && c.dp == 0 && c.pp == 0) impl->coordinator = r;
  }
  if (!bad.ok()) return bad;
  H5CKPT_RETURN_IF_ERROR(impl->setup_nodes());
  return impl;
}

Status split_into(const comm::Comm& world, int color, int key, comm::Comm& out) {
  MPI_Comm tmp;
  const comm::BlockingGuard guard("topology set-up (MPI_Comm_split)", world.get());  // collective, blocking
  H5CKPT_RETURN_IF_ERROR(comm::mpi_status(MPI_Comm_split(world.get(), color, key, &tmp), "MPI_Comm_split"));
  auto dup = comm::Comm::duplicate(tmp);
  MPI_Comm_free(&tmp);
  if (!dup.ok()) return dup.status();
  out = std::move(dup).value();
  return Status::Ok();
}

// CP, DP x CP, EP and expert-DP groups where they equal another group or one rank: with cp = 1 the
// CP group is the rank itself and DP x CP is DP; with ep = 1 the EP group is the rank itself and
// expert DP is DP x CP. So a job with cp = ep = 1 makes no extra split of the world.
Status trivial_expert_and_context_comms(Topology::Impl& impl) {
  if (impl.sizes.cp == 1) {
    H5CKPT_ASSIGN_OR_RETURN(impl.cp, comm::Comm::duplicate(MPI_COMM_SELF));
    H5CKPT_ASSIGN_OR_RETURN(impl.dp_cp, comm::Comm::duplicate(impl.dp.get()));
  }
  if (impl.sizes.ep == 1) {
    H5CKPT_ASSIGN_OR_RETURN(impl.ep, comm::Comm::duplicate(MPI_COMM_SELF));
    H5CKPT_ASSIGN_OR_RETURN(impl.edp, comm::Comm::duplicate(impl.dp_cp.get()));
  }
  return Status::Ok();
}

}  // namespace

Result<Topology> Topology::create(MPI_Comm world, ParallelSizes sizes) {
  auto impl = std::make_unique<Impl>();
  H5CKPT_ASSIGN_OR_RETURN(impl->world, comm::Comm::duplicate(world));
  const int size = impl->world.size(), rank = impl->world.rank();
  const int64_t want = int64_t{sizes.tp} * sizes.cp * sizes.dp * sizes.pp;
  if (sizes.tp < 1 || sizes.dp < 1 || sizes.pp < 1 || sizes.cp < 1 || sizes.ep < 1 || want != size) {
    std::string what = "topology tp=" + std::to_string(sizes.tp);
    if (sizes.cp != 1) what += " cp=" + std::to_string(sizes.cp);
    what += " dp=" + std::to_string(sizes.dp) + " pp=" + std::to_string(sizes.pp);
    if (sizes.ep != 1) what += " ep=" + std::to_string(sizes.ep);
    return Status(ErrorCode::kInvalidArgument,
                  what + " needs " + std::to_string(want) + " ranks, world has " + std::to_string(size));
  }
  if ((int64_t{sizes.dp} * sizes.cp) % sizes.ep != 0)
    return Status(ErrorCode::kInvalidArgument, "topology ep=" + std::to_string(sizes.ep) + " must divide dp*cp = " +
                                                   std::to_string(int64_t{sizes.dp} * sizes.cp) +
                                                   " (experts are split inside the DP x CP ranks)");
  impl->sizes = sizes;
  // Megatron order: TP fastest, then CP, then DP, then PP; experts: EP fastest inside DP x CP.
  RankCoords c;
  c.tp = rank % sizes.tp;
  c.cp = (rank / sizes.tp) % sizes.cp;
  c.dp = (rank / (sizes.tp * sizes.cp)) % sizes.dp;
  c.pp = rank / (sizes.tp * sizes.cp * sizes.dp);
  const int g = c.dp * sizes.cp + c.cp;  // position in the DP x CP group
  c.ep = g % sizes.ep;
  c.edp = g / sizes.ep;
  impl->coords = c;
  const int TP = sizes.tp, CP = sizes.cp, DP = sizes.dp, EP = sizes.ep, EDP = sizes.edp();
  H5CKPT_RETURN_IF_ERROR(split_into(impl->world, (c.pp * DP + c.dp) * CP + c.cp, c.tp, impl->tp));
  H5CKPT_RETURN_IF_ERROR(split_into(impl->world, (c.pp * CP + c.cp) * TP + c.tp, c.dp, impl->dp));
  H5CKPT_RETURN_IF_ERROR(split_into(impl->world, (c.dp * CP + c.cp) * TP + c.tp, c.pp, impl->pp));
  if (CP > 1) {
    H5CKPT_RETURN_IF_ERROR(split_into(impl->world, (c.pp * DP + c.dp) * TP + c.tp, c.cp, impl->cp));
    H5CKPT_RETURN_IF_ERROR(split_into(impl->world, c.pp * TP + c.tp, g, impl->dp_cp));
  }
  if (EP > 1) {
    H5CKPT_RETURN_IF_ERROR(split_into(impl->world, (c.pp * EDP + c.edp) * TP + c.tp, c.ep, impl->ep));
    H5CKPT_RETURN_IF_ERROR(split_into(impl->world, (c.pp * EP + c.ep) * TP + c.tp, c.edp, impl->edp));
  }
  H5CKPT_RETURN_IF_ERROR(trivial_expert_and_context_comms(*impl));
  H5CKPT_ASSIGN_OR_RETURN(auto done, finish(std::move(impl)));
  return Topology(std::move(done));
}

Result<Topology> Topology::from_comms(MPI_Comm world, MPI_Comm tp, MPI_Comm dp, MPI_Comm pp) {
  return from_comms(world, tp, MPI_COMM_SELF, dp, pp, MPI_COMM_SELF);
}

Result<Topology> Topology::from_comms(MPI_Comm world, MPI_Comm tp, MPI_Comm cp, MPI_Comm dp, MPI_Comm pp, MPI_Comm ep) {
  auto impl = std::make_unique<Impl>();
  H5CKPT_ASSIGN_OR_RETURN(impl->world, comm::Comm::duplicate(world));
  H5CKPT_ASSIGN_OR_RETURN(impl->tp, comm::Comm::duplicate(tp));
  H5CKPT_ASSIGN_OR_RETURN(impl->dp, comm::Comm::duplicate(dp));
  H5CKPT_ASSIGN_OR_RETURN(impl->pp, comm::Comm::duplicate(pp));
  int cp_size = 1, cp_rank = 0, ep_size = 1, ep_rank = 0;
  MPI_Comm_size(cp, &cp_size);
  MPI_Comm_rank(cp, &cp_rank);
  MPI_Comm_size(ep, &ep_size);
  MPI_Comm_rank(ep, &ep_rank);
  impl->sizes = ParallelSizes{impl->tp.size(), impl->dp.size(), impl->pp.size(), cp_size, ep_size};
  impl->coords = RankCoords{impl->tp.rank(), impl->dp.rank(), impl->pp.rank(), cp_rank, ep_rank, 0};
  const ParallelSizes& z = impl->sizes;
  Status local;
  if (int64_t{z.tp} * z.cp * z.dp * z.pp != impl->world.size())
    local = Status(ErrorCode::kInvalidArgument, "tp*cp*dp*pp communicator sizes differ from the world size");
  else if ((int64_t{z.dp} * z.cp) % z.ep != 0)
    local = Status(ErrorCode::kInvalidArgument, "the EP communicator size " + std::to_string(z.ep) +
                                                    " does not divide dp*cp = " + std::to_string(int64_t{z.dp} * z.cp));
  // Every rank must take the same branches below: the CP and EP sizes agree everywhere.
  int flags[4] = {z.cp, -z.cp, z.ep, -z.ep};
  H5CKPT_RETURN_IF_ERROR(comm::agree(local, impl->world.get(), flags, 4));
  if (flags[0] != -flags[1] || flags[2] != -flags[3])  // the same minima and maxima on every rank
    return Status(ErrorCode::kInvalidArgument, "the CP or EP communicators have different sizes on different ranks");
  const RankCoords& c = impl->coords;
  if (z.cp > 1) {
    H5CKPT_ASSIGN_OR_RETURN(impl->cp, comm::Comm::duplicate(cp));
    // DP x CP: the ranks with my (tp, pp), ordered by dp * CP + cp.
    H5CKPT_RETURN_IF_ERROR(split_into(impl->world, c.pp * z.tp + c.tp, c.dp * z.cp + c.cp, impl->dp_cp));
  }
  if (z.ep > 1) {
    H5CKPT_ASSIGN_OR_RETURN(impl->ep, comm::Comm::duplicate(ep));
    // Expert DP: the ranks of my DP x CP group (same tp, pp) with my EP rank, ordered by dp * CP + cp.
    H5CKPT_RETURN_IF_ERROR(split_into(impl->world, (c.pp * z.ep + c.ep) * z.tp + c.tp, c.dp * z.cp + c.cp, impl->edp));
    impl->coords.edp = impl->edp.rank();
  } else {
    impl->coords.edp = c.dp * z.cp + c.cp;
  }
  H5CKPT_RETURN_IF_ERROR(trivial_expert_and_context_comms(*impl));
  // finish() checks the expert grid (a (tp, pp, ep, edp) position once, edp < dp*cp/ep).
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
  H5CKPT_RETURN_IF_ERROR(comm::mpi_status(MPI_Iallreduce(&lead_flag, &nodes, 1, MPI_INT, MPI_SUM, world.get(), &req),
                                          "MPI_Iallreduce(nodes)"));
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
MPI_Comm Topology::cp_comm() const { return impl_->cp.get(); }
MPI_Comm Topology::dp_cp_comm() const { return impl_->dp_cp.get(); }
MPI_Comm Topology::ep_comm() const { return impl_->ep.get(); }
MPI_Comm Topology::expert_dp_comm() const { return impl_->edp.get(); }

}  // namespace h5ckpt
