#include "storage/mpi_hints.h"

#include <mpi.h>

#include <climits>
#include <cstring>

namespace h5ckpt::storage {
namespace {

// ROMIO / OMPIO / Lustre / GPFS hints whose value MPI parses as an int (and divides by or sizes
// buffers with); the minimum each accepts.
struct NumericHint {
  const char* name;
  long min;
};
constexpr NumericHint kNumeric[] = {
    {"cb_nodes", 1},        {"cb_buffer_size", 1}, {"ind_rd_buffer_size", 1}, {"ind_wr_buffer_size", 1},
    {"striping_factor", 1}, {"striping_unit", 1},  {"start_iodevice", 0},     {"romio_lustre_co_ratio", 1},
    {"cb_block_size", 1},   {"num_io_nodes", 1},
};

}  // namespace

std::string check_mpi_hint(const std::string& name, const std::string& value) {
  if (name.empty()) return "empty hint name";
  if (name.size() >= MPI_MAX_INFO_KEY) return "hint name longer than " + std::to_string(MPI_MAX_INFO_KEY - 1);
  if (value.size() >= MPI_MAX_INFO_VAL) return "value longer than " + std::to_string(MPI_MAX_INFO_VAL - 1);
  if (name.find('\0') != std::string::npos || value.find('\0') != std::string::npos) return "contains a NUL byte";
  for (const auto& h : kNumeric) {
    if (name != h.name) continue;
    const std::string want = "an integer from " + std::to_string(h.min) + " to " + std::to_string(INT_MAX);
    if (value.empty() || value.size() > 10 || value.find_first_not_of("0123456789") != std::string::npos)
      return "\"" + value + "\" is not " + want;
    const long v = std::stol(value);
    if (v < h.min || v > INT_MAX) return "\"" + value + "\" is not " + want;
  }
  return "";
}

Status validate_mpi_hints(const std::map<std::string, std::string>& hints) {
  for (const auto& [k, v] : hints)
    if (auto why = check_mpi_hint(k, v); !why.empty())
      return Status(ErrorCode::kInvalidArgument, "MPI-IO hint '" + k + "': " + why);
  return Status::Ok();
}

}  // namespace h5ckpt::storage
