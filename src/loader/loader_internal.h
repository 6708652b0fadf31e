// Helpers shared by the loader state (src/loader) and the synthetic loader and extra states
// (src/extras): error text, the shard check, and a small little-endian serializer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "h5ckpt/loader_state.h"

namespace h5ckpt::loader::detail {

inline std::string id_str(SampleId id) {
  return "sample (source " + std::to_string(id.source) + ", record " + std::to_string(id.record) + ")";
}

inline Status corrupt(const std::string& what) { return Status(ErrorCode::kCorrupt, "loader state: " + what); }

/// Checks that `shards` are exactly shards 0..num_shards-1 of `rep`'s walk and well formed;
/// `by_id` gets them indexed by shard id.
Status check_shards(const ReplicatedState& rep, const std::vector<ShardState>& shards,
                    std::vector<const ShardState*>& by_id);

// Fixed layout, versioned by a magic at the start of every blob.
class Writer {
 public:
  template <class T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    buf.insert(buf.end(), p, p + sizeof(T));
  }
  void put_str(const std::string& s) {
    put<uint64_t>(s.size());
    buf.insert(buf.end(), s.begin(), s.end());
  }
  void put_i64s(const std::vector<int64_t>& v) {
    put<uint64_t>(v.size());
    for (int64_t x : v) put(x);
  }
  std::vector<uint8_t> buf;
};

class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), end_(p + n) {}
  template <class T>
  T get() {
    T v{};
    if (static_cast<size_t>(end_ - p_) < sizeof(T)) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  // Counts are bounded so that a corrupt blob cannot ask for a huge allocation.
  uint64_t get_count(size_t elem_size) {
    uint64_t n = get<uint64_t>();
    if (!ok_ || n > static_cast<uint64_t>(end_ - p_) / std::max<size_t>(elem_size, 1)) {
      ok_ = false;
      return 0;
    }
    return n;
  }
  std::string get_str() {
    uint64_t n = get_count(1);
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  std::vector<int64_t> get_i64s() {
    uint64_t n = get_count(sizeof(int64_t));
    std::vector<int64_t> v(n);
    for (auto& x : v) x = get<int64_t>();
    return v;
  }
  bool ok() const { return ok_; }
  bool at_end() const { return p_ == end_; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  bool ok_ = true;
};

}  // namespace h5ckpt::loader::detail
