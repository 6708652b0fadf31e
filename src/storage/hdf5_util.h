// HDF5 helpers: RAII handles, our dtypes as HDF5 types, error text from the HDF5 stack.
// Debian's parallel HDF5 is not thread-safe: callers serialize every call (see hdf5_lock()).
#pragma once

#include <hdf5.h>

#include <mutex>
#include <string>

#include "h5ckpt/status.h"
#include "h5ckpt/types.h"

namespace h5ckpt::storage {

/// Owns one HDF5 identifier and closes it with the right H5*close.
class Hid {
 public:
  Hid() = default;
  explicit Hid(hid_t id) : id_(id) {}
  Hid(Hid&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  Hid& operator=(Hid&& o) noexcept;
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid() { reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();
  /// Gives up ownership (after the caller closed the id itself).
  hid_t release() {
    hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

/// The process-wide lock every HDF5 call is made under.
std::mutex& hdf5_lock();

/// Silences HDF5's automatic error printing once per process (we report errors ourselves).
void hdf5_quiet();

/// Status for a failed HDF5 call: `what` plus the innermost messages of the HDF5 error stack.
Status h5_error(const std::string& what);

/// The HDF5 type a dtype is stored as (bf16 and e5m2 as custom floats, e4m3 and bool as u8).
Hid h5_type_of(DType t);

/// Writes a string attribute on an object.
Status write_string_attr(hid_t obj, const char* name, const std::string& value);
/// Writes an integer attribute on an object.
Status write_int_attr(hid_t obj, const char* name, int64_t value);

}  // namespace h5ckpt::storage
