// Multi-level checkpoints (CheckpointerOptions::local_dir): local saves with partner copies, loads
// from the newest servable level, lost and corrupted node-local storage, persists, retention and
// injected failures. Simulated nodes: H5CKPT_RANKS_PER_NODE cuts the machine, and "{node}" in
// local_dir gives each node its own directory, which the tests delete or damage as a lost node's
// disk would be. Values are a pure function of (key, global index) (support/test_model.h), plus
// a replicated "extra/saved_step" that tells the checkpoints of different steps apart.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "engine/local_level.h"
#include "storage/local_store.h"
#include "storage/posix_io.h"
#include "support/test_model.h"

using namespace h5ckpt;
using namespace h5ckpt::testing;
namespace fs = std::filesystem;

namespace {

int ranks_per_node() {
  const char* e = std::getenv("H5CKPT_RANKS_PER_NODE");
  return e && std::atoi(e) > 0 ? std::atoi(e) : 1 << 20;
}
int node_count() { return (world_size() + ranks_per_node() - 1) / ranks_per_node(); }
int my_node() { return world_rank() / ranks_per_node(); }

bool all_true(bool v) {
  int x = v ? 1 : 0, y = 0;
  MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return y == 1;
}

// A model of `layout` plus the step it was saved at.
struct Saved {
  Saved(const Layout& layout, bool fill, int64_t s) : model(layout, coords_of(layout), fill), step(fill ? s : -1) {
    all.items() = model.state().items();  // the model's checks cover only its own items
    all.add_replicated("extra/saved_step", DType::kI64, {1}, &step);
  }
  StateDict& state() { return all; }
  static RankCoords coords_of(const Layout& l) {
    const int r = world_rank();
    return {r % l.tp, (r / l.tp) % l.dp, r / (l.tp * l.dp)};
  }
  TestModel model;
  int64_t step;
  StateDict all;
};

class LocalLevel : public ::testing::Test {
 protected:
  void SetUp() override {
    root = shared_temp_dir(MPI_COMM_WORLD, "local_level");
    shared = root + "/shared";
    if (world_rank() == 0) fs::create_directories(shared);
    MPI_Barrier(MPI_COMM_WORLD);
    opts.local_dir = root + "/node{node}";
    opts.metrics = false;
    opts.async = false;
  }
  Topology topology(const Layout& l) {
    auto t = Topology::create(MPI_COMM_WORLD, {l.tp, l.dp, l.pp});
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return std::move(t).value();
  }
  std::string node_dir(int n) const { return root + "/node" + std::to_string(n); }
  std::string step_path(int64_t s) const { return shared + "/step-" + std::to_string(s); }
  // Every rank saves `layout` at `step` through `ck`.
  Result<SaveReport> save(Checkpointer& ck, const Layout& layout, int64_t step, bool persist = false) {
    Saved s(layout, true, step);
    SaveOptions so;
    so.step = step;
    so.persist = persist;
    return ck.save(s.state(), step_path(step), so);
  }
  // Loads `path` as `layout`; expects success, every element right and the step.
  void expect_loads(Checkpointer& ck, const Layout& layout, const std::string& path, int64_t step,
                    LoadReport* out = nullptr) {
    Saved s(layout, false, -1);
    auto rep = ck.load(s.state(), path);
    ASSERT_TRUE(rep.ok()) << rep.status().to_string();
    std::string first;
    EXPECT_EQ(s.model.count_mismatches(&first), 0) << first;
    EXPECT_EQ(s.step, step);
    if (out) *out = *rep;
  }
  // Deletes node n's local directory (its disk is lost), on the node's first rank.
  void lose_node(int n) {
    if (world_rank() == n * ranks_per_node()) fs::remove_all(node_dir(n));
    MPI_Barrier(MPI_COMM_WORLD);
  }
  std::string root, shared;
  CheckpointerOptions opts;
};

Layout layout_a() { return world_size() % 2 == 0 ? Layout{2, world_size() / 2, 1, true} : Layout{1, world_size(), 1}; }
Layout layout_b() {
  const int n = world_size();
  return n % 4 == 0 ? Layout{1, n / 2, 2, false} : n % 2 == 0 ? Layout{1, n, 1, false} : Layout{1, n, 1, true};
}

}  // namespace

