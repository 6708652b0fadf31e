// libFuzzer target: storage::metadata_from_json, the validation every reader runs on an untrusted
// metadata.json. Anything it accepts must survive a write/read round trip unchanged.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "storage/meta_v1.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  constexpr uint64_t kFileSize = uint64_t{1} << 40;
  auto info = h5ckpt::storage::metadata_from_json(text, kFileSize);
  if (!info.ok()) return 0;
  const std::string again = h5ckpt::storage::metadata_to_json(*info);
  auto back = h5ckpt::storage::metadata_from_json(again, kFileSize);
  if (!back.ok() || h5ckpt::storage::metadata_to_json(*back) != again) std::abort();
  return 0;
}
