// Tiny bounds-checked binary serialization; the message formats themselves live in engine/wire.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace h5ckpt {

class ByteWriter {
 public:
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const char*>(&v);
    buf_.append(p, sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    buf_.append(s);
  }
  void put_vec(const std::vector<int64_t>& v) {
    put<uint64_t>(v.size());
    buf_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
  }
  void put_bytes(const void* p, size_t n) { buf_.append(static_cast<const char*>(p), n); }
  void reserve(size_t bytes) { buf_.reserve(bytes); }
  std::string& str() { return buf_; }

 private:
  std::string buf_;
};

/// Reader that fails (ok() == false) instead of reading past the end.
class ByteReader {
 public:
  ByteReader(const char* data, size_t size) : p_(data), end_(data + size) {}
  explicit ByteReader(const std::string& s) : ByteReader(s.data(), s.size()) {}
  template <class T>
  T get() {
    T v{};
    if (!need(sizeof(T))) return v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  /// A count of elements of `min_elem_bytes` bytes or more that follow: a count the remaining
  /// bytes cannot hold fails the reader (never masked, never a huge allocation).
  uint64_t get_count(size_t min_elem_bytes) {
    const uint64_t n = get<uint64_t>();
    if (!ok_ || n > static_cast<uint64_t>(end_ - p_) / (min_elem_bytes ? min_elem_bytes : 1)) {
      ok_ = false;
      return 0;
    }
    return n;
  }
  std::string get_string() { return std::string(get_string_view()); }
  /// A view into the reader's bytes, which must outlive it.
  std::string_view get_string_view() {
    uint64_t n = get_count(1);
    if (!need(n)) return {};
    const std::string_view s(p_, n);
    p_ += n;
    return s;
  }
  std::vector<int64_t> get_vec() {
    const uint64_t n = get_count(sizeof(int64_t));
    if (!ok_) return {};
    std::vector<int64_t> v(n);
    if (n) std::memcpy(v.data(), p_, n * sizeof(int64_t));  // (an empty vector's data() may be null)
    p_ += n * sizeof(int64_t);
    return v;
  }
  /// A vector's elements where they lie in the reader's bytes (unaligned), `*n` of them.
  const char* get_vec_bytes(uint64_t* n) {
    *n = get_count(sizeof(int64_t));
    if (!ok_) return nullptr;
    const char* at = p_;
    p_ += *n * sizeof(int64_t);
    return at;
  }
  bool ok() const { return ok_; }
  bool at_end() const { return p_ == end_; }

 private:
  bool need(size_t n) {
    if (!ok_ || static_cast<size_t>(end_ - p_) < n) {
      ok_ = false;
      return false;
    }
    return true;
  }
  const char* p_;
  const char* end_;
  bool ok_ = true;
};

}  // namespace h5ckpt
