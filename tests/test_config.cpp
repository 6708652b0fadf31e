// Config files, environment variables and their precedence (include/h5ckpt/config.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "h5ckpt/config.h"
#include "logging/log.h"

extern char** environ;

namespace h5ckpt {
namespace {

namespace fs = std::filesystem;

// Every test starts with no H5CKPT_* variable set and gets the originals back afterwards.
class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (char** e = environ; e && *e; ++e) {
      std::string entry(*e);
      if (entry.rfind("H5CKPT_", 0) == 0) saved_.push_back(entry);
    }
    for (const auto& entry : saved_) unsetenv(entry.substr(0, entry.find('=')).c_str());
    dir_ = fs::temp_directory_path() / ("h5ckpt_test_config_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::vector<std::string> now;
    for (char** e = environ; e && *e; ++e) {
      std::string entry(*e);
      if (entry.rfind("H5CKPT_", 0) == 0) now.push_back(entry.substr(0, entry.find('=')));
    }
    for (const auto& n : now) unsetenv(n.c_str());
    for (const auto& entry : saved_) {
      auto eq = entry.find('=');
      setenv(entry.substr(0, eq).c_str(), entry.substr(eq + 1).c_str(), 1);
    }
    fs::remove_all(dir_);
  }
  std::string write(const std::string& name, const std::string& text) {
    auto p = (dir_ / name).string();
    std::ofstream(p) << text;
    return p;
  }
  std::vector<std::string> saved_;
  fs::path dir_;
};

// An error Status whose message contains every one of `parts`.
void expect_error(const Status& st, ErrorCode code, const std::vector<std::string>& parts) {
  ASSERT_FALSE(st.ok()) << "expected an error mentioning " << parts.front();
  EXPECT_EQ(st.code(), code) << st.to_string();
  for (const auto& p : parts)
    EXPECT_NE(st.message().find(p), std::string::npos) << "'" << p << "' not in: " << st.message();
}

void expect_defaults(const Config& c) {
  const CheckpointerOptions co;
  const SaveOptions so;
  const LoadOptions lo;
  EXPECT_EQ(c.checkpointer.async, co.async);
  EXPECT_EQ(c.checkpointer.direct_writes, co.direct_writes);
  EXPECT_EQ(c.checkpointer.direct_io, co.direct_io);
  EXPECT_EQ(c.checkpointer.staging_bytes, co.staging_bytes);
  EXPECT_EQ(c.checkpointer.max_piece_bytes, co.max_piece_bytes);
  EXPECT_EQ(c.checkpointer.alignment, co.alignment);
  EXPECT_EQ(c.checkpointer.io_threads, co.io_threads);
  EXPECT_EQ(c.checkpointer.timeout_s, co.timeout_s);
  EXPECT_EQ(c.checkpointer.mpi_hints, co.mpi_hints);
  EXPECT_EQ(c.checkpointer.metrics, co.metrics);
  EXPECT_EQ(c.checkpointer.metrics_dir, co.metrics_dir);
  EXPECT_EQ(c.save.checksums, so.checksums);
  EXPECT_EQ(c.save.overwrite, so.overwrite);
  EXPECT_EQ(c.save.update_latest, so.update_latest);
  EXPECT_EQ(c.save.aggregate_writes, so.aggregate_writes);
  EXPECT_EQ(c.save.write_window_bytes, so.write_window_bytes);
  EXPECT_EQ(c.load.strict, lo.strict);
  EXPECT_EQ(c.load.strictness, lo.strictness);
  EXPECT_EQ(c.load.convert_dtype, lo.convert_dtype);
  EXPECT_EQ(c.load.verify_checksums, lo.verify_checksums);
  EXPECT_EQ(c.load.zero_redundancy, lo.zero_redundancy);
  EXPECT_EQ(c.load.aggregate_reads, lo.aggregate_reads);
  EXPECT_EQ(c.load.read_window_bytes, lo.read_window_bytes);
  EXPECT_EQ(c.log_level, "warn");
}

TEST_F(ConfigTest, EmptyFileGivesLibraryDefaults) {
  auto c = parse_config("", "empty.toml");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  expect_defaults(*c);
}

// Every key set to a value different from its default, so each assignment is observable.
TEST_F(ConfigTest, EveryKeyParsed) {
  const std::string text = R"(
[checkpointer]
async = false
direct_writes = false
direct_io = false
staging_bytes = "3GiB"
max_piece_bytes = 65536
alignment = "4MiB"
io_threads = 7

[save]
checksums = false
overwrite = true
update_latest = false
aggregate_writes = "OFF"
write_window_bytes = "2MiB"

[load]
strict = false
strictness = "Raise_All"
convert_dtype = false
verify_checksums = true
zero_redundancy = false
aggregate_reads = true
read_window_bytes = "8MiB"

[mpi_hints]
romio_cb_write = "enable"
cb_nodes = 4
romio_no_indep_rw = true

[logging]
level = "DEBUG"

[metrics]
enabled = false
dir = "/tmp/metrics here"
)";
  auto r = parse_config(text, "all.toml");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const Config& c = *r;
  EXPECT_FALSE(c.checkpointer.async);
  EXPECT_FALSE(c.checkpointer.direct_writes);
  EXPECT_FALSE(c.checkpointer.direct_io);
  EXPECT_EQ(c.checkpointer.staging_bytes, 3ull * 1024 * 1024 * 1024);
  EXPECT_EQ(c.checkpointer.max_piece_bytes, 65536u);
  EXPECT_EQ(c.checkpointer.alignment, 4ull * 1024 * 1024);
  EXPECT_EQ(c.checkpointer.io_threads, 7);
  EXPECT_FALSE(c.save.checksums);
  EXPECT_TRUE(c.save.overwrite);
  EXPECT_FALSE(c.save.update_latest);
  EXPECT_EQ(c.save.aggregate_writes, AggregateWrites::kOff);
  EXPECT_EQ(c.save.write_window_bytes, 2ull << 20);
  EXPECT_FALSE(c.load.strict);
  EXPECT_EQ(c.load.strictness, LoadStrictness::kRaiseAll);
  EXPECT_FALSE(c.load.convert_dtype);
  EXPECT_TRUE(c.load.verify_checksums);
  EXPECT_FALSE(c.load.zero_redundancy);
  EXPECT_TRUE(c.load.aggregate_reads);
  EXPECT_EQ(c.load.read_window_bytes, 8ull << 20);
  const std::map<std::string, std::string> hints{
      {"romio_cb_write", "enable"}, {"cb_nodes", "4"}, {"romio_no_indep_rw", "true"}};
  EXPECT_EQ(c.checkpointer.mpi_hints, hints);
  EXPECT_EQ(c.log_level, "debug");
  EXPECT_FALSE(c.checkpointer.metrics);
  EXPECT_EQ(c.checkpointer.metrics_dir, "/tmp/metrics here");
}

