// The load contract: a load checks the whole request before reading a byte and fails with one
// error, the same on every rank, naming every missing key, shape mismatch, refused dtype and the
// keys nobody asked for; the strictness modes; and a save that creates the directories above it.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "storage/posix_io.h"
#include "support/test_model.h"

using namespace h5ckpt;
using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;
namespace fs = std::filesystem;

namespace {

void expect_same_on_all_ranks(const std::string& text) {
  uint64_t h = XXH3_64bits(text.data(), text.size()), lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi) << "ranks disagree; this rank has: " << text;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The value saved at global flat index i of tensor number `k` (independent of any layout).
float value_of(int k, int64_t i) { return static_cast<float>(1000 * (k + 1)) + 0.25f * static_cast<float>(i); }

constexpr int64_t kRows = 12, kCols = 6;
// The saved checkpoint: model/a [12,6] and model/b [12,6] split by rows over the ranks, model/n [5]
// replicated, opt/k0..opt/k2 [4] replicated.
const char* const kSaved[] = {"model/a", "model/b", "model/n", "opt/k0", "opt/k1", "opt/k2"};

class LoadContract : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "contract");
    ASSERT_FALSE(root_.empty());
    auto t = Topology::create(MPI_COMM_WORLD, {1, world_size(), 1});
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    topo_.emplace(std::move(t).value());
    StateDict sd;
    std::vector<std::vector<float>> bufs;
    for (int k = 0; k < 6; ++k) {
      const std::string key = kSaved[k];
      if (k < 2) {
        ShardSpec s = ShardSpec::split({kRows, kCols}, 0, world_size(), world_rank());
        auto& b = bufs.emplace_back(static_cast<size_t>(s.numel()));
        for (int64_t j = 0; j < s.numel(); ++j) b[j] = value_of(k, s.box.offset[0] * kCols + j);
        sd.add(key, DType::kF32, {kRows, kCols}, s, b.data());
      } else {
        const int64_t n = k == 2 ? 5 : 4;
        auto& b = bufs.emplace_back(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j) b[j] = value_of(k, j);
        sd.add_replicated(key, DType::kF32, {n}, b.data());
      }
    }
    Checkpointer ck(*topo_);
    auto saved = ck.save(sd, good());
    ASSERT_TRUE(saved.ok()) << saved.status().to_string();
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    topo_.reset();
    if (world_rank() == 0) fs::remove_all(root_);
  }
  std::string good() const { return root_ + "/good"; }

  // This rank's rows of model/a, and a buffer for them filled with a sentinel.
  ShardSpec rows() const { return ShardSpec::split({kRows, kCols}, 0, world_size(), world_rank()); }
  void expect_rows_of(int k, const std::vector<float>& b) {
    const ShardSpec s = rows();
    ASSERT_EQ(static_cast<int64_t>(b.size()), s.numel());
    for (int64_t j = 0; j < s.numel(); ++j)
      ASSERT_EQ(b[j], value_of(k, s.box.offset[0] * kCols + j)) << kSaved[k] << " element " << j;
  }

  std::string root_;
  std::optional<Topology> topo_;
};

