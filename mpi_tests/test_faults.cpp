// Injected storage faults (H5CKPT_FAULT, storage/posix_io.h) in every phase of save, async save
// and load, on the first and the last rank: every rank returns the same error naming the rank and
// the call, nothing is committed, `latest` and the last good checkpoint stay intact, no temporary
// directory outlives the next good save, and nothing hangs (CTest TIMEOUT). FullDisk.* saves into
// a real 8 MiB tmpfs that mpi_tests/faults/full_disk.sh mounts.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

#include "storage/commit.h"
#include "storage/posix_io.h"
#include "support/test_model.h"

using h5ckpt::testing::world_rank;
using h5ckpt::testing::world_size;

using namespace h5ckpt;
using h5ckpt::testing::Layout;
using h5ckpt::testing::TestModel;
namespace fs = std::filesystem;
namespace io = h5ckpt::storage::io;

namespace {

// Every rank must hold the same error code and message.
void expect_same_on_all_ranks(const Status& st) {
  const std::string text = st.to_string();
  uint64_t h = std::hash<std::string>{}(text), lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi) << "ranks disagree; this rank has: " << text;
}

// The same fault on every rank (each rank decides by rank= whether it applies to itself).
void set_fault(const std::string& spec) {
  if (spec.empty()) unsetenv("H5CKPT_FAULT");
  else setenv("H5CKPT_FAULT", spec.c_str(), 1);
  Status st = io::reload_faults_for_testing();
  ASSERT_TRUE(st.ok()) << st.to_string();
}

