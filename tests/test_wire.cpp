// The engine's message formats: every encoder round-trips, and every decoder rejects (never
// masks, never allocates for) a truncated message, a trailing byte, a count the message cannot
// hold and values outside their enums.
#include <gtest/gtest.h>

#include <algorithm>
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
  // The first record follows the count, the extents' count and every item's extents.
  size_t extents = 0;
  for (const auto& it : items)
    extents +=
        it.global_shape.size() + it.shard.box.offset.size() + it.shard.box.shape.size() + (it.shard.flat ? 2 : 0);
  const size_t flags_at = 8 + 8 + 8 * extents;
  std::string bad_dtype = msg;
  bad_dtype[flags_at + 1] = static_cast<char>(200);
  EXPECT_FALSE(decode_items(bad_dtype).ok());
  std::string bad_flags = msg;
  bad_flags[flags_at] = 4;  // neither flat (1) nor continues (2)
  EXPECT_FALSE(decode_items(bad_flags).ok());
  // One extent fewer or more than the items' counts take, the records unchanged.
  for (const int64_t delta : {-1, 1}) {
    std::string miscounted = msg;
    const uint64_t n = extents + delta;
    std::memcpy(miscounted.data() + 8, &n, 8);
    if (delta > 0) miscounted.insert(flags_at, 8, '\0');
    else miscounted.erase(flags_at - 8, 8);
    EXPECT_FALSE(decode_items(miscounted).ok()) << "extents " << n << " for " << extents;
  }
}

void expect_same_item(const planner::ItemDesc& got, const planner::ItemDesc& want, const std::string& where) {
  EXPECT_EQ(got.key, want.key) << where;
  EXPECT_EQ(got.dtype, want.dtype) << where;
  EXPECT_EQ(got.global_shape, want.global_shape) << where;
  EXPECT_EQ(got.shard, want.shard) << where;
  EXPECT_EQ(got.continues, want.continues) << where;
}

bool lies_in(const void* p, const void* begin, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  return c >= static_cast<const char*>(begin) && c < static_cast<const char*>(begin) + bytes;
}

