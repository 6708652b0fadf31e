// Shared pieces of the `h5ckpt` command-line tool. Each subcommand lives in its own cmd_*.cpp
// and exposes one register_* function (listed in main.cpp).
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "h5ckpt/checkpointer.h"
#include "h5ckpt/reader.h"

namespace h5ckpt::cli {

/// Exit statuses shared by every subcommand.
enum Exit : int {
  kExitOk = 0,
  kExitFailed = 1,  ///< the check failed: checksum mismatch, checkpoints differ, corrupt input
  kExitError = 2,   ///< could not run: bad arguments, missing files, I/O errors
};

/// Registers a subcommand on `app`; its callback stores the exit status in *exit_code.
using RegisterFn = void (*)(CLI::App& app, int* exit_code);
void register_inspect(CLI::App& app, int* exit_code);
void register_verify(CLI::App& app, int* exit_code);
void register_diff(CLI::App& app, int* exit_code);
void register_export(CLI::App& app, int* exit_code);
void register_reshard(CLI::App& app, int* exit_code);
void register_prune(CLI::App& app, int* exit_code);

/// Text from a checkpoint (attribute keys and values, names, error messages) made safe to show:
/// bytes that are not valid UTF-8 become "\xNN"; with `terminal`, control characters too (escape,
/// bell, NUL, ... would act on the terminal or cut the line). Valid printable text is unchanged.
std::string safe_text(std::string_view s, bool terminal);
/// json::dump(2) that never throws on text that is not UTF-8 (it names no field, so callers pass
/// fields through safe_text first; this is the last guard).
std::string dump_json(const nlohmann::json& j);

/// Exit status for a failed Status: corrupt data is a failed check, the rest an error.
int exit_for(const Status& st);
/// Prints "h5ckpt: <what>: <status>" on stderr.
void print_error(const std::string& what, const Status& st);

// ---- MPI -------------------------------------------------------------------------------------

/// True when a launcher (mpirun/mpiexec, srun --mpi=pmix, hydra) started this process.
bool launched_by_mpi_launcher();

/// Initializes MPI when launched by a launcher (or always with `force`), finalizes on
/// destruction. Without MPI it behaves as rank 0 of 1. Create it before any object that holds
/// communicators, so that those are destroyed first.
class MpiSession {
 public:
  explicit MpiSession(bool force);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  bool active() const { return active_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  /// Worst (largest) exit status over all ranks; every rank gets it.
  int agree_exit(int code) const;
  /// Sum over all ranks.
  uint64_t sum(uint64_t v) const;
  /// All ranks' strings, in rank order, on rank 0 (empty elsewhere).
  std::vector<std::string> gather_to_root(const std::string& s) const;

 private:
  bool active_ = false;
  bool we_initialized_ = false;
  int rank_ = 0, size_ = 1;
};

/// Runs fn on rank 0 only (serial subcommands started under mpirun); every rank returns its
/// exit status.
int run_on_rank0(const std::function<int()>& fn);

// ---- reading tensors in bounded chunks -------------------------------------------------------

inline constexpr uint64_t kDefaultChunkBytes = 64ull << 20;

/// Reads elements [begin, end) of the row-major flattening of tensor `t` into `dst` (end-begin
/// elements of dtype `as`; a float `as` converts from a float stored dtype).
Status read_flat(CheckpointReader& reader, const TensorInfo& t, int64_t begin, int64_t end, DType as, void* dst);
/// Number of elements of `t` per chunk of at most `chunk_bytes` (at least 1).
int64_t chunk_elements(DType as, uint64_t chunk_bytes);
int64_t numel_of(const Shape& shape);

// ---- output ----------------------------------------------------------------------------------

std::string human_bytes(uint64_t n);
std::string shape_str(const Shape& s);
std::string spec_str(const ShardSpec& s);

/// A plain text table: left-aligned columns, numbers right-aligned where flagged.
class Table {
 public:
  explicit Table(std::vector<std::string> header, std::vector<bool> right_align = {});
  void add(std::vector<std::string> row);
  bool empty() const { return rows_.empty(); }
  void print(std::ostream& os, const std::string& indent = "  ") const;

 private:
  std::vector<std::string> header_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

/// Metadata as JSON (the `inspect --json` schema; see docs/cli.md).
nlohmann::json info_to_json(const CheckpointInfo& info, bool with_regions);

/// A one-line progress bar on stderr, drawn only when enabled (stderr is a terminal).
class Progress {
 public:
  Progress(bool enabled, uint64_t total, std::string label);
  void update(uint64_t done, const std::string& item);
  void finish();

 private:
  bool enabled_;
  uint64_t total_;
  std::string label_;
  std::chrono::steady_clock::time_point last_{};
  bool drawn_ = false;
};

/// True when stderr is a terminal (progress bars only then).
bool stderr_is_tty();

}  // namespace h5ckpt::cli
