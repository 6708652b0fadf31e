// Unit tests of retention (storage/retention.h, h5ckpt::prune_checkpoints), the choice of what a
// directory load selects (storage::resolve_checkpoint_dir), the save lock, the overwrite publish
// and its crash windows, and the keep_last / keep_every settings. No MPI launch: checkpoints
// here are tiny directories with valid metadata and a data file of the right size.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "h5ckpt/checkpoint_info.h"
#include "h5ckpt/config.h"
#include "storage/commit.h"
#include "storage/meta_v1.h"
#include "storage/retention.h"

namespace h5ckpt::storage {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> del(const std::vector<RetentionEntry>& e, int64_t last, int64_t every,
                             const std::string& latest = "", const std::vector<std::string>& protect = {}) {
  return select_for_deletion(e, last, every, latest, protect);
}

std::vector<RetentionEntry> steps(std::initializer_list<int64_t> s) {
  std::vector<RetentionEntry> out;
  for (int64_t v : s) out.push_back({"step-" + std::to_string(100 + v), v});  // names sort like steps
  return out;
}

TEST(SelectForDeletion, KeepAllWhenKeepLastIsZero) {
  EXPECT_TRUE(del(steps({1, 2, 3, 4}), 0, 0).empty());
  EXPECT_TRUE(del(steps({1, 2, 3, 4}), 0, 2).empty());
}

TEST(SelectForDeletion, KeepsNewestAndMilestonesOldestFirst) {
  // Unordered input: the function orders by step itself.
  auto e = steps({3, 10, 1, 7, 4, 9, 2, 8, 6, 5});
  EXPECT_EQ(del(e, 3, 0), (std::vector<std::string>{"step-101", "step-102", "step-103", "step-104", "step-105",
                                                    "step-106", "step-107"}));
  EXPECT_EQ(del(e, 3, 4),
            (std::vector<std::string>{"step-101", "step-102", "step-103", "step-105", "step-106", "step-107"}));
  EXPECT_EQ(del(e, 1, 5), (std::vector<std::string>{"step-101", "step-102", "step-103", "step-104", "step-106",
                                                    "step-107", "step-108", "step-109"}));
  EXPECT_TRUE(del(e, 10, 0).empty());
  EXPECT_TRUE(del(e, 11, 0).empty());
}

TEST(SelectForDeletion, NeverLatestNorProtected) {
  auto e = steps({1, 2, 3, 4});
  EXPECT_EQ(del(e, 1, 0, "step-102"), (std::vector<std::string>{"step-101", "step-103"}));
  EXPECT_EQ(del(e, 1, 0, "step-102", {"step-101"}), (std::vector<std::string>{"step-103"}));
  // `latest` naming something that is not listed changes nothing.
  EXPECT_EQ(del(e, 2, 0, "elsewhere"), (std::vector<std::string>{"step-101", "step-102"}));
}

TEST(SelectForDeletion, UnsetStepsAreOldestAndNeverMilestones) {
  std::vector<RetentionEntry> e{{"b", -1}, {"a", -1}, {"s4", 4}, {"s0", 0}};
  // Newest first: s4, s0, then the unset ones by name descending (b, a).
  EXPECT_EQ(del(e, 1, 0), (std::vector<std::string>{"a", "b", "s0"}));
  EXPECT_EQ(del(e, 1, 2), (std::vector<std::string>{"a", "b"}));  // 0 is a multiple of 2
  EXPECT_EQ(del(e, 3, 0), (std::vector<std::string>{"a"}));
  // Equal steps: the name decides.
  std::vector<RetentionEntry> tie{{"x1", 5}, {"x2", 5}, {"x0", 5}};
  EXPECT_EQ(del(tie, 1, 0), (std::vector<std::string>{"x0", "x1"}));
}

// ---- directories ------------------------------------------------------------------------------

class Dir : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(test.begin(), test.end(), '/', '_');  // parameterized names
    root_ = (fs::temp_directory_path() / ("h5ckpt_retention_" + std::to_string(::getpid()) + "_" + test)).string();
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // A committed checkpoint: valid metadata for one 4-element f32 tensor, a data file holding it.
  std::string make_ckpt(const std::string& name, int64_t step) {
    CheckpointInfo info;
    info.format_version = kFormatVersion;
    info.library_version = "test";
    info.step = step;
    info.saved_sizes = ParallelSizes{1, 1, 1};
    info.saved_coords = {RankCoords{0, 0, 0}};
    TensorInfo t;
    t.key = "model/w";
    t.dtype = DType::kF32;
    t.shape = {4};
    t.nbytes = 16;
    t.file_offset = 0;
    t.regions.push_back(SavedRegion{ShardSpec::whole({4}), 0, 0});
    info.tensors.push_back(t);
    const std::string dir = root_ + "/" + name;
    fs::create_directories(dir);
    std::ofstream(dir + "/data.h5", std::ios::binary) << std::string(16, static_cast<char>(step));
    std::ofstream(dir + "/metadata.json", std::ios::binary) << metadata_to_json(info);
    return dir;
  }
  void set_latest(const std::string& text) {
    fs::remove_all(root_ + "/latest");
    std::ofstream(root_ + "/latest", std::ios::binary) << text;
  }
  std::set<std::string> names() const {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(root_))
      if (e.is_directory()) out.insert(e.path().filename().string());
    return out;
  }
  std::string resolved() const {
    auto r = resolve_checkpoint_dir(root_);
    return r.ok() ? fs::path(*r).filename().string() : "ERROR: " + r.status().to_string();
  }
  std::string root_;
};

