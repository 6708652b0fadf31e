#include "storage/signed_json.h"

#include <cstdio>

#include "storage/auth.h"
#include "storage/format.h"
#include "util/checked_math.h"

namespace h5ckpt::storage {

using nlohmann::json;

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool parse_hex64(const json& v, uint64_t* out) {
  if (!v.is_string()) return false;
  const std::string& x = v.get_ref<const std::string&>();
  if (x.size() != 16 || x.find_first_not_of("0123456789abcdef") != std::string::npos) return false;
  *out = std::stoull(x, nullptr, 16);
  return true;
}

namespace {

// Format v1 nests 5 deep (tensors -> regions -> offset), the v2 summary 3; newer writers get
// room to grow.
constexpr int kMaxNesting = 64;

// Deepest bracket nesting outside strings, stopping early past `limit`. nlohmann::json's dump()
// (run for the self-checksum) recurses once per level, so a document nested 100k deep would
// overflow the stack before any field is looked at; this linear scan runs first.
bool nesting_within(const std::string& text, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

std::string dump_canonical(const json& j) {
  // nlohmann sorts object keys, so the compact dump is canonical and a reader can recompute it.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Status corrupt(const std::string& why) { return Status(ErrorCode::kCorrupt, "metadata: " + why); }

}  // namespace

Result<json> parse_signed_json(const std::string& text) {
  if (!nesting_within(text, kMaxNesting))
    return corrupt("nested deeper than " + std::to_string(kMaxNesting) + " levels (damaged or hostile file)");
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return corrupt("not valid JSON (truncated or damaged file?)");
  // Authenticated (docs/format.md §12): a MAC under the configured key instead of the xxh3, and
  // nothing else is accepted while a key is configured.
  if (auto a = j.find("auth"); a != j.end()) {
    const std::string id = a->is_object() && a->contains("key_id") && (*a)["key_id"].is_string()
                               ? (*a)["key_id"].get<std::string>()
                               : std::string("?");
    if (!auth::enabled())
      return corrupt("authenticated with key " + printable(id) +
                     "; configure that key (auth_key_file / H5CKPT_AUTH_KEY_FILE) to read it");
    if (id != auth::key_id())
      return corrupt("authenticated with key " + printable(id) + ", not with the configured key " + auth::key_id());
    auto mac = j.find("index_mac");
    if (mac == j.end() || !mac->is_string()) return corrupt("authenticated, but without its index_mac");
    const std::string stored_mac = mac->get<std::string>();
    j.erase("index_mac");
    if (!auth::equal_tags(stored_mac, auth::tag256_hex(dump_canonical(j))))
      return corrupt("authentication failed: the metadata was modified, or was not written with this key");
    return j;
  }
  if (auth::enabled()) return corrupt("not authenticated, and a key is configured (auth_key_file): refused");
  uint64_t stored = 0;
  auto sum = j.find("index_xxh3");
  if (sum == j.end() || !sum->is_string()) return corrupt("missing index_xxh3 checksum");
  const std::string stored_text = sum->get<std::string>();
  j.erase("index_xxh3");
  const std::string body = dump_canonical(j);
  if (!parse_hex64(json(stored_text), &stored) || stored != checksum_bytes(body.data(), body.size()))
    return corrupt("checksum mismatch: the metadata was modified or damaged");
  return j;
}

std::string dump_signed_json(json j) {
  // Invalid UTF-8 (only possible in caller attributes) is replaced rather than thrown: an
  // exception here would leave the other ranks waiting in the commit agreement.
  if (auth::enabled()) {
    j["auth"] = {{"alg", "blake2b-keyed"}, {"key_id", auth::key_id()}};
    j["index_mac"] = auth::tag256_hex(dump_canonical(j));
    return dump_canonical(j);
  }
  const std::string body = dump_canonical(j);
  j["index_xxh3"] = hex64(checksum_bytes(body.data(), body.size()));
  return dump_canonical(j);
}

}  // namespace h5ckpt::storage
