// Never hang, never lose: what a load of a directory selects when `latest` or the newest
// checkpoint is damaged (always the newest checkpoint that validates, loaded bit-exactly), a
// second job saving into the same directory (a clear error, the first's files untouched),
// retention after a series of saves, and overwriting the checkpoint `latest` names (valid at
// every moment, also across a crash: the CrashDriver tests, run by commit_safety/crash.cmake).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <thread>
#include <vector>

#include "storage/commit.h"
#include "support/test_model.h"

using namespace h5ckpt;
using h5ckpt::testing::sum_all;
using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;
namespace fs = std::filesystem;

namespace {

// A state whose every element depends on a version number, so a load shows which save it read:
// a row-split f32 matrix, a replicated i32 vector, and the version itself.
class VersionedState {
 public:
  VersionedState(int64_t version, bool fill) {
    const int world = world_size(), rank = world_rank();
    const Shape shape{12, 5};
    shard_ = ShardSpec::split(shape, 0, world, rank);
    w_.assign(static_cast<size_t>(shard_.numel()), -1.0f);
    b_.assign(7, -1);
    v_ = fill ? version : -1;
    if (fill) {
      for (size_t j = 0; j < w_.size(); ++j) w_[j] = w_value(version, row0() * 5 + static_cast<int64_t>(j));
      for (size_t i = 0; i < b_.size(); ++i) b_[i] = b_value(version, static_cast<int64_t>(i));
    }
    state_.add("model/w", DType::kF32, shape, shard_, w_.data());
    state_.add_replicated("model/b", DType::kI32, {7}, b_.data());
    state_.add_replicated("extra/version", DType::kI64, {1}, &v_);
  }
  StateDict& state() { return state_; }
  int64_t version() const { return v_; }
  // Elements differing from what `version` saved, over all ranks (collective).
  uint64_t mismatches_everywhere(int64_t version) const {
    uint64_t bad = v_ == version ? 0 : 1;
    for (size_t j = 0; j < w_.size(); ++j) bad += w_[j] != w_value(version, row0() * 5 + static_cast<int64_t>(j));
    for (size_t i = 0; i < b_.size(); ++i) bad += b_[i] != b_value(version, static_cast<int64_t>(i));
    return sum_all(bad);
  }

 private:
  static float w_value(int64_t version, int64_t flat) { return static_cast<float>(version * 1000 + flat); }
  static int32_t b_value(int64_t version, int64_t i) { return static_cast<int32_t>(version * 100 + 7 * i); }
  int64_t row0() const { return shard_.box.offset[0]; }
  ShardSpec shard_;
  std::vector<float> w_;
  std::vector<int32_t> b_;
  int64_t v_ = -1;
  StateDict state_;
};

// Runs `fn` on rank 0 only, then a barrier.
void on_rank0(const std::function<void()>& fn) {
  if (world_rank() == 0) fn();
  MPI_Barrier(MPI_COMM_WORLD);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Names, sizes and `latest` of a directory tree: what "untouched" compares.
std::string snapshot(const std::string& root) {
  std::string out;
  std::set<std::string> lines;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::string line = fs::relative(it->path(), root).string();
    if (line == storage::kLockFileName) continue;  // its holder line changes with every save
    if (it->is_regular_file()) line += " " + std::to_string(it->file_size());
    lines.insert(line);
  }
  for (const auto& l : lines) out += l + "\n";
  return out + "latest=" + read_text(root + "/latest");
}

class CommitSafety : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "commit_safety");
    ASSERT_FALSE(root_.empty());
    auto t = Topology::create(MPI_COMM_WORLD, {1, world_size(), 1});
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    topo_.emplace(std::move(t).value());
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    topo_.reset();
    if (world_rank() == 0) fs::remove_all(root_);
  }

  Status save(const std::string& path, int64_t version, SaveOptions so = {}, const CheckpointerOptions& co = {}) {
    VersionedState s(version, true);
    Checkpointer ck(*topo_, co);
    if (so.step < 0) so.step = version;
    return ck.save(s.state(), path, so).status();
  }
  // Loads `path`; expects the checkpoint named `want_name` holding `want_version`, bit-exactly.
  void expect_load(const std::string& path, const std::string& want_name, int64_t want_version,
                   const std::string& label) {
    VersionedState s(0, false);
    Checkpointer ck(*topo_);
    auto r = ck.load(s.state(), path);
    ASSERT_TRUE(r.ok()) << label << ": " << r.status().to_string();
    EXPECT_EQ(fs::path(r->path).filename().string(), want_name) << label << ": LoadReport::path " << r->path;
    EXPECT_EQ(s.mismatches_everywhere(want_version), 0u) << label << ": loaded version " << s.version();
    // The CLI's view (read_checkpoint_info) selects the same checkpoint.
    auto info = read_checkpoint_info(path);
    ASSERT_TRUE(info.ok()) << label << ": " << info.status().to_string();
    EXPECT_EQ(fs::path(info->path).filename().string(), want_name) << label;
  }
  // root_/name: a copy of `base` (rank 0) with `damage` applied.
  std::string damaged(const std::string& base, const std::string& name,
                      const std::function<void(const std::string&)>& damage) {
    const std::string dir = root_ + "/" + name;
    on_rank0([&] {
      fs::copy(base, dir, fs::copy_options::recursive);
      damage(dir);
    });
    return dir;
  }

  std::string root_;
  std::optional<Topology> topo_;
};

