// The global metadata. Format v2 (written): binary tables in the data file's /meta group and a
// signed summary in `metadata.json` (storage/meta_v2.h). Format v1 (read only): the whole index as
// JSON in `metadata.json`. Validated completely before anything trusts it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "h5ckpt/checkpoint_info.h"

namespace h5ckpt::storage {

class RegionReader;

/// The format version this library writes, and the newest it reads.
inline constexpr int kFormatVersion = 2;
/// The JSON-indexed format version 1, still read.
inline constexpr int kFormatVersionV1 = 1;
inline constexpr const char* kFormatName = "h5ckpt";
// The file names are public (h5ckpt/checkpoint_info.h); storage code keeps its short names.
using h5ckpt::kDataFileName;
using h5ckpt::kLatestFileName;
using h5ckpt::kMetadataFileName;

/// Reads a checkpoint's metadata of either format from the text of its `metadata.json` and its
/// data file (format v2 reads its index tables from there): validated completely. With
/// `only_keys`, only those tensors are materialized (format v2; v1 materializes all).
Result<CheckpointInfo> read_metadata(const std::string& metadata_text, RegionReader& data,
                                     const std::vector<std::string>* only_keys = nullptr);

/// The `format_version` a metadata text declares, read without parsing the rest; 1 when absent
/// or unreadable (the v1 reader then says what is wrong).
uint64_t declared_format_version(const std::string& metadata_text);

/// The error for a checkpoint newer than this library (kUnsupported).
Status newer_than_library(uint64_t format_version);

/// Format v1: serializes `info` (paths excluded) as compact JSON carrying its own xxh3
/// ("index_xxh3"). Kept for tests and tools that make v1 checkpoints; saves write v2.
std::string metadata_to_json(const CheckpointInfo& info);

/// Format v1: parses and validates metadata text: self-checksum, known format and version,
/// dtypes, every region inside its tensor, sizes without overflow, regions disjoint and covering
/// each tensor, datasets inside a data file of `data_file_size` bytes and not overlapping each
/// other. Unknown fields are ignored (forward compatible).
Result<CheckpointInfo> metadata_from_json(const std::string& text, uint64_t data_file_size);

/// xxh3-64 of a byte range (the checksum used for regions, tables and the metadata itself).
uint64_t checksum_bytes(const void* data, size_t size);

}  // namespace h5ckpt::storage
