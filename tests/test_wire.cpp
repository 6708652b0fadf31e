// The engine's message formats: every encoder round-trips, and every decoder rejects (never
// masks, never allocates for) a truncated message, a trailing byte, a count the message cannot
// hold and values outside their enums.
#include <gtest/gtest.h>

#include <cstring>

#include "engine/wire.h"
#include "planner/load_planner.h"
#include "util/bytes.h"

namespace h5ckpt::engine::wire {
namespace {

std::vector<planner::ItemDesc> sample_items() {
  return {{"model/w", DType::kBF16, Shape{8, 4}, ShardSpec::split(Shape{8, 4}, 0, 2, 1)},
          {"optimizer/m/w", DType::kF32, Shape{8, 4}, ShardSpec::flat_range(Box{{0, 0}, {8, 4}}, 3, 17)},
          {"optimizer/m/w", DType::kF32, Shape{8, 4}, ShardSpec::flat_range(Box{{0, 0}, {8, 4}}, 20, 24), true},
          {"extra/step", DType::kI64, Shape{1}, ShardSpec::whole(Shape{1})}};
}

// The regions' shards, in order, of sample_tensors.
std::vector<std::vector<std::pair<ShardSpec, int>>> sample_regions() {
  const Box top{{0, 0}, {4, 4}}, bottom{{4, 0}, {4, 4}};
  return {// two boxes, one whole and one in flat ranges, and the first box again after the second
          {{ShardSpec{top, std::nullopt}, 0},
           {ShardSpec::flat_range(bottom, 0, 5), 3},
           {ShardSpec::flat_range(bottom, 5, 16), 2},
           {ShardSpec::flat_range(top, 0, 16), 1}},
          {{ShardSpec::whole(Shape{1}), 1}}};
}

std::vector<planner::TensorPlan> sample_tensors() {
  std::vector<planner::TensorPlan> out{{"model/w", DType::kBF16, Shape{8, 4}, {}, {}},
                                       {"extra/step", DType::kI64, Shape{1}, {}, {}}};
  const auto regions = sample_regions();
  for (size_t t = 0; t < out.size(); ++t)
    for (const auto& [shard, writer] : regions[t]) out[t].add_region(shard, writer);
  return out;
}

std::vector<planner::ItemRole> sample_roles() {
  return {
      {planner::Role::kRead, 0, -1, {1, 2, 3}}, {planner::Role::kReceive, 1, 2, {}}, {planner::Role::kSkip, 0, -1, {}}};
}

std::vector<LoadRequestEntry> sample_requests() {
  return {{false, true, {"sig-a", 128}}, {true, false, {"", 0}}, {false, false, {"sig-b", 7}}};
}

// Every strict prefix and every one-byte extension of a valid message is refused.
template <class Decode>
void expect_rejects_truncations_and_trailers(const std::string& msg, Decode decode, const char* what) {
  for (size_t n = 0; n < msg.size(); ++n)
    EXPECT_FALSE(decode(msg.substr(0, n)).ok()) << what << " accepted a prefix of " << n << " of " << msg.size();
  EXPECT_FALSE(decode(msg + '\0').ok()) << what << " accepted a trailing byte";
}

// Replaces the leading 64-bit count by `count`.
std::string with_count(std::string msg, uint64_t count) {
  std::memcpy(msg.data(), &count, sizeof count);
  return msg;
}

TEST(Wire, ItemsRoundTripAndRejectBrokenMessages) {
  const auto items = sample_items();
  const std::string msg = encode_items(items);
  auto back = decode_items(msg);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  ASSERT_EQ(back->size(), items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ((*back)[i].key, items[i].key);
    EXPECT_EQ((*back)[i].dtype, items[i].dtype);
    EXPECT_EQ((*back)[i].global_shape, items[i].global_shape);
    EXPECT_EQ((*back)[i].shard, items[i].shard);
    EXPECT_EQ((*back)[i].continues, items[i].continues);  // a multi-piece item's later piece
  }
  expect_rejects_truncations_and_trailers(msg, decode_items, "decode_items");
  // A count of 2^24 + 3 used to be masked to 3 and accepted; a huge one must not allocate.
  EXPECT_FALSE(decode_items(with_count(msg, (1ull << 24) + items.size())).ok());
  EXPECT_FALSE(decode_items(with_count(msg, ~0ull)).ok());
  std::string bad_dtype = msg;
  const size_t dtype_at = 8 + 8 + items[0].key.size();  // count, key length, key
  bad_dtype[dtype_at] = static_cast<char>(200);
  EXPECT_FALSE(decode_items(bad_dtype).ok());
}

TEST(Wire, TensorPlansRoundTripAndRejectBrokenMessages) {
  const auto tensors = sample_tensors();
  const std::string msg = encode_tensors(tensors);
  auto back = decode_tensors(msg);
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->size(), tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    EXPECT_EQ((*back)[t].key, tensors[t].key);
    EXPECT_EQ((*back)[t].shape, tensors[t].shape);
    EXPECT_EQ((*back)[t].boxes, tensors[t].boxes);  // numbered alike: first appearance
    ASSERT_EQ((*back)[t].regions.size(), tensors[t].regions.size());
    for (size_t r = 0; r < tensors[t].regions.size(); ++r) {
      const planner::PlannedRegion &got = (*back)[t].regions[r], &want = tensors[t].regions[r];
      EXPECT_EQ((*back)[t].shard(r), sample_regions()[t][r].first) << t << " " << r;
      EXPECT_EQ(got.writer, sample_regions()[t][r].second);
      EXPECT_EQ(got.box, want.box);
      EXPECT_EQ(got.flat, want.flat);
      EXPECT_EQ(got.begin, want.begin);
      EXPECT_EQ(got.end, want.end);
    }
  }
  EXPECT_EQ(tensors[0].boxes.size(), 2u);    // the plan keeps each distinct box once
  EXPECT_EQ(tensors[0].regions[0].end, 16);  // a whole box: all its elements
  expect_rejects_truncations_and_trailers(msg, decode_tensors, "decode_tensors");
  EXPECT_FALSE(decode_tensors(with_count(msg, ~0ull)).ok());
}

// Local manifests store the encoded plan: its bytes are what they were when each region carried
// its own shard (written here from the shards, field by field), though the plan now shares boxes.
TEST(Wire, TensorPlanEncodingKeepsEachRegionsShard) {
  const auto tensors = sample_tensors();
  const auto regions = sample_regions();
  ByteWriter w;
  w.put<uint64_t>(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    w.put_string(tensors[t].key);
    w.put<uint8_t>(static_cast<uint8_t>(tensors[t].dtype));
    w.put_vec(tensors[t].shape);
    w.put<uint64_t>(regions[t].size());
    for (const auto& [shard, writer] : regions[t]) {
      w.put_vec(shard.box.offset);
      w.put_vec(shard.box.shape);
      w.put<uint8_t>(shard.flat ? 1 : 0);
      if (shard.flat) {
        w.put<int64_t>(shard.flat->first);
        w.put<int64_t>(shard.flat->second);
      }
      w.put<int32_t>(writer);
    }
  }
  EXPECT_EQ(encode_tensors(tensors), w.str());
}

// A decoded region without a flat range spans its whole box: a box whose element count is
// negative or overflows (a damaged local manifest) is refused, not multiplied out.
TEST(Wire, TensorPlanWithABoxBeyondInt64IsRefused) {
  auto plan_with_box = [](const Shape& box_shape) {
    ByteWriter w;
    w.put<uint64_t>(1);
    w.put_string("model/w");
    w.put<uint8_t>(static_cast<uint8_t>(DType::kF32));
    w.put_vec(Shape{4, 4});
    w.put<uint64_t>(1);
    w.put_vec(Shape(box_shape.size(), 0));
    w.put_vec(box_shape);
    w.put<uint8_t>(0);
    w.put<int32_t>(0);
    return w.str();
  };
  const auto good = decode_tensors(plan_with_box({4, 4}));
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_EQ((*good)[0].regions[0].end, 16);
  EXPECT_FALSE(decode_tensors(plan_with_box({int64_t{1} << 40, int64_t{1} << 40})).ok());
  EXPECT_FALSE(decode_tensors(plan_with_box({-1, 4})).ok());
}

TEST(Wire, RolesRoundTripAndRejectBrokenMessages) {
  const auto roles = sample_roles();
  const std::string msg = encode_roles(roles);
  auto back = decode_roles(msg);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, roles);
  expect_rejects_truncations_and_trailers(msg, decode_roles, "decode_roles");
  EXPECT_FALSE(decode_roles(with_count(msg, (1ull << 24) + roles.size())).ok());
  std::string bad_role = msg;
  const int32_t role = 7;
  std::memcpy(bad_role.data() + 8, &role, sizeof role);
  EXPECT_FALSE(decode_roles(bad_role).ok());
}