TEST_F(CommitSafety, DirectoryLoadSelectsNewestValidCheckpoint) {
  const std::string base = root_ + "/base";
  on_rank0([&] { fs::create_directories(base); });
  for (int v = 1; v <= 3; ++v) ASSERT_TRUE(save(base + "/step-" + std::to_string(v), v).ok());
  expect_load(base, "step-3", 3, "intact");

  auto set_latest = [](const std::string& d, const std::string& text) {
    fs::remove_all(d + "/latest");
    std::ofstream(d + "/latest", std::ios::binary) << text;
  };
  struct Case {
    const char* name;
    std::function<void(const std::string&)> damage;
    const char* want;
    int64_t version;
  };
  const std::vector<Case> cases = {
      {"deleted", [](const std::string& d) { fs::remove(d + "/latest"); }, "step-3", 3},
      {"missing_step", [&](const std::string& d) { set_latest(d, "step-9\n"); }, "step-3", 3},
      {"garbage", [&](const std::string& d) { set_latest(d, std::string("\x00\xff/..\n\x01", 7)); }, "step-3", 3},
      {"symlink_loop",
       [](const std::string& d) {
         fs::remove(d + "/latest");
         fs::create_symlink("latest", d + "/latest");
       },
       "step-3", 3},
      {"symlink_outside",
       [&](const std::string& d) {
         // Outside the directory sits a valid checkpoint and a pointer to it: never followed.
         fs::create_directories(d + "-outside");
         fs::copy(d + "/step-1", d + "-outside/step-1", fs::copy_options::recursive);
         set_latest(d + "-outside", "step-1\n");
         fs::remove(d + "/latest");
         fs::create_symlink(d + "-outside/latest", d + "/latest");
       },
       "step-3", 3},
      {"regular_file",
       [&](const std::string& d) {
         std::ofstream(d + "/notes.txt") << "not a checkpoint";
         set_latest(d, "notes.txt\n");
       },
       "step-3", 3},
      {"directory",
       [](const std::string& d) {
         fs::remove(d + "/latest");
         fs::create_directories(d + "/latest/x");
       },
       "step-3", 3},
      {"fifo",
       [](const std::string& d) {
         fs::remove(d + "/latest");
         ::mkfifo((d + "/latest").c_str(), 0644);
       },
       "step-3", 3},
      {"newest_without_data", [](const std::string& d) { fs::remove(d + "/step-3/data.h5"); }, "step-2", 2},
      {"newest_metadata_truncated", [](const std::string& d) { fs::resize_file(d + "/step-3/metadata.json", 40); },
       "step-2", 2},
      {"newest_metadata_fifo",
       [](const std::string& d) {
         fs::remove(d + "/step-3/metadata.json");
         ::mkfifo((d + "/step-3/metadata.json").c_str(), 0644);
       },
       "step-2", 2},
      {"two_newest_broken",
       [&](const std::string& d) {
         fs::remove(d + "/step-3/data.h5");
         fs::resize_file(d + "/step-2/data.h5", 100);
         set_latest(d, "step-2\n");
       },
       "step-1", 1},
      {"older_latest_is_honoured", [&](const std::string& d) { set_latest(d, "step-1\n"); }, "step-1", 1},
  };
  for (const Case& c : cases) {
    const std::string dir = damaged(base, c.name, c.damage);
    expect_load(dir, c.want, c.version, c.name);
  }
  // One checkpoint named directly: no fallback, a clear error on every rank.
  const std::string broken = root_ + "/newest_without_data/step-3";
  VersionedState s(0, false);
  Checkpointer ck(*topo_);
  auto r = ck.load(s.state(), broken);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("step-3"), std::string::npos) << r.status().to_string();
  // Nothing valid at all: an error that says what is wrong, never a guess.
  const std::string none = damaged(base, "nothing_valid", [](const std::string& d) {
    for (const char* n : {"step-1", "step-2", "step-3"}) fs::remove(d + "/" + n + "/data.h5");
  });
  auto r2 = ck.load(s.state(), none);
  ASSERT_FALSE(r2.ok());
  // "corrupt" naming each checkpoint, never "not found" (a trainer would start fresh over them).
  EXPECT_EQ(r2.status().code(), ErrorCode::kCorrupt) << r2.status().to_string();
  EXPECT_NE(r2.status().message().find("none validates"), std::string::npos) << r2.status().to_string();
  for (const char* n : {"step-1:", "step-2:", "step-3"})
    EXPECT_NE(r2.status().message().find(n), std::string::npos) << r2.status().to_string();
}

