// Load planning without MPI: the coordinator's part (make_request, plan_load, assign_roles) and
// each rank's (plan_rank_load) composed as the engine composes them, then "executed" on synthetic
// tensor values: every element every rank ends up with is checked against a value computed
// independently from the key and the element's global index.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "planner/box_math.h"
#include "planner/load_planner.h"
#include "planner/save_planner.h"

namespace h5ckpt::planner {
namespace {

// ---- a model shaped like the MPI reshard test's (mpi_tests/support/test_model.cpp) ----------

struct Layout {
  int tp = 1, dp = 1, pp = 1;
  bool zero = false;
  int world() const { return tp * dp * pp; }
};

std::vector<Layout> layouts_for(int world) {
  std::vector<Layout> out;
  for (int tp = 1; tp <= world; tp *= 2)
    for (int pp = 1; pp <= 2; ++pp)
      if (world % (tp * pp) == 0)
        for (bool zero : {false, true}) out.push_back(Layout{tp, world / (tp * pp), pp, zero});
  return out;
}

// Megatron order: TP fastest, then DP, then PP.
struct Coords {
  int tp, dp, pp;
};
Coords coords_of(const Layout& L, int rank) { return {rank % L.tp, (rank / L.tp) % L.dp, rank / (L.tp * L.dp)}; }

std::vector<ItemDesc> model_items(const Layout& L, int rank) {
  const Coords c = coords_of(L, rank);
  std::vector<ItemDesc> items;
  auto with_optimizer = [&](const std::string& name, DType dtype, const Shape& shape, const ShardSpec& shard) {
    items.push_back({"model/" + name, dtype, shape, shard});
    ShardSpec opt = shard;
    if (L.zero) {
      const int64_t n = shard.box.volume();
      opt = ShardSpec::flat_range(shard.box, n * c.dp / L.dp, n * (c.dp + 1) / L.dp);
    }
    items.push_back({"optimizer/exp_avg/" + name, DType::kF32, shape, opt});
  };
  const Shape vocab{37, 16};
  if (c.pp == 0) with_optimizer("embedding.weight", DType::kF32, vocab, ShardSpec::split(vocab, 0, L.tp, c.tp));
  for (int l = 0; l < 2; ++l) {
    if (l * L.pp / 2 != c.pp) continue;
    const std::string p = "layers." + std::to_string(l) + ".";
    const Shape qkv{48, 16}, proj{16, 44}, norm{16}, scale{3};
    with_optimizer(p + "qkv.weight", DType::kF32, qkv, ShardSpec::split(qkv, 0, L.tp, c.tp));
    with_optimizer(p + "proj.weight", DType::kF32, proj, ShardSpec::split(proj, 1, L.tp, c.tp));
    with_optimizer(p + "norm.weight", DType::kF32, norm, ShardSpec::whole(norm));
    with_optimizer(p + "scale", DType::kF32, scale, ShardSpec::whole(scale));
    items.push_back({"model/" + p + "fc1.bias", DType::kBF16, Shape{40}, ShardSpec::split(Shape{40}, 0, L.tp, c.tp)});
  }
  if (c.pp == L.pp - 1) with_optimizer("output.weight", DType::kF32, vocab, ShardSpec::split(vocab, 0, L.tp, c.tp));
  items.push_back({"extra/step", DType::kI64, Shape{1}, ShardSpec::whole(Shape{1})});
  return items;
}

// ---- an independent reference: the global flat index of element j of a rank's buffer -------

int64_t flat_of(const Shape& coords, const Shape& shape) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + coords[d];
  return f;
}

Shape unravel(int64_t j, const Shape& extent) {
  Shape c(extent.size());
  for (size_t d = extent.size(); d-- > 0;) {
    c[d] = j % extent[d];
    j /= extent[d];
  }
  return c;
}

int64_t global_index(const ShardSpec& shard, const Shape& shape, int64_t j) {
  const int64_t in_box = shard.flat ? shard.flat->first + j : j;
  Shape c = unravel(in_box, shard.box.shape);
  for (size_t d = 0; d < c.size(); ++d) c[d] += shard.box.offset[d];
  return flat_of(c, shape);
}

// The value a stored tensor holds at a global flat index (0 is kept for "never written").
double stored_value(const std::string& key, int64_t g) {
  return 1.0 + static_cast<double>(std::hash<std::string>{}(key) % 997) * 1e5 + static_cast<double>(g);
}

// ---- the simulated job ----------------------------------------------------------------------

struct Job {
  std::vector<std::vector<LoadWant>> wants;  // [rank][item]
  std::map<std::string, StoredTensor> stored;
};

struct Outcome {
  std::vector<RankLoadPlan> plans;
  LoadPlan global;
};

Outcome plan_job(const Job& job, bool dedup) {
  const size_t world = job.wants.size();
  std::vector<std::vector<LoadRequest>> reqs(world);
  std::vector<std::vector<int>> item_of(world);
  std::vector<size_t> items(world);
  for (size_t r = 0; r < world; ++r) {
    items[r] = job.wants[r].size();
    for (size_t i = 0; i < job.wants[r].size(); ++i) {
      if (job.wants[r][i].skip) continue;
      reqs[r].push_back(make_request(job.wants[r][i]));
      item_of[r].push_back(static_cast<int>(i));
    }
  }
  Outcome out;
  out.global = plan_load(reqs, dedup);
  const auto roles = assign_roles(out.global, item_of, items);
  for (size_t r = 0; r < world; ++r) {
    std::vector<StoredTensor> stored(job.wants[r].size());
    for (size_t i = 0; i < stored.size(); ++i)
      if (!job.wants[r][i].skip) stored[i] = job.stored.at(job.wants[r][i].desc.key);
    out.plans.push_back(plan_rank_load(roles.roles_of(out.global, r), job.wants[r], stored, /*file_order=*/true));
  }
  return out;
}

// Executes the plans: readers fill their buffers from the stored values, receivers copy their
// reader's buffer. Returns the buffers ([rank][item]).
std::vector<std::vector<std::vector<double>>> execute(const Job& job, const Outcome& o) {
  const size_t world = job.wants.size();
  std::vector<std::vector<std::vector<double>>> buf(world);
  for (size_t r = 0; r < world; ++r) {
    buf[r].resize(job.wants[r].size());
    for (size_t i = 0; i < job.wants[r].size(); ++i) buf[r][i].assign(job.wants[r][i].desc.shard.numel(), 0.0);
  }
  for (size_t r = 0; r < world; ++r)
    for (const ReadItem& it : o.plans[r].items) {
      if (it.role != Role::kRead) continue;
      const LoadWant& w = job.wants[r][it.item];
      const Frame frame = frame_of(w.desc.shard);
      for (const Box& box : it.boxes)
        for (int64_t e = 0; e < box.volume(); ++e) {
          Shape c = unravel(e, box.shape);
          for (size_t d = 0; d < c.size(); ++d) c[d] += box.offset[d];
          buf[r][it.item][frame.index_of(c)] = stored_value(w.desc.key, flat_of(c, it.stored.shape));
        }
    }
  for (size_t r = 0; r < world; ++r)
    for (const ReadItem& it : o.plans[r].items) {
      if (it.role != Role::kReceive) continue;
      // The reader holds one kRead entry of the same group that names this rank.
      const auto& rp = o.plans.at(it.reader).items;
      auto src = std::find_if(rp.begin(), rp.end(), [&](const ReadItem& x) { return x.group == it.group; });
      EXPECT_NE(src, rp.end()) << "rank " << r << " receives group " << it.group << " that rank " << it.reader
                               << " does not read";
      if (src == rp.end()) continue;
      EXPECT_EQ(src->role, Role::kRead);
      EXPECT_NE(std::find(src->receivers.begin(), src->receivers.end(), static_cast<int>(r)), src->receivers.end());
      EXPECT_EQ(src->bytes, it.bytes);
      buf[r][it.item] = buf[it.reader][src->item];
    }
  return buf;
}

// Every element of every non-skipped item equals the stored value at its global index (or zero
// where a padded item reaches past the stored shape).
void expect_all_delivered(const Job& job, const std::vector<std::vector<std::vector<double>>>& buf,
                          const std::string& what) {
  for (size_t r = 0; r < job.wants.size(); ++r)
    for (size_t i = 0; i < job.wants[r].size(); ++i) {
      const LoadWant& w = job.wants[r][i];
      if (w.skip) continue;
      const StoredTensor& st = job.stored.at(w.desc.key);
      int64_t bad = 0;
      for (int64_t j = 0; j < w.desc.shard.numel(); ++j) {
        const int64_t g = global_index(w.desc.shard, w.desc.global_shape, j);
        const Shape c = unravel(g, w.desc.global_shape);
        bool inside = true;
        for (size_t d = 0; d < c.size(); ++d) inside = inside && c[d] < st.shape[d];
        const double want = inside ? stored_value(w.desc.key, flat_of(c, st.shape)) : 0.0;
        if (buf[r][i][j] != want && bad++ == 0)
          ADD_FAILURE() << what << ": rank " << r << " '" << w.desc.key << "' element " << j << " is " << buf[r][i][j]
                        << ", expected " << want;
      }
    }
}

Job job_for(const Layout& saver, const Layout& loader) {
  Job job;
  int64_t offset = 4096;
  for (int r = 0; r < saver.world(); ++r)
    for (const ItemDesc& d : model_items(saver, r))
      if (!job.stored.count(d.key)) {
        job.stored[d.key] = StoredTensor{d.dtype, d.global_shape, offset};
        offset += 1 << 16;
      }
  job.wants.resize(loader.world());
  for (int r = 0; r < loader.world(); ++r)
    for (ItemDesc& d : model_items(loader, r)) job.wants[r].push_back(LoadWant{std::move(d), false, false, false});
  return job;
}

std::string name(const Layout& L) {
  return "tp" + std::to_string(L.tp) + "dp" + std::to_string(L.dp) + "pp" + std::to_string(L.pp) + (L.zero ? "z" : "");
}

TEST(LoadPlan, EveryLayoutPairOfTheReshardTestDeliversEveryElement) {
  int pairs = 0;
  for (int saver_world : {1, 2, 4, 8})
    for (int loader_world : {1, 2, 4, 8})
      for (const Layout& s : layouts_for(saver_world))
        for (const Layout& l : layouts_for(loader_world)) {
          const Job job = job_for(s, l);
          for (bool dedup : {true, false}) {
            const Outcome o = plan_job(job, dedup);
            const std::string what = name(s) + " -> " + name(l) + (dedup ? "" : " (no dedup)");
            expect_all_delivered(job, execute(job, o), what);
            // Each group is read by exactly one rank, one of its members.
            std::map<int, int> readers;
            for (const RankLoadPlan& p : o.plans)
              for (const ReadItem& it : p.items) readers[it.group] += it.role == Role::kRead;
            for (auto [g, n] : readers) EXPECT_EQ(n, 1) << what << ": group " << g << " read " << n << " times";
            ++pairs;
          }
        }
  EXPECT_GE(pairs, 2 * 20 * 20);  // every pair was planned
}

TEST(LoadPlan, ReplicasAreReadOnceAndSentToEveryOtherMember) {
  // DP 4, TP 2: every TP shard is wanted by 4 ranks, read once and sent to the other 3 (of the
  // same TP rank); replicated tensors are wanted by all 8, read once and sent to the other 7.
  const Layout L{2, 4, 1, false};
  const Job job = job_for(L, L);
  const Outcome o = plan_job(job, true);
  std::map<std::pair<std::string, Shape>, int> reads;  // (key, shard offset) -> reads
  for (int r = 0; r < L.world(); ++r)
    for (const ReadItem& it : o.plans[r].items) {
      const ItemDesc& d = job.wants[r][it.item].desc;
      if (it.role == Role::kRead) {
        ++reads[{d.key, d.shard.box.offset}];
        const bool replicated = d.shard == ShardSpec::whole(d.global_shape);
        EXPECT_EQ(it.receivers.size(), replicated ? 7u : 3u) << d.key << " on rank " << r;
        if (!replicated)
          for (int t : it.receivers) EXPECT_EQ(coords_of(L, t).tp, coords_of(L, r).tp) << "sent across TP ranks";
      }
    }
  for (const auto& [k, n] : reads) EXPECT_EQ(n, 1) << k.first;
  // Without de-duplication every rank reads its own items.
  const Outcome all = plan_job(job, false);
  for (int r = 0; r < L.world(); ++r)
    for (const ReadItem& it : all.plans[r].items) EXPECT_EQ(it.role, Role::kRead);
}

TEST(LoadPlan, ReadsAreBalancedOverTheReplicas) {
  // 8 equal tensors wanted whole by 4 ranks: each rank reads exactly two of them.
  Job job;
  job.wants.resize(4);
  for (int t = 0; t < 8; ++t) {
    const std::string key = "model/t" + std::to_string(t);
    job.stored[key] = StoredTensor{DType::kF32, Shape{64}, 4096 + t * 256};
    for (auto& w : job.wants) w.push_back(LoadWant{{key, DType::kF32, Shape{64}, ShardSpec::whole(Shape{64})}});
  }
  const Outcome o = plan_job(job, true);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(o.global.read_bytes_by_rank[r], 2u * 64 * 4) << "rank " << r;
    int reads = 0;
    for (const ReadItem& it : o.plans[r].items) reads += it.role == Role::kRead;
    EXPECT_EQ(reads, 2) << "rank " << r;
  }
  expect_all_delivered(job, execute(job, o), "balanced");
  // Unequal sizes: the largest group goes first, to the least-loaded member.
  Job uneven;
  uneven.wants.resize(2);
  for (int t = 0; t < 3; ++t) {
    const std::string key = "model/u" + std::to_string(t);
    const Shape shape{t == 0 ? 100 : 50};
    uneven.stored[key] = StoredTensor{DType::kF32, shape, 4096 + t * 1024};
    for (auto& w : uneven.wants) w.push_back(LoadWant{{key, DType::kF32, shape, ShardSpec::whole(shape)}});
  }
  const Outcome u = plan_job(uneven, true);
  EXPECT_EQ(u.global.read_bytes_by_rank[0], 400u);  // the 100-element tensor
  EXPECT_EQ(u.global.read_bytes_by_rank[1], 400u);  // both 50-element ones
}