TEST(Wire, GatheredItemsViewTheirMessagesAndShareOnlyEqualExtents) {
  // Rank 1 repeats rank 0 (a replica of every item); rank 2 differs in its first item's offset and
  // its second's flat range, and gives its last item another key with the same extents; rank 3
  // differs from rank 2 only in its last item's global shape; rank 4 sends nothing, so rank 5,
  // rank 0 again, has no previous item to share with.
  std::vector<std::vector<planner::ItemDesc>> ranks(6, sample_items());
  ranks[2][0].shard = ShardSpec::split(Shape{8, 4}, 0, 2, 0);
  ranks[2][1].shard.flat = std::pair<int64_t, int64_t>{4, 17};
  ranks[2][3].key = "extra/epoch";
  ranks[3] = ranks[2];
  ranks[3][3].global_shape = Shape{2};
  ranks[3][3].shard = ShardSpec::whole(Shape{2});
  ranks[4].clear();
  std::vector<std::string> messages;
  for (const auto& items : ranks) messages.push_back(encode_items(items));
  auto in = decode_gathered_items(messages);
  ASSERT_TRUE(in.ok()) << in.status().to_string();
  ASSERT_EQ(in->items.size(), ranks.size());
  // Which views share the extents of the previous rank's view at their position.
  const std::vector<std::vector<bool>> shared{
      {false, false, false, false}, {true, true, true, true}, {false, false, true, true}, {true, true, true, false}, {},
      {false, false, false, false}};
  for (size_t r = 0; r < ranks.size(); ++r) {
    ASSERT_EQ(in->items[r].size(), ranks[r].size()) << "rank " << r;
    // Every rank's views lie in the one array, rank after rank.
    const planner::ItemView* next = r == 0 ? in->views.data() : in->items[r - 1].data() + in->items[r - 1].size();
    EXPECT_EQ(in->items[r].data(), next) << "rank " << r;
    for (size_t i = 0; i < ranks[r].size(); ++i) {
      const planner::ItemView& v = in->items[r][i];
      const std::string where = "rank " + std::to_string(r) + " item " + std::to_string(i);
      expect_same_item(v.desc(), ranks[r][i], where);
      // A key equal to the previous rank's view's at its position is that view's; any other lies in
      // its own message (never copied).
      if (r > 0 && i < ranks[r - 1].size() && ranks[r - 1][i].key == ranks[r][i].key) {
        EXPECT_EQ(v.key.data(), in->items[r - 1][i].key.data()) << where;
      } else {
        EXPECT_TRUE(lies_in(v.key.data(), messages[r].data(), messages[r].size())) << where << ": key copied";
      }
      if (shared[r][i]) {
        EXPECT_EQ(v.dims, in->items[r - 1][i].dims) << where;
      } else {
        // Its own extents, viewed in its message (never copied).
        EXPECT_TRUE(lies_in(v.dims, messages[r].data(), messages[r].size())) << where << ": extents copied";
        if (r > 0 && i < ranks[r - 1].size()) EXPECT_NE(v.dims, in->items[r - 1][i].dims) << where;
      }
    }
  }
  // One broken message fails the decode and names its rank.
  for (size_t n = 0; n < messages[2].size(); ++n) {
    std::vector<std::string> broken = messages;
    broken[2].resize(n);
    auto bad = decode_gathered_items(broken);
    ASSERT_FALSE(bad.ok()) << "a prefix of " << n << " bytes accepted";
    EXPECT_NE(bad.status().message().find("from rank 2"), std::string::npos) << bad.status().to_string();
  }
  std::vector<std::string> trailing = messages;
  trailing[5].push_back('\0');
  EXPECT_FALSE(decode_gathered_items(trailing).ok());
  EXPECT_TRUE(in->dims.empty()) << "extents copied from aligned messages";

  // A message whose extents are not 8-byte aligned in memory (one byte into a buffer) decodes to
  // the same items, from a copy of its extents.
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string shifted = " " + messages[r];
    auto items = decode_items(std::string_view(shifted).substr(1));
    ASSERT_TRUE(items.ok()) << "rank " << r << ": " << items.status().to_string();
    ASSERT_EQ(items->size(), ranks[r].size());
    for (size_t i = 0; i < ranks[r].size(); ++i)
      expect_same_item((*items)[i], ranks[r][i], "unaligned rank " + std::to_string(r) + " item " + std::to_string(i));
  }
}

TEST(Wire, ExtentCountsAViewCannotHoldAreRefusedAndLargeOnesPlannedToTheirError) {
  // 65,536 extents: more than a view counts; the decode refuses the message, and a view of the
  // description is refused with the key named (never truncated into a smaller shape).
  planner::ItemDesc huge{"model/huge", DType::kF32, Shape(planner::ItemView::kMaxCount + 1, 1),
                         ShardSpec::whole(Shape{4})};
  const std::vector<std::string> messages{encode_items({huge})};
  EXPECT_FALSE(decode_gathered_items(messages).ok());
  EXPECT_FALSE(decode_items(messages[0]).ok());
  std::vector<int64_t> dims;
  auto view = planner::ItemView::of(huge, dims);
  ASSERT_FALSE(view.ok());
  EXPECT_NE(view.status().message().find("model/huge"), std::string::npos) << view.status().to_string();
  EXPECT_FALSE(planner::plan_save(std::vector<std::vector<planner::ItemDesc>>{{huge}}).ok());
  // 33 dimensions fit a view; planning the decoded message gives ShardSpec::validate's error, as
  // planning the description does.
  const Shape g(33, 1);
  planner::ItemDesc deep{"model/deep", DType::kF32, g, ShardSpec::whole(g)};
  auto decoded = decode_gathered_items({encode_items({deep})});
  ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
  auto from_views = planner::plan_save(decoded->items);
  auto from_descs = planner::plan_save(std::vector<std::vector<planner::ItemDesc>>{{deep}});
  ASSERT_FALSE(from_views.ok());
  ASSERT_FALSE(from_descs.ok());
  EXPECT_EQ(from_views.status().to_string(), from_descs.status().to_string());
  EXPECT_NE(from_views.status().message().find("more than 32 dimensions"), std::string::npos);
}