TEST_F(ConfigTest, ByteSizes) {
  const std::pair<const char*, uint64_t> ok[] = {
      {"0", 0},
      {"512", 512},
      {"512B", 512},
      {"4K", 4096},
      {"4KiB", 4096},
      {"4kb", 4000},
      {"2 MiB", 2 * 1048576ull},
      {"3MB", 3000000},
      {"1.5GiB", 1610612736ull},
      {"0.5KiB", 512},
      {"1GB", 1000000000ull},
      {"2TiB", 2ull << 40},
      {"18446744073709551615", 18446744073709551615ull},
  };
  for (const auto& [text, want] : ok) {
    auto r = parse_byte_size(text);
    ASSERT_TRUE(r.ok()) << text << ": " << r.status().to_string();
    EXPECT_EQ(*r, want) << text;
  }
  const std::pair<const char*, const char*> bad[] = {
      {"", "empty"},
      {"-1", "negative"},
      {"1.5", "whole number"},
      {"0.3KiB", "whole number"},
      {"12XB", "unknown unit"},
      {"GiB", "expected a number"},
      {"18446744073709551616", "too large"},
      {"16777216TiB", "too large"},
  };
  for (const auto& [text, why] : bad) expect_error(parse_byte_size(text).status(), ErrorCode::kInvalidArgument, {why});
}

