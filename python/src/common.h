// Shared declarations of the pybind11 module h5ckpt._core (python/src/*.cpp).
//
// What the binding adds to the C++ API, and why:
//  - Buffers come from Python objects (the buffer protocol: numpy arrays, bytearray, memoryview;
//    or torch tensors through data_ptr()). A StateDict keeps a reference to every object it points
//    into (and keeps its buffer exported), so a tensor cannot be freed while the StateDict, or a
//    save_async snapshot taken from it, may still read it.
//  - Problems with a buffer (not contiguous, wrong size or dtype, read-only for a load) are found
//    where the C++ library cannot see them. They are recorded by StateDict.add and reported by the
//    next save/save_async/load through an agreement over the topology's world, so every rank raises
//    the same h5ckpt.Error, as for the library's own errors, and none is left waiting in a collective.
#pragma once

#include <mpi.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <h5ckpt/config.h>
#include <h5ckpt/h5ckpt.hpp>
#include <h5ckpt/loader_state.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;

namespace h5ckpt_py {

using h5ckpt::DType;
using h5ckpt::ErrorCode;
using h5ckpt::Status;

// ---- errors ------------------------------------------------------------------------------------

/// Raises h5ckpt.Error carrying the status's code and message. Needs the GIL.
[[noreturn]] void raise_status(const Status& st);
inline void check(const Status& st) {
  if (!st.ok()) raise_status(st);
}
template <class T>
T unwrap(h5ckpt::Result<T>&& r) {
  if (!r.ok()) raise_status(r.status());
  return std::move(r).value();
}
void init_errors(py::module_& m);

/// The library's agreement, for failures the binding finds before calling it: every rank of `comm`
/// learns whether any rank failed; all return the first failing rank's status, formatted as the
/// library does ("rank R: ... [failed on rank(s) R,S]"). Collective; call without the GIL.
Status agree(MPI_Comm comm, const Status& local);

bool mpi_finalized();

// ---- mpi4py ------------------------------------------------------------------------------------

/// The MPI_Comm of an mpi4py communicator (None: MPI_COMM_WORLD). TypeError for anything else.
MPI_Comm comm_from_py(py::handle obj);
/// A new mpi4py.MPI.Comm referring to `comm` (not owning it).
py::object comm_to_py(MPI_Comm comm);

// ---- buffers -----------------------------------------------------------------------------------

struct PyLoaderCheckpoint;
/// Bumped by every stage_* call of a LoaderCheckpoint (which frees the bytes staged before).
uint64_t loader_generation(const PyLoaderCheckpoint* lc);

/// Keeps what a StateDict item points into alive: the owning Python object, the exported buffer
/// (released when the last holder goes), or the LoaderCheckpoint whose bytes the item references.
struct Hold {
  py::object owner;
  Py_buffer view{};
  bool has_view = false;
  const PyLoaderCheckpoint* loader = nullptr;  ///< items staged by a LoaderCheckpoint
  uint64_t loader_generation = 0;
  Hold() = default;
  Hold(const Hold&) = delete;
  Hold& operator=(const Hold&) = delete;
  ~Hold();
};
using HoldPtr = std::shared_ptr<Hold>;

/// A Python object's memory as the library sees it.
struct BufferRef {
  void* ptr = nullptr;
  size_t itemsize = 0;
  int64_t numel = 0;
  std::vector<int64_t> shape;
  std::optional<DType> natural;  ///< dtype the object declares, when h5ckpt has it
  bool raw_bits = false;         ///< an integer buffer that may carry another dtype of its size
  std::string type_name;         ///< what the object declares ("float32", "torch.bfloat16", "H"), for messages
  h5ckpt::Device device = h5ckpt::Device::kHost;
  bool writable = false;
  HoldPtr hold;
  std::string error;  ///< not empty: the object cannot be used (says why)
};

/// Inspects a numpy array, any buffer-protocol object, or a torch tensor. Never throws for an
/// unusable object: BufferRef::error says why. Needs the GIL.
BufferRef get_buffer(py::handle obj);

/// dtype given as h5ckpt.DType, a name ("bf16", "bfloat16", "float32") or a torch/numpy dtype.
std::optional<DType> dtype_arg(py::handle obj);

/// The dtype an item gets: `requested` when given (it must fit the buffer), else the buffer's own.
h5ckpt::Result<DType> resolve_dtype(const BufferRef& b, std::optional<DType> requested);

/// numpy dtype of an h5ckpt dtype; bf16 and fp8 (no numpy type) as their raw bits (uint16, uint8).
py::dtype numpy_dtype(DType t);

// ---- state dict --------------------------------------------------------------------------------

struct PyStateDict {
  h5ckpt::StateDict sd;
  std::vector<HoldPtr> holds;  ///< parallel to sd.items()
  std::vector<char> writable;  ///< parallel to sd.items()
  Status deferred;             ///< first problem found by add*; reported by the next save/load
  int deferred_count = 0;

  void defer(const Status& st);
  /// The local status a save (for_load = false) or load checks before the library runs.
  Status local_status(bool for_load) const;
};

// ---- topology and checkpointer -----------------------------------------------------------------

struct PyTopology {
  std::shared_ptr<h5ckpt::Topology> topo;
  PyTopology();
  ~PyTopology();
  h5ckpt::Topology& get() const;
  void close();
};

struct PyCheckpointer {
  std::shared_ptr<h5ckpt::Topology> topo;  // declared first: destroyed after ck
  std::unique_ptr<h5ckpt::Checkpointer> ck;
  PyCheckpointer();
  ~PyCheckpointer();
  h5ckpt::Checkpointer& get() const;
  void close();
};

/// Closes every live Checkpointer (waiting for its save in flight), then every Topology. Run at
/// interpreter exit, before mpi4py finalizes MPI.
void close_all();

// ---- registration ------------------------------------------------------------------------------

void bind_types(py::module_& m);
void bind_core(py::module_& m);
void bind_info(py::module_& m);
void bind_loader(py::module_& m);
void bind_transfer(py::module_& m);

/// Sets the attributes named in `kwargs` on a copy of `value` (unknown names: AttributeError).
template <class T>
T with_kwargs(const T& value, const py::kwargs& kwargs) {
  if (!kwargs || kwargs.empty()) return value;
  py::object obj = py::cast(value);
  for (auto kv : kwargs) py::setattr(obj, kv.first, kv.second);
  return obj.cast<T>();
}

}  // namespace h5ckpt_py
