// The node tree of a topology (comm/topology_impl.h): node communicators, leaders, and the
// gather / scatter / broadcast the engine coordinates through. Run with H5CKPT_RANKS_PER_NODE
// set (simulated nodes of R consecutive ranks) and without; payload sizes vary per rank and a
// lowered chunk limit makes every message cross chunk boundaries.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "comm/comm.h"
#include "comm/topology_impl.h"

using namespace h5ckpt;

namespace {

int ranks_per_node() {
  const char* e = std::getenv("H5CKPT_RANKS_PER_NODE");
  return e ? std::atoi(e) : 0;
}

// Payload of rank r for round k: its own bytes, sizes that differ per rank (some empty).
std::string payload(int r, int k) {
  std::string s(static_cast<size_t>((r * 37 + k * 11) % 50), '\0');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>('a' + (r * 7 + k + i) % 26);
  return s;
}

class NodeTree : public ::testing::TestWithParam<uint64_t> {
 protected:
  void SetUp() override {
    comm::set_chunk_limit_for_testing(GetParam());
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    auto t = Topology::create(MPI_COMM_WORLD, {1, size, 1});
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    topo_.emplace(std::move(t).value());
  }
  void TearDown() override { comm::set_chunk_limit_for_testing(0); }
  const Topology::Impl& tree() const { return detail::TopologyAccess::of(*topo_); }
  int size = 0, rank = 0;

 private:
  std::optional<Topology> topo_;
};

}  // namespace

TEST_P(NodeTree, LeadersFollowTheNodes) {
  const Topology::Impl& t = tree();
  const int rpn = ranks_per_node();
  // One machine: the shared-memory node is the world; simulated nodes cut it R at a time.
  const int expect_nodes = rpn > 0 ? (size + rpn - 1) / rpn : 1;
  EXPECT_EQ(t.nodes, expect_nodes);
  ASSERT_EQ(t.node_ranks.size(), static_cast<size_t>(t.node.size()));
  const int my_node = rpn > 0 ? rank / rpn : 0;
  for (int r : t.node_ranks) EXPECT_EQ(rpn > 0 ? r / rpn : 0, my_node) << "rank " << r << " is on another node";
  EXPECT_EQ(t.leader(), t.node.rank() == 0);
  EXPECT_EQ(t.node_ranks[0], rpn > 0 ? my_node * rpn : 0) << "the lowest rank (the coordinator on its node) leads";
  if (rank == t.coordinator) {
    ASSERT_TRUE(t.leader());
    EXPECT_EQ(t.leaders.rank(), 0);
    ASSERT_EQ(t.node_members.size(), static_cast<size_t>(expect_nodes));
    size_t total = 0;
    for (const auto& m : t.node_members) total += m.size();
    EXPECT_EQ(total, static_cast<size_t>(size));
  }
}

TEST_P(NodeTree, GatherScatterBroadcastDeliverEveryByte) {
  const Topology::Impl& t = tree();
  for (int k = 0; k < 3; ++k) {
    auto all = t.gather(payload(rank, k));
    ASSERT_TRUE(all.ok()) << all.status().to_string();
    if (rank == t.coordinator) {
      ASSERT_EQ(all->size(), static_cast<size_t>(size));
      for (int r = 0; r < size; ++r) EXPECT_EQ((*all)[r], payload(r, k)) << "gathered from rank " << r;
    } else {
      EXPECT_TRUE(all->empty());
    }
    std::vector<std::string> parts;
    if (rank == t.coordinator)
      for (int r = 0; r < size; ++r) parts.push_back(payload(r, k + 100));
    auto mine = t.scatter(parts);
    ASSERT_TRUE(mine.ok()) << mine.status().to_string();
    EXPECT_EQ(*mine, payload(rank, k + 100));
    std::string b = rank == t.coordinator ? payload(size + 3, k) + std::string(1000, 'z') : std::string("junk");
    ASSERT_TRUE(t.bcast(b).ok());
    EXPECT_EQ(b, payload(size + 3, k) + std::string(1000, 'z'));
    // The agreement: a failure on the last rank reaches everyone with its message.
    Status local = rank == size - 1 && k == 1 ? Status(ErrorCode::kIo, "disk on fire") : Status::Ok();
    int flag = rank == 0 ? 3 : 5;
    Status agreed = comm::agree(local, t.world.get(), &flag);
    if (k == 1) {
      EXPECT_EQ(agreed.code(), ErrorCode::kIo);
      EXPECT_NE(agreed.message().find("rank " + std::to_string(size - 1) + ": disk on fire"), std::string::npos)
          << agreed.message();
    } else {
      EXPECT_TRUE(agreed.ok());
      EXPECT_EQ(flag, 3);  // the minimum over the ranks (rank 0 holds 3, the others 5)
    }
  }
}