TEST_F(LocalLevel, LocalSaveLoadsFromTheLocalLevelOnly) {
  Topology t = topology(layout_a());
  Checkpointer ck(t, opts);
  auto rep = save(ck, layout_a(), 3);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_EQ(rep->level, "local");
  EXPECT_TRUE(rep->persisted.empty());
  EXPECT_EQ(rep->path, node_dir(my_node()) + "/step-3");
  EXPECT_TRUE(fs::exists(node_dir(my_node()) + "/step-3/" + storage::local_rank_file(world_rank())));
  EXPECT_FALSE(fs::exists(step_path(3))) << "a local save must not touch the shared level";
  // Each node holds its own files and its partner's copies.
  if (node_count() > 1) {
    const int origin_node = (my_node() + node_count() - 1) % node_count();
    const int origin = origin_node * ranks_per_node() + world_rank() % ranks_per_node();
    if (origin < world_size())
      EXPECT_TRUE(fs::exists(node_dir(my_node()) + "/step-3/" + storage::local_rank_file(origin)));
  }
  auto res = ck.resolve(shared);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_EQ(res->level, "local") << res->reason;
  EXPECT_EQ(res->info.step, 3);
  LoadReport lr;
  expect_loads(ck, layout_a(), shared, 3, &lr);
  EXPECT_EQ(lr.transport, "mpi-local");
}

TEST_F(LocalLevel, ReshardsFromTheLocalLevel) {
  {
    Topology t = topology(layout_a());
    Checkpointer ck(t, opts);
    ASSERT_TRUE(save(ck, layout_a(), 5).ok());
  }
  Topology t = topology(layout_b());
  Checkpointer ck(t, opts);
  expect_loads(ck, layout_b(), shared, 5);
  // A load naming the checkpoint itself (not its directory) finds the same local copy.
  expect_loads(ck, layout_b(), step_path(5), 5);
}

// Under a tiny memory budget the load streams through a window of a few hundred bytes per peer:
// many rounds, chunks cut inside runs of mixed dtypes (u8, f32, bf16, i64; a 5-byte u8 run puts
// the f32 run after it off its alignment), a float conversion applied run by run as it lands, and
// the library's own memory within the budget.
TEST_F(LocalLevel, ReshardsThroughASmallWindowWithinTheBudget) {
  const int w = world_size();
  const int64_t per_u8 = 5, per_f32 = 301;
  auto u8_value = [](int64_t i) { return static_cast<uint8_t>(i * 37 + 11); };
  auto f32_value = [](int64_t i) { return 0.25f * static_cast<float>(i) - 7.0f; };
  {
    Topology t = topology(layout_a());
    Checkpointer ck(t, opts);
    Saved s(layout_a(), true, 9);
    // Each rank saves its own shard of both: it is their only writer, so one server's stream to
    // a rank that loads them whole is [5 bytes][301 f32] per saved rank.
    std::vector<uint8_t> u8(per_u8);
    std::vector<float> f32(per_f32);
    for (int64_t i = 0; i < per_u8; ++i) u8[i] = u8_value(world_rank() * per_u8 + i);
    for (int64_t i = 0; i < per_f32; ++i) f32[i] = f32_value(world_rank() * per_f32 + i);
    s.state().add("extra/a_u8", DType::kU8, {w * per_u8}, ShardSpec::split({w * per_u8}, 0, w, world_rank()),
                  u8.data());
    s.state().add("extra/b_converted", DType::kF32, {w * per_f32}, ShardSpec::split({w * per_f32}, 0, w, world_rank()),
                  f32.data());
    SaveOptions so;
    so.step = 9;
    ASSERT_TRUE(ck.save(s.state(), step_path(9), so).ok());
  }
  CheckpointerOptions small = opts;
  small.memory_bytes = 2048;
  Topology t = topology(layout_b());
  Checkpointer ck(t, small);
  Saved s(layout_b(), false, -1);
  std::vector<uint8_t> u8(static_cast<size_t>(w * per_u8), 0);
  std::vector<double> f64(static_cast<size_t>(w * per_f32), -1.0);  // loaded whole, as f64
  s.state().add_replicated("extra/a_u8", DType::kU8, {w * per_u8}, u8.data());
  s.state().add_replicated("extra/b_converted", DType::kF64, {w * per_f32}, f64.data());
  ck.reset_memory_peak();
  auto rep = ck.load(s.state(), shared);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_EQ(rep->transport, "mpi-local");
  std::string first;
  EXPECT_EQ(s.model.count_mismatches(&first), 0) << first;
  EXPECT_EQ(s.step, 9);
  for (int64_t i = 0; i < w * per_u8; ++i) ASSERT_EQ(u8[static_cast<size_t>(i)], u8_value(i)) << "u8 element " << i;
  for (int64_t i = 0; i < w * per_f32; ++i)
    ASSERT_EQ(f64[static_cast<size_t>(i)], static_cast<double>(f32_value(i))) << "converted element " << i;
  EXPECT_LE(ck.memory_peak_bytes(), small.memory_bytes);
  EXPECT_GT(ck.memory_peak_bytes(), 0u) << "the window was never leased from the budget";
}

