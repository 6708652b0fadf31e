// Authenticated checkpoints (issue 25): with a key, what someone who can write the files but lacks
// the key makes is refused by load and verify, naming what failed; without a key, nothing changes.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "storage/auth.h"
#include "storage/commit.h"
#include "storage/signed_json.h"
#include "support/test_model.h"

using namespace h5ckpt;
using h5ckpt::testing::Layout;
using h5ckpt::testing::sum_all;
using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;
namespace fs = std::filesystem;

namespace {

class Auth : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "auth");
    ASSERT_FALSE(root_.empty());
    if (world_rank() == 0) {
      std::ofstream(root_ + "/key-a") << "0123456789abcdef-the-first-test-key";
      std::ofstream(root_ + "/key-b") << "fedcba9876543210-the-other-test-key";
    }
    MPI_Barrier(MPI_COMM_WORLD);
    layout_ = Layout{1, world_size(), 1, true};
    auto t = Topology::create(MPI_COMM_WORLD, {layout_.tp, layout_.dp, layout_.pp});
    ASSERT_TRUE(t.ok());
    topo_.emplace(std::move(t).value());
  }
  void TearDown() override {
    ASSERT_TRUE(set_auth_key_file("").ok());
    MPI_Barrier(MPI_COMM_WORLD);
    topo_.reset();
    if (world_rank() == 0) fs::remove_all(root_);
  }
  CheckpointerOptions with_key(const std::string& name) const {
    CheckpointerOptions o;
    if (!name.empty()) o.auth_key_file = root_ + "/" + name;
    return o;
  }
  Status save(const std::string& path, const std::string& key) {
    h5ckpt::testing::TestModel model(layout_, topo_->coords(), true);
    Checkpointer ck(*topo_, with_key(key));
    return ck.save(model.state(), path).status();
  }
  // Loads with `key` (empty: none) and counts wrong elements over all ranks when it succeeds.
  Status load(const std::string& path, const std::string& key, int64_t* wrong = nullptr) {
    if (key.empty()) EXPECT_TRUE(set_auth_key_file("").ok());
    h5ckpt::testing::TestModel model(layout_, topo_->coords(), false);
    Checkpointer ck(*topo_, with_key(key));
    auto r = ck.load(model.state(), path);
    std::string first;
    if (r.ok() && wrong) *wrong = static_cast<int64_t>(sum_all(static_cast<uint64_t>(model.count_mismatches(&first))));
    return r.status();
  }
  // Rank 0 edits a file; everyone waits.
  template <class F>
  void on_rank0(F&& f) {
    if (world_rank() == 0) f();
    MPI_Barrier(MPI_COMM_WORLD);
  }
  std::string root_;
  Layout layout_;
  std::optional<Topology> topo_;
};

void flip_byte(const std::string& file, uint64_t at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x20);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

