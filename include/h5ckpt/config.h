// Settings from a TOML file and H5CKPT_* environment variables (docs/configuration.md).
//
// Precedence, lowest first: built-in defaults < config file < environment < values the caller
// sets in code on the returned Config. Every key is checked: an unknown key or a bad value is an
// error that names the key (and the file and line for file values).
#pragma once

#include <string>

#include "h5ckpt/checkpointer.h"
#include "h5ckpt/export.h"
#include "h5ckpt/status.h"

namespace h5ckpt {

struct Config {
  CheckpointerOptions checkpointer;  ///< [checkpointer], [mpi_hints], [metrics]
  SaveOptions save;                  ///< [save] (the per-call `step` is not configurable)
  LoadOptions load;                  ///< [load]
  /// [logging] level: trace, debug, info, warn, error, critical or off.
  std::string log_level = "warn";
};

/// Defaults overlaid with the TOML file at `path`. No side effects.
H5CKPT_API Result<Config> load_config(const std::string& path);

/// Like load_config, from TOML text; `source` names it in error messages.
H5CKPT_API Result<Config> parse_config(const std::string& toml_text, const std::string& source = "<string>");

/// Overlays the H5CKPT_* environment variables (see docs/configuration.md) on `config`.
/// A malformed value is an error naming the variable; `config` is unchanged then.
/// Unknown H5CKPT_* variables are not errors (scripts use the prefix too); recognised near-misses
/// of a library variable are warned about.
H5CKPT_API Status apply_env(Config& config);

/// The start-up call: defaults < file (`path_or_empty`, else $H5CKPT_CONFIG when set) <
/// environment; then applies the log level to the library logger. Change fields of the returned
/// Config to override both in code (call set_log_level for log_level).
H5CKPT_API Result<Config> resolve_config(const std::string& path_or_empty = "");

/// Sets the level of the library logger ("h5ckpt"). Error for an unknown level name.
H5CKPT_API Status set_log_level(const std::string& level);

/// Parses a byte size: a non-negative integer with an optional unit (case-insensitive):
/// B; K, KiB = 1024; KB = 1000; M, MiB; MB; G, GiB; GB; T, TiB; TB. A decimal fraction is allowed
/// when the result is a whole number of bytes ("1.5GiB", not "0.3KiB").
H5CKPT_API Result<uint64_t> parse_byte_size(const std::string& text);

}  // namespace h5ckpt
