// Overflow-checked arithmetic and small formatting helpers shared by the layers.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>

#include "h5ckpt/types.h"

namespace h5ckpt {

inline constexpr size_t kMaxDims = 32;

inline bool checked_mul(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }
inline bool checked_add(int64_t a, int64_t b, int64_t* out) { return !__builtin_add_overflow(a, b, out); }

inline std::string to_string_shape(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << ']';
  return os.str();
}

inline std::string to_string_spec(const ShardSpec& s) {
  std::string r = "offset " + to_string_shape(s.box.offset) + " shape " + to_string_shape(s.box.shape);
  if (s.flat) r += " flat [" + std::to_string(s.flat->first) + "," + std::to_string(s.flat->second) + ")";
  return r;
}

}  // namespace h5ckpt
