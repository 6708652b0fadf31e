// libFuzzer target: the format-v2 index readers every load runs on untrusted bytes:
// v2::parse_summary (metadata.json) and v2::Index::open over the tables' image, without and with
// full validation. Input: one flag byte, a 4-byte little-endian summary length, the summary text,
// the image. With flag bit 0 set the harness re-signs the summary after setting each table's
// xxh3 to that of its bytes in the image, so mutations reach the checks behind the checksums (a
// hostile writer can do the same). Whatever validates must materialize, encode again, and come
// back equal.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "storage/meta_v2.h"
#include "storage/meta_v1.h"
#include "storage/signed_json.h"

namespace v2 = h5ckpt::storage::v2;

namespace {

// The summary with every table's xxh3 made to match the image, re-signed; as is if that fails.
std::string resigned(const std::string& text, const uint8_t* image, size_t image_size) {
  using nlohmann::json;
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("tables") || !j["tables"].is_object()) return text;
  j.erase("index_xxh3");
  uint64_t at = 0;
  for (size_t i = 0; i < v2::kTableCount; ++i) {
    auto t = j["tables"].find(v2::table_name(static_cast<v2::Table>(i)));
    uint64_t bytes = 0;
    if (t == j["tables"].end() || !t->is_object() || !h5ckpt::storage::json_member_int(*t, "bytes", &bytes))
      return text;
    at = (at + 7) / 8 * 8;
    if (at > image_size || bytes > image_size - at) return text;
    (*t)["xxh3"] = h5ckpt::storage::hex64(h5ckpt::storage::checksum_bytes(image + at, bytes));
    at += bytes;
  }
  return h5ckpt::storage::dump_signed_json(std::move(j));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  const bool resign = data[0] & 1;
  uint32_t summary_len = 0;
  for (int i = 0; i < 4; ++i) summary_len |= uint32_t{data[1 + i]} << (8 * i);
  if (summary_len > size - 5) return 0;
  std::string text(reinterpret_cast<const char*>(data) + 5, summary_len);
  const uint8_t* image = data + 5 + summary_len;
  const size_t image_size = size - 5 - summary_len;
  if (resign) text = resigned(text, image, image_size);
  constexpr uint64_t kFileSize = uint64_t{1} << 40;

  auto summary = v2::parse_summary(text);
  if (!summary.ok()) return 0;
  // Bytes nobody validated (as a rank that trusts the coordinator would get them, damaged): the
  // structural checks alone must keep every accessor inside the image.
  if (auto unchecked = v2::Index::open(*summary, image, image_size, kFileSize, false); unchecked.ok())
    (void)unchecked->to_info();
  auto index = v2::Index::open(*summary, image, image_size, kFileSize, true);
  if (!index.ok()) return 0;
  const h5ckpt::CheckpointInfo info = index->to_info();
  for (size_t t = 0; t < index->tensor_count(); ++t)
    if (index->find(index->key(t)) != t) std::abort();  // validated keys are sorted and unique

  auto encoded = v2::encode(info);
  if (!encoded.ok()) std::abort();
  std::array<int64_t, v2::kTableCount> offsets;
  int64_t at = 0;
  for (size_t i = 0; i < v2::kTableCount; ++i) {
    offsets[i] = encoded->tables[i].empty() ? -1 : at;
    at += static_cast<int64_t>(encoded->tables[i].size());
  }
  auto again = v2::parse_summary(encoded->summary_json(offsets));
  if (!again.ok()) std::abort();
  const std::vector<char> image2 = encoded->image();
  auto reopened = v2::Index::open(*again, image2.data(), image2.size(), kFileSize, false);
  if (!reopened.ok()) std::abort();
  if (h5ckpt::storage::metadata_to_json(reopened->to_info()) != h5ckpt::storage::metadata_to_json(info)) std::abort();
  return 0;
}