TEST(Wire, RolesFromTheCoordinatorsTableDecodeAsTheRanksRoles) {
  // Three ranks: a tensor all want (rank 0 reads, sends to 1 and 2), one wanted twice by rank 1
  // alone (read, sent to no one), one by ranks 1 and 2; rank 2 skips its first item.
  const std::vector<std::vector<planner::LoadRequest>> reqs{
      {{"all", 40}}, {{"all", 40}, {"one", 8}, {"one", 8}, {"pair", 16}}, {{"all", 40}, {"pair", 16}}};
  const std::vector<std::vector<int>> item_of{{0}, {0, 1, 2, 3}, {1, 2}};
  const planner::LoadPlan plan = planner::plan_load(reqs, true);
  const planner::RoleTable table = planner::assign_roles(plan, item_of, {1, 4, 3});
  using planner::Role;
  const int pair_reader = plan.groups[table.group(1, 3)].reader;
  const std::vector<std::vector<planner::ItemRole>> want{
      {{Role::kRead, 0, -1, {1, 2}}},
      {{Role::kReceive, 0, 0, {}},
       {Role::kRead, 1, -1, {}},
       {Role::kRead, 1, -1, {}},
       pair_reader == 1 ? planner::ItemRole{Role::kRead, 2, -1, {2}} : planner::ItemRole{Role::kReceive, 2, 2, {}}},
      {{Role::kSkip, 0, -1, {}},
       {Role::kReceive, 0, 0, {}},
       pair_reader == 2 ? planner::ItemRole{Role::kRead, 2, -1, {1}} : planner::ItemRole{Role::kReceive, 2, 1, {}}}};
  for (size_t r = 0; r < 3; ++r) {
    const std::string msg = encode_roles(plan, table, r);
    EXPECT_EQ(msg, encode_roles(table.roles_of(plan, r))) << "rank " << r;
    auto back = decode_roles(msg);
    ASSERT_TRUE(back.ok()) << "rank " << r;
    EXPECT_EQ(*back, want[r]) << "rank " << r;
  }
}

