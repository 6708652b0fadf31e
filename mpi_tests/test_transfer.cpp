// StateTransfer (include/h5ckpt/transfer.h): live state between layouts without storage. Values
// are a pure function of (key, global index), so every destination rank checks each element it
// receives; byte counts are checked against sums computed from the layouts alone.
#include <gtest/gtest.h>

#include <cstring>

#include "engine/transfer.h"
#include "h5ckpt/transfer.h"
#include "support/test_model.h"
#include "support/transfer_support.h"
#include "util/dtype_convert.h"

using namespace h5ckpt;
using h5ckpt::testing::Layout;
using h5ckpt::testing::max_all;
using h5ckpt::testing::sum_all;
using h5ckpt::testing::TestModel;
using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;
using namespace h5ckpt::testing::transfer;

// The same ranks in two layouts: every (source, destination) pair of the reshard test, in memory.
TEST(Transfer, OverlappingEveryLayoutPair) {
  const auto layouts = h5ckpt::testing::layouts_for(world_size());
  StateTransfer x(MPI_COMM_WORLD);  // one object: each pair changes the structure and replans
  int64_t version = 0;
  for (const Layout& s : layouts)
    for (const Layout& d : layouts) {
      Topology ts = make_topology(MPI_COMM_WORLD, s), td = make_topology(MPI_COMM_WORLD, d);
      TestModel src(s, ts.coords(), true), dst(d, td.coords(), false);
      TransferOptions o;
      o.version = ++version;
      o.delta = false;              // a fresh destination each time
      o.verify = version % 2 == 0;  // every other pair unverified: received in place, no staging
      auto r = x.transfer(&src.state(), &dst.state(), o);
      ASSERT_TRUE(r.ok()) << s.name() << " -> " << d.name() << ": " << r.status().to_string();
      std::string first;
      EXPECT_EQ(dst.count_mismatches(&first), 0) << s.name() << " -> " << d.name() << ": first mismatch at " << first;
      EXPECT_EQ(src.count_mismatches(&first), 0) << "the source changed: " << first;
      // Every destination byte arrives exactly once.
      const uint64_t want = sum_all(state_bytes(dst.state()));
      EXPECT_EQ(sum_all(r->bytes_received), want) << s.name() << " -> " << d.name();
      EXPECT_EQ(sum_all(r->bytes_sent), want) << s.name() << " -> " << d.name();
      EXPECT_EQ(r->bytes_total, r->bytes_received);
    }
}

// Sources and destinations are different ranks (a trainer publishing to inference ranks).
TEST(Transfer, DisjointEveryLayoutPair) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  Halves h;
  const auto src_layouts = h5ckpt::testing::layouts_for(h.k),
             dst_layouts = h5ckpt::testing::layouts_for(world_size() - h.k);
  StateTransfer x(MPI_COMM_WORLD);
  int64_t version = 0;
  for (const Layout& s : src_layouts)
    for (const Layout& d : dst_layouts) {
      const Layout& mine = h.source ? s : d;
      Topology t = make_topology(h.comm, mine);
      TestModel model(mine, t.coords(), h.source);
      TransferOptions o;
      o.version = ++version;
      o.delta = false;
      o.verify = version % 2 == 0;
      auto r = x.transfer(h.source ? &model.state() : nullptr, h.source ? nullptr : &model.state(), o);
      ASSERT_TRUE(r.ok()) << s.name() << " -> " << d.name() << ": " << r.status().to_string();
      std::string first;
      EXPECT_EQ(model.count_mismatches(&first), 0) << s.name() << " -> " << d.name() << ": first mismatch at " << first;
      const uint64_t want = sum_all(h.source ? 0 : state_bytes(model.state()));
      EXPECT_EQ(sum_all(r->bytes_received), want);
      EXPECT_EQ(sum_all(r->bytes_sent), want);
      if (h.source) EXPECT_EQ(r->bytes_received, 0u);
      else EXPECT_EQ(r->bytes_sent, 0u);
      // Replicas share the sending: with several source replicas of everything, no one rank
      // sends it all.
      if (s.dp >= 2 && s.tp * s.pp == 1)
        EXPECT_LT(max_all(r->bytes_sent), want) << s.name() << " -> " << d.name() << ": one replica sent everything";
    }
}