TEST(LoadPlan, DeviceAndHostDestinationsNeverShareAGroup) {
  // Four DP replicas of one tensor: ranks 0 and 2 load into device memory, 1 and 3 into host.
  Job job;
  job.wants.resize(4);
  job.stored["model/w"] = StoredTensor{DType::kF32, Shape{8, 8}, 4096};
  for (int r = 0; r < 4; ++r)
    job.wants[r].push_back(LoadWant{{"model/w", DType::kF32, Shape{8, 8}, ShardSpec::whole(Shape{8, 8})}, r % 2 == 0});
  const Outcome o = plan_job(job, true);
  ASSERT_EQ(o.global.groups.size(), 2u);
  for (size_t g = 0; g < o.global.groups.size(); ++g) {
    std::set<bool> kinds;
    for (const auto& m : o.global.members_of(g)) kinds.insert(job.wants[m.rank][m.item].on_device);
    EXPECT_EQ(kinds.size(), 1u) << "a group mixes device and host destinations";
  }
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(o.plans[r].items.size(), 1u);
    EXPECT_EQ(o.plans[r].items[0].on_device, r % 2 == 0) << "rank " << r;
  }
  expect_all_delivered(job, execute(job, o), "device/host");
}

TEST(LoadPlan, PaddedVocabularyReadsTheCommonPartAndZeroFillsTheRest) {
  // Stored [37, 16]; the loader pads to [40, 16] over TP 2: rows 20..39 on rank 1, 37..39 zero.
  Job job;
  job.stored["model/embedding.weight"] = StoredTensor{DType::kF32, Shape{37, 16}, 4096};
  job.wants.resize(2);
  for (int r = 0; r < 2; ++r)
    job.wants[r].push_back(
        LoadWant{{"model/embedding.weight", DType::kF32, Shape{40, 16}, ShardSpec::split(Shape{40, 16}, 0, 2, r)},
                 false,
                 /*pad=*/true});
  const Outcome o = plan_job(job, true);
  const ReadItem& last = o.plans[1].items.at(0);
  ASSERT_EQ(last.role, Role::kRead);
  EXPECT_TRUE(last.zero_fill);
  ASSERT_EQ(last.boxes.size(), 1u);
  EXPECT_EQ(last.boxes[0], (Box{{20, 0}, {17, 16}}));  // cut at the stored rows
  expect_all_delivered(job, execute(job, o), "padded");
}