std::string slurp(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_F(Auth, RoundTripAndVerifyWithTheKey) {
  ASSERT_TRUE(save(root_ + "/a", "key-a").ok());
  int64_t wrong = -1;
  const Status st = load(root_ + "/a", "key-a", &wrong);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(wrong, 0);
  auto info = read_checkpoint_info(root_ + "/a");
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_TRUE(verify_checkpoint(*info).ok());
  // The summary names the key and carries a MAC, not an xxh3.
  const auto j = nlohmann::json::parse(slurp(root_ + "/a/metadata.json"));
  EXPECT_EQ(j["auth"]["key_id"], storage::auth::key_id());
  EXPECT_TRUE(j.contains("index_mac"));
  EXPECT_FALSE(j.contains("index_xxh3"));
}

TEST_F(Auth, RefusedWithoutTheKeyOrWithAnother) {
  ASSERT_TRUE(save(root_ + "/a", "key-a").ok());
  Status st = load(root_ + "/a", "");
  EXPECT_EQ(st.code(), ErrorCode::kCorrupt);
  EXPECT_NE(st.message().find("configure that key"), std::string::npos) << st.to_string();
  st = load(root_ + "/a", "key-b");
  EXPECT_EQ(st.code(), ErrorCode::kCorrupt);
  EXPECT_NE(st.message().find("not with the configured key"), std::string::npos) << st.to_string();
}

TEST_F(Auth, UnauthenticatedRefusedWhenAKeyIsConfigured) {
  ASSERT_TRUE(save(root_ + "/plain", "").ok());
  EXPECT_TRUE(load(root_ + "/plain", "").ok());  // without a key nothing changes
  const Status st = load(root_ + "/plain", "key-a");
  EXPECT_EQ(st.code(), ErrorCode::kCorrupt);
  EXPECT_NE(st.message().find("not authenticated"), std::string::npos) << st.to_string();
}

TEST_F(Auth, FlippedDataByteRefusedByLoadAndVerify) {
  ASSERT_TRUE(save(root_ + "/a", "key-a").ok());
  auto info = read_checkpoint_info(root_ + "/a");
  ASSERT_TRUE(info.ok());
  const TensorInfo& t = info->tensors.front();
  on_rank0([&] { flip_byte(root_ + "/a/data.h5", static_cast<uint64_t>(t.file_offset) + t.nbytes / 2); });
  const Status st = load(root_ + "/a", "key-a");
  EXPECT_EQ(st.code(), ErrorCode::kCorrupt) << st.to_string();
  auto again = read_checkpoint_info(root_ + "/a");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(verify_checkpoint(*again).code(), ErrorCode::kCorrupt);
}

// What a forger without the key can do: rewrite the summary's signature as an unkeyed one (the
// format-v2 xxh3), with the data and tables changed to match. Refused: the key is configured.
TEST_F(Auth, ResignedWithoutTheKeyRefused) {
  ASSERT_TRUE(save(root_ + "/a", "key-a").ok());
  on_rank0([&] {
    auto j = nlohmann::json::parse(slurp(root_ + "/a/metadata.json"));
    j.erase("auth");
    j.erase("index_mac");
    j["step"] = 999;
    ASSERT_TRUE(storage::auth::configure("").ok());  // the forger has no key
    const std::string forged = storage::dump_signed_json(j);
    std::ofstream(root_ + "/a/metadata.json", std::ios::trunc) << forged;
  });
  Status st = load(root_ + "/a", "key-a");
  EXPECT_EQ(st.code(), ErrorCode::kCorrupt);
  EXPECT_NE(st.message().find("not authenticated"), std::string::npos) << st.to_string();
  // Keeping the "auth" member with a recomputed (unkeyed) digest fails the MAC instead.
  on_rank0([&] {
    auto j = nlohmann::json::parse(slurp(root_ + "/a/metadata.json"));
    j.erase("index_xxh3");
    j["auth"] = {{"alg", "blake2b-keyed"}, {"key_id", storage::auth::key_id()}};
    j["index_mac"] = std::string(64, '0');
    std::ofstream(root_ + "/a/metadata.json", std::ios::trunc) << j.dump();
  });
  st = load(root_ + "/a", "key-a");
  EXPECT_EQ(st.code(), ErrorCode::kCorrupt);
  EXPECT_NE(st.message().find("authentication failed"), std::string::npos) << st.to_string();
}

// The data file of another checkpoint made with the same key (other values): the blocks are bound
// to the key, but also to what they hold, so the other file's bytes fail.
TEST_F(Auth, SwappedDataFileRefused) {
  ASSERT_TRUE(save(root_ + "/a", "key-a").ok());
  {
    h5ckpt::testing::TestModel model(layout_, topo_->coords(), true);
    model.scribble();  // other values, same structure
    Checkpointer ck(*topo_, with_key("key-a"));
    ASSERT_TRUE(ck.save(model.state(), root_ + "/b").ok());
  }
  on_rank0([&] { fs::copy_file(root_ + "/b/data.h5", root_ + "/a/data.h5", fs::copy_options::overwrite_existing); });
  const Status st = load(root_ + "/a", "key-a");
  EXPECT_EQ(st.code(), ErrorCode::kCorrupt) << st.to_string();
}

TEST_F(Auth, DifferentKeysOnRanksRefusedEverywhere) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  h5ckpt::testing::TestModel model(layout_, topo_->coords(), true);
  Checkpointer ck(*topo_, with_key(world_rank() == 0 ? "key-a" : "key-b"));
  const Status st = ck.save(model.state(), root_ + "/mixed").status();
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("different keys"), std::string::npos) << st.to_string();
  EXPECT_FALSE(fs::exists(root_ + "/mixed"));
}

TEST_F(Auth, ShortOrMissingKeyFileRefused) {
  on_rank0([&] { std::ofstream(root_ + "/short") << "too short"; });
  h5ckpt::testing::TestModel model(layout_, topo_->coords(), true);
  for (const char* name : {"short", "missing"}) {
    Checkpointer ck(*topo_, with_key(name));
    const Status st = ck.save(model.state(), root_ + "/x").status();
    EXPECT_FALSE(st.ok()) << name;
    EXPECT_NE(st.to_string().find("auth_key_file"), std::string::npos) << st.to_string();
  }
}