TEST_F(Dir, SelectionFollowsValidLatest) {
  make_ckpt("step-1", 1);
  make_ckpt("step-2", 2);
  make_ckpt("step-3", 3);
  set_latest("step-2\n");
  EXPECT_EQ(resolved(), "step-2");  // an older, valid `latest` is honoured
  set_latest("step-3");
  EXPECT_EQ(resolved(), "step-3");
}

TEST_F(Dir, SelectionFallsBackToNewestValid) {
  make_ckpt("step-1", 1);
  make_ckpt("step-2", 2);
  make_ckpt("step-3", 3);
  fs::create_directories(root_ + "/.step-4.inprogress-1-2");  // never a candidate
  std::ofstream(root_ + "/.step-4.inprogress-1-2/metadata.json") << "{}";
  EXPECT_EQ(resolved(), "step-3");  // no latest
  set_latest("step-9");
  EXPECT_EQ(resolved(), "step-3");
  set_latest(std::string("\x01\x02garbage\xff", 11));
  EXPECT_EQ(resolved(), "step-3");
  set_latest("../step-2");
  EXPECT_EQ(resolved(), "step-3");
  set_latest(".step-4.inprogress-1-2");
  EXPECT_EQ(resolved(), "step-3");
  std::ofstream(root_ + "/notes.txt") << "hello";
  set_latest("notes.txt");
  EXPECT_EQ(resolved(), "step-3");
  fs::remove(root_ + "/latest");
  fs::create_directory(root_ + "/latest");
  EXPECT_EQ(resolved(), "step-3");
  fs::remove(root_ + "/latest");
  ASSERT_EQ(::mkfifo((root_ + "/latest").c_str(), 0644), 0);
  EXPECT_EQ(resolved(), "step-3");  // and did not block
  fs::remove(root_ + "/latest");
  fs::create_symlink("latest", root_ + "/latest");  // a loop
  EXPECT_EQ(resolved(), "step-3");
  fs::remove(root_ + "/latest");
  // A symbolic link out of the directory is never followed, even to a valid checkpoint.
  const std::string outside = root_ + "-outside";
  fs::create_directories(outside);
  std::ofstream(outside + "/latest") << "step-1\n";
  fs::create_symlink(outside + "/latest", root_ + "/latest");
  EXPECT_EQ(resolved(), "step-3");
  fs::remove_all(outside);
  fs::remove(root_ + "/latest");
  set_latest("step-3\n");
  // The newest is broken in several ways: the next newest that validates is chosen.
  fs::remove(root_ + "/step-3/data.h5");
  EXPECT_EQ(resolved(), "step-2");
  std::ofstream(root_ + "/step-2/metadata.json", std::ios::trunc) << "{\"format\":";
  EXPECT_EQ(resolved(), "step-1");
  fs::resize_file(root_ + "/step-1/data.h5", 8);  // shorter than the metadata says
  const std::string r = resolved();
  EXPECT_NE(r.find("ERROR: "), std::string::npos) << r;
  // Checkpoints that all fail validation: "corrupt", naming each, never "not found".
  EXPECT_NE(r.find("none validates"), std::string::npos) << r;
  EXPECT_NE(r.find("step-1:"), std::string::npos) << r;
  EXPECT_NE(r.find("step-2:"), std::string::npos) << r;
}