TEST_F(ConfigTest, FileErrorsNameKeyFileAndLine) {
  // Line numbers below are those of the offending key or value in each text.
  struct Case {
    const char* text;
    std::vector<std::string> parts;
  };
  const Case cases[] = {
      {"[checkpointer]\nasync = true\nasynk = true\n",
       {"f.toml:3:", "checkpointer.asynk", "unknown key", "io_threads"}},
      {"[checkpoint]\nasync = true\n", {"f.toml:1:", "checkpoint", "unknown section", "[checkpointer]"}},
      {"async = true\n", {"f.toml:1:", "async", "unknown top-level key"}},
      {"[checkpointer]\n\nasync = \"yes\"\n", {"f.toml:3:", "checkpointer.async", "expected a boolean", "a string"}},
      {"[checkpointer]\nstaging_bytes = -5\n", {"f.toml:2:", "checkpointer.staging_bytes", "negative size -5"}},
      {"[checkpointer]\nstaging_bytes = \"1.5GX\"\n", {"f.toml:2:", "checkpointer.staging_bytes", "unknown unit"}},
      {"[checkpointer]\nalignment = 1.5\n", {"f.toml:2:", "checkpointer.alignment", "floating-point"}},
      {"[checkpointer]\nmax_piece_bytes = 0\n", {"f.toml:2:", "checkpointer.max_piece_bytes", "greater than 0"}},
      {"[checkpointer]\nio_threads = 1025\n", {"f.toml:2:", "checkpointer.io_threads", "from 0 to 1024"}},
      {"[checkpointer]\nio_threads = -1\n", {"f.toml:2:", "checkpointer.io_threads", "from 0 to 1024"}},
      {"[checkpointer]\nio_threads = \"4\"\n", {"f.toml:2:", "checkpointer.io_threads", "an integer"}},
      {"[logging]\nlevel = \"verbose\"\n", {"f.toml:2:", "logging.level", "unknown log level \"verbose\""}},
      {"[load]\nstrictness = \"lenient\"\n",
       {"f.toml:2:", "load.strictness", "unknown strictness \"lenient\"",
        "ignore_unexpected, raise_all, allow_missing"}},
      {"[load]\nstrictness = 1\n", {"f.toml:2:", "load.strictness", "an integer"}},
      {"[mpi_hints]\ncb_nodes = 4.5\n", {"f.toml:2:", "mpi_hints.cb_nodes", "floating-point"}},
      {"[metrics]\ndir = 3\n", {"f.toml:2:", "metrics.dir", "expected a string"}},
      {"[save]\nchecksums = true\n[save]\n", {"f.toml:3:", "TOML syntax error"}},
      {"[load]\nstrict = tru\n", {"f.toml:2:", "TOML syntax error"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    expect_error(parse_config(c.text, "f.toml").status(), ErrorCode::kInvalidArgument, c.parts);
  }
}

TEST_F(ConfigTest, LoadConfigFromFile) {
  const std::string p = write("a.toml", "[checkpointer]\nio_threads = 3\n\n[load]\nbogus = 1\n");
  expect_error(load_config(p).status(), ErrorCode::kInvalidArgument, {p + ":5:", "load.bogus"});
  const std::string q = write("b.toml", "[checkpointer]\nio_threads = 3\n");
  auto c = load_config(q);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->checkpointer.io_threads, 3);
  const std::string missing = (dir_ / "nope.toml").string();
  expect_error(load_config(missing).status(), ErrorCode::kNotFound, {missing});
}

TEST_F(ConfigTest, EveryEnvironmentVariable) {
  setenv("H5CKPT_ASYNC", "off", 1);
  setenv("H5CKPT_DIRECT_WRITES", "no", 1);
  setenv("H5CKPT_DIRECT_IO", "0", 1);
  setenv("H5CKPT_STAGING_BYTES", "1.5MiB", 1);
  setenv("H5CKPT_MAX_PIECE_BYTES", "8K", 1);
  setenv("H5CKPT_ALIGNMENT", "0", 1);
  setenv("H5CKPT_IO_THREADS", "9", 1);
  setenv("H5CKPT_CHECKSUMS", "0", 1);
  setenv("H5CKPT_OVERWRITE", "YES", 1);
  setenv("H5CKPT_UPDATE_LATEST", "false", 1);
  setenv("H5CKPT_LOAD_STRICT", "no", 1);
  setenv("H5CKPT_LOAD_STRICTNESS", " allow_missing ", 1);
  setenv("H5CKPT_CONVERT_DTYPE", "0", 1);
  setenv("H5CKPT_VERIFY_CHECKSUMS", "1", 1);
  setenv("H5CKPT_ZERO_REDUNDANCY", "off", 1);
  setenv("H5CKPT_MPI_HINTS", "romio_cb_write=disable, cb_nodes=2", 1);
  setenv("H5CKPT_LOG_LEVEL", "Error", 1);
  setenv("H5CKPT_METRICS", "false", 1);
  setenv("H5CKPT_METRICS_DIR", "/scratch/m", 1);
  Config c;
  ASSERT_TRUE(apply_env(c).ok());
  EXPECT_FALSE(c.checkpointer.async);
  EXPECT_FALSE(c.checkpointer.direct_writes);
  EXPECT_FALSE(c.checkpointer.direct_io);
  EXPECT_EQ(c.checkpointer.staging_bytes, 1572864u);
  EXPECT_EQ(c.checkpointer.max_piece_bytes, 8192u);
  EXPECT_EQ(c.checkpointer.alignment, 0u);
  EXPECT_EQ(c.checkpointer.io_threads, 9);
  EXPECT_FALSE(c.save.checksums);
  EXPECT_TRUE(c.save.overwrite);
  EXPECT_FALSE(c.save.update_latest);
  EXPECT_FALSE(c.load.strict);
  EXPECT_EQ(c.load.strictness, LoadStrictness::kAllowMissing);
  EXPECT_FALSE(c.load.convert_dtype);
  EXPECT_TRUE(c.load.verify_checksums);
  EXPECT_FALSE(c.load.zero_redundancy);
  const std::map<std::string, std::string> hints{{"romio_cb_write", "disable"}, {"cb_nodes", "2"}};
  EXPECT_EQ(c.checkpointer.mpi_hints, hints);
  EXPECT_EQ(c.log_level, "error");
  EXPECT_FALSE(c.checkpointer.metrics);
  EXPECT_EQ(c.checkpointer.metrics_dir, "/scratch/m");
}

TEST_F(ConfigTest, EnvironmentErrorsNameTheVariableAndLeaveConfigUnchanged) {
  const std::pair<std::pair<const char*, const char*>, const char*> cases[] = {
      {{"H5CKPT_ASYNC", "maybe"}, "expected a boolean"},
      {{"H5CKPT_LOAD_STRICTNESS", "strict"}, "unknown strictness \"strict\""},
      {{"H5CKPT_STAGING_BYTES", "-1"}, "negative"},
      {{"H5CKPT_STAGING_BYTES", "1.5GB "}, ""},  // valid: trailing blank ignored (checked below)
      {{"H5CKPT_ALIGNMENT", "1.5"}, "whole number"},
      {{"H5CKPT_IO_THREADS", "two"}, "from 0 to 1024"},
      {{"H5CKPT_IO_THREADS", "1025"}, "from 0 to 1024"},
      {{"H5CKPT_LOG_LEVEL", "loud"}, "unknown log level"},
      {{"H5CKPT_MPI_HINTS", "cb_nodes=2,novalue"}, "not key=value"},
  };
  for (const auto& [kv, why] : cases) {
    SCOPED_TRACE(kv.first + std::string("=") + kv.second);
    setenv(kv.first, kv.second, 1);
    setenv("H5CKPT_IO_THREADS_UNUSED_GUARD", "x", 1);  // unknown, far from any name: ignored
    Config c;
    c.checkpointer.io_threads = 5;  // a value set earlier must survive a failed apply_env
    c.checkpointer.staging_bytes = 11;
    const Status st = apply_env(c);
    if (std::string(why).empty()) {
      ASSERT_TRUE(st.ok()) << st.to_string();
      EXPECT_EQ(c.checkpointer.staging_bytes, 1500000000u);
    } else {
      expect_error(st, ErrorCode::kInvalidArgument, {kv.first, why});
      EXPECT_EQ(c.checkpointer.io_threads, 5);
      EXPECT_EQ(c.checkpointer.staging_bytes, 11u);
    }
    unsetenv(kv.first);
  }
}

TEST_F(ConfigTest, PrecedenceDefaultsFileEnvironmentCode) {
  const std::string file = write("p.toml",
                                 "[checkpointer]\nasync = false\nstaging_bytes = \"1MiB\"\nio_threads = 3\n"
                                 "[mpi_hints]\ncb_nodes = 8\nromio_cb_write = \"enable\"\n");
  setenv("H5CKPT_IO_THREADS", "5", 1);                            // env beats file
  setenv("H5CKPT_MPI_HINTS", "cb_nodes=2,striping_factor=4", 1);  // merged key by key
  auto r = resolve_config(file);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  Config c = *r;
  EXPECT_FALSE(c.checkpointer.async);                                    // file
  EXPECT_EQ(c.checkpointer.staging_bytes, 1048576u);                     // file
  EXPECT_EQ(c.checkpointer.io_threads, 5);                               // env over file
  EXPECT_EQ(c.checkpointer.alignment, CheckpointerOptions{}.alignment);  // default
  const std::map<std::string, std::string> hints{
      {"cb_nodes", "2"}, {"romio_cb_write", "enable"}, {"striping_factor", "4"}};
  EXPECT_EQ(c.checkpointer.mpi_hints, hints);
  c.checkpointer.io_threads = 1;  // code has the last word: it simply assigns
  EXPECT_EQ(c.checkpointer.io_threads, 1);

  // H5CKPT_CONFIG names the file when no path is given; an explicit path wins over it.
  const std::string other = write("q.toml", "[checkpointer]\nio_threads = 6\nasync = true\n");
  unsetenv("H5CKPT_IO_THREADS");
  setenv("H5CKPT_CONFIG", other.c_str(), 1);
  auto from_env = resolve_config("");
  ASSERT_TRUE(from_env.ok()) << from_env.status().to_string();
  EXPECT_EQ(from_env->checkpointer.io_threads, 6);
  EXPECT_TRUE(from_env->checkpointer.async);
  auto explicit_path = resolve_config(file);
  ASSERT_TRUE(explicit_path.ok());
  EXPECT_EQ(explicit_path->checkpointer.io_threads, 3);

  // Errors from either layer come out of resolve_config.
  setenv("H5CKPT_CONFIG", (dir_ / "absent.toml").string().c_str(), 1);
  expect_error(resolve_config("").status(), ErrorCode::kNotFound, {"absent.toml"});
  unsetenv("H5CKPT_CONFIG");
  setenv("H5CKPT_CHECKSUMS", "2", 1);
  expect_error(resolve_config(file).status(), ErrorCode::kInvalidArgument, {"H5CKPT_CHECKSUMS"});
}

TEST_F(ConfigTest, LogLevelReachesTheLibraryLogger) {
  const std::string file = write("l.toml", "[logging]\nlevel = \"debug\"\n");
  ASSERT_TRUE(resolve_config(file).ok());
  EXPECT_EQ(logging::log().level(), spdlog::level::debug);
  setenv("H5CKPT_LOG_LEVEL", "critical", 1);  // env over file
  ASSERT_TRUE(resolve_config(file).ok());
  EXPECT_EQ(logging::log().level(), spdlog::level::critical);
  ASSERT_TRUE(set_log_level("info").ok());  // in code
  EXPECT_EQ(logging::log().level(), spdlog::level::info);
  expect_error(set_log_level("chatty"), ErrorCode::kInvalidArgument, {"chatty"});
  EXPECT_EQ(logging::log().level(), spdlog::level::info);
  ASSERT_TRUE(set_log_level("warn").ok());
}

// The shipped example documents every key, uncommented, at its default value.
TEST_F(ConfigTest, ExampleFileHasEveryKeyAtItsDefault) {
  const std::string path = std::string(H5CKPT_SOURCE_DIR) + "/config/h5ckpt.toml";
  auto c = load_config(path);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  expect_defaults(*c);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* key : {"[checkpointer]",
                          "\nasync = ",
                          "\ndirect_writes = ",
                          "\ndirect_io = ",
                          "\nstaging_bytes = ",
                          "\nmax_piece_bytes = ",
                          "\nalignment = ",
                          "\nio_threads = ",
                          "\ntimeout_s = ",
                          "[save]",
                          "\nchecksums = ",
                          "\noverwrite = ",
                          "\nupdate_latest = ",
                          "\naggregate_writes = ",
                          "\nwrite_window_bytes = ",
                          "[load]",
                          "\nstrict = ",
                          "\nstrictness = ",
                          "\nconvert_dtype = ",
                          "\nverify_checksums = ",
                          "\nzero_redundancy = ",
                          "\naggregate_reads = ",
                          "\nread_window_bytes = ",
                          "[mpi_hints]",
                          "[logging]",
                          "\nlevel = ",
                          "[metrics]",
                          "\nenabled = ",
                          "\ndir = "})
    EXPECT_NE(text.find(key), std::string::npos) << key << " missing from " << path;
}