// Runs `check` on rank 0 once every rank got here; every rank gets its verdict ("" = fine).
std::string on_rank0(const std::function<std::string()>& check) {
  MPI_Barrier(MPI_COMM_WORLD);
  std::string why = world_rank() == 0 ? check() : "";
  uint64_t n = why.size();
  MPI_Bcast(&n, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  why.resize(n);
  MPI_Bcast(why.data(), static_cast<int>(n), MPI_CHAR, 0, MPI_COMM_WORLD);
  return why;
}

std::string read_latest(const std::string& root) {
  std::ifstream in(root + "/latest");
  std::string name;
  std::getline(in, name);
  return name;
}

// What is wrong with `root` after a failed save of `failed` (empty: nothing).
std::string temp_dirs_in(const std::string& root) {
  std::string found;
  for (const auto& e : fs::directory_iterator(root))
    if (storage::is_temp_name(e.path().string()))
      found +=
          " " + e.path().filename().string() + (fs::exists(e.path() / "metadata.json") ? "(with metadata.json)" : "");
  return found.empty() ? "" : "temporary directories left:" + found;
}

Layout zero_layout() { return Layout{1, world_size(), 1, true}; }

Topology make_topology(const Layout& L) {
  auto t = Topology::create(MPI_COMM_WORLD, {L.tp, L.dp, L.pp});
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(t).value();
}

// Loads `path` into a fresh model and counts the elements that differ from the expected values.
Status load_and_count(Checkpointer& ck, const Layout& L, const Topology& topo, const std::string& path,
                      int64_t* mismatches, std::string* first, const LoadOptions& opts = {}) {
  TestModel fresh(L, topo.coords(), false);
  auto r = ck.load(fresh.state(), path, opts);
  *mismatches = r.ok() ? fresh.count_mismatches(first) : -1;
  return r.status();
}

enum class Kind { kSave, kAsync, kLoad, kLoadAggregated };
enum class Who { kFirst, kLast };
enum class Expect { kFails, kSucceeds, kCommittedButLatestFails };

struct FaultCase {
  const char* name;
  Kind kind;
  Who who;
  const char* spec;  // without rank=
  const char* op;    // the op the message must name
  int call;          // and the call number
  Expect expect = Expect::kFails;
};

std::string case_name(const ::testing::TestParamInfo<FaultCase>& info) { return info.param.name; }

// Save faults, run for sync and async saves. The coordinator (rank 0) alone makes the temporary
// directory and commits; every rank opens, writes and fsyncs the data file.
std::vector<FaultCase> save_cases(Kind kind) {
  const std::vector<FaultCase> base = {
      {"mkdir_prepare_first", kind, Who::kFirst, "op=mkdir,phase=prepare,errno=ENOSPC", "mkdir", 1},
      {"open_write_first", kind, Who::kFirst, "op=open,phase=write,errno=EACCES", "open", 1},
      {"open_write_last", kind, Who::kLast, "op=open,phase=write,errno=EACCES", "open", 1},
      {"fallocate_write_first", kind, Who::kFirst, "op=fallocate,phase=write,errno=ENOSPC", "fallocate", 1},
      {"pwrite_write_first", kind, Who::kFirst, "op=pwrite,phase=write,nth=2,errno=ENOSPC", "pwrite", 2},
      {"pwrite_write_last", kind, Who::kLast, "op=pwrite,phase=write,nth=2,errno=ENOSPC", "pwrite", 2},
      {"pwrite_anyphase_last", kind, Who::kLast, "op=pwrite,errno=EIO", "pwrite", 1},
      {"fsync_write_first", kind, Who::kFirst, "op=fsync,phase=write,errno=EIO", "fsync", 1},
      {"fsync_write_last", kind, Who::kLast, "op=fsync,phase=write,errno=EIO", "fsync", 1},
      {"open_commit_first", kind, Who::kFirst, "op=open,phase=commit,errno=EIO", "open", 1},
      {"write_commit_first", kind, Who::kFirst, "op=write,phase=commit,errno=ENOSPC", "write", 1},
      {"fsync_commit_first", kind, Who::kFirst, "op=fsync,phase=commit,errno=EIO", "fsync", 1},
      {"rename_metadata_first", kind, Who::kFirst, "op=rename,phase=commit,nth=1,errno=EIO", "rename", 1},
      {"rename_publish_first", kind, Who::kFirst, "op=rename,phase=commit,nth=2,errno=EXDEV", "rename", 2},
      {"rename_latest_first", kind, Who::kFirst, "op=rename,phase=commit,nth=3,errno=EIO", "rename", 3,
       Expect::kCommittedButLatestFails},
      {"short_pwrite_first", kind, Who::kFirst, "op=pwrite,nth=1,short", "pwrite", 1, Expect::kSucceeds},
      {"short_pwrite_last", kind, Who::kLast, "op=pwrite,nth=2,short", "pwrite", 2, Expect::kSucceeds},
      {"short_write_commit_first", kind, Who::kFirst, "op=write,phase=commit,short", "write", 1, Expect::kSucceeds},
      {"delay_fsync_last", kind, Who::kLast, "op=fsync,phase=write,delay_ms=300", "fsync", 1, Expect::kSucceeds},
      {"delay_rename_first", kind, Who::kFirst, "op=rename,phase=commit,nth=2,delay_ms=300", "rename", 2,
       Expect::kSucceeds},
  };
  return base;
}

std::vector<FaultCase> load_cases() {
  return {
      {"open_metadata_first", Kind::kLoad, Who::kFirst, "op=open,phase=metadata,errno=EIO", "open", 1},
      {"open_metadata_last", Kind::kLoad, Who::kLast, "op=open,phase=metadata,errno=EACCES", "open", 1},
      {"read_metadata_first", Kind::kLoad, Who::kFirst, "op=read,phase=metadata,errno=EIO", "read", 1},
      // Reads run on helper threads that carry no phase: select by op only. Two-phase reads of
      // this small model read on the first rank only (the others aggregate nothing).
      {"pread_first", Kind::kLoad, Who::kFirst, "op=pread,errno=EIO", "pread", 1},
      {"pread_last", Kind::kLoad, Who::kLast, "op=pread,nth=2,errno=EIO", "pread", 2},
      {"pread_aggregated_first", Kind::kLoadAggregated, Who::kFirst, "op=pread,errno=EIO", "pread", 1},
      {"short_pread_first", Kind::kLoad, Who::kFirst, "op=pread,short", "pread", 1, Expect::kSucceeds},
      {"short_pread_aggregated_first", Kind::kLoadAggregated, Who::kFirst, "op=pread,short", "pread", 1,
       Expect::kSucceeds},
      {"short_read_metadata_first", Kind::kLoad, Who::kFirst, "op=read,phase=metadata,short", "read", 1,
       Expect::kSucceeds},
      {"delay_pread_last", Kind::kLoad, Who::kLast, "op=pread,delay_ms=300", "pread", 1, Expect::kSucceeds},
  };
}

class Faults : public ::testing::TestWithParam<FaultCase> {
 protected:
  void SetUp() override {
    root_ = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "faults");
    ASSERT_FALSE(root_.empty());
    L_ = zero_layout();
    topo_.emplace(make_topology(L_));
  }
  void TearDown() override {
    set_fault("");
    MPI_Barrier(MPI_COMM_WORLD);
    topo_.reset();
    if (world_rank() == 0) fs::remove_all(root_);
  }
  std::string root_;
  Layout L_;
  std::optional<Topology> topo_;
};