// A TP2 x DP3 job with ZeRO, DP rank fastest (so the previous rank holds the same TP shard): the
// weights are replicas across DP, their optimizer states flat ranges of each TP shard.
std::vector<std::vector<planner::ItemDesc>> tp_dp_zero_items() {
  const int tp = 2, dp = 3;
  const Shape w{12, 6};
  std::vector<std::vector<planner::ItemDesc>> ranks;
  for (int t = 0; t < tp; ++t)
    for (int d = 0; d < dp; ++d) {
      const ShardSpec mine = ShardSpec::split(w, 0, tp, t);
      const int64_t n = mine.numel(), per = (n + dp - 1) / dp;
      const ShardSpec slice = ShardSpec::flat_range(mine.box, std::min(n, d * per), std::min(n, (d + 1) * per));
      ranks.push_back({{"model/w", DType::kBF16, w, mine},
                       {"optimizer/exp_avg/w", DType::kF32, w, slice},
                       {"optimizer/exp_avg_sq/w", DType::kF32, w, slice},
                       {"extra/step", DType::kI64, Shape{1}, ShardSpec::whole(Shape{1})}});
    }
  return ranks;
}

TEST(Wire, PlanOfTheDecodedMessagesEqualsThePlanOfTheDescriptions) {
  const auto ranks = tp_dp_zero_items();
  std::vector<std::string> messages;
  for (const auto& items : ranks) messages.push_back(encode_items(items));
  auto in = decode_gathered_items(messages);
  ASSERT_TRUE(in.ok()) << in.status().to_string();
  auto got = planner::plan_save(in->items);
  auto want = planner::plan_save(ranks);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  EXPECT_EQ(got->bytes_by_rank, want->bytes_by_rank);
  ASSERT_EQ(got->tensors.size(), want->tensors.size());
  for (size_t t = 0; t < got->tensors.size(); ++t) {
    const planner::TensorPlan &g = got->tensors[t], &w = want->tensors[t];
    EXPECT_EQ(g.key, w.key);
    EXPECT_EQ(g.dtype, w.dtype);
    EXPECT_EQ(g.shape, w.shape);
    EXPECT_EQ(g.boxes, w.boxes) << g.key;
    ASSERT_EQ(g.regions.size(), w.regions.size()) << g.key;
    for (size_t k = 0; k < g.regions.size(); ++k) {
      EXPECT_EQ(g.shard(k), w.shard(k)) << g.key << " region " << k;
      EXPECT_EQ(g.regions[k].writer, w.regions[k].writer) << g.key << " region " << k;
    }
  }
  // Independently of the planner: the weights' TP shards once each (2), the optimizer states'
  // slices once each (2 x 3), the step once; every element's bytes written once.
  ASSERT_EQ(got->tensors.size(), 4u);  // sorted by key
  EXPECT_EQ(got->tensors[0].key, "extra/step");
  EXPECT_EQ(got->tensors[0].regions.size(), 1u);
  EXPECT_EQ(got->tensors[1].regions.size(), 2u);  // model/w
  EXPECT_EQ(got->tensors[2].regions.size(), 6u);
  EXPECT_EQ(got->tensors[3].regions.size(), 6u);
  uint64_t total = 0;
  for (uint64_t b : got->bytes_by_rank) total += b;
  EXPECT_EQ(total, 8u + 12 * 6 * 2 + 2 * 12 * 6 * 4);
  // A rank whose weight shard differs from its replica's in one extent is refused as an overlap,
  // from the messages as from the descriptions.
  auto broken = ranks;
  broken[1][0].shard.box.shape[0] = 5;
  messages[1] = encode_items(broken[1]);
  auto bad_in = decode_gathered_items(messages);
  ASSERT_TRUE(bad_in.ok());
  auto bad = planner::plan_save(bad_in->items);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().to_string(), planner::plan_save(broken).status().to_string());
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
  EXPECT_FALSE(decode_tensors(with_count(msg, ~0ull)).ok());  // no tag: read as the older encoding
  std::string huge = msg;                                     // the compact encoding's tensor count, after its tag
  const uint64_t count = ~0ull;
  std::memcpy(huge.data() + 8, &count, sizeof count);
  EXPECT_FALSE(decode_tensors(huge).ok());
}

