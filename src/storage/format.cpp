#include "storage/format.h"

#include <xxhash.h>

#include <nlohmann/json.hpp>

#include "storage/meta_v1.h"
#include "storage/meta_v2.h"
#include "storage/region_reader.h"

namespace h5ckpt::storage {

using nlohmann::json;

uint64_t checksum_bytes(const void* data, size_t size) { return XXH3_64bits(data, size); }

Status newer_than_library(uint64_t format_version) {
  return Status(ErrorCode::kUnsupported, "checkpoint format version " + std::to_string(format_version) +
                                             " is newer than this library's (" + std::to_string(kFormatVersion) + ")");
}

uint64_t declared_format_version(const std::string& metadata_text) {
  // Every top-level member but format_version is dropped while parsing (a v1 index can be large).
  json::parser_callback_t keep_version = [](int depth, json::parse_event_t event, json& parsed) {
    return !(event == json::parse_event_t::key && depth == 1 && parsed != "format_version");
  };
  // Deeply nested garbage is the v1 reader's to refuse (it checks nesting before parsing).
  json j = json::parse(metadata_text, keep_version, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return kFormatVersionV1;
  auto v = j.find("format_version");
  return v != j.end() && v->is_number_unsigned() ? v->get<uint64_t>() : kFormatVersionV1;
}

Result<CheckpointInfo> read_metadata(const std::string& metadata_text, RegionReader& data,
                                     const std::vector<std::string>* only_keys) {
  const uint64_t version = declared_format_version(metadata_text);
  if (version != static_cast<uint64_t>(v2::kFormatVersion)) return metadata_from_json(metadata_text, data.file_size());
  H5CKPT_ASSIGN_OR_RETURN(v2::Summary summary, v2::parse_summary(metadata_text));
  H5CKPT_ASSIGN_OR_RETURN(std::vector<char> image, v2::read_image(summary, data));
  H5CKPT_ASSIGN_OR_RETURN(v2::Index index,
                          v2::Index::open(summary, image.data(), image.size(), data.file_size(), /*validate=*/true));
  return index.to_info(only_keys);
}

}  // namespace h5ckpt::storage