TEST_F(Dir, SymlinkedCheckpointIsNotFollowed) {
  make_ckpt("step-1", 1);
  const std::string outside = root_ + "-outside";
  fs::remove_all(outside);
  fs::create_directories(outside);
  fs::copy(root_ + "/step-1", outside + "/step-9", fs::copy_options::recursive);
  fs::create_symlink(outside + "/step-9", root_ + "/step-9");
  set_latest("step-9");
  EXPECT_EQ(resolved(), "step-1");
  fs::remove_all(outside);
}

TEST_F(Dir, OneCheckpointHasNoFallback) {
  make_ckpt("step-1", 1);
  const std::string two = make_ckpt("step-2", 2);
  fs::remove(two + "/metadata.json");
  auto r = resolve_checkpoint_dir(two);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kNotCommitted);
  // A metadata.json that is a FIFO is refused without blocking.
  ASSERT_EQ(::mkfifo((two + "/metadata.json").c_str(), 0644), 0);
  auto info = read_checkpoint_info(two);
  ASSERT_FALSE(info.ok());
  EXPECT_NE(info.status().message().find("not a regular file"), std::string::npos) << info.status().to_string();
  // read_checkpoint_info of the directory agrees with resolve_checkpoint_dir.
  auto dir_info = read_checkpoint_info(root_);
  ASSERT_TRUE(dir_info.ok()) << dir_info.status().to_string();
  EXPECT_EQ(fs::path(dir_info->path).filename(), "step-1");
  EXPECT_EQ(dir_info->step, 1);
}

