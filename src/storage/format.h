// What both index codecs share, and the choice between them. A checkpoint's `metadata.json`
// declares its format version: v2 (written, storage/meta_v2.h) keeps the index as binary tables in
// the data file and a signed summary in `metadata.json`; v1 (read only, storage/meta_v1.h) keeps
// the whole index as JSON there. Each codec includes this header and never the other codec;
// `read_metadata` is the one place that knows both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "h5ckpt/checkpoint_info.h"

namespace h5ckpt::storage {

class RegionReader;

/// The JSON-indexed format version 1, still read.
inline constexpr int kFormatVersionV1 = 1;
/// The table-indexed format version 2.
inline constexpr int kFormatVersionV2 = 2;
/// The format version this library writes, and the newest it reads.
inline constexpr int kFormatVersion = kFormatVersionV2;
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

/// xxh3-64 of a byte range (the checksum used for regions, tables and the metadata itself).
uint64_t checksum_bytes(const void* data, size_t size);

}  // namespace h5ckpt::storage