// A delta moves only the blocks whose checksum changed: none when nothing changed, one per
// destination rank holding a flipped element.
TEST(Transfer, DeltaMovesOnlyChangedBlocks) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  Halves h;
  const int m = h.size();
  const Layout mine = h.source ? Layout{1, m, 1, false} : Layout{m % 2 == 0 ? 2 : 1, m % 2 == 0 ? m / 2 : m, 1, true};
  Topology t = make_topology(h.comm, mine);
  TestModel model(mine, t.coords(), h.source);
  StateTransfer x(MPI_COMM_WORLD);
  StateDict* src = h.source ? &model.state() : nullptr;
  StateDict* dst = h.source ? nullptr : &model.state();
  TransferOptions o;
  o.version = 1;
  auto r1 = x.transfer(src, dst, o);
  ASSERT_TRUE(r1.ok()) << r1.status().to_string();
  EXPECT_FALSE(r1->delta);
  EXPECT_EQ(sum_all(r1->blocks_received), sum_all(r1->blocks_total));
  EXPECT_GT(sum_all(r1->bytes_received), 0u);
  EXPECT_EQ(x.version(), 1);

  o.version = 2;  // nothing changed
  auto r2 = x.transfer(src, dst, o);
  ASSERT_TRUE(r2.ok()) << r2.status().to_string();
  EXPECT_TRUE(r2->delta);
  EXPECT_EQ(sum_all(r2->bytes_received), 0u);
  EXPECT_EQ(sum_all(r2->bytes_sent), 0u);
  EXPECT_EQ(sum_all(r2->bytes_total), sum_all(r1->bytes_total));

  // One element changes on every source replica holding it.
  const std::string key = "model/layers.0.qkv.weight";
  const int64_t g = 100;
  const float changed = 12345.0f;
  const int64_t held = for_element(model.state(), key, g, [&](float* v) {
    if (h.source) *v = changed;
  });
  const int64_t holders = static_cast<int64_t>(sum_all(static_cast<uint64_t>(h.source ? 0 : held)));
  ASSERT_GT(holders, 0);
  o.version = 3;
  auto r3 = x.transfer(src, dst, o);
  ASSERT_TRUE(r3.ok()) << r3.status().to_string();
  EXPECT_TRUE(r3->delta);
  EXPECT_EQ(sum_all(r3->blocks_received), static_cast<uint64_t>(holders)) << "one block per destination holding it";
  EXPECT_EQ(sum_all(r3->blocks_sent), static_cast<uint64_t>(holders));
  EXPECT_LT(sum_all(r3->bytes_received), sum_all(r3->bytes_total));
  EXPECT_GT(sum_all(r3->bytes_received), 0u);
  if (!h.source) {
    std::string first;
    int64_t bad = model.count_mismatches(&first);
    const int64_t seen = for_element(model.state(), key, g, [&](float* v) { EXPECT_EQ(*v, changed); });
    EXPECT_EQ(bad, seen) << "only the changed element differs from version 1; first: " << first;
  }
}

// A block corrupted in flight fails the transfer on every rank naming the key, and the
// destination keeps the previous version; the retry without the fault delivers the new one.
void corrupted_in_flight(bool overlapping) {
  Halves h;
  const bool src_role = overlapping || h.source, dst_role = overlapping || !h.source;
  const int n = overlapping ? world_size() : h.size();
  const MPI_Comm comm = overlapping ? MPI_COMM_WORLD : h.comm;
  const Layout ls{1, n, 1, true}, ld{n % 2 == 0 ? 2 : 1, n % 2 == 0 ? n / 2 : n, n % 2 == 0 ? 1 : 1, false};
  std::optional<Topology> ts, td;
  std::optional<TestModel> src, dst;
  if (src_role) {
    ts.emplace(make_topology(comm, ls));
    src.emplace(ls, ts->coords(), true);
  }
  if (dst_role) {
    td.emplace(make_topology(comm, ld));
    dst.emplace(ld, td->coords(), false);
  }
  StateTransfer x(MPI_COMM_WORLD);
  StateDict* s = src ? &src->state() : nullptr;
  StateDict* d = dst ? &dst->state() : nullptr;
  TransferOptions o;
  o.version = 7;
  auto r1 = x.transfer(s, d, o);
  ASSERT_TRUE(r1.ok()) << r1.status().to_string();
  std::string first;
  if (d) EXPECT_EQ(dst->count_mismatches(&first), 0) << first;

  if (s) flip_all(*s);  // version 8 differs in every element
  const std::string key = "model/embedding.weight";
  engine::set_transfer_fault_for_testing(world_rank(), key);  // whichever rank sends it corrupts it
  o.version = 8;
  auto r2 = x.transfer(s, d, o);
  engine::set_transfer_fault_for_testing(-1, "");
  expect_agreed_error(r2.status(), ErrorCode::kCorrupt, "'" + key + "'");
  if (d) EXPECT_EQ(dst->count_mismatches(&first), 0) << "the destination lost version 7: " << first;
  EXPECT_EQ(x.version(), 7);

  auto r3 = x.transfer(s, d, o);
  ASSERT_TRUE(r3.ok()) << r3.status().to_string();
  EXPECT_TRUE(r3->delta);
  if (d) EXPECT_EQ(flipped_mismatches(*d), 0);
  EXPECT_EQ(x.version(), 8);

  // A full transfer (a new StateTransfer: no previous version) sends the sums after the data;
  // a corrupted block fails it the same way and the destination keeps version 8.
  StateTransfer fresh(MPI_COMM_WORLD);
  if (s) flip_all(*s);  // version 9 = version 7's values
  engine::set_transfer_fault_for_testing(world_rank(), key);
  o.version = 9;
  auto r4 = fresh.transfer(s, d, o);
  engine::set_transfer_fault_for_testing(-1, "");
  expect_agreed_error(r4.status(), ErrorCode::kCorrupt, "'" + key + "'");
  if (d) EXPECT_EQ(flipped_mismatches(*d), 0) << "the destination lost version 8";
  auto r5 = fresh.transfer(s, d, o);
  ASSERT_TRUE(r5.ok()) << r5.status().to_string();
  EXPECT_FALSE(r5->delta);
  if (d) EXPECT_EQ(dst->count_mismatches(&first), 0) << first;
}