TEST(LoadPlan, SkippedItemsArePlannedForNobody) {
  Job job = job_for(Layout{1, 2, 1, false}, Layout{1, 2, 1, false});
  job.wants[1].push_back(LoadWant{{"model/new", DType::kF32, Shape{4}, ShardSpec::whole(Shape{4})},
                                  false,
                                  false,
                                  /*skip=*/true});
  const Outcome o = plan_job(job, true);
  EXPECT_EQ(o.plans[1].skipped, (std::vector<int>{static_cast<int>(job.wants[1].size()) - 1}));
  for (const RankLoadPlan& p : o.plans)
    for (const ReadItem& it : p.items) EXPECT_NE(job.wants[&p - o.plans.data()][it.item].desc.key, "model/new");
  EXPECT_NE(o.plans[1].describe(job.wants[1]).find("skip 'model/new'"), std::string::npos);
}

TEST(LoadPlan, ReadsGoInFileOrderAndTheDescriptionNamesEveryStep) {
  Job job = job_for(Layout{1, 1, 1, false}, Layout{1, 1, 1, false});
  const Outcome o = plan_job(job, true);
  const RankLoadPlan& p = o.plans[0];
  ASSERT_EQ(p.read_order.size(), p.items.size());
  for (size_t k = 1; k < p.read_order.size(); ++k)
    EXPECT_LE(p.items[p.read_order[k - 1]].stored.file_offset, p.items[p.read_order[k]].stored.file_offset);
  // Group order is ascending in items; every key appears in the description.
  for (size_t k = 1; k < p.items.size(); ++k) EXPECT_LT(p.items[k - 1].group, p.items[k].group);
  const std::string text = p.describe(job.wants[0]);
  for (const LoadWant& w : job.wants[0]) EXPECT_NE(text.find("'" + w.desc.key + "'"), std::string::npos) << w.desc.key;
}

