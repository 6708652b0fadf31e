// Python objects as h5ckpt buffers: the buffer protocol (numpy, bytearray, memoryview) and torch
// tensors (data_ptr), without copies; dtype inference; the StateDict's deferred local errors.
#include <cctype>
#include <cstring>

#include "common.h"

namespace h5ckpt_py {

Hold::~Hold() {
  if (!has_view && !owner) return;
  if (!Py_IsInitialized()) {  // interpreter gone: nothing left to release safely
    (void)owner.release();
    return;
  }
  py::gil_scoped_acquire gil;
  if (has_view) PyBuffer_Release(&view);
  owner = py::object();
}

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::optional<DType> torch_dtype(const std::string& name) {
  static const std::pair<const char*, DType> kMap[] = {{"torch.float32", DType::kF32},
                                                       {"torch.float64", DType::kF64},
                                                       {"torch.float16", DType::kF16},
                                                       {"torch.bfloat16", DType::kBF16},
                                                       {"torch.int8", DType::kI8},
                                                       {"torch.int16", DType::kI16},
                                                       {"torch.int32", DType::kI32},
                                                       {"torch.int64", DType::kI64},
                                                       {"torch.uint8", DType::kU8},
                                                       {"torch.bool", DType::kBool},
                                                       {"torch.float8_e4m3fn", DType::kF8E4M3},
                                                       {"torch.float8_e5m2", DType::kF8E5M2}};
  for (const auto& [n, t] : kMap)
    if (name == n) return t;
  return std::nullopt;
}

bool is_torch_tensor(py::handle obj) {
  return py::hasattr(obj, "data_ptr") && py::hasattr(obj, "element_size") && py::hasattr(obj, "is_contiguous") &&
         py::hasattr(obj, "layout") && py::hasattr(obj, "device");
}

BufferRef torch_buffer(py::handle t) {
  BufferRef b;
  b.type_name = py::str(t.attr("dtype")).cast<std::string>();
  const std::string layout = py::str(t.attr("layout")).cast<std::string>();
  if (layout != "torch.strided") {
    b.error = "a " + layout + " tensor has no dense buffer";
    return b;
  }
  if (!t.attr("is_contiguous")().cast<bool>()) {
    b.error = "the tensor is not contiguous (call .contiguous() and keep that tensor)";
    return b;
  }
  if (py::hasattr(t, "is_conj") && t.attr("is_conj")().cast<bool>()) {
    b.error = "the tensor is a lazily conjugated view (call .resolve_conj())";
    return b;
  }
  if (py::hasattr(t, "is_neg") && t.attr("is_neg")().cast<bool>()) {
    b.error = "the tensor is a lazily negated view (call .resolve_neg())";
    return b;
  }
  const std::string dev = py::str(t.attr("device").attr("type")).cast<std::string>();
  if (dev == "cuda") {
    b.device = h5ckpt::Device::kCuda;
  } else if (dev != "cpu") {
    b.error = "tensors on device '" + dev + "' are not supported (CPU or CUDA)";
    return b;
  }
  b.natural = torch_dtype(b.type_name);
  b.raw_bits = b.type_name == "torch.uint8" || b.type_name == "torch.int8" || b.type_name == "torch.int16" ||
               b.type_name == "torch.int32" || b.type_name == "torch.int64";
  b.itemsize = t.attr("element_size")().cast<size_t>();
  b.numel = t.attr("numel")().cast<int64_t>();
  for (auto d : t.attr("shape")) b.shape.push_back(d.cast<int64_t>());
  b.ptr = reinterpret_cast<void*>(t.attr("data_ptr")().cast<uintptr_t>());
  b.writable = true;
  b.hold = std::make_shared<Hold>();
  b.hold->owner = py::reinterpret_borrow<py::object>(t);
  return b;
}

// A buffer-protocol format character with its item size -> dtype.
void classify_format(const std::string& format_in, size_t itemsize, BufferRef& b) {
  std::string f = format_in;
  if (!f.empty() && (f[0] == '>' || f[0] == '!')) {
    b.error = "big-endian buffers are not supported (format '" + format_in + "')";
    return;
  }
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<')) f = f.substr(1);
  b.type_name = "format '" + format_in + "'";
  if (f.size() != 1) return;  // structured or multi-item formats: bytes only
  const char c = f[0];
  switch (c) {
    case 'f':
    case 'd':
    case 'e':
      if (itemsize == 4) b.natural = DType::kF32, b.type_name = "float32";
      if (itemsize == 8) b.natural = DType::kF64, b.type_name = "float64";
      if (itemsize == 2) b.natural = DType::kF16, b.type_name = "float16";
      return;
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q':
    case 'n':
      b.raw_bits = true;
      if (itemsize == 1) b.natural = DType::kI8, b.type_name = "int8";
      if (itemsize == 2) b.natural = DType::kI16, b.type_name = "int16";
      if (itemsize == 4) b.natural = DType::kI32, b.type_name = "int32";
      if (itemsize == 8) b.natural = DType::kI64, b.type_name = "int64";
      return;
    case 'B':
    case 'c':
      b.raw_bits = true;
      b.natural = DType::kU8;
      b.type_name = "uint8";
      return;
    case 'H':
    case 'I':
    case 'L':
    case 'Q':
    case 'N':
      b.raw_bits = true;  // no h5ckpt dtype of its own: uint16 may carry bf16/f16 bits, etc.
      b.type_name = "uint" + std::to_string(itemsize * 8);
      return;
    case '?':
      b.natural = DType::kBool;
      b.type_name = "bool";
      return;
    default: return;
  }
}

}  // namespace

