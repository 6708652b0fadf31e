// `h5ckpt`: inspect, verify, compare, export and rewrite h5ckpt checkpoints (docs/cli.md).
// To add a subcommand: write cmd_<name>.cpp with a register_<name>(app, exit_code) function,
// declare it in cli_common.h and list it below.
#include <cstdlib>
#include <iostream>

#include "tools/cli_common.h"
#include "tools/cmd_report.h"

int main(int argc, char** argv) {
  using namespace h5ckpt::cli;
  CLI::App app{"h5ckpt " + std::string(h5ckpt::version()) +
               ": inspect, verify, compare, export, reshard and prune h5ckpt checkpoints"};
  app.set_version_flag("--version", std::string(h5ckpt::version()));
  app.require_subcommand(1);
  int exit_code = kExitOk;
  // Authenticated checkpoints: the key for every subcommand (docs/cli.md).
  std::string key_file;
  if (const char* env = std::getenv("H5CKPT_AUTH_KEY_FILE")) key_file = env;
  app.add_option("--auth-key-file", key_file,
                 "key of authenticated checkpoints (default: $H5CKPT_AUTH_KEY_FILE); they are refused without it, and "
                 "unauthenticated ones with it");
  app.parse_complete_callback([&] {
    if (key_file.empty()) return;
    if (const h5ckpt::Status st = h5ckpt::set_auth_key_file(key_file); !st.ok()) {
      print_error("--auth-key-file", st);
      std::exit(kExitError);
    }
  });
  for (RegisterFn reg : {register_inspect, register_verify, register_diff, register_export, register_reshard,
                         register_report, register_prune})
    reg(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help (rc 0) or the usage error
    return rc == 0 ? kExitOk : kExitError;
  }
  return exit_code;
}
