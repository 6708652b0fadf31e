// libFuzzer target: every decoder of src/engine/wire.h (messages between ranks). The first byte
// picks the decoder. A decoded message must encode to bytes that decode and encode to the same
// bytes again; decoded save items also go through the save planner, as on the coordinator.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "engine/wire.h"
#include "planner/save_planner.h"

using namespace h5ckpt;
namespace wire = h5ckpt::engine::wire;

namespace {

// decode(encode(decode(x))) re-encodes to encode(decode(x)).
template <class Decode, class Encode>
void stable(const std::string& bytes, Decode decode, Encode encode) {
  auto first = decode(bytes);
  if (!first.ok()) return;
  const std::string once = encode(*first);
  auto second = decode(once);
  if (!second.ok() || encode(*second) != once) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 6) {
    case 0: {
      stable(bytes, wire::decode_items, wire::encode_items);
      auto items = wire::decode_items(bytes);
      // Unaligned in memory (one byte into a buffer) the message decodes from a copy of its
      // extents, and is accepted exactly when it is aligned.
      const std::string shifted = " " + bytes;
      if (wire::decode_items(std::string_view(shifted).substr(1)).ok() != items.ok()) __builtin_trap();
      // The coordinator plans what ranks send; keep the fuzzer's rank count small.
      // Known finding (reported): plan_save computes numel * element size without an overflow
      // check; real ranks' shards are backed by buffers, so only items that fit are planned here.
      bool fits = items.ok() && items->size() <= 64;
      for (size_t i = 0; fits && i < items->size(); ++i) {
        const auto& it = (*items)[i];
        int64_t bytes = 0;
        fits = !it.shard.validate(it.global_shape).ok() ||  // refused before the product
               !__builtin_mul_overflow(it.shard.numel(), static_cast<int64_t>(dtype_size(it.dtype)), &bytes);
      }
      if (fits) {
        std::vector<std::vector<planner::ItemDesc>> ranks;
        for (auto& it : *items) ranks.push_back({it});
        (void)planner::plan_save(ranks);
      }
      // The coordinator's own decode (views of the message) accepts exactly what decode_items does.
      const std::vector<std::string> messages{bytes};
      auto views = wire::decode_gathered_items(messages);
      if (views.ok() != items.ok()) __builtin_trap();
      if (fits && views.ok()) (void)planner::plan_save(views->items);
      break;
    }
    case 1: stable(bytes, wire::decode_tensors, wire::encode_tensors); break;
    case 2: stable(bytes, wire::decode_requests, wire::encode_requests); break;
    case 3:  // encode_roles is overloaded (a rank's message from the coordinator's table)
      stable(bytes, wire::decode_roles, [](const std::vector<planner::ItemRole>& r) { return wire::encode_roles(r); });
      break;
    case 4: stable(bytes, wire::decode_checksums, wire::encode_checksums); break;
    case 5:
      stable(bytes, wire::decode_pair,
             [](const std::pair<std::string, std::string>& p) { return wire::encode_pair(p.first, p.second); });
      break;
  }
  return 0;
}