TEST(LoadPlan, RequestsDifferWhenAnythingThatChangesTheBytesDiffers) {
  const LoadWant base{{"model/w", DType::kF32, Shape{8, 8}, ShardSpec::split(Shape{8, 8}, 0, 2, 0)}};
  std::vector<LoadWant> variants(7, base);
  variants[1].desc.key = "model/v";
  variants[2].desc.dtype = DType::kBF16;
  variants[3].desc.global_shape = Shape{8, 9};
  variants[4].desc.shard = ShardSpec::split(Shape{8, 8}, 0, 2, 1);
  variants[5].desc.shard = ShardSpec::flat_range(base.desc.shard.box, 0, 8);
  variants[6].pad = true;
  std::set<std::string> sigs;
  for (const auto& v : variants) sigs.insert(make_request(v).signature);
  LoadWant dev = base;
  dev.on_device = true;
  sigs.insert(make_request(dev).signature);
  EXPECT_EQ(sigs.size(), variants.size() + 1);
  EXPECT_EQ(make_request(base).signature, make_request(LoadWant(base)).signature);
  EXPECT_EQ(make_request(base).bytes, 4u * 8 * 4);
}

// plan_load written out plainly: groups by signature in a std::map in order of first appearance,
// each with its own vector of members in request order, worst-fit by a stable sort.
struct ReferenceGroup {
  std::vector<LoadMember> members;
  int reader = -1;
  uint64_t bytes = 0;
};
struct ReferencePlan {
  std::vector<ReferenceGroup> groups;
  std::vector<uint64_t> read_bytes_by_rank;
};
ReferencePlan reference_plan_load(const std::vector<std::vector<LoadRequest>>& ranks, bool dedup) {
  ReferencePlan plan;
  std::map<std::string, size_t> group_of;
  for (size_t r = 0; r < ranks.size(); ++r)
    for (size_t i = 0; i < ranks[r].size(); ++i) {
      const LoadRequest& q = ranks[r][i];
      auto [it, fresh] = group_of.try_emplace(q.signature, plan.groups.size());
      if (!dedup || fresh) plan.groups.push_back(ReferenceGroup{{}, -1, q.bytes});
      plan.groups[dedup ? it->second : plan.groups.size() - 1].members.push_back(
          {static_cast<int>(r), static_cast<int>(i)});
    }
  plan.read_bytes_by_rank.assign(ranks.size(), 0);
  std::vector<size_t> order(plan.groups.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return plan.groups[a].bytes > plan.groups[b].bytes; });
  for (size_t g : order) {
    ReferenceGroup& grp = plan.groups[g];
    for (const auto& m : grp.members)
      if (grp.reader < 0 || plan.read_bytes_by_rank[m.rank] < plan.read_bytes_by_rank[grp.reader]) grp.reader = m.rank;
    plan.read_bytes_by_rank[grp.reader] += grp.bytes;
  }
  return plan;
}

