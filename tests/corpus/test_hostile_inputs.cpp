// Unit tests of hostile configuration input (label `corpus`): MPI-IO hints that crash Open MPI
// (cb_nodes = 0: SIGFPE; negative sizes: a crash at MPI_Finalize) are refused where they are read
// (TOML file, H5CKPT_MPI_HINTS) and by the check the writer runs on every rank.
#include <gtest/gtest.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "h5ckpt/config.h"
#include "storage/mpi_hints.h"

namespace h5ckpt {
namespace {

TEST(MpiHints, NumericHintsMustBePositiveInts) {
  for (const char* bad :
       {"0", "-1", "-5", "2147483648", "4294967297", "99999999999999999999", "1e6", "", " 4", "0x10", "4.0", "+4"}) {
    for (const char* name : {"cb_nodes", "cb_buffer_size", "striping_factor", "striping_unit"})
      EXPECT_NE(storage::check_mpi_hint(name, bad), "") << name << "=" << bad;
  }
  for (const char* good : {"1", "4", "16777216", "2147483647"})
    EXPECT_EQ(storage::check_mpi_hint("cb_buffer_size", good), "") << good;
  EXPECT_EQ(storage::check_mpi_hint("start_iodevice", "0"), "");  // the one that may be 0
  EXPECT_NE(storage::check_mpi_hint("start_iodevice", "-1"), "");
  // Unknown and string hints pass through, within MPI_Info's limits.
  EXPECT_EQ(storage::check_mpi_hint("romio_cb_write", "enable"), "");
  EXPECT_EQ(storage::check_mpi_hint("some_future_hint", "-3"), "");
  EXPECT_NE(storage::check_mpi_hint("", "1"), "");
  EXPECT_NE(storage::check_mpi_hint(std::string(1000, 'k'), "1"), "");
  EXPECT_NE(storage::check_mpi_hint("romio_cb_write", std::string(5000, 'v')), "");

  auto st = storage::validate_mpi_hints({{"romio_cb_write", "enable"}, {"cb_nodes", "0"}});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("cb_nodes"), std::string::npos) << st.message();
  EXPECT_TRUE(storage::validate_mpi_hints({{"cb_nodes", "2"}, {"romio_cb_write", "disable"}}).ok());
}

TEST(MpiHints, ConfigFileRefusesBadHints) {
  for (const char* text : {"[mpi_hints]\ncb_nodes = 0\n", "[mpi_hints]\ncb_buffer_size = -1\n",
                           "[mpi_hints]\nstriping_unit = \"-4096\"\n", "[mpi_hints]\nstriping_factor = 4294967297\n"}) {
    auto c = parse_config(text, "f.toml");
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("f.toml:2:"), std::string::npos) << c.status().message();
    EXPECT_NE(c.status().message().find("mpi_hints."), std::string::npos) << c.status().message();
  }
  auto ok = parse_config("[mpi_hints]\ncb_nodes = 2\nromio_cb_write = \"enable\"\n", "f.toml");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->checkpointer.mpi_hints.at("cb_nodes"), "2");
}

TEST(MpiHints, EnvironmentRefusesBadHints) {
  ::setenv("H5CKPT_MPI_HINTS", "romio_cb_write=enable,cb_nodes=0", 1);
  auto c = resolve_config("");
  ::unsetenv("H5CKPT_MPI_HINTS");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("H5CKPT_MPI_HINTS"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("cb_nodes"), std::string::npos) << c.status().message();
}

}  // namespace
}  // namespace h5ckpt
