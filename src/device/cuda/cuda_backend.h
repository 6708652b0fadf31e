// Factories of the optional CUDA target (built when the CUDA toolkit and NCCL are found).
#pragma once

#include <memory>
#include <string>

#include "device/staging.h"

namespace h5ckpt::device::cuda {

/// Pinned host memory, a dedicated non-blocking stream and events; null when no GPU is visible.
std::unique_ptr<Staging> make_cuda_staging();

/// NCCL point-to-point between device buffers over a communicator bootstrapped through `comm`
/// (collective). `s` must be the CUDA staging: transfers run on its stream, after its copies.
std::unique_ptr<comm::Transport> make_nccl_transport(MPI_Comm comm, Staging& s, std::string* why);

}  // namespace h5ckpt::device::cuda