// 64 ranks, 300 requests each, over 2,500 signatures of 1 to 300 bytes (the table grows several
// times; short signatures and lengths that are not a multiple of 8 take the hash's tail), some
// wanted twice by one rank, a few differing from another only in their last byte.
std::vector<std::vector<LoadRequest>> random_requests() {
  std::vector<std::string> signatures;
  uint64_t x = 88172645463325252ull;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  for (int s = 0; s < 2500; ++s) {
    std::string sig(1 + next() % 300, '\0');
    for (char& c : sig) c = static_cast<char>(next());
    signatures.push_back(sig);
    if (s % 50 == 0) {
      sig.back() = static_cast<char>(sig.back() + 1);
      signatures.push_back(sig);
    }
  }
  std::vector<std::vector<LoadRequest>> ranks(64);
  for (auto& requests : ranks)
    for (int i = 0; i < 300; ++i) {
      const std::string& sig = signatures[next() % signatures.size()];
      requests.push_back(LoadRequest{sig, 1 + std::hash<std::string>{}(sig) % 4096});
    }
  return ranks;
}

TEST(LoadPlan, GroupsEqualAPlainReferenceOnManyRequests) {
  const auto ranks = random_requests();
  for (bool dedup : {true, false}) {
    const LoadPlan got = plan_load(ranks, dedup);
    const ReferencePlan want = reference_plan_load(ranks, dedup);
    ASSERT_EQ(got.groups.size(), want.groups.size()) << "dedup " << dedup;
    if (dedup) EXPECT_GT(want.groups.size(), 2000u);  // most signatures were wanted, many more than once
    size_t members = 0;
    for (size_t g = 0; g < want.groups.size(); ++g) {
      const LoadGroup& a = got.groups[g];
      const ReferenceGroup& b = want.groups[g];
      EXPECT_EQ(a.bytes, b.bytes) << "group " << g;
      EXPECT_EQ(a.reader, b.reader) << "group " << g;
      const auto got_members = got.members_of(g);
      ASSERT_EQ(got_members.size(), b.members.size()) << "group " << g;
      for (size_t m = 0; m < b.members.size(); ++m) {
        EXPECT_EQ(got_members[m].rank, b.members[m].rank) << "group " << g << " member " << m;
        EXPECT_EQ(got_members[m].item, b.members[m].item) << "group " << g << " member " << m;
      }
      members += b.members.size();
    }
    EXPECT_EQ(got.members.size(), members);  // no member outside a group
    EXPECT_EQ(got.read_bytes_by_rank, want.read_bytes_by_rank);
  }
}

