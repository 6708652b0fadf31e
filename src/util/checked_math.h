// Overflow-checked arithmetic and small formatting helpers shared by the layers.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

#include "h5ckpt/types.h"

namespace h5ckpt {

inline constexpr size_t kMaxDims = 32;

inline bool checked_mul(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }
inline bool checked_add(int64_t a, int64_t b, int64_t* out) { return !__builtin_add_overflow(a, b, out); }

/// Untrusted text quoted in a message: bytes outside printable ASCII become "\xNN", so a NUL, an
/// escape sequence or a bell in a key read from a file neither cuts nor acts on the message.
inline std::string printable(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7F) {
      out += ch;
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

inline std::string to_string_shape(const Shape& s) {
  // std::to_string, not a stream: no locale is consulted (a process whose C++ runtime state was
  // set up by another library, as in a Python interpreter that loaded torch, crashed in
  // ostream::operator<< here; this also runs for every region identity of every save).
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ',';
    r += std::to_string(s[i]);
  }
  r += ']';
  return r;
}

inline std::string to_string_spec(const ShardSpec& s) {
  std::string r = "offset " + to_string_shape(s.box.offset) + " shape " + to_string_shape(s.box.shape);
  if (s.flat) r += " flat [" + std::to_string(s.flat->first) + "," + std::to_string(s.flat->second) + ")";
  return r;
}

}  // namespace h5ckpt