TEST_F(LocalLevel, LostNodeIsServedFromItsPartnerCopy) {
  if (node_count() < 2) GTEST_SKIP() << "one node: no partner copies";
  Topology t = topology(layout_a());
  Checkpointer ck(t, opts);
  ASSERT_TRUE(save(ck, layout_a(), 6).ok());
  lose_node(node_count() - 1);  // a replaced node with an empty local disk
  auto res = ck.resolve(shared);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_EQ(res->level, "local") << res->reason;
  EXPECT_NE(res->reason.find("from partner copies"), std::string::npos) << res->reason;
  expect_loads(ck, layout_a(), shared, 6);
}

TEST_F(LocalLevel, FilesLostAfterResolveFailTheLoadEverywhereThenResolveAgain) {
  if (node_count() < 2) GTEST_SKIP() << "one node: no partner copies";
  opts.timeout_s = 30;  // a hang (requesters waiting for bytes never sent) ends the job, failing the test
  Topology t = topology(layout_a());
  Checkpointer ck(t, opts);
  ASSERT_TRUE(save(ck, layout_a(), 3).ok());
  auto res = ck.resolve(shared);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  lose_node(node_count() - 1);  // after the answer: its servers' files are gone
  Saved s(layout_a(), false, -1);
  auto rep = ck.load(s.state(), shared);  // uses the answer: a clear error on every rank, no hang
  ASSERT_FALSE(rep.ok());
  EXPECT_NE(rep.status().to_string().find("rank-"), std::string::npos) << rep.status().to_string();
  expect_loads(ck, layout_a(), shared, 3);  // resolves again: the partner copies serve
}

