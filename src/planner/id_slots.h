// Open addressing over 32-bit ids, the planners' hash tables (regions and boxes of a save,
// request groups of a load): `slots`, a power of two at most half full, hold ids whose hashes
// give their home slots; collisions probe the next slot.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace h5ckpt::planner {

constexpr uint32_t kNoId = UINT32_MAX;  // an empty slot

/// Doubles `slots` (to at least `min_slots`) and puts ids [0, ids) back, each at `hash_of(id)`.
template <class Slots, class HashOf>
void rehash_ids(Slots& slots, uint32_t ids, size_t min_slots, HashOf hash_of) {
  slots.assign(std::max<size_t>(min_slots, 2 * slots.size()), kNoId);
  const size_t mask = slots.size() - 1;
  for (uint32_t id = 0; id < ids; ++id) {
    size_t i = hash_of(id) & mask;
    while (slots[i] != kNoId) i = (i + 1) & mask;
    slots[i] = id;
  }
}

/// The first id along `h`'s probe sequence that `same` accepts, or else `next`, stored in the
/// empty slot that ended the search (the caller adds the entry when it gets `next` back).
template <class Slots, class Same>
uint32_t find_or_insert_id(Slots& slots, uint64_t h, uint32_t next, Same same) {
  const size_t mask = slots.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const uint32_t id = slots[i];
    if (id == kNoId) return slots[i] = next;
    if (same(id)) return id;
  }
}

}  // namespace h5ckpt::planner