TEST(LoadPlan, RolesEqualAPlainReferenceWithSkippedItems) {
  // The random requests as the items of ranks that also skip every seventh item (items not in
  // the checkpoint hold a place but make no request), so request and item indices differ; rank 5
  // also wants one tensor twice that no other rank wants (a group within one rank).
  auto ranks = random_requests();
  ranks[5].push_back(LoadRequest{"only rank 5 wants this", 64});
  ranks[5].push_back(LoadRequest{"only rank 5 wants this", 64});
  std::vector<std::vector<int>> item_of(ranks.size());
  std::vector<size_t> items(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    int item = 0;
    for (size_t k = 0; k < ranks[r].size(); ++k, ++item) {
      if ((item + static_cast<int>(r)) % 7 == 0) ++item;  // a skipped item before this request's
      item_of[r].push_back(item);
    }
    items[r] = static_cast<size_t>(item) + r % 2;  // odd ranks end with a skipped item
  }
  const LoadPlan plan = plan_load(ranks, true);
  const ReferencePlan ref = reference_plan_load(ranks, true);
  const RoleTable table = assign_roles(plan, item_of, items);
  ASSERT_EQ(table.ranks(), ranks.size());
  // Roles written out plainly from the reference plan: the reader reads and sends to every other
  // member's rank (a rank wanting the bytes twice is sent nothing), the others receive from it.
  size_t reads = 0, receives = 0, self_only = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::vector<ItemRole> want(items[r]);
    for (size_t g = 0; g < ref.groups.size(); ++g)
      for (const LoadMember& m : ref.groups[g].members) {
        if (m.rank != static_cast<int>(r)) continue;
        ItemRole& role = want[static_cast<size_t>(item_of[r][static_cast<size_t>(m.item)])];
        role.group = static_cast<int32_t>(g);
        if (ref.groups[g].reader == m.rank) {
          role.role = Role::kRead;
          for (const LoadMember& o : ref.groups[g].members)
            if (o.rank != m.rank) role.targets.push_back(o.rank);
          self_only += role.targets.empty() && ref.groups[g].members.size() > 1;
          ++reads;
        } else {
          role.role = Role::kReceive;
          role.peer = ref.groups[g].reader;
          ++receives;
        }
      }
    ASSERT_EQ(table.items(r), items[r]) << "rank " << r;
    const std::vector<ItemRole> got = table.roles_of(plan, r);
    ASSERT_EQ(got.size(), want.size()) << "rank " << r;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i], want[i]) << "rank " << r << " item " << i;
      EXPECT_EQ(table.group(r, i), want[i].role == Role::kSkip ? -1 : want[i].group) << "rank " << r << " item " << i;
    }
  }
  EXPECT_GT(reads, 2000u);
  EXPECT_GT(receives, 10000u);
  EXPECT_GE(self_only, 2u);  // rank 5's two items read, sent to no one
  size_t within_one_rank = 0;
  for (size_t g = 0; g < ref.groups.size(); ++g) {
    bool crosses = false;
    for (const LoadMember& m : ref.groups[g].members) crosses = crosses || m.rank != ref.groups[g].reader;
    EXPECT_EQ(plan.crosses_ranks(g), crosses) << "group " << g;
    within_one_rank += !crosses;
  }
  EXPECT_GE(within_one_rank, 1u);
}

