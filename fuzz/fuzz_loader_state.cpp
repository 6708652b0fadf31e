// libFuzzer target: the data-loader state decoders (parse_replicated, parse_shard,
// parse_shard_key), which read bytes from a checkpoint. The first byte picks the decoder; what
// decodes must serialize back to the same bytes.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "h5ckpt/loader_state.h"

using namespace h5ckpt::loader;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t which = data[0] % 3;
  ++data;
  --size;
  if (which == 0) {
    auto rep = parse_replicated(data, size);
    if (rep.ok() && serialize(*rep) != std::vector<uint8_t>(data, data + size)) std::abort();
  } else if (which == 1) {
    auto shard = parse_shard(data, size);
    if (shard.ok() && serialize(*shard) != std::vector<uint8_t>(data, data + size)) std::abort();
  } else {
    const std::string key(reinterpret_cast<const char*>(data), size);
    auto parsed = parse_shard_key(key);
    if (parsed.ok() && parse_shard_key(shard_key(parsed->first, parsed->second)).value() != *parsed) std::abort();
  }
  return 0;
}