TEST(Wire, GatheredRequestsViewTheirMessagesAndSkipNothingButSkippedItems) {
  // Rank 0 sends sample_requests() (its second item skipped), rank 1 no items, rank 2 one.
  const std::vector<std::string> messages{encode_requests(sample_requests()), encode_requests({}),
                                          encode_requests({{false, false, {"sig-c", 3}}})};
  auto in = decode_gathered_requests(messages);
  ASSERT_TRUE(in.ok()) << in.status().to_string();
  EXPECT_EQ(in->items, (std::vector<size_t>{3, 0, 1}));
  EXPECT_EQ(in->item_of, (std::vector<std::vector<int>>{{0, 2}, {}, {0}}));
  EXPECT_EQ(in->on_device, (std::vector<std::vector<char>>{{1, 0, 0}, {}, {0}}));
  ASSERT_EQ(in->requests[0].size(), 2u);
  EXPECT_EQ(in->requests[0][0].signature, "sig-a");
  EXPECT_EQ(in->requests[0][0].bytes, 128u);
  EXPECT_EQ(in->requests[0][1].signature, "sig-b");
  EXPECT_EQ(in->requests[0][1].bytes, 7u);
  EXPECT_EQ(in->requests[2][0].signature, "sig-c");
  // The views lie in the messages (nothing copied).
  const char* m0 = messages[0].data();
  EXPECT_TRUE(in->requests[0][1].signature.data() > m0 &&
              in->requests[0][1].signature.data() < m0 + messages[0].size());
  // One rank's broken message fails the whole decode.
  std::vector<std::string> broken = messages;
  broken[2].pop_back();
  EXPECT_FALSE(decode_gathered_requests(broken).ok());
  broken = messages;
  broken[0].push_back('\0');
  EXPECT_FALSE(decode_gathered_requests(broken).ok());
}

TEST(Wire, RequestsChecksumsAndPairsRoundTrip) {
  const auto reqs = sample_requests();
  const std::string rmsg = encode_requests(reqs);
  auto rback = decode_requests(rmsg);
  ASSERT_TRUE(rback.ok());
  ASSERT_EQ(rback->size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ((*rback)[i].skip, reqs[i].skip);
    EXPECT_EQ((*rback)[i].on_device, reqs[i].on_device);
    EXPECT_EQ((*rback)[i].request.signature, reqs[i].skip ? "" : reqs[i].request.signature);
    EXPECT_EQ((*rback)[i].request.bytes, reqs[i].request.bytes);
  }
  expect_rejects_truncations_and_trailers(rmsg, decode_requests, "decode_requests");

  const std::vector<RegionChecksum> sums{{0, 1, 1 << 20, {0x1234567890abcdefull, 7}}, {3, 0, 0, {}}};
  const std::string cmsg = encode_checksums(sums);
  auto cback = decode_checksums(cmsg);
  ASSERT_TRUE(cback.ok());
  ASSERT_EQ(cback->size(), 2u);
  EXPECT_EQ((*cback)[0].blocks, sums[0].blocks);
  EXPECT_EQ((*cback)[0].block_bytes, sums[0].block_bytes);
  EXPECT_EQ((*cback)[1].tensor, 3);
  EXPECT_TRUE((*cback)[1].blocks.empty());
  expect_rejects_truncations_and_trailers(cmsg, decode_checksums, "decode_checksums");
  EXPECT_FALSE(decode_checksums(with_count(cmsg, 3)).ok());

  const std::string pmsg = encode_pair("/ckpt/step-1", std::string("{\"a\":\0}", 7));
  auto pback = decode_pair(pmsg);
  ASSERT_TRUE(pback.ok());
  EXPECT_EQ(pback->first, "/ckpt/step-1");
  EXPECT_EQ(pback->second.size(), 7u);
  expect_rejects_truncations_and_trailers(pmsg, decode_pair, "decode_pair");
}

}  // namespace
}  // namespace h5ckpt::engine::wire