TEST(Transfer, CorruptedBlockDisjoint) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  corrupted_in_flight(false);
}
TEST(Transfer, CorruptedBlockOverlapping) { corrupted_in_flight(true); }

// in_place: checked where received. A corrupted block still fails everywhere naming the key.
// keep_previous off: the destination then holds no single version, and the next transfer is a full
// one that restores it. keep_previous on (the default): the overwritten bytes were kept aside and
// are put back, so the destination holds the previous version element by element, and the retry
// can be a delta.
void in_place_corrupted(bool keep_previous) {
  const int n = world_size();
  const Layout ls{1, n, 1, false}, ld{n % 2 == 0 ? 2 : 1, n % 2 == 0 ? n / 2 : n, 1, false};
  Topology ts = make_topology(MPI_COMM_WORLD, ls), td = make_topology(MPI_COMM_WORLD, ld);
  TestModel src(ls, ts.coords(), true), dst(ld, td.coords(), false);
  StateTransfer x(MPI_COMM_WORLD);
  TransferOptions o;
  o.in_place = true;
  o.keep_previous = keep_previous;
  o.version = 1;
  auto r1 = x.transfer(&src.state(), &dst.state(), o);
  ASSERT_TRUE(r1.ok()) << r1.status().to_string();
  std::string first;
  EXPECT_EQ(dst.count_mismatches(&first), 0) << first;
  flip_all(src.state());
  const std::string key = "model/layers.1.qkv.weight";
  engine::set_transfer_fault_for_testing(world_rank(), key);
  o.version = 2;
  auto r2 = x.transfer(&src.state(), &dst.state(), o);
  engine::set_transfer_fault_for_testing(-1, "");
  expect_agreed_error(r2.status(), ErrorCode::kCorrupt, "'" + key + "'");
  EXPECT_EQ(x.version(), 1);
  if (keep_previous) EXPECT_EQ(dst.count_mismatches(&first), 0) << "the destination lost version 1: " << first;
  auto r3 = x.transfer(&src.state(), &dst.state(), o);
  ASSERT_TRUE(r3.ok()) << r3.status().to_string();
  if (keep_previous) EXPECT_TRUE(r3->delta) << "version 1 was kept: the retry is a delta";
  else EXPECT_FALSE(r3->delta) << "after a failed in-place transfer the next one must be full";
  EXPECT_EQ(flipped_mismatches(dst.state()), 0);
}

TEST(Transfer, InPlaceCorruptedBlockThenFullRetry) { in_place_corrupted(false); }
TEST(Transfer, InPlaceCorruptedBlockKeepsPrevious) { in_place_corrupted(true); }

