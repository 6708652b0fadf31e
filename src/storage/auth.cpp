#include "storage/auth.h"

#include <sodium.h>

#include <array>
#include <cstring>
#include <mutex>

#include "storage/commit.h"  // read_whole_file

namespace h5ckpt::storage::auth {

namespace {

struct Key {
  bool on = false;
  std::array<unsigned char, crypto_generichash_KEYBYTES> bytes{};
  std::string id;
};

Key& key() {
  static Key k;
  return k;
}

constexpr size_t kTag64Bytes = 16;  // BLAKE2b's shortest output in libsodium; 8 bytes are kept

std::string hex(const unsigned char* p, size_t n) {
  std::string out(2 * n + 1, '\0');
  sodium_bin2hex(out.data(), out.size(), p, n);
  out.pop_back();
  return out;
}

}  // namespace

Status configure(const std::string& key_file) {
  static std::once_flag init;
  std::call_once(init, [] {
    if (sodium_init() < 0) std::abort();  // no entropy source needed for hashing; never expected
  });
  Key& k = key();
  if (key_file.empty()) {
    sodium_memzero(k.bytes.data(), k.bytes.size());
    k = Key{};
    return Status::Ok();
  }
  auto text = read_whole_file(key_file, 1 << 20);
  if (!text.ok()) return text.status().with_context("auth_key_file");
  if (text->size() < 16)
    return Status(ErrorCode::kInvalidArgument, "auth_key_file '" + key_file + "' holds " +
                                                   std::to_string(text->size()) + " bytes; a key needs at least 16");
  Key fresh;
  crypto_generichash(fresh.bytes.data(), fresh.bytes.size(), reinterpret_cast<const unsigned char*>(text->data()),
                     text->size(), nullptr, 0);
  sodium_memzero(text->data(), text->size());
  fresh.on = true;
  unsigned char id[kTag64Bytes];
  static constexpr char kIdLabel[] = "h5ckpt key id";
  crypto_generichash(id, sizeof id, reinterpret_cast<const unsigned char*>(kIdLabel), sizeof kIdLabel - 1,
                     fresh.bytes.data(), fresh.bytes.size());
  fresh.id = hex(id, 8);
  k = fresh;
  return Status::Ok();
}

bool enabled() { return key().on; }

std::string key_id() { return key().id; }

Tag64::Tag64(uint64_t seed) {
  static_assert(sizeof(state_) >= sizeof(crypto_generichash_state));
  auto* st = reinterpret_cast<crypto_generichash_state*>(state_);
  crypto_generichash_init(st, key().bytes.data(), key().bytes.size(), kTag64Bytes);
  unsigned char s[8];
  for (int i = 0; i < 8; ++i) s[i] = static_cast<unsigned char>(seed >> (8 * i));
  crypto_generichash_update(st, s, sizeof s);
}

void Tag64::update(const void* data, size_t size) {
  crypto_generichash_update(reinterpret_cast<crypto_generichash_state*>(state_),
                            static_cast<const unsigned char*>(data), size);
}

uint64_t Tag64::final() {
  unsigned char out[kTag64Bytes];
  crypto_generichash_final(reinterpret_cast<crypto_generichash_state*>(state_), out, sizeof out);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{out[i]} << (8 * i);
  return v;
}

uint64_t tag64(uint64_t seed, const void* data, size_t size) {
  Tag64 t(seed);
  t.update(data, size);
  return t.final();
}

std::string tag256_hex(const std::string& text) {
  unsigned char out[32];
  crypto_generichash(out, sizeof out, reinterpret_cast<const unsigned char*>(text.data()), text.size(),
                     key().bytes.data(), key().bytes.size());
  return hex(out, sizeof out);
}

bool equal_tags(const std::string& a, const std::string& b) {
  return a.size() == b.size() && sodium_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace h5ckpt::storage::auth
