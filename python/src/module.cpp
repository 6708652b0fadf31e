// h5ckpt._core: the module, its exception class, the agreement and the mpi4py glue.
#include <mpi4py/mpi4py.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <mutex>
#include <set>

#include "common.h"

namespace h5ckpt_py {

namespace {
PyObject* g_error_type = nullptr;  // h5ckpt.Error (a RuntimeError subclass); lives as long as the process
}  // namespace

void init_errors(py::module_& m) {
  g_error_type = PyErr_NewExceptionWithDoc(
      "h5ckpt.Error",
      "A failed h5ckpt call. `code` is an h5ckpt.ErrorCode, `message` the library's message; str() is\n"
      "'<code name>: <message>'. Collective calls raise the same code and message on every rank.",
      PyExc_RuntimeError, nullptr);
  if (!g_error_type) throw py::error_already_set();
  m.attr("Error") = py::handle(g_error_type);
}

void raise_status(const Status& st) {
  py::object type = py::reinterpret_borrow<py::object>(g_error_type);
  py::object inst = type(py::str(st.to_string()));
  inst.attr("code") = py::cast(st.code());
  inst.attr("message") = py::str(st.message());
  PyErr_SetObject(g_error_type, inst.ptr());
  throw py::error_already_set();
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

Status agree(MPI_Comm comm, const Status& local) {
  int size = 0, rank = 0;
  if (MPI_Comm_size(comm, &size) != MPI_SUCCESS || MPI_Comm_rank(comm, &rank) != MPI_SUCCESS)
    return Status(ErrorCode::kMpi, "the binding's agreement: MPI_Comm_size/rank failed");
  const int mine = local.ok() ? 0 : 1;
  std::vector<int> flags(size, 0);
  if (MPI_Allgather(&mine, 1, MPI_INT, flags.data(), 1, MPI_INT, comm) != MPI_SUCCESS)
    return Status(ErrorCode::kMpi, "the binding's agreement: MPI_Allgather failed");
  std::vector<int> failed;
  for (int r = 0; r < size; ++r)
    if (flags[r]) failed.push_back(r);
  if (failed.empty()) return Status::Ok();
  const int root = failed.front();
  // The first failing rank's code and message reach every rank.
  int code = static_cast<int>(local.code());
  std::string text = rank == root ? local.message() : std::string();
  int len = static_cast<int>(text.size());
  int hdr[2] = {code, len};
  MPI_Bcast(hdr, 2, MPI_INT, root, comm);
  text.resize(static_cast<size_t>(hdr[1]));
  if (hdr[1] > 0) MPI_Bcast(text.data(), hdr[1], MPI_CHAR, root, comm);
  std::string ranks;
  for (size_t i = 0; i < failed.size(); ++i) ranks += (i ? "," : "") + std::to_string(failed[i]);
  return Status(static_cast<ErrorCode>(hdr[0]),
                "rank " + std::to_string(root) + ": " + text + " [failed on rank(s) " + ranks + "]");
}

MPI_Comm comm_from_py(py::handle obj) {
  if (obj.is_none()) return MPI_COMM_WORLD;
  MPI_Comm* c = PyMPIComm_Get(obj.ptr());
  if (!c) throw py::error_already_set();
  return *c;
}

py::object comm_to_py(MPI_Comm comm) {
  PyObject* o = PyMPIComm_New(comm);
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

// ---- live objects, closed at exit ----------------------------------------------------------------

namespace {
std::mutex g_live_mu;
std::set<PyTopology*>& live_topologies() {
  static auto* s = new std::set<PyTopology*>;
  return *s;
}
std::set<PyCheckpointer*>& live_checkpointers() {
  static auto* s = new std::set<PyCheckpointer*>;
  return *s;
}
}  // namespace

PyTopology::PyTopology() {
  std::lock_guard<std::mutex> lock(g_live_mu);
  live_topologies().insert(this);
}
PyTopology::~PyTopology() {
  {
    std::lock_guard<std::mutex> lock(g_live_mu);
    live_topologies().erase(this);
  }
  close();
}
h5ckpt::Topology& PyTopology::get() const {
  if (!topo) raise_status(Status(ErrorCode::kInvalidArgument, "this Topology is closed"));
  return *topo;
}
void PyTopology::close() {
  // After MPI_Finalize its communicators cannot be freed any more: leave them.
  if (topo && mpi_finalized()) new std::shared_ptr<h5ckpt::Topology>(std::move(topo));
  topo.reset();
}

PyCheckpointer::PyCheckpointer() {
  std::lock_guard<std::mutex> lock(g_live_mu);
  live_checkpointers().insert(this);
}
PyCheckpointer::~PyCheckpointer() {
  {
    std::lock_guard<std::mutex> lock(g_live_mu);
    live_checkpointers().erase(this);
  }
  close();
}
h5ckpt::Checkpointer& PyCheckpointer::get() const {
  if (!ck) raise_status(Status(ErrorCode::kInvalidArgument, "this Checkpointer is closed"));
  return *ck;
}
void PyCheckpointer::close() {
  if (mpi_finalized()) {
    (void)ck.release();
    if (topo) new std::shared_ptr<h5ckpt::Topology>(std::move(topo));
    return;
  }
  if (ck) {
    // Waits for the save in flight (its outcome stays on its handle); the writer never needs the GIL.
    py::gil_scoped_release release;
    ck.reset();
  }
  topo.reset();
}

void close_all() {
  std::vector<PyCheckpointer*> cks;
  std::vector<PyTopology*> topos;
  {
    std::lock_guard<std::mutex> lock(g_live_mu);
    cks.assign(live_checkpointers().begin(), live_checkpointers().end());
    topos.assign(live_topologies().begin(), live_topologies().end());
  }
  for (PyCheckpointer* c : cks) c->close();
  for (PyTopology* t : topos) t->close();
}

}  // namespace h5ckpt_py

PYBIND11_MODULE(_core, m) {
  using namespace h5ckpt_py;
  m.doc() = "h5ckpt: distributed checkpoints in parallel HDF5 (C++ library binding; see docs/python.md)";
  if (import_mpi4py() < 0) throw py::error_already_set();
  init_errors(m);
  bind_types(m);
  bind_info(m);  // before bind_core: ResolvedCheckpoint.info is a CheckpointInfo
  bind_core(m);
  bind_transfer(m);
  py::module_ loader = m.def_submodule("loader", "Data-loader state as reshardable checkpoint items (loader_state.h)");
  bind_loader(loader);
  m.def(
      "version", [] { return std::string(h5ckpt::version()); }, "Library version string, e.g. '0.1.0'.");
  m.def("_close_all", &close_all,
        "Closes every live Checkpointer (waiting for its save in flight) and Topology; registered with "
        "atexit by the package so that their communicators are freed before MPI_Finalize.");
}
