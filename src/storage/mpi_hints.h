// MPI-IO hints reach Open MPI unchecked otherwise: cb_nodes = 0 raised SIGFPE inside ROMIO and
// negative sizes crashed at MPI_Finalize. Checked where hints come from (config) and where they
// are applied (every rank, before the collective file create), so a bad one is an error.
#pragma once

#include <map>
#include <string>

#include "h5ckpt/status.h"

namespace h5ckpt::storage {

/// Why one hint is unusable, or "" when it is fine: names and values must fit MPI_Info, and the
/// known numeric hints (cb_nodes, cb_buffer_size, striping_factor, striping_unit, ...) must be
/// decimal integers within int range, positive (start_iodevice: non-negative).
std::string check_mpi_hint(const std::string& name, const std::string& value);

/// kInvalidArgument naming the first unusable hint, else Ok.
Status validate_mpi_hints(const std::map<std::string, std::string>& hints);

}  // namespace h5ckpt::storage
