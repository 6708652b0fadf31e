// `h5ckpt report` registration (declared here so cli_common.h needs no change).
#pragma once

namespace CLI {
class App;
}

namespace h5ckpt::cli {
void register_report(CLI::App& app, int* exit_code);
}  // namespace h5ckpt::cli