// A plan's message in the older encoding, each region's shard in full (as local manifests of
// earlier versions hold it), written field by field.
std::string full_shard_message(const std::vector<planner::TensorPlan>& tensors,
                               const std::vector<std::vector<std::pair<ShardSpec, int>>>& regions) {
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
  return std::move(w.str());
}

void expect_same_plan(const std::vector<planner::TensorPlan>& got, const std::vector<planner::TensorPlan>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t t = 0; t < want.size(); ++t) {
    EXPECT_EQ(got[t].key, want[t].key);
    EXPECT_EQ(got[t].dtype, want[t].dtype);
    EXPECT_EQ(got[t].shape, want[t].shape);
    EXPECT_EQ(got[t].boxes, want[t].boxes);
    ASSERT_EQ(got[t].regions.size(), want[t].regions.size());
    for (size_t r = 0; r < want[t].regions.size(); ++r) {
      const planner::PlannedRegion &a = got[t].regions[r], &b = want[t].regions[r];
      EXPECT_EQ(a.box, b.box) << t << " " << r;
      EXPECT_EQ(a.flat, b.flat) << t << " " << r;
      EXPECT_EQ(a.begin, b.begin) << t << " " << r;
      EXPECT_EQ(a.end, b.end) << t << " " << r;
      EXPECT_EQ(a.writer, b.writer) << t << " " << r;
    }
  }
}