TEST_F(LocalLevel, CorruptFileIsServedFromAnotherCopy) {
  if (node_count() < 2) GTEST_SKIP() << "one node: no partner copies";
  Topology t = topology(layout_a());
  Checkpointer ck(t, opts);
  ASSERT_TRUE(save(ck, layout_a(), 2).ok());
  if (world_rank() == 0) {  // flip one byte in the middle of rank 0's own file on node 0
    const std::string f = node_dir(0) + "/step-2/" + storage::local_rank_file(0);
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(0, std::ios::end);
    const auto n = static_cast<std::streamoff>(io.tellg());
    ASSERT_GT(n, 0);
    io.seekg(n / 2);
    char c = 0;
    io.read(&c, 1);
    c = static_cast<char>(c ^ 0x40);
    io.seekp(n / 2);
    io.write(&c, 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  auto res = ck.resolve(shared);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_EQ(res->level, "local") << res->reason;
  expect_loads(ck, layout_a(), shared, 2);
}

TEST_F(LocalLevel, LosingANodeAndItsPartnerFallsBackToTheSharedLevel) {
  if (node_count() < 2) GTEST_SKIP() << "one node: no partner copies";
  Topology t = topology(layout_a());
  Checkpointer ck(t, opts);
  auto persisted = save(ck, layout_a(), 4, true);
  ASSERT_TRUE(persisted.ok()) << persisted.status().to_string();
  EXPECT_EQ(persisted->persisted, storage::canonical_path(step_path(4)));
  ASSERT_TRUE(save(ck, layout_a(), 6).ok());
  lose_node(0);  // node 0 and node 1, which holds node 0's copy
  lose_node(1);
  auto res = ck.resolve(shared);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_EQ(res->level, "shared") << res->reason;
  EXPECT_EQ(res->info.step, 4);
  if (node_count() > 2) {  // the message names the pieces that had no copy: node 0's ranks
    EXPECT_NE(res->reason.find("ranks 0"), std::string::npos) << res->reason;
    EXPECT_NE(res->reason.find("saved on node 0"), std::string::npos) << res->reason;
    EXPECT_EQ(res->reason.find("saved on node 2"), std::string::npos) << res->reason;
  } else {  // every local disk is gone
    EXPECT_NE(res->reason.find("no local checkpoint"), std::string::npos) << res->reason;
  }
  LoadReport lr;
  expect_loads(ck, layout_a(), shared, 4, &lr);
  EXPECT_NE(lr.transport, "mpi-local");
  // The shared checkpoint is the normal format: a Checkpointer without a local level reads it.
  CheckpointerOptions plain = opts;
  plain.local_dir.clear();
  Checkpointer ck2(t, plain);
  expect_loads(ck2, layout_a(), shared, 4);
}

TEST_F(LocalLevel, AsyncSavePersistsEveryKthStepFromTheLocalCopy) {
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) GTEST_SKIP() << "needs MPI_THREAD_MULTIPLE";
  opts.async = true;
  opts.persist_every = 2;
  opts.local_keep = 2;
  Topology t = topology(layout_a());
  Checkpointer ck(t, opts);
  for (int64_t step = 1; step <= 4; ++step) {
    Saved s(layout_a(), true, step);
    SaveOptions so;
    so.step = step;
    auto h = ck.save_async(s.state(), step_path(step), so);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    s.model.scribble();  // the snapshot is taken: the trainer goes on
    s.step = -7;
    auto rep = h->wait();
    ASSERT_TRUE(rep.ok()) << rep.status().to_string();
    EXPECT_EQ(rep->level, "local");
    EXPECT_EQ(rep->persisted.empty(), step % 2 != 0) << "step " << step;
    EXPECT_EQ(fs::exists(step_path(step)), step % 2 == 0) << "step " << step;
  }
  // Retention per level: two local checkpoints per node; the shared level keeps both persists.
  EXPECT_FALSE(fs::exists(node_dir(my_node()) + "/step-1"));
  EXPECT_FALSE(fs::exists(node_dir(my_node()) + "/step-2"));
  EXPECT_TRUE(fs::exists(node_dir(my_node()) + "/step-4"));
  auto info = read_checkpoint_info(step_path(4));
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->step, 4);
  EXPECT_TRUE(verify_checkpoint(*info, world_rank(), world_size()).ok());
  CheckpointerOptions plain = opts;
  plain.local_dir.clear();
  Checkpointer ck2(t, plain);
  expect_loads(ck2, layout_b(), step_path(4), 4);
  expect_loads(ck, layout_a(), shared, 4);
}