// A scatter with a missing part fails on the coordinator and delivers nothing wrong elsewhere.
TEST_P(NodeTree, ScatterWithMissingPartsFailsOnTheCoordinator) {
  const Topology::Impl& t = tree();
  std::vector<std::string> parts;
  if (rank == t.coordinator) parts.push_back("only one");
  auto mine = t.scatter(parts);
  if (rank == t.coordinator && size > 1) EXPECT_FALSE(mine.ok());
  Status agreed = comm::agree(mine.status(), t.world.get());
  EXPECT_EQ(agreed.ok(), size == 1);
}

// The coordinator hears from its node's members and the other leaders only: a gather brings it a
// size and a payload from each of them (payloads cut into chunk_limit() pieces), O(nodes + node
// size) messages, never one per rank of the world.
TEST_P(NodeTree, CoordinatorReceivesFromLeadersAndItsNodeOnly) {
  const Topology::Impl& t = tree();
  const uint64_t chunk = comm::chunk_limit();
  auto pieces = [&](uint64_t bytes) { return (bytes + chunk - 1) / chunk; };
  const std::string mine(100 + static_cast<size_t>(rank), 'x');
  MPI_Barrier(MPI_COMM_WORLD);
  const comm::Traffic before = comm::received_traffic();
  auto all = t.gather(mine);
  const comm::Traffic after = comm::received_traffic();
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  if (rank != t.coordinator) return;
  // Expected from the tree's shape, recomputed here: node members send (size, payload); every
  // other leader sends (size, bundle of its node's (rank, length, bytes) records).
  uint64_t messages = 0, bytes = 0;
  for (size_t i = 1; i < t.node_ranks.size(); ++i) {
    const uint64_t payload = 100 + static_cast<uint64_t>(t.node_ranks[i]);
    messages += 1 + pieces(payload);
    bytes += sizeof(uint64_t) + payload;
  }
  for (size_t l = 1; l < t.node_members.size(); ++l) {
    uint64_t bundle = 0;
    for (int r : t.node_members[l]) bundle += sizeof(int32_t) + sizeof(uint64_t) + 100 + static_cast<uint64_t>(r);
    messages += 1 + pieces(bundle);
    bytes += sizeof(uint64_t) + bundle;
  }
  EXPECT_EQ(after.messages - before.messages, messages);
  EXPECT_EQ(after.bytes - before.bytes, bytes);
  // Fewer than a flat gather's 2 (size - 1) wherever (node size - 1) + (nodes - 1) < size - 1.
  const int rpn = ranks_per_node();
  if (rpn > 1 && rpn + (size + rpn - 1) / rpn < size + 1) {
    EXPECT_LT(after.messages - before.messages, 2 * static_cast<uint64_t>(size - 1) * pieces(100 + size))
        << "the coordinator heard from every rank: the tree is flat";
  }
}

// One copy per node: every rank reads the coordinator's bytes in place in its node's shared
// buffer (the same address range for the ranks of a node), and a failure to produce them on the
// coordinator reaches every rank instead of leaving leaders waiting.
TEST_P(NodeTree, ShareWithNodesGivesEveryRankTheCoordinatorsBytes) {
  const Topology::Impl& t = tree();
  const uint64_t n = 1000 + 3 * comm::chunk_limit() % 977;
  auto expected = [](uint64_t i) { return static_cast<char>((i * 131 + 7) % 251); };
  auto shared = t.share_with_nodes(n, [&](char* out) {
    for (uint64_t i = 0; i < n; ++i) out[i] = expected(i);
    return Status::Ok();
  });
  ASSERT_TRUE(shared.ok()) << shared.status().to_string();
  ASSERT_EQ(shared->size(), n);
  uint64_t wrong = 0;
  for (uint64_t i = 0; i < n; ++i) wrong += shared->data()[i] != expected(i);
  EXPECT_EQ(wrong, 0u) << "bytes differ from the coordinator's";
  ASSERT_TRUE(shared->sync(t.node.get()).ok());  // everyone has checked before the leader writes
  // The ranks of a node see one buffer: the node leader's write is visible to the others.
  if (t.node.rank() == 0) shared->data()[0] = static_cast<char>(0x5a + t.node_ranks[0] % 7);
  ASSERT_TRUE(shared->sync(t.node.get()).ok());
  EXPECT_EQ(shared->data()[0], static_cast<char>(0x5a + t.node_ranks[0] % 7));
  ASSERT_TRUE(shared->sync(t.node.get()).ok());  // nobody frees before everyone has read

  auto failed = t.share_with_nodes(n, [](char*) { return Status(ErrorCode::kIo, "cannot read the index"); });
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("cannot read the index"), std::string::npos) << failed.status().to_string();
}

INSTANTIATE_TEST_SUITE_P(Chunks, NodeTree, ::testing::Values(0, 7));