TEST_F(Dir, EmptyDirectoryIsNotFound) {
  auto r = resolve_checkpoint_dir(root_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
}

TEST_F(Dir, ApplyRetentionKeepsTheRightSet) {
  for (int s = 1; s <= 10; ++s) make_ckpt("step-" + std::to_string(100 + s), s);
  fs::create_directories(root_ + "/.step-111.inprogress-7-7");  // a concurrent save: untouchable
  fs::create_directories(root_ + "/broken");
  std::ofstream(root_ + "/broken/metadata.json") << "not json";
  fs::create_directories(root_ + "/logs");
  set_latest("step-102\n");
  auto dry = apply_retention(root_, 3, 4, {"step-101"}, /*dry_run=*/true);
  ASSERT_TRUE(dry.ok()) << dry.status().to_string();
  EXPECT_EQ(dry->deleted, (std::vector<std::string>{"step-103", "step-105", "step-106", "step-107"}));
  EXPECT_EQ(names().size(), 13u);  // dry: nothing removed
  auto done = apply_retention(root_, 3, 4, {"step-101"}, false);
  ASSERT_TRUE(done.ok()) << done.status().to_string();
  EXPECT_EQ(done->deleted, dry->deleted);
  EXPECT_EQ(names(), (std::set<std::string>{".step-111.inprogress-7-7", "broken", "logs", "step-101", "step-102",
                                            "step-104", "step-108", "step-109", "step-110"}));
  EXPECT_EQ(done->kept,
            (std::vector<std::string>{"step-110", "step-109", "step-108", "step-104", "step-102", "step-101"}));
}

TEST_F(Dir, RetentionKeepsWhatALoadWouldSelect) {
  make_ckpt("step-1", 1);
  make_ckpt("step-2", 2);
  make_ckpt("step-3", 3);
  fs::remove(root_ + "/step-3/data.h5");  // newest and `latest`, but broken: loads select step-2
  set_latest("step-3");
  auto done = apply_retention(root_, 1, 0, {}, false);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(names(), (std::set<std::string>{"step-2", "step-3"}));
  EXPECT_EQ(resolved(), "step-2");
}

TEST_F(Dir, PruneChecksArgumentsAndLock) {
  for (int s = 1; s <= 4; ++s) make_ckpt("step-" + std::to_string(100 + s), s);
  set_latest("step-104");
  EXPECT_EQ(prune_checkpoints(root_, {0, 0, false}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(prune_checkpoints(root_ + "/step-101", {1, 0, false}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(prune_checkpoints(root_ + "/nope", {1, 0, false}).status().code(), ErrorCode::kNotFound);
  {
    // A save in progress there (this process's registry, as the coordinator of a job holds it).
    ASSERT_TRUE(acquire_save_lock(root_ + "/step-105").ok());
    auto busy = prune_checkpoints(root_, {1, 0, false});
    ASSERT_FALSE(busy.ok());
    EXPECT_EQ(busy.status().code(), ErrorCode::kAlreadyExists);
    EXPECT_NE(busy.status().message().find("pid=" + std::to_string(::getpid())), std::string::npos)
        << busy.status().to_string();
    EXPECT_TRUE(prune_checkpoints(root_, {1, 0, true}).ok());  // a dry run takes no lock
    release_save_lock(root_ + "/step-105");
  }
  auto r = prune_checkpoints(root_, {2, 0, false});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->deleted, (std::vector<std::string>{"step-101", "step-102"}));
  EXPECT_EQ(names(), (std::set<std::string>{"step-103", "step-104"}));
}

TEST_F(Dir, SaveLockIsExclusiveAndNamesTheHolder) {
  const std::string target = root_ + "/step-1";
  ASSERT_TRUE(acquire_save_lock(target).ok());
  Status again = acquire_save_lock(root_ + "/step-2");  // same directory, same process
  EXPECT_EQ(again.code(), ErrorCode::kAlreadyExists) << again.to_string();
  // Another process sees the holder written in the lock file.
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    auto l = ScopedDirLock::acquire(root_);
    const std::string msg = l.ok() ? "locked" : l.status().message();
    (void)!::write(pipefd[1], msg.data(), msg.size());
    ::_exit(0);
  }
  ::close(pipefd[1]);
  char buf[512] = {};
  const ssize_t n = ::read(pipefd[0], buf, sizeof buf - 1);
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  const std::string msg(buf, n > 0 ? static_cast<size_t>(n) : 0);
  EXPECT_NE(msg.find("another save into"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pid=" + std::to_string(::getpid())), std::string::npos) << msg;
  release_save_lock(target);
  release_save_lock(target);  // idempotent
  EXPECT_TRUE(acquire_save_lock(root_ + "/step-2").ok());
  release_save_lock(root_ + "/step-2");
}

TEST_F(Dir, LatestUpdateUsesAPrivateTempName) {
  make_ckpt("step-1", 1);
  // A stale fixed-name temp file of another writer is neither used nor disturbed.
  std::ofstream(root_ + "/latest.tmp") << "step-0\n";
  ASSERT_TRUE(update_latest(root_ + "/step-1").ok());
  std::ifstream in(root_ + "/latest");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "step-1\n");
  std::ifstream stale(root_ + "/latest.tmp");
  std::string s((std::istreambuf_iterator<char>(stale)), std::istreambuf_iterator<char>());
  EXPECT_EQ(s, "step-0\n");
  int tmps = 0;
  for (const auto& e : fs::directory_iterator(root_))
    if (e.path().filename().string().rfind("latest.tmp.", 0) == 0) ++tmps;
  EXPECT_EQ(tmps, 0);
}

// Overwriting the checkpoint `latest` names: after the operation, and after a crash in its
// middle (a forked child _exits at the crash point), loading the directory works.
class Publish : public Dir, public ::testing::WithParamInterface<bool> {};

TEST_P(Publish, OverwriteCrashLeavesALoadableDirectory) {
  const bool exchange = GetParam();
  make_ckpt("step-1", 1);
  make_ckpt("step-2", 2);
  set_latest("step-2\n");
  const std::string fresh = make_ckpt(".step-2.inprogress-9-9", 22);
  const pid_t child = ::fork();
  if (child == 0) {
    if (!exchange) ::setenv("H5CKPT_TEST_NO_RENAME_EXCHANGE", "1", 1);
    ::setenv("H5CKPT_TEST_CRASH_AT", "publish", 1);
    (void)publish_dir(fresh, root_ + "/step-2", true);
    ::_exit(7);  // not reached when the crash point fires
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1) << "the crash point did not fire";
  auto info = read_checkpoint_info(root_);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  if (exchange) {
    EXPECT_EQ(fs::path(info->path).filename(), "step-2");  // never a moment without step-2
    EXPECT_EQ(info->step, 22);                             // the new one is in place
  } else {
    EXPECT_EQ(fs::path(info->path).filename(), "step-1");  // step-2 missing: the newest that validates
  }
  // And without a crash, the overwrite completes and leaves no temporary directory.
  fs::remove_all(root_);
  fs::create_directories(root_);
  make_ckpt("step-2", 2);
  set_latest("step-2\n");
  const std::string again = make_ckpt(".step-2.inprogress-9-9", 22);
  if (!exchange) ::setenv("H5CKPT_TEST_NO_RENAME_EXCHANGE", "1", 1);
  Status st = publish_dir(again, root_ + "/step-2", true);
  ::unsetenv("H5CKPT_TEST_NO_RENAME_EXCHANGE");
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(names(), (std::set<std::string>{"step-2"}));
  auto after = read_checkpoint_info(root_);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->step, 22);
  EXPECT_EQ(publish_dir(make_ckpt(".step-2.inprogress-8-8", 23), root_ + "/step-2", false).code(),
            ErrorCode::kAlreadyExists);
}

INSTANTIATE_TEST_SUITE_P(ExchangeOrFallback, Publish, ::testing::Bool());

// ---- settings ---------------------------------------------------------------------------------

TEST(RetentionConfig, KeysAndEnvironment) {
  auto c = parse_config("[checkpointer]\nkeep_last = 5\nkeep_every = 1000\n", "r.toml");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->checkpointer.keep_last, 5);
  EXPECT_EQ(c->checkpointer.keep_every, 1000);
  auto d = parse_config("", "empty.toml");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->checkpointer.keep_last, 0);
  EXPECT_EQ(d->checkpointer.keep_every, 0);
  auto neg = parse_config("[checkpointer]\nkeep_last = -1\n", "n.toml");
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("checkpointer.keep_last"), std::string::npos);
  EXPECT_FALSE(parse_config("[checkpointer]\nkeep_every = \"3\"\n", "s.toml").ok());
  ::setenv("H5CKPT_KEEP_LAST", "7", 1);
  ::setenv("H5CKPT_KEEP_EVERY", " 50 ", 1);
  Config e = *d;
  ASSERT_TRUE(apply_env(e).ok());
  EXPECT_EQ(e.checkpointer.keep_last, 7);
  EXPECT_EQ(e.checkpointer.keep_every, 50);
  ::setenv("H5CKPT_KEEP_LAST", "three", 1);
  Status bad = apply_env(e);
  EXPECT_EQ(bad.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("H5CKPT_KEEP_LAST"), std::string::npos) << bad.to_string();
  ::unsetenv("H5CKPT_KEEP_LAST");
  ::unsetenv("H5CKPT_KEEP_EVERY");
}

}  // namespace
}  // namespace h5ckpt::storage