// Retention keeps the checkpoint it drops as the spare, whose files the next save overwrites in
// place (the same inodes) and cuts to their new, shorter size; the spare is never listed, and the
// partner copies, recycled and cut too, serve a lost node with the newest values.
TEST_F(LocalLevel, SpareFilesAreOverwrittenInPlaceAndCutToSize) {
  opts.local_keep = 1;
  Topology t = topology(layout_a());
  Checkpointer ck(t, opts);
  // Steps 1 and 2 carry a padding blob (its bytes differ per step) that step 3 lacks: step 3's
  // files are shorter than the spare's, and every offset after the blob holds other bytes.
  std::vector<uint8_t> padding(3000);
  auto save_with = [&](int64_t step, bool padded) {
    Saved s(layout_a(), true, step);
    for (size_t i = 0; i < padding.size(); ++i) padding[i] = static_cast<uint8_t>(i * 7 + step);
    if (padded)
      s.state().add(
          "extra/a_padding", DType::kU8, {static_cast<int64_t>(padding.size()) * world_size()},
          ShardSpec::split({static_cast<int64_t>(padding.size()) * world_size()}, 0, world_size(), world_rank()),
          padding.data());
    SaveOptions so;
    so.step = step;
    return ck.save(s.state(), step_path(step), so);
  };
  ASSERT_TRUE(save_with(1, true).ok());
  MPI_Barrier(MPI_COMM_WORLD);  // the node leaders' retention runs after the others return
  const std::string mine = storage::local_rank_file(world_rank());
  struct stat first {};
  ASSERT_EQ(::stat((node_dir(my_node()) + "/step-1/" + mine).c_str(), &first), 0);
  ASSERT_TRUE(save_with(2, true).ok());
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string spare = node_dir(my_node()) + "/" + storage::kLocalSpareName;
  EXPECT_FALSE(fs::exists(node_dir(my_node()) + "/step-1"));
  EXPECT_TRUE(fs::exists(spare + "/" + mine)) << "retention keeps the dropped checkpoint's files as the spare";
  EXPECT_FALSE(fs::exists(spare + "/" + storage::kLocalManifestName)) << "the spare must not look like a checkpoint";
  for (const auto& e : storage::list_local_checkpoints(node_dir(my_node()), ""))
    EXPECT_EQ(e.name, "step-2") << "only the kept checkpoint is listed";
  std::error_code size_ec;
  const uint64_t spare_size = fs::file_size(spare + "/" + mine, size_ec);
  EXPECT_FALSE(size_ec) << size_ec.message();
  MPI_Barrier(MPI_COMM_WORLD);  // every node has looked at its spare before the next save takes it
  ASSERT_TRUE(save_with(3, false).ok());
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string third = node_dir(my_node()) + "/step-3/" + mine;
  struct stat now {};
  ASSERT_EQ(::stat(third.c_str(), &now), 0);
  EXPECT_EQ(now.st_ino, first.st_ino) << "step 3 wrote a new file instead of the spare's";
  EXPECT_LT(static_cast<uint64_t>(now.st_size), spare_size) << "the test needs a shorter file";
  // The loads read step 3's values and sizes: the files were cut (a longer file fails resolution).
  auto res = ck.resolve(shared);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_EQ(res->level, "local") << res->reason;
  EXPECT_EQ(res->info.step, 3);
  expect_loads(ck, layout_a(), shared, 3);
  if (node_count() < 2) return;
  lose_node(node_count() - 1);  // served from the recycled partner copies
  res = ck.resolve(shared);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_EQ(res->level, "local") << res->reason;
  EXPECT_NE(res->reason.find("from partner copies"), std::string::npos) << res->reason;
  expect_loads(ck, layout_a(), shared, 3);
}

