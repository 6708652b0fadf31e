// Format version 1 of the global index (docs/format.md): the whole index as JSON in
// `metadata.json`. Read only since format v2; the writer stays for tests and tools that make v1
// checkpoints. What the codecs share, and the choice between them, is storage/format.h.
#pragma once

#include <cstdint>
#include <string>

#include "h5ckpt/checkpoint_info.h"
#include "storage/format.h"

namespace h5ckpt::storage {

/// Format v1: serializes `info` (paths excluded) as compact JSON carrying its own xxh3
/// ("index_xxh3"). Kept for tests and tools that make v1 checkpoints; saves write v2.
std::string metadata_to_json(const CheckpointInfo& info);

/// Format v1: parses and validates metadata text: self-checksum, known format and version,
/// dtypes, every region inside its tensor, sizes without overflow, regions disjoint and covering
/// each tensor, datasets inside a data file of `data_file_size` bytes and not overlapping each
/// other. Unknown fields are ignored (forward compatible).
Result<CheckpointInfo> metadata_from_json(const std::string& text, uint64_t data_file_size);

}  // namespace h5ckpt::storage
