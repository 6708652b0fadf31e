// Topology with context (CP) and expert (EP) parallelism: coordinates and communicator membership
// for every tp x cp x dp x pp x ep layout of the world (ep dividing dp * cp), against tables built
// independently by enumeration in Megatron's orders (dense: TP fastest, then CP, DP, PP; experts:
// TP fastest, then EP, expert DP, PP), from sizes and from the caller's communicators.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "h5ckpt/topology.h"

using namespace h5ckpt;

namespace {

struct Layout {
  int tp, cp, dp, pp, ep;
  std::string name() const {
    return "tp" + std::to_string(tp) + ".cp" + std::to_string(cp) + ".dp" + std::to_string(dp) + ".pp" +
           std::to_string(pp) + ".ep" + std::to_string(ep);
  }
};

std::vector<Layout> layouts_of(int n) {
  std::vector<Layout> out;
  for (int tp = 1; tp <= n; ++tp)
    for (int cp = 1; cp <= n; ++cp)
      for (int dp = 1; dp <= n; ++dp)
        for (int pp = 1; pp <= n; ++pp) {
          if (tp * cp * dp * pp != n) continue;
          for (int ep = 1; ep <= dp * cp; ++ep)
            if ((dp * cp) % ep == 0) out.push_back({tp, cp, dp, pp, ep});
        }
  return out;
}

// The expected coordinates of every world rank, by enumeration (no division formulas).
struct Expected {
  std::vector<RankCoords> coords;
  std::vector<int> g;  // position in the DP x CP group: the order of that group
};

Expected expected_of(const Layout& L, int n) {
  Expected e;
  e.coords.resize(static_cast<size_t>(n));
  e.g.resize(static_cast<size_t>(n));
  int r = 0;
  for (int pp = 0; pp < L.pp; ++pp)
    for (int dp = 0; dp < L.dp; ++dp)
      for (int cp = 0; cp < L.cp; ++cp)
        for (int tp = 0; tp < L.tp; ++tp, ++r) {
          RankCoords& c = e.coords[static_cast<size_t>(r)];
          c.tp = tp;
          c.cp = cp;
          c.dp = dp;
          c.pp = pp;
        }
  // Megatron's expert rank generator: order tp-ep-dp-pp with expert DP = dp * cp / ep.
  const int edp = L.dp * L.cp / L.ep;
  r = 0;
  for (int pp = 0; pp < L.pp; ++pp)
    for (int d = 0; d < edp; ++d)
      for (int ep = 0; ep < L.ep; ++ep)
        for (int tp = 0; tp < L.tp; ++tp, ++r) {
          RankCoords& c = e.coords[static_cast<size_t>(r)];
          EXPECT_EQ(c.tp, tp);  // both orders keep TP fastest and PP slowest
          EXPECT_EQ(c.pp, pp);
          c.ep = ep;
          c.edp = d;
        }
  // The DP x CP group of a (tp, pp): its ranks in world order.
  std::map<std::pair<int, int>, int> next;
  for (int w = 0; w < n; ++w) {
    const RankCoords& c = e.coords[static_cast<size_t>(w)];
    e.g[static_cast<size_t>(w)] = next[{c.tp, c.pp}]++;
  }
  return e;
}

// World ranks of the members of `comm`, in the communicator's rank order.
std::vector<int> members(MPI_Comm comm) {
  int wr = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm_size(comm, &n);
  std::vector<int> out(static_cast<size_t>(n));
  MPI_Allgather(&wr, 1, MPI_INT, out.data(), 1, MPI_INT, comm);
  return out;
}

// Ranks r with same(r) sharing this rank's group key, sorted by order(r).
template <class Same, class Order>
std::vector<int> expected_group(int n, int me, Same same, Order order) {
  std::vector<std::pair<int, int>> v;
  for (int r = 0; r < n; ++r)
    if (same(r, me)) v.push_back({order(r), r});
  std::sort(v.begin(), v.end());
  std::vector<int> out;
  for (auto& [o, r] : v) out.push_back(r);
  return out;
}

void check_topology(const Topology& t, const Layout& L, const Expected& e, const std::string& where) {
  int n = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  SCOPED_TRACE(where + " " + L.name());
  const auto& E = e.coords;
  const RankCoords c = t.coords();
  const RankCoords& x = E[static_cast<size_t>(me)];
  EXPECT_EQ(c.tp, x.tp);
  EXPECT_EQ(c.cp, x.cp);
  EXPECT_EQ(c.dp, x.dp);
  EXPECT_EQ(c.pp, x.pp);
  EXPECT_EQ(c.ep, x.ep);
  EXPECT_EQ(c.edp, x.edp);
  const ParallelSizes z = t.sizes();
  EXPECT_EQ(z.tp, L.tp);
  EXPECT_EQ(z.cp, L.cp);
  EXPECT_EQ(z.dp, L.dp);
  EXPECT_EQ(z.pp, L.pp);
  EXPECT_EQ(z.ep, L.ep);
  EXPECT_EQ(z.edp(), L.dp * L.cp / L.ep);
  ASSERT_EQ(t.all_coords().size(), static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const RankCoords& a = t.all_coords()[static_cast<size_t>(r)];
    const RankCoords& b = E[static_cast<size_t>(r)];
    EXPECT_TRUE(a.tp == b.tp && a.cp == b.cp && a.dp == b.dp && a.pp == b.pp && a.ep == b.ep && a.edp == b.edp)
        << "all_coords of rank " << r;
  }
  auto at = [&](int r) -> const RankCoords& { return E[static_cast<size_t>(r)]; };
  EXPECT_EQ(
      members(t.tp_comm()),
      expected_group(
          n, me, [&](int r, int m) { return at(r).cp == at(m).cp && at(r).dp == at(m).dp && at(r).pp == at(m).pp; },
          [&](int r) { return at(r).tp; }))
      << "tp_comm";
  EXPECT_EQ(
      members(t.cp_comm()),
      expected_group(
          n, me, [&](int r, int m) { return at(r).tp == at(m).tp && at(r).dp == at(m).dp && at(r).pp == at(m).pp; },
          [&](int r) { return at(r).cp; }))
      << "cp_comm";
  EXPECT_EQ(
      members(t.dp_comm()),
      expected_group(
          n, me, [&](int r, int m) { return at(r).tp == at(m).tp && at(r).cp == at(m).cp && at(r).pp == at(m).pp; },
          [&](int r) { return at(r).dp; }))
      << "dp_comm";
  EXPECT_EQ(
      members(t.pp_comm()),
      expected_group(
          n, me, [&](int r, int m) { return at(r).tp == at(m).tp && at(r).cp == at(m).cp && at(r).dp == at(m).dp; },
          [&](int r) { return at(r).pp; }))
      << "pp_comm";
  EXPECT_EQ(members(t.dp_cp_comm()),
            expected_group(
                n, me, [&](int r, int m) { return at(r).tp == at(m).tp && at(r).pp == at(m).pp; },
                [&](int r) { return e.g[static_cast<size_t>(r)]; }))
      << "dp_cp_comm";
  EXPECT_EQ(
      members(t.ep_comm()),
      expected_group(
          n, me, [&](int r, int m) { return at(r).tp == at(m).tp && at(r).pp == at(m).pp && at(r).edp == at(m).edp; },
          [&](int r) { return at(r).ep; }))
      << "ep_comm";
  EXPECT_EQ(
      members(t.expert_dp_comm()),
      expected_group(
          n, me, [&](int r, int m) { return at(r).tp == at(m).tp && at(r).pp == at(m).pp && at(r).ep == at(m).ep; },
          [&](int r) { return at(r).edp; }))
      << "expert_dp_comm";
  // An expert slice's replicas together with the EP ranks cover the DP x CP group exactly once.
  int ep_size = 0, edp_size = 0, dpcp_size = 0;
  MPI_Comm_size(t.ep_comm(), &ep_size);
  MPI_Comm_size(t.expert_dp_comm(), &edp_size);
  MPI_Comm_size(t.dp_cp_comm(), &dpcp_size);
  EXPECT_EQ(ep_size * edp_size, dpcp_size);
}

class TopologyEpCp : public ::testing::Test {
 protected:
  void SetUp() override {
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
  }
  int n = 0, me = 0;
};

}  // namespace