// A storage server that is down takes its files with it: on GlusterFS (distribute) they are absent
// with ENOENT while every directory stays. Every file of every checkpoint gone, `latest` too: the
// marker directories still show checkpoints stood there, so the answer is "corrupt", naming each,
// never "not found" (a trainer would start over and save over them).
TEST_F(CommitSafety, CheckpointsWhoseFilesVanishedAreNotAnEmptyDirectory) {
  const std::string base = root_ + "/vanished";
  on_rank0([&] { fs::create_directories(base); });
  for (int v = 1; v <= 2; ++v) ASSERT_TRUE(save(base + "/step-" + std::to_string(v), v).ok());
  on_rank0([&] {
    fs::remove(base + "/latest");
    for (const char* n : {"step-1", "step-2"}) {
      ASSERT_TRUE(fs::is_directory(base + "/" + n + "/" + storage::kCheckpointMarkerDir)) << n;
      fs::remove(base + "/" + n + "/data.h5");
      fs::remove(base + "/" + n + "/metadata.json");
    }
  });
  MPI_Barrier(MPI_COMM_WORLD);
  VersionedState s(0, false);
  Checkpointer ck(*topo_);
  auto r = ck.load(s.state(), base);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt) << r.status().to_string();
  for (const char* n : {"step-1", "step-2"})
    EXPECT_NE(r.status().message().find(std::string(n) + ": "), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("storage server"), std::string::npos) << r.status().to_string();
  // Named directly, the same answer (not a directory of checkpoints that holds none).
  auto named = ck.load(s.state(), base + "/step-2");
  ASSERT_FALSE(named.ok());
  EXPECT_EQ(named.status().code(), ErrorCode::kCorrupt) << named.status().to_string();
  EXPECT_NE(named.status().message().find("missing"), std::string::npos) << named.status().to_string();
  // An empty directory of the same name without the marker is still nothing at all.
  on_rank0([&] { fs::create_directories(root_ + "/plain/step-1"); });
  MPI_Barrier(MPI_COMM_WORLD);
  auto plain = ck.load(s.state(), root_ + "/plain");
  ASSERT_FALSE(plain.ok());
  EXPECT_EQ(plain.status().code(), ErrorCode::kNotFound) << plain.status().to_string();
}

