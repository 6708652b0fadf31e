#include "planner/load_contract.h"

#include <algorithm>

#include "util/bytes.h"
#include "util/checked_math.h"

namespace h5ckpt::planner {

bool check_contract_item(const StoredTensor* stored, const ContractItem& item, bool convert_dtype, LoadContract* out) {
  if (!stored) {
    out->missing.push_back(item.key);
    return false;
  }
  const std::string name = "'" + item.key + "'";
  if (stored->dtype != item.dtype && !(convert_dtype && dtype_is_float(stored->dtype) && dtype_is_float(item.dtype)))
    out->dtype.push_back(name + ": checkpoint holds " + dtype_name(stored->dtype) + ", the state wants " +
                         dtype_name(item.dtype) + (convert_dtype ? "" : " (convert_dtype is off)"));
  if (stored->shape != item.global_shape) {
    // allow_shape_mismatch is for padded vocabularies: only the size of dimension 0 may differ,
    // and the checkpoint must hold rows at all (not a transposed or emptied tensor).
    const Shape& s = stored->shape;
    const Shape& w = item.global_shape;
    bool padded = item.allow_shape_mismatch && s.size() == w.size() && !s.empty() && s[0] > 0 && w[0] > 0;
    for (size_t d = 1; padded && d < s.size(); ++d) padded = s[d] == w[d];
    if (!padded)
      out->shape.push_back(
          name + ": checkpoint has global shape " + to_string_shape(s) + ", the state wants " + to_string_shape(w) +
          (item.allow_shape_mismatch ? " (allow_shape_mismatch lets only a non-empty dimension 0 differ)" : ""));
  }
  return true;
}

namespace {

void sort_unique(std::vector<std::string>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

void put_list(ByteWriter& w, const std::vector<std::string>& v) {
  w.put<uint64_t>(v.size());
  for (const auto& s : v) w.put_string(s);
}

std::vector<std::string> get_list(ByteReader& r) {
  const uint64_t n = r.get_count(sizeof(uint64_t));  // each entry has at least its length
  std::vector<std::string> v;
  v.reserve(n);
  for (uint64_t i = 0; i < n && r.ok(); ++i) v.push_back(r.get_string());
  return v;
}

constexpr uint32_t kContractMagic = 0x4c43'3548;  // "H5CL"

// "N keys missing: 'a', 'b' and 3 more" (keys are quoted; problem entries quote their own key).
void describe(std::string& out, const std::vector<std::string>& v, const char* one, const char* many, bool quote,
              size_t shown, const char* note) {
  if (v.empty()) return;
  if (!out.empty()) out += "; ";
  out += std::to_string(v.size()) + " " + (v.size() == 1 ? one : many) + note + ": ";
  for (size_t i = 0; i < v.size() && i < shown; ++i) {
    if (i) out += ", ";
    out += quote ? "'" + v[i] + "'" : v[i];
  }
  if (v.size() > shown) out += " and " + std::to_string(v.size() - shown) + " more";
}

}  // namespace

void normalize_contract(LoadContract& c) {
  sort_unique(c.missing);
  sort_unique(c.shape);
  sort_unique(c.dtype);
  sort_unique(c.unexpected);
}

void merge_contract(LoadContract& into, const LoadContract& from) {
  into.missing.insert(into.missing.end(), from.missing.begin(), from.missing.end());
  into.shape.insert(into.shape.end(), from.shape.begin(), from.shape.end());
  into.dtype.insert(into.dtype.end(), from.dtype.begin(), from.dtype.end());
  into.unexpected.insert(into.unexpected.end(), from.unexpected.begin(), from.unexpected.end());
  normalize_contract(into);
}

std::string encode_contract(const LoadContract& c) {
  ByteWriter w;
  w.put<uint32_t>(kContractMagic);
  put_list(w, c.missing);
  put_list(w, c.shape);
  put_list(w, c.dtype);
  put_list(w, c.unexpected);
  return std::move(w.str());
}

Result<LoadContract> decode_contract(const std::string& bytes) {
  ByteReader r(bytes);
  LoadContract c;
  const bool magic = r.get<uint32_t>() == kContractMagic;
  c.missing = get_list(r);
  c.shape = get_list(r);
  c.dtype = get_list(r);
  c.unexpected = get_list(r);
  if (!magic || !r.ok() || !r.at_end()) return Status(ErrorCode::kInternal, "malformed load contract message");
  return c;
}

Status contract_status(const LoadContract& c, bool fail_missing, bool fail_unexpected, size_t shown) {
  const bool missing = fail_missing && !c.missing.empty();
  const bool unexpected = fail_unexpected && !c.unexpected.empty();
  if (!missing && c.shape.empty() && c.dtype.empty() && !unexpected) return Status::Ok();
  const ErrorCode code = missing            ? ErrorCode::kNotFound
                         : !c.shape.empty() ? ErrorCode::kShapeMismatch
                         : !c.dtype.empty() ? ErrorCode::kDtypeMismatch
                                            : ErrorCode::kInvalidArgument;
  std::string text;
  describe(text, c.missing, "key missing from the checkpoint", "keys missing from the checkpoint", true, shown,
           missing ? "" : " (skipped, not an error)");
  describe(text, c.shape, "shape mismatch", "shape mismatches", false, shown, "");
  describe(text, c.dtype, "dtype refused", "dtypes refused", false, shown, "");
  describe(text, c.unexpected, "key in the checkpoint the state does not ask for",
           "keys in the checkpoint the state does not ask for", true, shown, unexpected ? "" : " (not an error)");
  return Status(code, "the state does not match the checkpoint: " + text);
}

}  // namespace h5ckpt::planner
