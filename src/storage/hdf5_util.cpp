#include "storage/hdf5_util.h"

#include <vector>

namespace h5ckpt::storage {

Hid& Hid::operator=(Hid&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void Hid::reset() {
  if (id_ < 0) return;
  switch (H5Iget_type(id_)) {
    case H5I_FILE: H5Fclose(id_); break;
    case H5I_GROUP: H5Gclose(id_); break;
    case H5I_DATASET: H5Dclose(id_); break;
    case H5I_DATASPACE: H5Sclose(id_); break;
    case H5I_DATATYPE: H5Tclose(id_); break;
    case H5I_ATTR: H5Aclose(id_); break;
    case H5I_GENPROP_LST: H5Pclose(id_); break;
    default: break;
  }
  id_ = H5I_INVALID_HID;
}

std::mutex& hdf5_lock() {
  static std::mutex m;
  return m;
}

void hdf5_quiet() {
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
}

Status h5_error(const std::string& what) {
  std::vector<std::string> msgs;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned, const H5E_error2_t* e, void* data) -> herr_t {
        auto* v = static_cast<std::vector<std::string>*>(data);
        if (e->desc && v->size() < 3) v->push_back(std::string(e->func_name ? e->func_name : "?") + ": " + e->desc);
        return 0;
      },
      &msgs);
  H5Eclear2(H5E_DEFAULT);
  std::string text = what;
  if (!msgs.empty()) {
    text += " (HDF5: ";
    for (size_t i = 0; i < msgs.size(); ++i) text += (i ? "; " : "") + msgs[i];
    text += ")";
  }
  return Status(ErrorCode::kIo, text);
}

namespace {

// Custom little-endian float: sign at bit (ebits + mbits), exponent, mantissa.
Hid custom_float(int ebits, int mbits, int bias) {
  const int bits = 1 + ebits + mbits;
  hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  // Order matters in 1.10: fields, then precision, then size.
  H5Tset_fields(t, bits - 1, mbits, ebits, 0, mbits);
  H5Tset_precision(t, bits);
  H5Tset_offset(t, 0);
  H5Tset_size(t, bits / 8);
  H5Tset_ebias(t, bias);
  return Hid(t);
}

}  // namespace

Hid h5_type_of(DType t) {
  switch (t) {
    case DType::kF32: return Hid(H5Tcopy(H5T_IEEE_F32LE));
    case DType::kF64: return Hid(H5Tcopy(H5T_IEEE_F64LE));
    case DType::kF16: return custom_float(5, 10, 15);
    case DType::kBF16: return custom_float(8, 7, 127);
    case DType::kF8E5M2: return custom_float(5, 2, 15);
    case DType::kF8E4M3: return Hid(H5Tcopy(H5T_STD_U8LE));  // HDF5 reads e4m3fn's 256..448 as NaN
    case DType::kI8: return Hid(H5Tcopy(H5T_STD_I8LE));
    case DType::kI16: return Hid(H5Tcopy(H5T_STD_I16LE));
    case DType::kI32: return Hid(H5Tcopy(H5T_STD_I32LE));
    case DType::kI64: return Hid(H5Tcopy(H5T_STD_I64LE));
    case DType::kU8: return Hid(H5Tcopy(H5T_STD_U8LE));
    case DType::kBool: return Hid(H5Tcopy(H5T_STD_U8LE));
  }
  return Hid();
}

Status write_string_attr(hid_t obj, const char* name, const std::string& value) {
  Hid type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), value.empty() ? 1 : value.size());
  H5Tset_strpad(type.get(), H5T_STR_NULLTERM);
  Hid space(H5Screate(H5S_SCALAR));
  Hid attr(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.valid()) return h5_error(std::string("creating attribute ") + name);
  std::string padded = value.empty() ? std::string(1, '\0') : value;
  if (H5Awrite(attr.get(), type.get(), padded.data()) < 0) return h5_error(std::string("writing attribute ") + name);
  return Status::Ok();
}

Status write_int_attr(hid_t obj, const char* name, int64_t value) {
  Hid space(H5Screate(H5S_SCALAR));
  Hid attr(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.valid()) return h5_error(std::string("creating attribute ") + name);
  if (H5Awrite(attr.get(), H5T_NATIVE_INT64, &value) < 0) return h5_error(std::string("writing attribute ") + name);
  return Status::Ok();
}

}  // namespace h5ckpt::storage