TEST_F(TopologyEpCp, CreateMatchesMegatronOrders) {
  const auto layouts = layouts_of(n);
  ASSERT_FALSE(layouts.empty());
  for (const Layout& L : layouts) {
    const Expected e = expected_of(L, n);
    auto t = Topology::create(MPI_COMM_WORLD, ParallelSizes{L.tp, L.dp, L.pp, L.cp, L.ep});
    ASSERT_TRUE(t.ok()) << L.name() << ": " << t.status().to_string();
    check_topology(*t, L, e, "create");
  }
}

TEST_F(TopologyEpCp, FromCommsMatchesCreate) {
  for (const Layout& L : layouts_of(n)) {
    const Expected e = expected_of(L, n);
    const RankCoords& x = e.coords[static_cast<size_t>(me)];
    // The caller's communicators, split from the independent table (keys give the order).
    MPI_Comm tp, cp, dp, pp, ep;
    MPI_Comm_split(MPI_COMM_WORLD, (x.pp * L.dp + x.dp) * L.cp + x.cp, x.tp, &tp);
    MPI_Comm_split(MPI_COMM_WORLD, (x.pp * L.dp + x.dp) * L.tp + x.tp, x.cp, &cp);
    MPI_Comm_split(MPI_COMM_WORLD, (x.pp * L.cp + x.cp) * L.tp + x.tp, x.dp, &dp);
    MPI_Comm_split(MPI_COMM_WORLD, (x.dp * L.cp + x.cp) * L.tp + x.tp, x.pp, &pp);
    MPI_Comm_split(MPI_COMM_WORLD, (x.pp * n + x.edp) * L.tp + x.tp, x.ep, &ep);
    {
      auto t = Topology::from_comms(MPI_COMM_WORLD, tp, cp, dp, pp, ep);
      ASSERT_TRUE(t.ok()) << L.name() << ": " << t.status().to_string();
      check_topology(*t, L, e, "from_comms");
    }
    for (MPI_Comm* c : {&tp, &cp, &dp, &pp, &ep}) MPI_Comm_free(c);
  }
}