// Returns the failing save's or load's agreed status.
// Every rank writes its own runs (aggregated writes off): a fault on the last rank's n-th pwrite
// must find that call. Faults inside aggregated writes: test_aggregated_write.
Status save_b(Checkpointer& ck, StateDict& state, const std::string& path, bool async) {
  SaveOptions own_runs;
  own_runs.aggregate_writes = AggregateWrites::kOff;
  if (!async) return ck.save(state, path, own_runs).status();
  auto h = ck.save_async(state, path, own_runs);
  if (!h.ok()) return h.status();  // prepare runs on the caller's thread
  return h->wait().status();
}

TEST_P(Faults, SameErrorNothingCommittedLastGoodIntact) {
  const FaultCase& c = GetParam();
  const int target = c.who == Who::kFirst ? 0 : world_size() - 1;
  if (c.who == Who::kLast && world_size() == 1) GTEST_SKIP() << "one rank: same as the first-rank case";
  const std::string spec = std::string(c.spec) + ",rank=" + std::to_string(target);
  const std::string injected = "injected fault on rank " + std::to_string(target) + ", call " + std::to_string(c.call);
  Checkpointer ck(*topo_);
  TestModel model(L_, topo_->coords(), true);
  auto a = ck.save(model.state(), root_ + "/A");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  int64_t bad = 0;
  std::string first;

  if (c.kind == Kind::kLoad || c.kind == Kind::kLoadAggregated) {
    LoadOptions opts;
    opts.aggregate_reads = c.kind == Kind::kLoadAggregated;
    set_fault(spec);
    // The checkpoint itself, not `latest`: an unreadable `latest` is not an error (the newest
    // checkpoint that validates is taken instead).
    Status st = load_and_count(ck, L_, *topo_, root_ + "/A", &bad, &first, opts);
    set_fault("");
    if (c.expect == Expect::kSucceeds) {
      ASSERT_TRUE(st.ok()) << spec << ": " << st.to_string();
      EXPECT_EQ(bad, 0) << spec << ": " << first;
    } else {
      ASSERT_FALSE(st.ok()) << spec << " did not fail the load";
      EXPECT_EQ(st.code(), ErrorCode::kIo) << st.to_string();
      EXPECT_NE(st.message().find(std::string(c.op) + " '"), std::string::npos) << st.to_string();
      EXPECT_NE(st.message().find(injected), std::string::npos) << st.to_string();
      expect_same_on_all_ranks(st);
    }
    // The checkpoint is untouched by a failed load and loads bit-exactly once the fault is gone.
    Status again = load_and_count(ck, L_, *topo_, root_, &bad, &first, opts);
    ASSERT_TRUE(again.ok()) << again.to_string();
    EXPECT_EQ(bad, 0) << first;
    return;
  }

  // A save: B holds other values than A, so a load that reads B instead of A is caught.
  const bool async = c.kind == Kind::kAsync;
  if (c.expect != Expect::kSucceeds) model.scribble();
  set_fault(spec);
  Status st = save_b(ck, model.state(), root_ + "/B", async);
  set_fault("");
  if (c.expect == Expect::kSucceeds) {
    ASSERT_TRUE(st.ok()) << spec << ": " << st.to_string();
    Status loaded = load_and_count(ck, L_, *topo_, root_ + "/B", &bad, &first);
    ASSERT_TRUE(loaded.ok()) << loaded.to_string();
    EXPECT_EQ(bad, 0) << spec << ": " << first;
    EXPECT_EQ(on_rank0([&] { return read_latest(root_) == "B" ? "" : "latest is " + read_latest(root_); }), "");
  } else {
    ASSERT_FALSE(st.ok()) << spec << " did not fail the save";
    EXPECT_EQ(st.code(), ErrorCode::kIo) << st.to_string();
    EXPECT_NE(st.message().find(std::string(c.op) + " '"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find(injected), std::string::npos) << st.to_string();
    expect_same_on_all_ranks(st);
    EXPECT_EQ(on_rank0([&]() -> std::string {
                if (c.expect == Expect::kFails && fs::exists(root_ + "/B")) return "B exists";
                if (read_latest(root_) != "A") return "latest is '" + read_latest(root_) + "'";
                return temp_dirs_in(root_);  // this save's leftovers are removed at once
              }),
              "");
    Status loaded = load_and_count(ck, L_, *topo_, root_, &bad, &first);
    ASSERT_TRUE(loaded.ok()) << loaded.to_string();
    EXPECT_EQ(bad, 0) << "latest does not load as A: " << first;
  }
  // The next good save commits, and no temporary directory remains.
  TestModel fresh(L_, topo_->coords(), true);
  auto next = async ? save_b(ck, fresh.state(), root_ + "/C", true) : ck.save(fresh.state(), root_ + "/C").status();
  ASSERT_TRUE(next.ok()) << next.to_string();
  EXPECT_EQ(on_rank0([&] { return read_latest(root_) == "C" ? temp_dirs_in(root_) : "latest is not C"; }), "");
}

INSTANTIATE_TEST_SUITE_P(Save, Faults, ::testing::ValuesIn(save_cases(Kind::kSave)), case_name);
INSTANTIATE_TEST_SUITE_P(Async, Faults, ::testing::ValuesIn(save_cases(Kind::kAsync)), case_name);
INSTANTIATE_TEST_SUITE_P(Load, Faults, ::testing::ValuesIn(load_cases()), case_name);

TEST(FaultSpec, MalformedIsRefusedAndInjectsNothing) {
  for (const char* bad : {"op=nosuch,errno=EIO", "op=pwrite", "op=pwrite,errno=EIO,delay_ms=5", "op=open,short",
                          "op=pwrite,nth=0,errno=EIO", "op=pwrite,errno=ENOTANERRNO", "op=pwrite,colour=red,short"}) {
    setenv("H5CKPT_FAULT", bad, 1);
    Status st = io::reload_faults_for_testing();
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << bad;
  }
  setenv("H5CKPT_FAULT", " op=pwrite , nth=3, errno=ENOSPC ; op=mkdir,rank=0,phase=prepare,errno=28 ;", 1);
  EXPECT_TRUE(io::reload_faults_for_testing().ok());
  set_fault("");
}

TEST(FaultSpec, ErrorNamesOpFileRankAndCall) {
  const std::string dir = h5ckpt::testing::shared_temp_dir(MPI_COMM_SELF, "faultspec");
  const std::string file = dir + "/f";
  setenv("H5CKPT_FAULT", ("op=open,nth=2,errno=ENOSPC,rank=" + std::to_string(world_rank())).c_str(), 1);
  ASSERT_TRUE(io::reload_faults_for_testing().ok());
  const int fd = io::open(file, O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  io::close(fd);
  EXPECT_EQ(io::open(file, O_RDONLY), -1);
  const int err = errno;
  EXPECT_EQ(err, ENOSPC);
  EXPECT_EQ(io::error("open", file, err).message(), "open '" + file + "' (injected fault on rank " +
                                                        std::to_string(world_rank()) +
                                                        ", call 2): " + std::strerror(ENOSPC));
  const int fd3 = io::open(file, O_RDONLY);  // the fault is spent
  EXPECT_GE(fd3, 0);
  io::close(fd3);
  set_fault("");
  fs::remove_all(dir);
}

// Temporary directories of crashed saves go with the next good save into the same root; a
// checkpoint moved aside by an overwrite that crashed stays while it may be the only copy.
TEST(Leftovers, NextGoodSaveRemovesCrashedTemps) {
  const std::string root = h5ckpt::testing::shared_temp_dir(MPI_COMM_WORLD, "leftovers");
  const Layout L = zero_layout();
  Topology topo = make_topology(L);
  if (world_rank() == 0) {
    fs::create_directories(root + "/.X.inprogress-99-1");
    std::ofstream(root + "/.X.inprogress-99-1/data.h5") << "half a save";
    fs::create_directories(root + "/.gone.inprogress-7-7.old");  // `gone` does not exist: keep
    fs::create_directories(root + "/A");                         // exists: its aside copy goes
    fs::create_directories(root + "/.A.inprogress-5-5.old");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  TestModel model(L, topo.coords(), true);
  Checkpointer ck(topo);
  auto r = ck.save(model.state(), root + "/C");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(on_rank0([&]() -> std::string {
              if (fs::exists(root + "/.X.inprogress-99-1")) return "crashed temp still there";
              if (fs::exists(root + "/.A.inprogress-5-5.old"))
                return "aside copy of an existing checkpoint still there";
              if (!fs::exists(root + "/.gone.inprogress-7-7.old")) return "the only copy of 'gone' was removed";
              return "";
            }),
            "");
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(root);
}

// ---- A real full disk: H5CKPT_TEST_FULL_DISK names an 8 MiB tmpfs (mpi_tests/faults/full_disk.sh).

struct DiskCase {
  const char* name;
  bool direct_writes;
  bool async;
  const char* fault = "";  // a file system without fallocate: the pwrites meet the full disk
};

class FullDisk : public ::testing::TestWithParam<DiskCase> {};

// Every rank holds a quarter-of-the-disk-or-more slice of one large tensor: 16 MiB in all.
TEST_P(FullDisk, EnospcOnEveryRankLastGoodIntact) {
  const char* disk = std::getenv("H5CKPT_TEST_FULL_DISK");
  if (!disk || !*disk)
    GTEST_SKIP() << "H5CKPT_TEST_FULL_DISK is not set (run by mpi_tests/faults/full_disk.sh as root)";
  const DiskCase& c = GetParam();
  const std::string root = std::string(disk) + "/" + c.name;
  if (world_rank() == 0) fs::create_directories(root);
  MPI_Barrier(MPI_COMM_WORLD);
  const Layout L = zero_layout();
  Topology topo = make_topology(L);
  CheckpointerOptions copts;
  copts.direct_writes = c.direct_writes;
  Checkpointer ck(topo, copts);
  TestModel model(L, topo.coords(), true);
  auto a = ck.save(model.state(), root + "/A");
  ASSERT_TRUE(a.ok()) << a.status().to_string();

  const int64_t total = 4 << 20;  // f32 elements: 16 MiB, twice the disk
  const int n = world_size(), r = world_rank();
  const int64_t begin = total * r / n, end = total * (r + 1) / n;
  std::vector<float> big(static_cast<size_t>(end - begin), 1.5f);
  StateDict state;
  state.add("model/big", DType::kF32, {total}, ShardSpec::box_of({begin}, {end - begin}), big.data());
  set_fault(c.fault);
  Status st = save_b(ck, state, root + "/B", c.async);
  set_fault("");
  ASSERT_FALSE(st.ok()) << "a 16 MiB save fit into 8 MiB";
  if (world_rank() == 0) std::printf("full disk, %s: %s\n", c.name, st.to_string().c_str());
  EXPECT_EQ(st.code(), ErrorCode::kIo) << st.to_string();
  EXPECT_NE(st.message().find(std::strerror(ENOSPC)), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("data.h5"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("rank "), std::string::npos) << st.to_string();
  expect_same_on_all_ranks(st);
  EXPECT_EQ(on_rank0([&]() -> std::string {
              if (fs::exists(root + "/B")) return "B exists";
              if (read_latest(root) != "A") return "latest is '" + read_latest(root) + "'";
              return temp_dirs_in(root);
            }),
            "");
  int64_t bad = 0;
  std::string first;
  Status loaded = load_and_count(ck, L, topo, root, &bad, &first);
  ASSERT_TRUE(loaded.ok()) << loaded.to_string();
  EXPECT_EQ(bad, 0) << first;
  // The space is free again: a small save commits.
  auto c2 = ck.save(model.state(), root + "/C");
  EXPECT_TRUE(c2.ok()) << c2.status().to_string();
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(root);
}

INSTANTIATE_TEST_SUITE_P(Disk, FullDisk,
                         ::testing::Values(DiskCase{"direct", true, false}, DiskCase{"direct_async", true, true},
                                           DiskCase{"direct_nofallocate", true, false, "op=fallocate,errno=EOPNOTSUPP"},
                                           DiskCase{"direct_nofallocate_async", true, true,
                                                    "op=fallocate,errno=EOPNOTSUPP"},
                                           DiskCase{"mpiio", false, false}, DiskCase{"mpiio_async", false, true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