// keep_previous: a piece's data receives wait for the copy of its previous bytes, while its sums
// may already be in. Sources and destinations disjoint (the sources' threads only hash), backups
// held back 0.2 s: the sums arrive first every time, and the piece must still be checked only once
// its data is in (a check of the old bytes fails as corrupted).
TEST(Transfer, InPlaceKeptPieceCheckedAfterItsData) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  Halves h;
  const int n = h.size();
  const Layout ls{1, n, 1, false}, ld{n % 2 == 0 ? 2 : 1, n % 2 == 0 ? n / 2 : n, 1, false};
  const Layout& mine = h.source ? ls : ld;
  Topology t = make_topology(h.comm, mine);
  TestModel model(mine, t.coords(), h.source);
  StateTransfer x(MPI_COMM_WORLD);
  TransferOptions o;
  o.in_place = true;
  o.delta = false;
  engine::set_transfer_backup_delay_for_testing(0.2);
  auto r = x.transfer(h.source ? &model.state() : nullptr, h.source ? nullptr : &model.state(), o);
  engine::set_transfer_backup_delay_for_testing(0);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::string first;
  if (!h.source) EXPECT_EQ(model.count_mismatches(&first), 0) << first;
}

// The same with a staged piece behind a kept one: rank 0 holds "a" and "b" (f32); the other ranks
// want "a" in f32 (received in place, kept) and "b" in bf16 (staged, converted after the check).
// "b"'s receive waits behind "a"'s held-back undo copy while its sums are already in; it too must
// be checked only once its data is in.
TEST(Transfer, StagedPieceBehindAKeptOneCheckedAfterItsData) {
  const int n = world_size(), me = world_rank();
  if (n < 2) GTEST_SKIP() << "needs pieces from another rank";
  const Shape shape{64, 256};
  const int64_t count = 64 * 256;
  auto value = [](int t, int64_t g) { return static_cast<float>((g * 7 + t * 3) % 1000) * 0.5f; };
  std::vector<float> a(count), b(count);
  std::vector<uint16_t> b_bf16(count, 0);
  StateDict src, dst;
  if (me == 0) {
    for (int64_t g = 0; g < count; ++g) {
      a[g] = value(0, g);
      b[g] = value(1, g);
    }
    src.add("a", DType::kF32, shape, ShardSpec::whole(shape), a.data());
    src.add("b", DType::kF32, shape, ShardSpec::whole(shape), b.data());
  } else {
    dst.add("a", DType::kF32, shape, ShardSpec::whole(shape), a.data());
    dst.add("b", DType::kBF16, shape, ShardSpec::whole(shape), b_bf16.data());
  }
  StateTransfer x(MPI_COMM_WORLD);
  TransferOptions o;
  o.in_place = true;
  o.delta = false;
  engine::set_transfer_backup_delay_for_testing(0.2);
  auto r = x.transfer(me == 0 ? &src : nullptr, me == 0 ? nullptr : &dst, o);
  engine::set_transfer_backup_delay_for_testing(0);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  if (me == 0) return;
  int64_t bad = 0;
  for (int64_t g = 0; g < count; ++g) {
    bad += a[g] != value(0, g);
    bad += b_bf16[g] != detail::f32_to_bf16(value(1, g));
  }
  EXPECT_EQ(bad, 0);
}