// One error names all 3 missing keys, both shape mismatches and the refused dtype, with the keys
// nobody asked for, on every rank; and nothing was read (a correct item's buffer is untouched).
TEST_F(LoadContract, OneErrorNamesEveryProblem) {
  Checkpointer ck(*topo_);
  StateDict sd;
  std::vector<float> a(static_cast<size_t>(rows().numel()), -7.0f);
  std::vector<float> wide(kRows * 8), n9(9), c(3), d(3), e(3);
  std::vector<int32_t> n_as_int(5);
  sd.add("model/a", DType::kF32, {kRows, kCols}, rows(), a.data());    // fine
  sd.add_replicated("model/b", DType::kF32, {kRows, 8}, wide.data());  // shape mismatch
  sd.add_replicated("opt/k0", DType::kF32, {9}, n9.data());            // shape mismatch
  sd.add_replicated("model/n", DType::kI32, {5}, n_as_int.data());     // dtype refused
  sd.add_replicated("model/c", DType::kF32, {3}, c.data());            // missing
  sd.add_replicated("model/d", DType::kF32, {3}, d.data());            // missing
  sd.add_replicated("model/e", DType::kF32, {3}, e.data());            // missing
  auto r = ck.load(sd, good());
  ASSERT_FALSE(r.ok());
  const std::string msg = r.status().to_string();
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound) << msg;
  for (const char* part :
       {"3 keys missing from the checkpoint: 'model/c', 'model/d', 'model/e'",
        "2 shape mismatches: ", "'model/b': checkpoint has global shape [12,6], the state wants [12,8]",
        "'opt/k0': checkpoint has global shape [4], the state wants [9]",
        "1 dtype refused: ", "'model/n': checkpoint holds f32, the state wants i32",
        "2 keys in the checkpoint the state does not ask for (not an error): 'opt/k1', 'opt/k2'"})
    EXPECT_TRUE(has(msg, part)) << "missing \"" << part << "\" in: " << msg;
  expect_same_on_all_ranks(msg);
  for (float x : a) ASSERT_EQ(x, -7.0f) << "a failing load wrote into a buffer";

  // check_only returns every list, the same on every rank, and reads nothing.
  LoadOptions check;
  check.check_only = true;
  auto rep = ck.load(sd, good(), check);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_EQ(rep->missing_keys, (std::vector<std::string>{"model/c", "model/d", "model/e"}));
  EXPECT_EQ(rep->unexpected_keys, (std::vector<std::string>{"opt/k1", "opt/k2"}));
  ASSERT_EQ(rep->shape_mismatches.size(), 2u);
  EXPECT_TRUE(has(rep->shape_mismatches[0], "'model/b'"));
  EXPECT_TRUE(has(rep->shape_mismatches[1], "'opt/k0'"));
  ASSERT_EQ(rep->dtype_mismatches.size(), 1u);
  EXPECT_TRUE(has(rep->dtype_mismatches[0], "'model/n'"));
  EXPECT_EQ(rep->bytes_read, 0u);
  for (float x : a) ASSERT_EQ(x, -7.0f) << "check_only wrote into a buffer";
}

// Problems seen by different ranks are merged: each rank asks for a key of its own that the
// checkpoint lacks, and every rank's error names all of them (counts complete, the first 10 shown).
TEST_F(LoadContract, ProblemsOfEveryRankInOneError) {
  Checkpointer ck(*topo_);
  StateDict sd;
  std::vector<float> a(static_cast<size_t>(rows().numel()));
  std::vector<std::vector<float>> extra(12, std::vector<float>(2));
  sd.add("model/a", DType::kF32, {kRows, kCols}, rows(), a.data());
  // 12 missing keys per rank, named after the rank: 12 * world in all.
  for (int j = 0; j < 12; ++j)
    sd.add_replicated("gone/r" + std::to_string(world_rank()) + "_" + std::to_string(j / 10) + std::to_string(j % 10),
                      DType::kF32, {2}, extra[j].data());
  auto r = ck.load(sd, good());
  ASSERT_FALSE(r.ok());
  const std::string msg = r.status().to_string();
  const int total = 12 * world_size();
  EXPECT_TRUE(has(msg, std::to_string(total) + " keys missing from the checkpoint: 'gone/r0_00'")) << msg;
  EXPECT_TRUE(has(msg, " and " + std::to_string(total - 10) + " more")) << msg;
  expect_same_on_all_ranks(msg);
  LoadOptions check;
  check.check_only = true;
  auto rep = ck.load(sd, good(), check);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  std::vector<std::string> want;
  for (int q = 0; q < world_size(); ++q)
    for (int j = 0; j < 12; ++j)
      want.push_back("gone/r" + std::to_string(q) + "_" + std::to_string(j / 10) + std::to_string(j % 10));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(rep->missing_keys, want);
}

