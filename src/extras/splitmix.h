// splitmix64 (Steele, Lea, Flood 2014): the one mixing function of the synthetic loader and the
// per-rank RNG. Not part of the installed library.
#pragma once

#include <cstdint>

namespace h5ckpt::extras {

inline constexpr uint64_t kSplitmixGamma = 0x9E3779B97F4A7C15ull;

/// The splitmix64 output function of state `z` (already advanced by the gamma).
inline uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// One splitmix64 step from state `z`: a well-mixed hash of one word.
inline uint64_t mix64(uint64_t z) { return splitmix64_mix(z + kSplitmixGamma); }

/// Hash of four words, chained through mix64.
inline uint64_t hash4(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  return mix64(mix64(mix64(mix64(a) ^ b) ^ c) ^ d);
}

}  // namespace h5ckpt::extras