// Under memory_bytes the partner streams go in chunks of a quarter of the budget over the window's
// slots (here 1 KiB: one partner, four slots; files of several chunks), leased from the budget
// with the rest of the save.
TEST_F(LocalLevel, PartnerCopiesStreamInChunksWithinTheBudget) {
  if (node_count() < 2) GTEST_SKIP() << "one node: no partner copies";
  opts.memory_bytes = 16 << 10;
  Topology t = topology(layout_a());
  Checkpointer ck(t, opts);
  for (int64_t step = 1; step <= 2; ++step) {
    ck.reset_memory_peak();
    auto rep = save(ck, layout_a(), step);
    ASSERT_TRUE(rep.ok()) << rep.status().to_string();
    EXPECT_LE(ck.memory_peak_bytes(), opts.memory_bytes);
    EXPECT_GT(ck.memory_peak_bytes(), 0u) << "the window was not leased from the budget";
    EXPECT_GT(fs::file_size(node_dir(my_node()) + "/step-" + std::to_string(step) + "/" +
                            storage::local_rank_file(world_rank())),
              uint64_t{2 * 1024})
        << "the test needs streams of several chunks";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  lose_node(node_count() - 1);
  auto res = ck.resolve(shared);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_NE(res->reason.find("from partner copies"), std::string::npos) << res->reason;
  expect_loads(ck, layout_a(), shared, 2);
}

TEST_F(LocalLevel, FailedLocalSaveLeavesThePreviousOneSelected) {
  Topology t = topology(layout_a());
  Checkpointer ck(t, opts);
  ASSERT_TRUE(save(ck, layout_a(), 7).ok());
  // The last rank's local file write fails (a full node-local disk).
  const int victim = world_size() - 1;
  ASSERT_EQ(setenv("H5CKPT_FAULT", ("op=pwrite,rank=" + std::to_string(victim) + ",errno=ENOSPC").c_str(), 1), 0);
  ASSERT_TRUE(storage::io::reload_faults_for_testing().ok());
  auto rep = save(ck, layout_a(), 8);
  unsetenv("H5CKPT_FAULT");
  ASSERT_TRUE(storage::io::reload_faults_for_testing().ok());
  ASSERT_FALSE(rep.ok());
  EXPECT_NE(rep.status().to_string().find("No space left"), std::string::npos) << rep.status().to_string();
  EXPECT_FALSE(fs::exists(node_dir(my_node()) + "/step-8"));
  EXPECT_FALSE(fs::exists(storage::local_partial_dir(node_dir(my_node()), "step-8"))) << "the partial save is removed";
  auto res = ck.resolve(shared);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_EQ(res->info.step, 7);
  expect_loads(ck, layout_a(), shared, 7);
}

// A file that cannot be cut to its size (the save overwrote a longer spare file in place) fails
// the save on every rank, naming the call and the file; the previous checkpoint stays selected.
TEST_F(LocalLevel, FileThatCannotBeCutFailsTheSave) {
  Topology t = topology(layout_a());
  Checkpointer ck(t, opts);
  ASSERT_TRUE(save(ck, layout_a(), 7).ok());
  const int victim = world_size() - 1;
  ASSERT_EQ(setenv("H5CKPT_FAULT", ("op=ftruncate,rank=" + std::to_string(victim) + ",errno=EIO").c_str(), 1), 0);
  ASSERT_TRUE(storage::io::reload_faults_for_testing().ok());
  auto rep = save(ck, layout_a(), 8);
  unsetenv("H5CKPT_FAULT");
  ASSERT_TRUE(storage::io::reload_faults_for_testing().ok());
  ASSERT_FALSE(rep.ok());
  const std::string msg = rep.status().to_string();
  EXPECT_NE(msg.find("ftruncate"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank-" + std::to_string(victim) + ".bin"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(node_dir(my_node()) + "/step-8"));
  auto res = ck.resolve(shared);
  ASSERT_TRUE(res.ok()) << res.status().to_string();
  EXPECT_EQ(res->info.step, 7);
  expect_loads(ck, layout_a(), shared, 7);
}

TEST_F(LocalLevel, MissingKeyAndWrongShapeAreClearErrors) {
  Topology t = topology(layout_a());
  Checkpointer ck(t, opts);
  ASSERT_TRUE(save(ck, layout_a(), 1).ok());
  Saved s(layout_a(), false, -1);
  std::vector<float> extra(3);
  s.state().add_replicated("model/not.saved", DType::kF32, {3}, extra.data());
  auto rep = ck.load(s.state(), shared);
  ASSERT_FALSE(rep.ok());
  EXPECT_EQ(rep.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(rep.status().to_string().find("model/not.saved"), std::string::npos) << rep.status().to_string();
  StateDict wrong;
  int64_t step = 0;
  wrong.add_replicated("extra/saved_step", DType::kI64, {2}, &step);
  rep = ck.load(wrong, shared);
  ASSERT_FALSE(rep.ok());
  EXPECT_EQ(rep.status().code(), ErrorCode::kShapeMismatch) << rep.status().to_string();
  LoadOptions lenient;
  lenient.strict = false;
  Saved s2(layout_a(), false, -1);
  s2.state().add_replicated("model/not.saved", DType::kF32, {3}, extra.data());
  rep = ck.load(s2.state(), shared, lenient);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_EQ(rep->missing_keys, std::vector<std::string>{"model/not.saved"});
  std::string first;
  EXPECT_EQ(s2.model.count_mismatches(&first), 0) << first;
}

TEST_F(LocalLevel, LocalDirSharedByNodesIsRefused) {
  if (node_count() < 2) GTEST_SKIP() << "one node";
  opts.local_dir = root + "/one-for-all";  // no {node}: every simulated node sees the same directory
  Topology t = topology(layout_a());
  Checkpointer ck(t, opts);
  auto rep = save(ck, layout_a(), 1);
  ASSERT_FALSE(rep.ok());
  EXPECT_EQ(rep.status().code(), ErrorCode::kInvalidArgument) << rep.status().to_string();
  EXPECT_NE(rep.status().to_string().find("is shared by nodes"), std::string::npos) << rep.status().to_string();
  EXPECT_FALSE(fs::exists(root + "/one-for-all/step-1"));
}

TEST(LocalManifest, RoundTripsAndRefusesDamage) {
  storage::LocalManifest m;
  m.name = "step-5";
  m.shared_path = "/x/ck/step-5";
  m.step = 5;
  m.library_version = "t";
  m.sizes = {2, 1, 1, 1, 1};
  m.coords = {{0, 0, 0, 0, 0, 0}, {1, 0, 0, 0, 0, 0}};
  m.node_of_rank = {0, 1};
  m.attributes = {{"a", "b"}};
  m.files = {{10, 0x1234}, {0, 0}};
  m.plan = std::string("\x01\x02\x00\x03", 4);
  const std::string bytes = storage::encode_local_manifest(m);
  auto back = storage::decode_local_manifest(bytes);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->shared_path, m.shared_path);
  EXPECT_EQ(back->parent(), "/x/ck");
  EXPECT_EQ(back->files[0].bytes, 10u);
  EXPECT_EQ(back->files[0].xxh3, 0x1234u);
  EXPECT_EQ(back->plan, m.plan);
  EXPECT_EQ(back->node_of_rank, m.node_of_rank);
  EXPECT_EQ(back->sizes.tp, 2);
  // A CP job: world = tp * cp * dp * pp, coordinates with their cp, ep and edp.
  storage::LocalManifest cpm = m;
  cpm.sizes = {1, 1, 1, 2, 2};
  cpm.coords = {{0, 0, 0, 0, 0, 0}, {0, 0, 0, 1, 1, 0}};
  auto cpback = storage::decode_local_manifest(storage::encode_local_manifest(cpm));
  ASSERT_TRUE(cpback.ok()) << cpback.status().to_string();
  EXPECT_EQ(cpback->sizes.cp, 2);
  EXPECT_EQ(cpback->sizes.ep, 2);
  EXPECT_EQ(cpback->coords[1].cp, 1);
  EXPECT_EQ(cpback->coords[1].ep, 1);
  for (size_t at : {size_t{0}, size_t{20}, bytes.size() / 2, bytes.size() - 1}) {
    std::string bad = bytes;
    bad[at] = static_cast<char>(bad[at] ^ 1);
    EXPECT_FALSE(storage::decode_local_manifest(bad).ok()) << "flipped byte " << at;
  }
  EXPECT_FALSE(storage::decode_local_manifest(bytes.substr(0, bytes.size() - 3)).ok());
}
