// h5ckpt.StateTransfer: live state between ranks without storage (include/h5ckpt/transfer.h).
#include <optional>

#include "common.h"
#include "h5ckpt/transfer.h"

namespace h5ckpt_py {

namespace {

struct PyStateTransfer {
  std::unique_ptr<h5ckpt::StateTransfer> x;
  MPI_Comm world = MPI_COMM_NULL;
};

}  // namespace

void bind_transfer(py::module_& m) {
  using h5ckpt::TransferOptions;
  using h5ckpt::TransferReport;
  py::class_<TransferOptions>(m, "TransferOptions", "Options of StateTransfer.transfer (see the C++ header).")
      .def(py::init<>())
      .def_readwrite("version", &TransferOptions::version)
      .def_readwrite("delta", &TransferOptions::delta)
      .def_readwrite("verify", &TransferOptions::verify)
      .def_readwrite("in_place", &TransferOptions::in_place)
      .def_readwrite("keep_previous", &TransferOptions::keep_previous)
      .def_readwrite("strict", &TransferOptions::strict)
      .def_readwrite("convert_dtype", &TransferOptions::convert_dtype)
      .def_readwrite("memory_bytes", &TransferOptions::memory_bytes)
      .def_readwrite("timeout_s", &TransferOptions::timeout_s)
      .def_readwrite("threads", &TransferOptions::threads)
      .def_property(
          "device_stream", [](const TransferOptions& o) { return reinterpret_cast<uintptr_t>(o.device_stream); },
          [](TransferOptions& o, uintptr_t s) { o.device_stream = reinterpret_cast<void*>(s); },
          "device buffers: the CUDA stream (torch.cuda.current_stream().cuda_stream) read after; 0: the whole device");
  py::class_<TransferReport>(m, "TransferReport", "Per-call figures of this rank for a transfer.")
      .def_readonly("version", &TransferReport::version)
      .def_readonly("delta", &TransferReport::delta)
      .def_readonly("plan_cached", &TransferReport::plan_cached)
      .def_readonly("rounds", &TransferReport::rounds)
      .def_readonly("bytes_sent", &TransferReport::bytes_sent)
      .def_readonly("bytes_received", &TransferReport::bytes_received)
      .def_readonly("bytes_total", &TransferReport::bytes_total)
      .def_readonly("blocks_sent", &TransferReport::blocks_sent)
      .def_readonly("blocks_received", &TransferReport::blocks_received)
      .def_readonly("blocks_total", &TransferReport::blocks_total)
      .def_readonly("memory_peak_bytes", &TransferReport::memory_peak_bytes)
      .def_readonly("missing_keys", &TransferReport::missing_keys)
      .def_readonly("plan_s", &TransferReport::plan_s)
      .def_readonly("checksum_s", &TransferReport::checksum_s)
      .def_readonly("exchange_s", &TransferReport::exchange_s)
      .def_readonly("commit_s", &TransferReport::commit_s)
      .def_readonly("total_s", &TransferReport::total_s)
      .def_readonly("transport", &TransferReport::transport)
      .def_readonly("bytes_sent_device", &TransferReport::bytes_sent_device);
  py::class_<PyStateTransfer>(m, "StateTransfer",
                              "Publishes live state between ranks in any layouts, without storage: a collective\n"
                              "over `comm` (mpi4py; None: COMM_WORLD) in which each rank passes its source state,\n"
                              "its destination state, or both. Keeps the plan and the last version's checksums for\n"
                              "deltas. Call close() (or let it go) before MPI is finalized.")
      .def(py::init([](py::object comm) {
             auto p = std::make_unique<PyStateTransfer>();
             p->world = comm_from_py(comm);
             py::gil_scoped_release release;
             p->x = std::make_unique<h5ckpt::StateTransfer>(p->world);
             return p;
           }),
           py::arg("comm") = py::none())
      .def(
          "transfer",
          [](PyStateTransfer& self, PyStateDict* source, PyStateDict* destination, py::object options, py::kwargs kw) {
            if (!self.x) check(h5ckpt::Status(h5ckpt::ErrorCode::kInvalidArgument, "StateTransfer is closed"));
            TransferOptions o = options.is_none() ? TransferOptions{} : options.cast<TransferOptions>();
            o = with_kwargs(o, kw);
            PyStateDict* src = source;
            PyStateDict* dst = destination;
            // The binding's own checks (buffers exported, writable destination) agreed first.
            Status local = src ? src->local_status(false) : Status::Ok();
            if (local.ok() && dst) local = dst->local_status(true);
            h5ckpt::StateDict src_copy, dst_copy;
            std::vector<HoldPtr> holds;
            if (src) src_copy = src->sd, holds.insert(holds.end(), src->holds.begin(), src->holds.end());
            if (dst) dst_copy = dst->sd, holds.insert(holds.end(), dst->holds.begin(), dst->holds.end());
            std::optional<h5ckpt::Result<TransferReport>> r;
            {
              py::gil_scoped_release release;
              Status agreed = agree(self.world, local);
              if (!agreed.ok()) r.emplace(agreed);
              else r.emplace(self.x->transfer(src ? &src_copy : nullptr, dst ? &dst_copy : nullptr, o));
            }
            return unwrap(std::move(*r));
          },
          py::arg("source") = py::none(), py::arg("destination") = py::none(), py::arg("options") = py::none(),
          "Fills every destination buffer from the source ranks (each byte from one of them), verified by\n"
          "block checksums and, between consecutive versions, moving only changed blocks. Keywords set\n"
          "TransferOptions fields (version=step). Collective; raises h5ckpt.Error alike on every rank.")
      .def_property_readonly("version", [](const PyStateTransfer& self) { return self.x ? self.x->version() : -1; })
      .def("close", [](PyStateTransfer& self) { self.x.reset(); });
}

}  // namespace h5ckpt_py