TEST_F(TopologyEpCp, OldEntryPointsKeepTheirCoordinates) {
  // cp = ep = 1: the TP/DP/PP order of before, ep = cp = 0 and the expert-DP rank is the DP rank.
  for (const Layout& L : layouts_of(n)) {
    if (L.cp != 1 || L.ep != 1) continue;
    auto t = Topology::create(MPI_COMM_WORLD, ParallelSizes{L.tp, L.dp, L.pp});
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    const RankCoords c = t->coords();
    EXPECT_EQ(c, (RankCoords{me % L.tp, (me / L.tp) % L.dp, me / (L.tp * L.dp)}));
    EXPECT_EQ(c.cp, 0);
    EXPECT_EQ(c.ep, 0);
    EXPECT_EQ(c.edp, c.dp);
    check_topology(*t, L, expected_of(L, n), "create(tp, dp, pp)");
    auto f = Topology::from_comms(MPI_COMM_WORLD, t->tp_comm(), t->dp_comm(), t->pp_comm());
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    check_topology(*f, L, expected_of(L, n), "from_comms(tp, dp, pp)");
  }
}

TEST_F(TopologyEpCp, RefusesBadSizes) {
  // ep must divide dp * cp; the world must be tp * cp * dp * pp.
  auto a = Topology::create(MPI_COMM_WORLD, ParallelSizes{1, n, 1, 1, n + 1});
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("must divide dp*cp"), std::string::npos) << a.status().message();
  auto b = Topology::create(MPI_COMM_WORLD, ParallelSizes{1, n, 1, 2, 1});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("cp=2"), std::string::npos) << b.status().message();
  auto c = Topology::create(MPI_COMM_WORLD, ParallelSizes{1, n, 1, 0, 1});
  EXPECT_FALSE(c.ok());
}
