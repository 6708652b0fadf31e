// Authenticated checkpoints (docs/format.md §12): with a key configured (auth_key_file /
// H5CKPT_AUTH_KEY_FILE), every digest the format keeps becomes a keyed MAC (libsodium's keyed
// BLAKE2b): each verification block's 64-bit sum, each index table's sum, and the summary's
// signature (256 bits). Anyone who can write the files but lacks the key cannot make a checkpoint
// that loads, and a checkpoint made with a key is refused without it. Without a key nothing
// changes (xxh3, as before).
//
// The key is process-wide, like the deadline (comm/deadline.h): the last Checkpointer constructed
// with auth_key_file (or the tools, from the environment) sets it. It must be the same on every
// rank; saves and loads agree on its identity before they start.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "h5ckpt/status.h"

namespace h5ckpt::storage::auth {

/// Loads the key from `key_file` (at least 16 bytes of anything; the key is their BLAKE2b-256),
/// or turns authentication off for an empty path. The file must be a regular file.
Status configure(const std::string& key_file);

/// True while a key is configured.
bool enabled();

/// 16 hex digits naming the key (a keyed hash of a constant; reveals nothing of the key): written
/// in each authenticated summary so a wrong key is named as such. Empty when disabled.
std::string key_id();

/// 64-bit MAC of `data` under the key, bound to `seed` (what the bytes mean: region identity and
/// block index, or a table's number).
uint64_t tag64(uint64_t seed, const void* data, size_t size);

/// The same MAC over data that arrives in pieces.
class Tag64 {
 public:
  explicit Tag64(uint64_t seed);
  void update(const void* data, size_t size);
  uint64_t final();

 private:
  alignas(64) unsigned char state_[384];  // crypto_generichash_state
};

/// 256-bit MAC of a document, as 64 hex digits.
std::string tag256_hex(const std::string& text);

/// Constant-time comparison of two hex MACs.
bool equal_tags(const std::string& a, const std::string& b);

}  // namespace h5ckpt::storage::auth
