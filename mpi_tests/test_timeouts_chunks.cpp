// Byte collectives with sizes as 64-bit values and payloads cut at a chunk limit: with the limit
// lowered to a few bytes, gathers, scatters, broadcasts and transfers of payloads larger than it
// give every rank exactly the expected bytes (the path every rank takes no longer depends on
// sizes, so > 2 GiB payloads cannot split ranks between an error and a collective).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/deadline.h"
#include "comm/transport.h"
#include "support/test_model.h"

namespace h5ckpt::comm {
namespace {

using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;

// Rank r's payload: a size that differs per rank (one rank sends nothing) and bytes that depend
// on (rank, index, salt), so a piece landing at the wrong offset or rank is caught.
std::string payload(int r, int salt) {
  const size_t n = r == 1 ? 0 : static_cast<size_t>(1000 + 977 * r + 131 * salt);
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 7 + r * 13 + salt * 29 + i / 251) & 0xff);
  return s;
}

// Index of the first differing byte, or -1.
int64_t first_difference(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return static_cast<int64_t>(std::min(a.size(), b.size()));
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  return -1;
}

class Chunked : public ::testing::TestWithParam<uint64_t> {
 protected:
  void SetUp() override {
    auto c = Comm::duplicate(MPI_COMM_WORLD);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    comm_ = std::move(c).value();
    set_chunk_limit_for_testing(GetParam());
  }
  void TearDown() override { set_chunk_limit_for_testing(0); }
  Comm comm_;
};

TEST_P(Chunked, GatherGivesTheRootEveryRanksBytes) {
  ASSERT_EQ(chunk_limit(), GetParam() ? GetParam() : 1ull << 30);
  const int n = world_size(), me = world_rank();
  for (int root : {0, n - 1}) {
    auto got = gather_bytes(payload(me, root), root, comm_.get());
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    if (me != root) {
      EXPECT_TRUE(got->empty());
      continue;
    }
    ASSERT_EQ(got->size(), static_cast<size_t>(n));
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(first_difference((*got)[r], payload(r, root)), -1) << "root " << root << ", from rank " << r;
  }
}

TEST_P(Chunked, ScatterGivesEveryRankItsPart) {
  const int n = world_size(), me = world_rank();
  for (int root : {0, n - 1}) {
    std::vector<std::string> parts;
    if (me == root)
      for (int r = 0; r < n; ++r) parts.push_back(payload(r, 3 + root));
    auto got = scatter_bytes(parts, root, comm_.get());
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(first_difference(*got, payload(me, 3 + root)), -1) << "root " << root;
  }
}

TEST_P(Chunked, BroadcastGivesEveryRankTheRootsBytes) {
  const int n = world_size(), me = world_rank();
  for (int root = 0; root < n; ++root) {
    std::string bytes = me == root ? payload(root == 1 ? 0 : root, 5) : std::string("stale");
    ASSERT_TRUE(bcast_bytes(bytes, root, comm_.get()).ok());
    EXPECT_EQ(first_difference(bytes, payload(root == 1 ? 0 : root, 5)), -1) << "root " << root;
  }
  std::string empty = me == 0 ? "" : "stale";
  ASSERT_TRUE(bcast_bytes(empty, 0, comm_.get()).ok());
  EXPECT_TRUE(empty.empty());
}

TEST_P(Chunked, TransportMovesBuffersLargerThanTheLimit) {
  const int n = world_size(), me = world_rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  const std::string out = payload(me == 1 ? 2 : me, 7);  // every rank sends something
  std::string in(payload(prev == 1 ? 2 : prev, 7).size(), '\0');
  auto t = make_mpi_transport(comm_.get());
  ASSERT_TRUE(t->post_recv(prev, in.data(), in.size(), 3).ok());
  ASSERT_TRUE(t->post_send(next, out.data(), out.size(), 3).ok());
  ASSERT_TRUE(t->wait_all().ok());
  EXPECT_EQ(first_difference(in, payload(prev == 1 ? 2 : prev, 7)), -1);
}

TEST_P(Chunked, AgreementCarriesTheFailingRanksMessage) {
  const int n = world_size(), me = world_rank();
  const int bad = n - 1;
  Status local = me == bad ? Status(ErrorCode::kIo, std::string(3000, 'x') + " disk on fire") : Status::Ok();
  Status st = agree(local, comm_.get());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kIo);
  EXPECT_NE(st.message().find("disk on fire"), std::string::npos);
  EXPECT_NE(st.message().find("failed on rank(s) " + std::to_string(bad)), std::string::npos) << st.message();
}

// 1 and 7 bytes: many pieces per payload and none aligned; 1000: a few; 0: the default (1 GiB).
INSTANTIATE_TEST_SUITE_P(Limits, Chunked, ::testing::Values(1, 7, 1000, 0));

TEST(Timeout, SettingIsProcessWideAndZeroMeansNone) {
  const double saved = timeout();
  EXPECT_EQ(saved, 600.0);  // the default, as CheckpointerOptions::timeout_s
  set_timeout(2.5);
  EXPECT_EQ(timeout(), 2.5);
  EXPECT_TRUE(Deadline().bounded());
  set_timeout(0);
  EXPECT_EQ(timeout(), 0.0);
  EXPECT_FALSE(Deadline().bounded());
  set_timeout(-3);
  EXPECT_FALSE(Deadline().bounded());
  set_timeout(std::nan(""));
  EXPECT_FALSE(Deadline().bounded());
  set_timeout(saved);
}

TEST(Timeout, WaitsWellWithinTheDeadlineComplete) {
  set_timeout(30);
  auto c = Comm::duplicate(MPI_COMM_WORLD);
  ASSERT_TRUE(c.ok());
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(agree(Status::Ok(), c->get()).ok());
  ASSERT_TRUE(idle_barrier(c->get()).ok());
  set_timeout(600);
}

}  // namespace
}  // namespace h5ckpt::comm