TEST_F(CommitSafety, SecondJobSavingIntoTheDirectoryIsRefused) {
  const std::string dir = root_ + "/job";
  on_rank0([&] { fs::create_directories(dir); });
  ASSERT_TRUE(save(dir + "/step-1", 1).ok());
  // Another job: a process that holds the directory's lock (what its coordinator does mid-save).
  int to_child[2] = {-1, -1}, from_child[2] = {-1, -1};
  pid_t child = -1;
  int64_t holder = -1;
  if (world_rank() == 0) {
    ASSERT_EQ(::pipe(to_child), 0);
    ASSERT_EQ(::pipe(from_child), 0);
    child = ::fork();
    if (child == 0) {
      ::close(to_child[1]);
      auto lock = storage::ScopedDirLock::acquire(dir);
      const char ok = lock.ok() ? 'L' : 'E';
      (void)!::write(from_child[1], &ok, 1);
      char c;
      (void)!::read(to_child[0], &c, 1);  // until the parent closes its end
      ::_exit(0);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    char c = 0;
    ASSERT_EQ(::read(from_child[0], &c, 1), 1);
    ASSERT_EQ(c, 'L');
    holder = child;
  }
  MPI_Bcast(&holder, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  std::string before;
  on_rank0([&] { before = snapshot(dir); });

  SaveOptions so;
  Status st = save(dir + "/step-2", 2, so);
  EXPECT_EQ(st.code(), ErrorCode::kAlreadyExists) << st.to_string();
  EXPECT_NE(st.message().find("another save into"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("pid=" + std::to_string(holder)), std::string::npos) << st.to_string();
  // Also an overwrite of the checkpoint `latest` names, and an asynchronous save.
  so.overwrite = true;
  EXPECT_EQ(save(dir + "/step-1", 5, so).code(), ErrorCode::kAlreadyExists);
  {
    VersionedState s(6, true);
    Checkpointer ck(*topo_);
    auto h = ck.save_async(s.state(), dir + "/step-6");
    Status ast = h.ok() ? h->wait().status() : h.status();
    EXPECT_EQ(ast.code(), ErrorCode::kAlreadyExists) << ast.to_string();
  }
  on_rank0([&] { EXPECT_EQ(snapshot(dir), before) << "the first job's files changed"; });
  expect_load(dir, "step-1", 1, "after the refused saves");

  if (world_rank() == 0) {
    ::close(to_child[1]);  // the other job ends: its lock goes with it
    int status = 0;
    ::waitpid(child, &status, 0);
    ::close(from_child[0]);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  ASSERT_TRUE(save(dir + "/step-2", 2).ok());
  // A failed save releases the lock: the next save in this process goes through.
  EXPECT_EQ(save(dir + "/step-2", 2).code(), ErrorCode::kAlreadyExists);  // exists, no overwrite
  ASSERT_TRUE(save(dir + "/step-3", 3).ok());
  expect_load(dir, "step-3", 3, "after the other job ended");
}

TEST_F(CommitSafety, RetentionKeepsTheRightSet) {
  const std::string dir = root_ + "/ret";
  on_rank0([&] { fs::create_directories(dir); });
  CheckpointerOptions co;
  co.keep_last = 3;
  co.keep_every = 4;
  co.metrics = true;  // <checkpoint>.save.json beside each: deleted with its checkpoint
  VersionedState s(0, true);
  Checkpointer ck(*topo_, co);  // asynchronous saves: retention runs on the writer thread
  auto name = [](int64_t step) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
    return std::string(buf);
  };
  auto listing = [&] {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_directory()) out.insert(e.path().filename().string());
    return out;
  };
  auto metrics_listing = [&] {
    std::set<std::string> out;
    const std::string suffix = ".save.json";
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string f = e.path().filename().string();
      if (f.size() > suffix.size() && f.compare(f.size() - suffix.size(), suffix.size(), suffix) == 0)
        out.insert(f.substr(0, f.size() - suffix.size()));
    }
    return out;
  };
  auto save_step = [&](int64_t step, bool update_latest) {
    VersionedState v(step, true);
    SaveOptions so;
    so.step = step;
    so.update_latest = update_latest;
    auto h = ck.save_async(v.state(), dir + "/" + name(step), so);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    auto r = h->wait();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
  };
  for (int64_t step = 1; step <= 10; ++step) {
    save_step(step, true);
    // Expected independently: the 3 newest, every multiple of 4.
    std::set<std::string> want;
    for (int64_t k = std::max<int64_t>(1, step - 2); k <= step; ++k) want.insert(name(k));
    for (int64_t k = 4; k <= step; k += 4) want.insert(name(k));
    on_rank0([&] {
      EXPECT_EQ(listing(), want) << "after step " << step;
      EXPECT_EQ(metrics_listing(), want) << "metrics files after step " << step;
    });
  }
  // `latest` left on step 10: the new step 11 and step 10 both stay.
  save_step(11, false);
  on_rank0([&] { EXPECT_EQ(listing(), (std::set<std::string>{name(4), name(8), name(9), name(10), name(11)})); });
  // `latest` moved back to step 4 by hand: never deleted; step 9 now goes.
  on_rank0([&] { std::ofstream(dir + "/latest", std::ios::trunc) << name(4) << "\n"; });
  save_step(12, false);
  on_rank0([&] { EXPECT_EQ(listing(), (std::set<std::string>{name(4), name(8), name(10), name(11), name(12)})); });
  expect_load(dir, name(4), 4, "latest kept by retention");
  expect_load(dir + "/" + name(12), name(12), 12, "the newest");
}

// Overwriting the checkpoint `latest` names, repeatedly, while another thread of rank 0 keeps
// resolving the directory: it must always find a valid checkpoint.
TEST_F(CommitSafety, OverwriteKeepsLatestValidThroughout) {
  for (const bool exchange : {true, false}) {
    const std::string dir = root_ + (exchange ? "/ow_exchange" : "/ow_fallback");
    on_rank0([&] { fs::create_directories(dir); });
    if (!exchange) ::setenv("H5CKPT_TEST_NO_RENAME_EXCHANGE", "1", 1);
    ASSERT_TRUE(save(dir + "/step-1", 1).ok());
    ASSERT_TRUE(save(dir + "/step-2", 2).ok());
    std::atomic<bool> stop{false};
    std::atomic<int> checks{0}, failures{0}, older{0};
    std::thread poller;
    if (world_rank() == 0)
      poller = std::thread([&] {
        while (!stop.load()) {
          auto r = storage::resolve_checkpoint_dir(dir);
          ++checks;
          if (!r.ok()) ++failures;
          else if (fs::path(*r).filename() != "step-2") ++older;
        }
      });
    SaveOptions so;
    so.overwrite = true;
    // Enough overwrites that the poller meets one while it checks the old copy (the copy is
    // removed right after the exchange): the check must then look again, not fall back.
    constexpr int kLast = 40;
    for (int v = 3; v <= kLast; ++v) ASSERT_TRUE(save(dir + "/step-2", v, so).ok());
    stop = true;
    if (poller.joinable()) poller.join();
    ::unsetenv("H5CKPT_TEST_NO_RENAME_EXCHANGE");
    if (world_rank() == 0) EXPECT_GT(checks.load(), 0);
    EXPECT_EQ(failures.load(), 0) << "of " << checks.load() << " resolutions";
    // With the exchange, `latest` names a complete step-2 at every instant.
    if (exchange) EXPECT_EQ(older.load(), 0) << "of " << checks.load() << " resolutions";
    expect_load(dir, "step-2", kLast, exchange ? "exchange" : "fallback");
    on_rank0([&] {
      for (const auto& e : fs::directory_iterator(dir))
        EXPECT_FALSE(storage::is_temp_name(e.path().filename().string())) << e.path();
    });
  }
}

// ---- crash driver: run in phases by commit_safety/crash.cmake ------------------------------
// H5CKPT_CS_DIR: the directory; H5CKPT_CS_SCENARIO: overwrite (re-save step-2 with overwrite)
// or next (save step-3 with keep_last 1). The crash itself comes from H5CKPT_TEST_CRASH_AT.

std::string driver_dir() {
  const char* d = std::getenv("H5CKPT_CS_DIR");
  return d ? d : "";
}

TEST_F(CommitSafety, CrashDriverPrepare) {
  if (driver_dir().empty()) GTEST_SKIP() << "run by commit_safety/crash.cmake";
  on_rank0([&] {
    fs::remove_all(driver_dir());
    fs::create_directories(driver_dir());
  });
  ASSERT_TRUE(save(driver_dir() + "/step-1", 1).ok());
  ASSERT_TRUE(save(driver_dir() + "/step-2", 2).ok());
}

TEST_F(CommitSafety, CrashDriverSave) {
  if (driver_dir().empty()) GTEST_SKIP() << "run by commit_safety/crash.cmake";
  const std::string scenario = std::getenv("H5CKPT_CS_SCENARIO") ? std::getenv("H5CKPT_CS_SCENARIO") : "";
  SaveOptions so;
  CheckpointerOptions co;
  co.keep_last = 1;
  so.overwrite = scenario == "overwrite";
  Status st = save(driver_dir() + (scenario == "overwrite" ? "/step-2" : "/step-3"), 3, so, co);
  // Reached only when the crash point did not fire.
  ADD_FAILURE() << "the save was expected to crash; it returned " << st.to_string();
}

TEST_F(CommitSafety, CrashDriverCheck) {
  if (driver_dir().empty()) GTEST_SKIP() << "run by commit_safety/crash.cmake";
  const char* want = std::getenv("H5CKPT_CS_WANT");  // "NAME:VERSION"
  ASSERT_NE(want, nullptr);
  const std::string w = want;
  const std::string name = w.substr(0, w.find(':'));
  expect_load(driver_dir(), name, std::stoll(w.substr(w.find(':') + 1)), "after the crash");
  // The next save after the crash commits and cleans up what the crash left.
  SaveOptions so;
  so.overwrite = true;
  ASSERT_TRUE(save(driver_dir() + "/step-4", 4, so).ok());
  expect_load(driver_dir(), "step-4", 4, "after the next save");
  // What the crash left is gone, except an old copy moved aside whose name is still missing.
  on_rank0([&] {
    for (const auto& e : fs::directory_iterator(driver_dir())) {
      const std::string n = e.path().filename().string();
      EXPECT_FALSE(storage::is_temp_name(n) && !n.ends_with(".old")) << e.path();
    }
  });
}

}  // namespace
