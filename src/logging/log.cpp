#include "logging/log.h"

#include <mpi.h>

#include <cstdlib>
#include <mutex>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <string>

namespace h5ckpt::logging {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger;
  static std::once_flag once;
  std::call_once(once, [] {
    int rank = -1, inited = 0;
    MPI_Initialized(&inited);
    if (inited) MPI_Comm_rank(MPI_COMM_WORLD, &rank);  // label only; no communication
    logger = spdlog::stderr_color_mt("h5ckpt");
    logger->set_pattern("[%H:%M:%S.%e] [h5ckpt rank " + std::to_string(rank) + "] [%^%l%$] %v");
    // spdlog maps unknown names to "off"; a typo must not silence warnings, so keep the default.
    const char* lvl = std::getenv("H5CKPT_LOG_LEVEL");
    const auto parsed = lvl ? spdlog::level::from_str(lvl) : spdlog::level::warn;
    const bool typo = lvl && parsed == spdlog::level::off && std::string(lvl) != "off";
    logger->set_level(typo ? spdlog::level::warn : parsed);
    if (typo)
      logger->warn("H5CKPT_LOG_LEVEL='{}' is not a level (trace, debug, info, warn, error, critical, off)", lvl);
  });
  return *logger;
}

}  // namespace h5ckpt::logging