// Local manifests store the encoded plan: those of earlier versions, whose regions each carry
// their shard in full, still decode to the same plan (and refuse what they refused), and the
// compact encoding is pinned here field by field.
TEST(Wire, TensorPlanEncodingsOlderAndCompact) {
  const auto tensors = sample_tensors();
  const auto regions = sample_regions();
  const std::string older = full_shard_message(tensors, regions);
  auto back = decode_tensors(older);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  expect_same_plan(*back, tensors);
  expect_rejects_truncations_and_trailers(older, decode_tensors, "decode_tensors (older encoding)");

  // The compact bytes from the shards: each tensor's distinct boxes in order of first
  // appearance, then every region as its box's position among them.
  ByteWriter w;
  w.put<uint64_t>(0xc0de'9a11'0000'0002ull);
  w.put<uint64_t>(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    std::vector<Box> distinct;
    for (const auto& [shard, writer] : regions[t])
      if (std::find(distinct.begin(), distinct.end(), shard.box) == distinct.end()) distinct.push_back(shard.box);
    w.put_string(tensors[t].key);
    w.put<uint8_t>(static_cast<uint8_t>(tensors[t].dtype));
    w.put_vec(tensors[t].shape);
    w.put<uint64_t>(distinct.size());
    for (const Box& b : distinct) {
      w.put_vec(b.offset);
      w.put_vec(b.shape);
    }
    w.put<uint64_t>(regions[t].size());
    for (const auto& [shard, writer] : regions[t]) {
      w.put<uint32_t>(static_cast<uint32_t>(std::find(distinct.begin(), distinct.end(), shard.box) - distinct.begin()));
      w.put<uint8_t>(shard.flat ? 1 : 0);
      if (shard.flat) w.put<int64_t>(shard.flat->first), w.put<int64_t>(shard.flat->second);
      w.put<int32_t>(writer);
    }
  }
  const std::string compact = encode_tensors(tensors);
  EXPECT_EQ(compact, w.str());
  EXPECT_LT(compact.size(), older.size());
}

// A compact message's region names its box by number: a number past the tensor's boxes is
// refused, as is a whole-box region of a box whose element count overflows.
TEST(Wire, CompactTensorPlanRefusesBadBoxNumbers) {
  auto message = [](uint32_t box, const Shape& box_shape, bool flat) {
    ByteWriter w;
    w.put<uint64_t>(0xc0de'9a11'0000'0002ull);
    w.put<uint64_t>(1);
    w.put_string("model/w");
    w.put<uint8_t>(static_cast<uint8_t>(DType::kF32));
    w.put_vec(Shape{4, 4});
    w.put<uint64_t>(1);  // one box
    w.put_vec(Shape(box_shape.size(), 0));
    w.put_vec(box_shape);
    w.put<uint64_t>(1);  // one region
    w.put<uint32_t>(box);
    w.put<uint8_t>(flat ? 1 : 0);
    if (flat) {
      w.put<int64_t>(0);
      w.put<int64_t>(3);
    }
    w.put<int32_t>(0);
    return w.str();
  };
  const auto good = decode_tensors(message(0, {4, 4}, false));
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_EQ((*good)[0].regions[0].end, 16);
  const auto flat = decode_tensors(message(0, {4, 4}, true));
  ASSERT_TRUE(flat.ok()) << flat.status().to_string();
  EXPECT_EQ((*flat)[0].regions[0].begin, 0);
  EXPECT_EQ((*flat)[0].regions[0].end, 3);
  EXPECT_FALSE(decode_tensors(message(1, {4, 4}, false)).ok());
  EXPECT_FALSE(decode_tensors(message(1, {4, 4}, true)).ok());
  EXPECT_FALSE(decode_tensors(message(UINT32_MAX, {4, 4}, false)).ok());
  EXPECT_FALSE(decode_tensors(message(0, {int64_t{1} << 40, int64_t{1} << 40}, false)).ok());
  EXPECT_FALSE(decode_tensors(message(0, {-1, 4}, false)).ok());
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

// The older encoding's decoder compares each region's box where it lies in the message: boxes
// that share an offset, or a prefix of their extents, are still told apart (a damaged local
// manifest may hold them; a plan of disjoint regions never does), and the plan survives the
// compact encoding.
TEST(Wire, TensorPlanDecodesEachRegionsOwnBox) {
  const std::vector<std::pair<ShardSpec, int>> regions{
      {ShardSpec::box_of({0, 0}, {2, 4}), 0},
      {ShardSpec::box_of({0, 0}, {4, 4}), 1},
      {ShardSpec::flat_range(Box{{0, 0}, {2, 4}}, 0, 4), 2},
      {ShardSpec::box_of({0, 0}, {2, 4}), 3},
      {ShardSpec{Box{{0, 0}, {2, 4, 1}}, std::nullopt}, 4},  // extents longer than the offset
      {ShardSpec::box_of({2, 0}, {2, 4}), 5},
      {ShardSpec::box_of({0, 0, 0}, {2, 4, 1}), 6}};
  const auto back = decode_tensors(full_shard_message({{"model/w", DType::kF32, Shape{8, 4}, {}, {}}}, {regions}));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  const planner::TensorPlan& t = (*back)[0];
  ASSERT_EQ(t.regions.size(), regions.size());
  EXPECT_EQ(t.boxes.size(), 5u);  // the first box again (twice) is the same box
  const std::vector<uint32_t> want_box{0, 1, 0, 0, 2, 3, 4};
  const std::vector<int64_t> want_end{8, 16, 4, 8, 8, 8, 8};
  for (size_t r = 0; r < regions.size(); ++r) {
    EXPECT_EQ(t.shard(r), regions[r].first) << r;
    EXPECT_EQ(t.regions[r].box, want_box[r]) << r;
    EXPECT_EQ(t.regions[r].end, want_end[r]) << r;
    EXPECT_EQ(t.regions[r].writer, regions[r].second) << r;
  }
  // Compact, the same plan again.
  const auto again = decode_tensors(encode_tensors(*back));
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  expect_same_plan(*again, *back);
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
