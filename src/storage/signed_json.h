// JSON documents that carry their own checksum ("index_xxh3", docs/format.md §4.2): the format-v1
// metadata and the format-v2 summary. Shared parsing helpers that refuse silently wrapped integers.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "h5ckpt/status.h"

namespace h5ckpt::storage {

/// 16 lowercase hex digits.
std::string hex64(uint64_t v);
/// Parses exactly 16 lowercase hex digits.
bool parse_hex64(const nlohmann::json& v, uint64_t* out);

/// An integer JSON value that fits T exactly; floats, and integers outside T's range (which
/// nlohmann's get<T>() would silently wrap), are refused.
template <class T>
bool json_int(const nlohmann::json& v, T* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (!std::in_range<T>(u)) return false;
    *out = static_cast<T>(u);
    return true;
  }
  if (!v.is_number_integer()) return false;
  const int64_t i = v.get<int64_t>();
  if (!std::in_range<T>(i)) return false;
  *out = static_cast<T>(i);
  return true;
}

/// Member `name` of object `j` as an integer of type T (see json_int); false if absent or not one.
template <class T>
bool json_member_int(const nlohmann::json& j, const char* name, T* out) {
  auto it = j.find(name);
  return it != j.end() && json_int(*it, out);
}

/// Parses a signed document: nesting at most 64 deep (checked before parsing), a JSON object,
/// and an `index_xxh3` that matches the rest. Returns the object without `index_xxh3`. Errors
/// are kCorrupt, prefixed "metadata: ".
Result<nlohmann::json> parse_signed_json(const std::string& text);

/// Adds `index_xxh3` to `j` and dumps it compactly (invalid UTF-8 replaced, never thrown).
std::string dump_signed_json(nlohmann::json j);

}  // namespace h5ckpt::storage