// aggregate_writes: auto, on or off in any case, from the file or H5CKPT_AGGREGATE_WRITES; any
// other word is refused naming the key and the accepted values.
TEST_F(ConfigTest, AggregateWritesModes) {
  for (const auto& [text, mode] : {std::pair{"auto", AggregateWrites::kAuto}, std::pair{"On", AggregateWrites::kOn},
                                   std::pair{"off", AggregateWrites::kOff}}) {
    auto r = parse_config(std::string("[save]\naggregate_writes = \"") + text + "\"\n", "a.toml");
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->save.aggregate_writes, mode) << text;
  }
  auto bad = parse_config("[save]\naggregate_writes = \"sometimes\"\n", "a.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("aggregate_writes"), std::string::npos) << bad.status().to_string();
  EXPECT_NE(bad.status().message().find("auto, on, off"), std::string::npos) << bad.status().to_string();
  setenv("H5CKPT_AGGREGATE_WRITES", "on", 1);
  auto env = resolve_config("");
  unsetenv("H5CKPT_AGGREGATE_WRITES");
  ASSERT_TRUE(env.ok()) << env.status().to_string();
  EXPECT_EQ(env->save.aggregate_writes, AggregateWrites::kOn);
}

// timeout_s: seconds as a TOML integer or float, or a decimal in H5CKPT_TIMEOUT_S; 0 turns the
// deadline off; negative or non-numeric values are refused with the key's name.
TEST_F(ConfigTest, TimeoutSeconds) {
  EXPECT_EQ(CheckpointerOptions{}.timeout_s, 600.0);
  auto r = parse_config("[checkpointer]\ntimeout_s = 30\n", "t.toml");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->checkpointer.timeout_s, 30.0);
  r = parse_config("[checkpointer]\ntimeout_s = 2.5\n", "t.toml");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->checkpointer.timeout_s, 2.5);
  r = parse_config("[checkpointer]\ntimeout_s = 0\n", "t.toml");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->checkpointer.timeout_s, 0.0);
  expect_error(parse_config("[checkpointer]\ntimeout_s = -1\n", "t.toml").status(), ErrorCode::kInvalidArgument,
               {"t.toml:2:", "checkpointer.timeout_s", "seconds >= 0"});
  expect_error(parse_config("[checkpointer]\ntimeout_s = \"5\"\n", "t.toml").status(), ErrorCode::kInvalidArgument,
               {"t.toml:2:", "checkpointer.timeout_s", "a string"});
  Config c;
  setenv("H5CKPT_TIMEOUT_S", "7.5", 1);
  ASSERT_TRUE(apply_env(c).ok());
  EXPECT_EQ(c.checkpointer.timeout_s, 7.5);
  for (const char* bad : {"five", "-2", "", "5s", "nan"}) {
    setenv("H5CKPT_TIMEOUT_S", bad, 1);
    Status st = apply_env(c);
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message().find("H5CKPT_TIMEOUT_S"), std::string::npos) << st.message();
    EXPECT_EQ(c.checkpointer.timeout_s, 7.5);  // unchanged by a failed apply_env
  }
}

}  // namespace
}  // namespace h5ckpt
