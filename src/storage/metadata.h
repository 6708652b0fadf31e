// The global metadata (format v1): JSON in `metadata.json` beside the data file and in the
// data file's `/meta` group. Validated completely before anything trusts it.
#pragma once

#include <string>

#include "h5ckpt/checkpoint_info.h"

namespace h5ckpt::storage {

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kFormatName = "h5ckpt";
// The file names are public (h5ckpt/checkpoint_info.h); storage code keeps its short names.
using h5ckpt::kDataFileName;
using h5ckpt::kLatestFileName;
using h5ckpt::kMetadataFileName;

/// Serializes `info` (paths excluded) as compact JSON carrying its own xxh3 ("index_xxh3").
std::string metadata_to_json(const CheckpointInfo& info);

/// Parses and validates metadata text: self-checksum, known format and version, dtypes, every
/// region inside its tensor, sizes without overflow, regions disjoint and covering each tensor,
/// datasets inside a data file of `data_file_size` bytes and not overlapping each other.
/// Unknown fields are ignored (forward compatible).
Result<CheckpointInfo> metadata_from_json(const std::string& text, uint64_t data_file_size);

/// xxh3-64 of a byte range (the checksum used for regions and the metadata itself).
uint64_t checksum_bytes(const void* data, size_t size);

}  // namespace h5ckpt::storage