TEST(SavePlan, WritesSplitLargeRegionsIntoConsecutivePieces) {
  // One rank holding a [10, 10] f32 tensor, pieces of at most 120 bytes (30 elements).
  const std::vector<std::vector<ItemDesc>> ranks{
      {{"model/w", DType::kF32, Shape{10, 10}, ShardSpec::whole(Shape{10, 10})}}};
  auto plan = plan_save(ranks);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  auto writes = plan_writes(0, plan->tensors, ranks[0], 120);
  ASSERT_TRUE(writes.ok());
  ASSERT_EQ(writes->size(), 4u);  // 30 + 30 + 30 + 10 elements
  int64_t next = 0;
  for (size_t k = 0; k < writes->size(); ++k) {
    const WriteItem& w = (*writes)[k];
    ASSERT_TRUE(w.box.flat.has_value());
    EXPECT_EQ(w.box.flat->first, next);
    EXPECT_EQ(w.src_offset, static_cast<uint64_t>(next) * 4);
    EXPECT_EQ(w.bytes, static_cast<uint64_t>(w.box.flat->second - w.box.flat->first) * 4);
    EXPECT_EQ(w.region_end, k + 1 == writes->size());
    next = w.box.flat->second;
  }
  EXPECT_EQ(next, 100);
  // Unlimited pieces: one write per region, as the plan assigned it.
  auto whole = plan_writes(0, plan->tensors, ranks[0], UINT64_MAX);
  ASSERT_TRUE(whole.ok());
  ASSERT_EQ(whole->size(), 1u);
  EXPECT_EQ((*whole)[0].bytes, 400u);
  // A rank asked to write a region it does not hold is a planning bug, reported.
  auto wrong = plan_writes(0, plan->tensors, {{"model/other", DType::kF32, Shape{1}, ShardSpec::whole(Shape{1})}}, 120);
  EXPECT_FALSE(wrong.ok());
}

}  // namespace
}  // namespace h5ckpt::planner