BufferRef get_buffer(py::handle obj) {
  if (obj.is_none()) {
    BufferRef b;
    b.error = "None is not a buffer";
    return b;
  }
  if (is_torch_tensor(obj)) return torch_buffer(obj);
  BufferRef b;
  auto hold = std::make_shared<Hold>();
  if (PyObject_GetBuffer(obj.ptr(), &hold->view, PyBUF_RECORDS) == 0) {
    b.writable = true;
  } else {
    PyErr_Clear();
    if (PyObject_GetBuffer(obj.ptr(), &hold->view, PyBUF_RECORDS_RO) != 0) {
      PyErr_Clear();
      b.error = std::string("a ") + Py_TYPE(obj.ptr())->tp_name +
                " is neither a buffer (numpy array, bytearray, memoryview) nor a torch tensor";
      return b;
    }
    b.writable = false;
  }
  hold->has_view = true;
  hold->owner = py::reinterpret_borrow<py::object>(obj);
  const Py_buffer& v = hold->view;
  b.hold = hold;
  b.ptr = v.buf;
  b.itemsize = static_cast<size_t>(v.itemsize);
  b.numel = v.itemsize > 0 ? static_cast<int64_t>(v.len / v.itemsize) : 0;
  for (int i = 0; i < v.ndim; ++i) b.shape.push_back(static_cast<int64_t>(v.shape[i]));
  if (v.ndim == 0) b.shape.clear();
  classify_format(v.format ? v.format : "B", b.itemsize, b);
  if (b.error.empty() && !PyBuffer_IsContiguous(&v, 'C'))
    b.error = "the array is not C-contiguous (use numpy.ascontiguousarray and keep that array)";
  return b;
}

std::optional<DType> dtype_arg(py::handle obj) {
  if (obj.is_none()) return std::nullopt;
  if (py::isinstance<DType>(obj)) return obj.cast<DType>();
  std::string name = py::str(obj).cast<std::string>();
  if (name.rfind("torch.", 0) == 0) {
    if (auto t = torch_dtype(name)) return t;
    name = name.substr(6);
  }
  auto r = h5ckpt::dtype_from_name(lower(name));
  if (!r.ok()) raise_status(r.status());
  return r.value();
}

h5ckpt::Result<DType> resolve_dtype(const BufferRef& b, std::optional<DType> requested) {
  if (!requested) {
    if (b.natural) return *b.natural;
    return Status(ErrorCode::kInvalidArgument,
                  "cannot tell the dtype of a buffer of " + b.type_name + ": pass dtype= (e.g. 'bf16')");
  }
  const DType want = *requested;
  if (h5ckpt::dtype_size(want) != b.itemsize)
    return Status(ErrorCode::kDtypeMismatch, std::string("dtype ") + h5ckpt::dtype_name(want) + " has " +
                                                 std::to_string(h5ckpt::dtype_size(want)) +
                                                 "-byte elements, the buffer (" + b.type_name + ") " +
                                                 std::to_string(b.itemsize) + "-byte ones");
  if (b.natural && *b.natural != want && !b.raw_bits)
    return Status(ErrorCode::kDtypeMismatch, "the buffer holds " + b.type_name + ", not " + h5ckpt::dtype_name(want) +
                                                 " (only integer buffers may carry the raw bits of another dtype)");
  return want;
}

py::dtype numpy_dtype(DType t) {
  switch (t) {
    case DType::kF32: return py::dtype("float32");
    case DType::kF64: return py::dtype("float64");
    case DType::kF16: return py::dtype("float16");
    case DType::kBF16: return py::dtype("uint16");
    case DType::kF8E4M3:
    case DType::kF8E5M2: return py::dtype("uint8");
    case DType::kI8: return py::dtype("int8");
    case DType::kI16: return py::dtype("int16");
    case DType::kI32: return py::dtype("int32");
    case DType::kI64: return py::dtype("int64");
    case DType::kU8: return py::dtype("uint8");
    case DType::kBool: return py::dtype("bool");
  }
  return py::dtype("uint8");
}

void PyStateDict::defer(const Status& st) {
  if (deferred.ok()) deferred = st;
  ++deferred_count;
}

Status PyStateDict::local_status(bool for_load) const {
  if (!deferred.ok()) {
    if (deferred_count == 1) return deferred;
    return Status(deferred.code(), deferred.message() + " (and " + std::to_string(deferred_count - 1) +
                                       " more problem(s) on this rank)");
  }
  const auto& items = sd.items();
  for (size_t i = 0; i < items.size(); ++i) {
    const Hold* h = holds[i].get();
    if (h && h->loader) {
      if (loader_generation(h->loader) != h->loader_generation)
        return Status(
            ErrorCode::kInvalidArgument,
            "key '" + items[i].key +
                "': its LoaderCheckpoint staged other items since (its bytes are gone); build a new StateDict");
    }
    if (for_load && !writable[i])
      return Status(ErrorCode::kInvalidArgument,
                    "key '" + items[i].key + "': the buffer is read-only, and a load writes into it");
  }
  return Status::Ok();
}

}  // namespace h5ckpt_py