// Unexpected keys: those no rank asked for (rank r asks for opt/k{r % 3}), sorted, on every rank.
TEST_F(LoadContract, UnexpectedKeysAreTheUnionOfRequests) {
  Checkpointer ck(*topo_);
  StateDict sd;
  std::vector<float> a(static_cast<size_t>(rows().numel())), k(4);
  const int mine = world_rank() % 3;
  sd.add("model/a", DType::kF32, {kRows, kCols}, rows(), a.data());
  sd.add_replicated("opt/k" + std::to_string(mine), DType::kF32, {4}, k.data());
  auto r = ck.load(sd, good());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::vector<std::string> want = {"model/b", "model/n"};
  for (int q = std::min(world_size(), 3); q < 3; ++q) want.push_back("opt/k" + std::to_string(q));
  EXPECT_EQ(r->unexpected_keys, want);
  EXPECT_TRUE(r->missing_keys.empty());
  expect_rows_of(0, a);
  for (int j = 0; j < 4; ++j) EXPECT_EQ(k[j], value_of(3 + mine, j));
  // The cached plan reports the same lists.
  auto again = ck.load(sd, good());
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_TRUE(again->plan_cached);
  EXPECT_EQ(again->unexpected_keys, want);
}

TEST_F(LoadContract, StrictnessModes) {
  Checkpointer ck(*topo_);
  std::vector<float> a(static_cast<size_t>(rows().numel())), zz(3, 5.0f), wide(kRows * 8);
  StateDict subset;
  subset.add("model/a", DType::kF32, {kRows, kCols}, rows(), a.data());
  const std::vector<std::string> others = {"model/b", "model/n", "opt/k0", "opt/k1", "opt/k2"};

  // Default: a subset loads; the rest is reported.
  auto def = ck.load(subset, good());
  ASSERT_TRUE(def.ok()) << def.status().to_string();
  EXPECT_EQ(def->unexpected_keys, others);
  expect_rows_of(0, a);

  // kRaiseAll: the same subset fails, naming the keys nobody asked for.
  LoadOptions all;
  all.strictness = LoadStrictness::kRaiseAll;
  std::fill(a.begin(), a.end(), 0.0f);
  auto raised = ck.load(subset, good(), all);
  ASSERT_FALSE(raised.ok());
  EXPECT_EQ(raised.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(has(raised.status().message(),
                  "5 keys in the checkpoint the state does not ask for: 'model/b', 'model/n', 'opt/k0', 'opt/k1', "
                  "'opt/k2'"))
      << raised.status().to_string();
  expect_same_on_all_ranks(raised.status().to_string());
  for (float x : a) ASSERT_EQ(x, 0.0f);

  // kRaiseAll with every key asked for loads.
  StateDict full;
  std::vector<std::vector<float>> bufs;
  for (int k = 0; k < 6; ++k) {
    if (k < 2) {
      full.add(kSaved[k], DType::kF32, {kRows, kCols}, rows(), bufs.emplace_back(rows().numel()).data());
    } else {
      const int64_t n = k == 2 ? 5 : 4;
      full.add_replicated(kSaved[k], DType::kF32, {n}, bufs.emplace_back(n).data());
    }
  }
  auto whole = ck.load(full, good(), all);
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  EXPECT_TRUE(whole->unexpected_keys.empty());
  expect_rows_of(0, bufs[0]);
  expect_rows_of(1, bufs[1]);
  for (int k = 2; k < 6; ++k)
    for (size_t j = 0; j < bufs[k].size(); ++j) ASSERT_EQ(bufs[k][j], value_of(k, static_cast<int64_t>(j)));

  // kAllowMissing: a missing key is skipped (buffer untouched) and reported; the rest loads.
  StateDict with_missing;
  std::fill(a.begin(), a.end(), 0.0f);
  with_missing.add("model/a", DType::kF32, {kRows, kCols}, rows(), a.data());
  with_missing.add_replicated("model/zz", DType::kF32, {3}, zz.data());
  auto strict_default = ck.load(with_missing, good());
  ASSERT_FALSE(strict_default.ok());
  EXPECT_EQ(strict_default.status().code(), ErrorCode::kNotFound);
  LoadOptions allow;
  allow.strictness = LoadStrictness::kAllowMissing;
  for (const LoadOptions& o : {allow, [] {
                                 LoadOptions l;
                                 l.strict = false;
                                 return l;
                               }()}) {
    std::fill(a.begin(), a.end(), 0.0f);
    auto lax = ck.load(with_missing, good(), o);
    ASSERT_TRUE(lax.ok()) << lax.status().to_string();
    EXPECT_EQ(lax->missing_keys, std::vector<std::string>{"model/zz"});
    EXPECT_EQ(lax->unexpected_keys, others);
    expect_rows_of(0, a);
    for (float x : zz) ASSERT_EQ(x, 5.0f);
  }
  // kAllowMissing still refuses a shape mismatch, and reports the missing key beside it.
  with_missing.add_replicated("model/b", DType::kF32, {kRows, 8}, wide.data());
  auto shape = ck.load(with_missing, good(), allow);
  ASSERT_FALSE(shape.ok());
  EXPECT_EQ(shape.status().code(), ErrorCode::kShapeMismatch);
  EXPECT_TRUE(has(shape.status().message(), "1 key missing from the checkpoint (skipped, not an error): 'model/zz'"))
      << shape.status().to_string();

  // A strictness outside the enum is refused on every rank before anything happens.
  LoadOptions bad;
  bad.strictness = static_cast<LoadStrictness>(7);
  auto refused = ck.load(subset, good(), bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kInvalidArgument);
}

// ---- a save creates the directories above it --------------------------------------------------

TEST_F(LoadContract, SaveCreatesMissingParents) {
  Checkpointer ck(*topo_);
  std::vector<float> a(static_cast<size_t>(rows().numel()));
  for (int64_t j = 0; j < rows().numel(); ++j) a[j] = value_of(0, rows().box.offset[0] * kCols + j);
  StateDict sd;
  sd.add("model/a", DType::kF32, {kRows, kCols}, rows(), a.data());
  const std::string target = root_ + "/runs/exp 1/ckpt/step-1";
  auto saved = ck.save(sd, target);
  ASSERT_TRUE(saved.ok()) << saved.status().to_string();
  EXPECT_TRUE(fs::is_directory(target));
  std::ifstream latest(root_ + "/runs/exp 1/ckpt/latest");
  std::string name;
  std::getline(latest, name);
  EXPECT_EQ(name, "step-1");
  std::vector<float> back(a.size(), 0.0f);
  StateDict ld;
  ld.add("model/a", DType::kF32, {kRows, kCols}, rows(), back.data());
  auto loaded = ck.load(ld, root_ + "/runs/exp 1/ckpt");
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  expect_rows_of(0, back);
}

// A parent that cannot be made is a clear error on every rank: a file in the way (real)
// and a read-only file system (EROFS, injected into the first mkdir of rank 0).
TEST_F(LoadContract, UnmakeableParentIsAClearError) {
  Checkpointer ck(*topo_);
  std::vector<float> a(static_cast<size_t>(rows().numel()), 1.0f);
  StateDict sd;
  sd.add("model/a", DType::kF32, {kRows, kCols}, rows(), a.data());
  if (world_rank() == 0) std::ofstream(root_ + "/plain_file") << "x";
  MPI_Barrier(MPI_COMM_WORLD);
  auto blocked = ck.save(sd, root_ + "/plain_file/sub/step-1");
  ASSERT_FALSE(blocked.ok());
  const std::string m1 = blocked.status().to_string();
  EXPECT_TRUE(has(m1, "creating the parent directories of '" + root_ + "/plain_file/sub/step-1': '" + root_ +
                          "/plain_file' exists and is not a directory"))
      << m1;
  expect_same_on_all_ranks(m1);

  setenv("H5CKPT_FAULT", "op=mkdir,rank=0,nth=1,errno=EROFS", 1);
  ASSERT_TRUE(storage::io::reload_faults_for_testing().ok());
  auto ro = ck.save(sd, root_ + "/ro/deeper/step-1");
  unsetenv("H5CKPT_FAULT");
  ASSERT_TRUE(storage::io::reload_faults_for_testing().ok());
  ASSERT_FALSE(ro.ok());
  const std::string m2 = ro.status().to_string();
  EXPECT_TRUE(has(m2, "creating the parent directories of '" + root_ + "/ro/deeper/step-1'")) << m2;
  EXPECT_TRUE(has(m2, "mkdir '" + root_ + "/ro' (injected fault on rank 0")) << m2;
  EXPECT_TRUE(has(m2, "Read-only file system")) << m2;
  expect_same_on_all_ranks(m2);
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_FALSE(fs::exists(root_ + "/ro"));
}

}  // namespace
