#include "metrics/log.h"

#include <mpi.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>

namespace h5ckpt::metrics {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger;
  static std::once_flag once;
  std::call_once(once, [] {
    int rank = -1, inited = 0;
    MPI_Initialized(&inited);
    if (inited) MPI_Comm_rank(MPI_COMM_WORLD, &rank);  // label only; no communication
    logger = spdlog::stderr_color_mt("h5ckpt");
    logger->set_pattern("[%H:%M:%S.%e] [h5ckpt rank " + std::to_string(rank) + "] [%^%l%$] %v");
    const char* lvl = std::getenv("H5CKPT_LOG_LEVEL");
    logger->set_level(lvl ? spdlog::level::from_str(lvl) : spdlog::level::warn);
  });
  return *logger;
}

}  // namespace h5ckpt::metrics