// Under memory_bytes the transfer runs in rounds whose staging stays within the bound.
TEST(Transfer, MemoryBoundRounds) {
  const int n = world_size();
  const Layout ls{1, n, 1, false}, ld{n >= 2 ? 2 : 1, n >= 2 ? n / 2 : 1, 1, true};
  if (n >= 2 && n % 2) GTEST_SKIP() << "even rank counts";
  Topology ts = make_topology(MPI_COMM_WORLD, ls), td = make_topology(MPI_COMM_WORLD, ld);
  TestModel src(ls, ts.coords(), true), dst(ld, td.coords(), false);
  StateTransfer x(MPI_COMM_WORLD);
  TransferOptions o;
  o.memory_bytes = 2048;
  std::string first;
  for (const bool in_place : {false, true}) {  // in place: the kept bytes take the staging's room
    o.in_place = in_place;
    o.delta = false;
    auto r = x.transfer(&src.state(), &dst.state(), o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_GT(r->rounds, 1);
    EXPECT_LE(r->memory_peak_bytes, o.memory_bytes) << "in_place " << in_place;
    EXPECT_EQ(dst.count_mismatches(&first), 0) << first;
  }
  o.in_place = false;
  o.memory_bytes = 100;  // below the minimum: the same error everywhere, before any transfer
  expect_agreed_error(x.transfer(&src.state(), &dst.state(), o).status(), ErrorCode::kInvalidArgument, "memory_bytes");
}

// Strictness, shapes, dtypes and padding follow the load's rules; errors are agreed.
TEST(Transfer, LoadRulesAndAgreedErrors) {
  const int n = world_size(), me = world_rank();
  const Shape shape{37, 8};
  // Sources: rows split over the ranks; every rank is also a destination holding all of it.
  std::vector<float> src_buf(37 * 8 + 1), dst_f32(37 * 8 + 1, -1), pad_buf(40 * 8, -1);
  std::vector<uint16_t> dst_bf16(37 * 8 + 1, 0);
  std::vector<int64_t> ints(4, 5);
  const ShardSpec part = ShardSpec::split(shape, 0, n, me);
  for (int64_t j = 0; j < part.numel(); ++j)
    src_buf[j] = static_cast<float>(h5ckpt::testing::global_flat_index(part, shape, j)) * 0.25f - 3.0f;
  auto expected = [](int64_t g) { return static_cast<float>(g) * 0.25f - 3.0f; };
  StateDict src;
  src.add("w", DType::kF32, shape, part, src_buf.data());
  src.add("ints", DType::kI64, Shape{4}, ShardSpec::whole(Shape{4}), ints.data());
  StateTransfer x(MPI_COMM_WORLD);
  {  // f32 -> f32, f32 -> bf16 (converted), padded 37 -> 40 rows
    StateDict dst;
    dst.add("w", DType::kF32, shape, ShardSpec::whole(shape), dst_f32.data());
    StateDict dst2;
    dst2.add("w", DType::kBF16, shape, ShardSpec::whole(shape), dst_bf16.data());
    StateDict dst3;
    dst3.add("w", DType::kF32, Shape{40, 8}, ShardSpec::whole(Shape{40, 8}), pad_buf.data()).allow_shape_mismatch =
        true;
    for (StateDict* d : {&dst, &dst2, &dst3}) {
      auto r = x.transfer(&src, d, {});
      ASSERT_TRUE(r.ok()) << r.status().to_string();
    }
    int64_t bad = 0;
    for (int64_t g = 0; g < 37 * 8; ++g) {
      bad += dst_f32[g] != expected(g);
      bad += dst_bf16[g] != detail::f32_to_bf16(expected(g));
      bad += pad_buf[g] != expected(g);
    }
    for (int64_t g = 37 * 8; g < 40 * 8; ++g) bad += pad_buf[g] != 0.0f;
    EXPECT_EQ(bad, 0);
  }
  {  // a key no source holds: strict fails everywhere naming it; non-strict skips it untouched
    std::vector<float> other(3, 9.0f);
    StateDict dst;
    dst.add("w", DType::kF32, shape, ShardSpec::whole(shape), dst_f32.data());
    dst.add("missing.bias", DType::kF32, Shape{3}, ShardSpec::whole(Shape{3}), other.data());
    expect_agreed_error(x.transfer(&src, &dst, {}).status(), ErrorCode::kNotFound, "missing.bias");
    TransferOptions lax;
    lax.strict = false;
    auto r = x.transfer(&src, &dst, lax);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->missing_keys.size(), 1u);
    EXPECT_EQ(r->missing_keys[0], "missing.bias");
    EXPECT_EQ(other[0], 9.0f);
  }
  {  // another shape; a non-float dtype change; conversion turned off
    std::vector<float> f(4);
    StateDict a, b, c;
    a.add("w", DType::kF32, Shape{36, 8}, ShardSpec::whole(Shape{36, 8}), dst_f32.data());
    expect_agreed_error(x.transfer(&src, &a, {}).status(), ErrorCode::kShapeMismatch, "'w'");
    b.add("ints", DType::kF32, Shape{4}, ShardSpec::whole(Shape{4}), f.data());
    expect_agreed_error(x.transfer(&src, &b, {}).status(), ErrorCode::kDtypeMismatch, "'ints'");
    c.add("w", DType::kBF16, shape, ShardSpec::whole(shape), dst_bf16.data());
    TransferOptions exact;
    exact.convert_dtype = false;
    expect_agreed_error(x.transfer(&src, &c, exact).status(), ErrorCode::kDtypeMismatch, "'w'");
  }
  if (n >= 2) {  // source shards that overlap without being identical
    StateDict bad_src;
    bad_src.add("w", DType::kF32, shape, ShardSpec::box_of({me == 0 ? 0 : 1, 0}, {me == 0 ? 37 : 36, 8}),
                src_buf.data());
    StateDict dst;
    dst.add("w", DType::kF32, shape, ShardSpec::whole(shape), dst_f32.data());
    expect_agreed_error(x.transfer(&bad_src, &dst, {}).status(), ErrorCode::kInvalidArgument, "overlap");
  }
}
