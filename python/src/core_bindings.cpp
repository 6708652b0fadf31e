// Value types, options, reports, StateDict, Topology, Checkpointer, SaveHandle and Config.
#include <sstream>

#include "common.h"

namespace h5ckpt_py {

using namespace h5ckpt;

namespace {

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string spec_repr(const ShardSpec& s) { return "ShardSpec(" + region_to_string(s) + ")"; }

Shape shape_arg(py::handle obj) {
  Shape s;
  if (py::isinstance<py::int_>(obj)) {
    s.push_back(obj.cast<int64_t>());
    return s;
  }
  for (auto d : obj) s.push_back(d.cast<int64_t>());
  return s;
}

// Options passed as an object, as keyword arguments, or both (keywords override the object's fields).
template <class T>
T options_arg(const py::object& obj, const py::kwargs& kwargs) {
  T base = obj.is_none() ? T{} : obj.cast<T>();
  return with_kwargs(base, kwargs);
}

struct PySaveHandle {
  SaveHandle handle;
  std::vector<HoldPtr> holds;  // the buffers of the state, until the save is done
};

// Runs a collective call of the Checkpointer on a copy of the StateDict's item list, after the
// binding's agreement on the local problems the library cannot see. The holds keep every buffer
// alive (and exported) for the call, whatever other threads do with the StateDict or the arrays.
template <class R, class F>
std::pair<Result<R>, std::vector<HoldPtr>> run_collective(PyCheckpointer& pc, PyStateDict& psd, bool for_load, F&& f) {
  Checkpointer& ck = pc.get();
  MPI_Comm world = pc.topo->world();
  const Status local = psd.local_status(for_load);
  StateDict copy = psd.sd;
  std::vector<HoldPtr> holds = psd.holds;
  std::optional<Result<R>> r;
  {
    py::gil_scoped_release release;
    Status agreed = agree(world, local);
    if (!agreed.ok()) r.emplace(agreed);
    else r.emplace(f(ck, copy));
  }
  return {std::move(*r), std::move(holds)};
}

py::dict save_report_dict(const SaveReport& r) {
  py::dict d;
  d["path"] = r.path;
  d["bytes_written"] = r.bytes_written;
  d["bytes_direct"] = r.bytes_direct;
  d["write_calls"] = r.write_calls;
  d["bytes_aggregated"] = r.bytes_aggregated;
  d["bytes_total"] = r.bytes_total;
  d["blocked_bytes"] = r.blocked_bytes;
  d["plan_s"] = r.plan_s;
  d["snapshot_s"] = r.snapshot_s;
  d["write_s"] = r.write_s;
  d["commit_s"] = r.commit_s;
  d["total_s"] = r.total_s;
  d["plan_cached"] = r.plan_cached;
  d["async"] = r.async;
  d["level"] = r.level;
  d["persisted"] = r.persisted;
  d["replicate_s"] = r.replicate_s;
  d["persist_s"] = r.persist_s;
  return d;
}

py::dict load_report_dict(const LoadReport& r) {
  py::dict d;
  d["path"] = r.path;
  d["bytes_read"] = r.bytes_read;
  d["bytes_sent"] = r.bytes_sent;
  d["bytes_received"] = r.bytes_received;
  d["missing_keys"] = r.missing_keys;
  d["unexpected_keys"] = r.unexpected_keys;
  d["shape_mismatches"] = r.shape_mismatches;
  d["dtype_mismatches"] = r.dtype_mismatches;
  d["plan_s"] = r.plan_s;
  d["open_s"] = r.open_s;
  d["read_s"] = r.read_s;
  d["io_s"] = r.io_s;
  d["copy_s"] = r.copy_s;
  d["exchange_s"] = r.exchange_s;
  d["total_s"] = r.total_s;
  d["plan_cached"] = r.plan_cached;
  d["index_shared"] = r.index_shared;
  d["transport"] = r.transport;
  return d;
}

std::string dict_repr(const char* name, const py::dict& d) {
  std::string out = std::string(name) + "(";
  bool first = true;
  for (auto kv : d) {
    out += (first ? "" : ", ") + kv.first.cast<std::string>() + "=" + py::repr(kv.second).cast<std::string>();
    first = false;
  }
  return out + ")";
}

void add_item(PyStateDict& self, const std::string& key, py::handle data, py::handle global_shape, py::handle shard,
              py::handle dtype, bool allow_shape_mismatch, py::handle device) {
  BufferRef b = get_buffer(data);
  if (!b.error.empty()) return self.defer(Status(ErrorCode::kInvalidArgument, "key '" + key + "': " + b.error));
  auto dt = resolve_dtype(b, dtype_arg(dtype));
  if (!dt.ok()) return self.defer(Status(dt.status().code(), "key '" + key + "': " + dt.status().message()));
  Shape shape;
  if (!global_shape.is_none()) {
    shape = shape_arg(global_shape);
  } else if (shard.is_none()) {
    shape = b.shape.empty() ? Shape{1} : b.shape;  // a 0-d array or tensor is stored as shape [1]
  } else {
    return self.defer(
        Status(ErrorCode::kInvalidArgument, "key '" + key + "': a shard needs the tensor's global_shape"));
  }
  ShardSpec spec = shard.is_none() ? ShardSpec::whole(shape) : shard.cast<ShardSpec>();
  Status valid = spec.validate(shape);
  if (!valid.ok()) return self.defer(Status(valid.code(), "key '" + key + "': " + valid.message()));
  if (spec.numel() != b.numel)
    return self.defer(Status(ErrorCode::kShapeMismatch, "key '" + key + "': the shard " + region_to_string(spec) +
                                                            " holds " + std::to_string(spec.numel()) +
                                                            " elements, the buffer " + std::to_string(b.numel)));
  Device dev = b.device;
  if (!device.is_none()) {
    Device want = device.cast<Device>();
    if (want != dev)
      return self.defer(Status(ErrorCode::kInvalidArgument,
                               "key '" + key + "': device=" + (want == Device::kCuda ? "CUDA" : "HOST") +
                                   " given for a buffer in " + (dev == Device::kCuda ? "CUDA" : "host") + " memory"));
  }
  StateItem& item = self.sd.add(key, dt.value(), shape, spec, b.ptr, dev);
  item.allow_shape_mismatch = allow_shape_mismatch;
  self.holds.push_back(b.hold);
  self.writable.push_back(b.writable ? 1 : 0);
}

// A piece given as a ShardPiece or as a (shard, buffer_offset_bytes) pair.
ShardPiece piece_arg(py::handle obj) {
  if (py::isinstance<ShardPiece>(obj)) return obj.cast<ShardPiece>();
  if (!py::isinstance<py::sequence>(obj) || py::isinstance<py::str>(obj) || py::len(obj) != 2)
    throw py::type_error("a piece is a ShardPiece or a (ShardSpec, buffer_offset_bytes) pair");
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  const int64_t off = seq[1].cast<int64_t>();
  if (off < 0) throw py::value_error("a piece's buffer_offset_bytes must not be negative");
  return ShardPiece{seq[0].cast<ShardSpec>(), static_cast<uint64_t>(off)};
}

// StateDict::add_pieces over a Python buffer. What the library cannot see (the buffer's size) is
// checked here: every piece that fits its shape must lie inside the buffer. The rest (overlaps,
// pieces outside the shape, misaligned offsets, an empty list) is the library's to report.
void add_pieces_item(PyStateDict& self, const std::string& key, py::handle dtype, py::handle global_shape,
                     py::handle pieces, py::handle data, py::handle device) {
  std::vector<ShardPiece> ps;
  for (auto p : pieces) ps.push_back(piece_arg(p));
  const Shape shape = shape_arg(global_shape);
  BufferRef b = get_buffer(data);
  if (!b.error.empty()) return self.defer(Status(ErrorCode::kInvalidArgument, "key '" + key + "': " + b.error));
  auto dt = resolve_dtype(b, dtype_arg(dtype));
  if (!dt.ok()) return self.defer(Status(dt.status().code(), "key '" + key + "': " + dt.status().message()));
  const uint64_t nbytes = static_cast<uint64_t>(b.numel) * b.itemsize;
  const uint64_t esize = dtype_size(dt.value());
  for (size_t i = 0; i < ps.size(); ++i) {
    if (!ps[i].shard.validate(shape).ok()) continue;  // the library names it
    const uint64_t need = static_cast<uint64_t>(ps[i].shard.numel()) * esize;
    if (ps[i].buffer_offset > nbytes || need > nbytes - ps[i].buffer_offset)
      return self.defer(Status(ErrorCode::kShapeMismatch,
                               "key '" + key + "': piece " + std::to_string(i) + " " + region_to_string(ps[i].shard) +
                                   " at byte offset " + std::to_string(ps[i].buffer_offset) + " needs " +
                                   std::to_string(need) + " bytes, the buffer holds " + std::to_string(nbytes)));
  }
  Device dev = b.device;
  if (!device.is_none()) {
    Device want = device.cast<Device>();
    if (want != dev)
      return self.defer(Status(ErrorCode::kInvalidArgument,
                               "key '" + key + "': device=" + (want == Device::kCuda ? "CUDA" : "HOST") +
                                   " given for a buffer in " + (dev == Device::kCuda ? "CUDA" : "host") + " memory"));
  }
  self.sd.add_pieces(key, dt.value(), shape, std::move(ps), b.ptr, dev);
  self.holds.push_back(b.hold);
  self.writable.push_back(b.writable ? 1 : 0);
}

std::string sizes_repr(const ParallelSizes& s) {
  return "ParallelSizes(tp=" + std::to_string(s.tp) + ", dp=" + std::to_string(s.dp) + ", pp=" + std::to_string(s.pp) +
         ", cp=" + std::to_string(s.cp) + ", ep=" + std::to_string(s.ep) + ")";
}

}  // namespace

void bind_types(py::module_& m) {
  py::enum_<ErrorCode>(m, "ErrorCode", "Broad class of a failure (h5ckpt::ErrorCode); Error.code holds one.")
      .value("OK", ErrorCode::kOk)
      .value("INVALID_ARGUMENT", ErrorCode::kInvalidArgument)
      .value("NOT_FOUND", ErrorCode::kNotFound)
      .value("SHAPE_MISMATCH", ErrorCode::kShapeMismatch)
      .value("DTYPE_MISMATCH", ErrorCode::kDtypeMismatch)
      .value("CORRUPT", ErrorCode::kCorrupt)
      .value("NOT_COMMITTED", ErrorCode::kNotCommitted)
      .value("ALREADY_EXISTS", ErrorCode::kAlreadyExists)
      .value("IO", ErrorCode::kIo)
      .value("MPI", ErrorCode::kMpi)
      .value("REMOTE", ErrorCode::kRemote)
      .value("UNSUPPORTED", ErrorCode::kUnsupported)
      .value("INTERNAL", ErrorCode::kInternal);
  m.def(
      "error_code_name", [](ErrorCode c) { return std::string(error_code_name(c)); },
      "The code's name as messages print it, e.g. 'corrupt'.");

  py::enum_<DType>(m, "DType", "Element types a checkpoint can hold.")
      .value("F32", DType::kF32)
      .value("F64", DType::kF64)
      .value("F16", DType::kF16)
      .value("BF16", DType::kBF16)
      .value("F8E4M3", DType::kF8E4M3)
      .value("F8E5M2", DType::kF8E5M2)
      .value("I8", DType::kI8)
      .value("I16", DType::kI16)
      .value("I32", DType::kI32)
      .value("I64", DType::kI64)
      .value("U8", DType::kU8)
      .value("BOOL", DType::kBool);
  m.def("dtype_size", &dtype_size, "Bytes per element.");
  m.def(
      "dtype_name", [](DType t) { return std::string(dtype_name(t)); }, "Canonical name: 'f32', 'bf16', ...");
  m.def(
      "dtype_from_name", [](const std::string& n) { return unwrap(dtype_from_name(n)); },
      "Inverse of dtype_name; also accepts aliases ('float32', 'bfloat16').");
  m.def("dtype_is_float", &dtype_is_float);
  m.def("numpy_dtype", &numpy_dtype, "numpy dtype of an h5ckpt dtype (bf16 and fp8 as their raw bits: uint16, uint8).");

  py::enum_<Device>(m, "Device").value("HOST", Device::kHost).value("CUDA", Device::kCuda);

  py::class_<Box>(m, "Box", "An n-D box: origin and extent per dimension.")
      .def(py::init([](py::handle offset, py::handle shape) {
             return Box{shape_arg(offset), shape_arg(shape)};
           }),
           py::arg("offset"), py::arg("shape"))
      .def_readwrite("offset", &Box::offset)
      .def_readwrite("shape", &Box::shape)
      .def_property_readonly("ndim", &Box::ndim)
      .def("volume", &Box::volume)
      .def("__eq__", [](const Box& a, const Box& b) { return a == b; })
      .def("__repr__",
           [](const Box& b) { return "Box(offset=" + shape_str(b.offset) + ", shape=" + shape_str(b.shape) + ")"; });

  py::class_<ShardSpec>(m, "ShardSpec",
                        "What part of a tensor's global shape one rank holds: a box, or a flat range of a box's "
                        "row-major flattening (ZeRO). Build with whole, box_of, split or flat_range.")
      .def_readwrite("box", &ShardSpec::box)
      .def_readwrite("flat", &ShardSpec::flat)
      .def_static(
          "whole", [](py::handle shape) { return ShardSpec::whole(shape_arg(shape)); }, py::arg("global_shape"),
          "The whole tensor (a replicated item).")
      .def_static(
          "box_of",
          [](py::handle off, py::handle shape) { return ShardSpec::box_of(shape_arg(off), shape_arg(shape)); },
          py::arg("offset"), py::arg("shape"), "An explicit box.")
      .def_static(
          "split",
          [](py::handle shape, int dim, int parts, int index) {
            return ShardSpec::split(shape_arg(shape), dim, parts, index);
          },
          py::arg("global_shape"), py::arg("dim"), py::arg("parts"), py::arg("index"),
          "Part `index` of dimension `dim` cut into `parts` near-equal parts (the first n % parts get one more).")
      .def_static("flat_range", &ShardSpec::flat_range, py::arg("box"), py::arg("begin"), py::arg("end"),
                  "Elements [begin, end) of the row-major flattening of `box`.")
      .def("numel", &ShardSpec::numel)
      .def(
          "validate", [](const ShardSpec& s, py::handle shape) { check(s.validate(shape_arg(shape))); },
          py::arg("global_shape"), "Raises h5ckpt.Error when the spec does not fit the global shape.")
      .def("__eq__", [](const ShardSpec& a, const ShardSpec& b) { return a == b; })
      .def("__repr__", &spec_repr);

  py::class_<ParallelSizes>(
      m, "ParallelSizes",
      "Sizes of the parallel dimensions; the world size is tp * cp * dp * pp, and ep divides dp * cp.")
      .def(py::init([](int tp, int dp, int pp, int cp, int ep) {
             ParallelSizes s;
             s.tp = tp, s.dp = dp, s.pp = pp, s.cp = cp, s.ep = ep;
             return s;
           }),
           py::arg("tp") = 1, py::arg("dp") = 1, py::arg("pp") = 1, py::kw_only(), py::arg("cp") = 1, py::arg("ep") = 1)
      .def_readwrite("tp", &ParallelSizes::tp)
      .def_readwrite("dp", &ParallelSizes::dp)
      .def_readwrite("pp", &ParallelSizes::pp)
      .def_readwrite("cp", &ParallelSizes::cp, "context parallel")
      .def_readwrite("ep", &ParallelSizes::ep, "expert parallel")
      .def("edp", &ParallelSizes::edp, "Expert-data-parallel size: dp * cp / ep.")
      .def("__eq__",
           [](const ParallelSizes& a, const ParallelSizes& b) {
             return a.tp == b.tp && a.dp == b.dp && a.pp == b.pp && a.cp == b.cp && a.ep == b.ep;
           })
      .def("__repr__", &sizes_repr);
  py::class_<RankCoords>(m, "RankCoords",
                         "A rank's dense (tp, cp, dp, pp) and expert (ep, edp) coordinates. == compares the dense\n"
                         "position (which determines ep and edp within one topology), as in C++.")
      .def(py::init([](int tp, int dp, int pp, int cp, int ep, py::object edp) {
             RankCoords c;
             c.tp = tp, c.dp = dp, c.pp = pp, c.cp = cp, c.ep = ep;
             c.edp = edp.is_none() ? dp : edp.cast<int>();
             return c;
           }),
           py::arg("tp") = 0, py::arg("dp") = 0, py::arg("pp") = 0, py::kw_only(), py::arg("cp") = 0, py::arg("ep") = 0,
           py::arg("edp") = py::none(), "edp defaults to dp (what a topology with cp = ep = 1 gives).")
      .def_readwrite("tp", &RankCoords::tp)
      .def_readwrite("dp", &RankCoords::dp)
      .def_readwrite("pp", &RankCoords::pp)
      .def_readwrite("cp", &RankCoords::cp, "context-parallel rank")
      .def_readwrite("ep", &RankCoords::ep, "expert-parallel rank")
      .def_readwrite("edp", &RankCoords::edp, "expert-data-parallel rank")
      .def("__eq__", [](const RankCoords& a, const RankCoords& b) { return a == b; })
      .def("__repr__", [](const RankCoords& c) {
        return "RankCoords(tp=" + std::to_string(c.tp) + ", dp=" + std::to_string(c.dp) +
               ", pp=" + std::to_string(c.pp) + ", cp=" + std::to_string(c.cp) + ", ep=" + std::to_string(c.ep) +
               ", edp=" + std::to_string(c.edp) + ")";
      });

  py::class_<ShardPiece>(m, "ShardPiece",
                         "One piece of a multi-piece item (StateDict.add_pieces): a shard of the global tensor whose\n"
                         "elements (row-major within the piece) start `buffer_offset` bytes into the item's buffer.")
      .def(py::init([](const ShardSpec& shard, int64_t off) {
             if (off < 0) throw py::value_error("buffer_offset must not be negative");
             return ShardPiece{shard, static_cast<uint64_t>(off)};
           }),
           py::arg("shard"), py::arg("buffer_offset") = 0)
      .def_readwrite("shard", &ShardPiece::shard)
      .def_readwrite("buffer_offset", &ShardPiece::buffer_offset, "bytes from the buffer's start")
      .def("__eq__", [](const ShardPiece& a,
                        const ShardPiece& b) { return a.shard == b.shard && a.buffer_offset == b.buffer_offset; })
      .def("__repr__", [](const ShardPiece& p) {
        return "ShardPiece(" + spec_repr(p.shard) + ", buffer_offset=" + std::to_string(p.buffer_offset) + ")";
      });
}

void bind_core(py::module_& m) {
  // ---- options ----
  py::class_<SaveOptions>(m, "SaveOptions", "Per-call options of save/save_async (checkpointer.h).")
      .def(py::init([](py::kwargs kw) { return with_kwargs(SaveOptions{}, kw); }))
      .def_readwrite("checksums", &SaveOptions::checksums)
      .def_readwrite("overwrite", &SaveOptions::overwrite)
      .def_readwrite("update_latest", &SaveOptions::update_latest)
      .def_readwrite("step", &SaveOptions::step)
      .def_property(
          "aggregate_writes",
          [](const SaveOptions& o) {
            return o.aggregate_writes == AggregateWrites::kOn    ? "on"
                   : o.aggregate_writes == AggregateWrites::kOff ? "off"
                                                                 : "auto";
          },
          [](SaveOptions& o, const std::string& v) {
            if (v == "auto") o.aggregate_writes = AggregateWrites::kAuto;
            else if (v == "on") o.aggregate_writes = AggregateWrites::kOn;
            else if (v == "off") o.aggregate_writes = AggregateWrites::kOff;
            else throw py::value_error("aggregate_writes: expected 'auto', 'on' or 'off', got '" + v + "'");
          },
          "two-phase writes of short runs: 'auto' (default), 'on' or 'off'")
      .def_readwrite("write_window_bytes", &SaveOptions::write_window_bytes)
      .def_readwrite("persist", &SaveOptions::persist,
                     "with CheckpointerOptions.local_dir: also write this save to the shared level")
      .def_property(
          "device_stream", [](const SaveOptions& o) { return reinterpret_cast<uintptr_t>(o.device_stream); },
          [](SaveOptions& o, uintptr_t s) { o.device_stream = reinterpret_cast<void*>(s); },
          "cudaStream_t as an integer (torch.cuda.current_stream().cuda_stream); 0: synchronize the device");

  py::enum_<LoadStrictness>(m, "LoadStrictness",
                            "What a load does when the keys of the state and the checkpoint differ (checkpointer.h); "
                            "LoadOptions.strictness also takes the names in lower case ('raise_all', ...).")
      .value("IGNORE_UNEXPECTED", LoadStrictness::kIgnoreUnexpected)
      .value("RAISE_ALL", LoadStrictness::kRaiseAll)
      .value("ALLOW_MISSING", LoadStrictness::kAllowMissing);

  py::class_<LoadOptions>(m, "LoadOptions", "Per-call options of load (checkpointer.h).")
      .def(py::init([](py::kwargs kw) { return with_kwargs(LoadOptions{}, kw); }))
      .def_readwrite("strict", &LoadOptions::strict)
      .def_property(
          "strictness", [](const LoadOptions& o) { return o.strictness; },
          [](LoadOptions& o, const py::object& v) {
            if (py::isinstance<py::str>(v)) {
              const std::string name = v.cast<std::string>();
              if (name == "ignore_unexpected") o.strictness = LoadStrictness::kIgnoreUnexpected;
              else if (name == "raise_all") o.strictness = LoadStrictness::kRaiseAll;
              else if (name == "allow_missing") o.strictness = LoadStrictness::kAllowMissing;
              else
                throw py::value_error("strictness '" + name +
                                      "' is none of 'ignore_unexpected', 'raise_all', 'allow_missing'");
            } else {
              o.strictness = v.cast<LoadStrictness>();
            }
          })
      .def_readwrite("check_only", &LoadOptions::check_only)
      .def_readwrite("convert_dtype", &LoadOptions::convert_dtype)
      .def_readwrite("verify", &LoadOptions::verify)
      .def_readwrite("verify_checksums", &LoadOptions::verify_checksums)
      .def_readwrite("zero_redundancy", &LoadOptions::zero_redundancy)
      .def_readwrite("aggregate_reads", &LoadOptions::aggregate_reads)
      .def_readwrite("read_window_bytes", &LoadOptions::read_window_bytes);

  py::class_<CheckpointerOptions>(m, "CheckpointerOptions",
                                  "Settings of a Checkpointer (checkpointer.h); `async_` is C++'s `async`.")
      .def(py::init([](py::kwargs kw) { return with_kwargs(CheckpointerOptions{}, kw); }))
      .def_readwrite("async_", &CheckpointerOptions::async)
      .def_readwrite("staging_bytes", &CheckpointerOptions::staging_bytes)
      .def_readwrite("memory_bytes", &CheckpointerOptions::memory_bytes,
                     "bound of the library's own memory per save/load (0: none; same on every rank)")
      .def_readwrite("direct_writes", &CheckpointerOptions::direct_writes)
      .def_readwrite("direct_io", &CheckpointerOptions::direct_io)
      .def_readwrite("max_piece_bytes", &CheckpointerOptions::max_piece_bytes)
      .def_readwrite("alignment", &CheckpointerOptions::alignment)
      .def_readwrite("mpi_hints", &CheckpointerOptions::mpi_hints, "dict of str; assign a whole dict")
      .def_readwrite("io_threads", &CheckpointerOptions::io_threads)
      .def_readwrite("timeout_s", &CheckpointerOptions::timeout_s)
      .def_readwrite("metrics", &CheckpointerOptions::metrics)
      .def_readwrite("metrics_dir", &CheckpointerOptions::metrics_dir)
      .def_readwrite("keep_last", &CheckpointerOptions::keep_last)
      .def_readwrite("keep_every", &CheckpointerOptions::keep_every)
      .def_readwrite("local_dir", &CheckpointerOptions::local_dir,
                     "node-local directory of multi-level saves ('{node}': the node's index); empty: off")
      .def_readwrite("local_replicas", &CheckpointerOptions::local_replicas,
                     "copies of each node's files on the next nodes")
      .def_readwrite(
          "persist_every", &CheckpointerOptions::persist_every,
          "every persist_every-th save (by step, else count) also goes to the shared level; 0: only persist=True")
      .def_readwrite("local_keep", &CheckpointerOptions::local_keep, "local checkpoints each node keeps");

  // ---- reports ----
  py::class_<SaveReport>(m, "SaveReport", "Per-call figures of this rank for a save.")
      .def_readonly("path", &SaveReport::path)
      .def_readonly("bytes_written", &SaveReport::bytes_written)
      .def_readonly("bytes_direct", &SaveReport::bytes_direct)
      .def_readonly("write_calls", &SaveReport::write_calls)
      .def_readonly("bytes_aggregated", &SaveReport::bytes_aggregated)
      .def_readonly("bytes_total", &SaveReport::bytes_total)
      .def_readonly("blocked_bytes", &SaveReport::blocked_bytes)
      .def_readonly("plan_s", &SaveReport::plan_s)
      .def_readonly("snapshot_s", &SaveReport::snapshot_s)
      .def_readonly("write_s", &SaveReport::write_s)
      .def_readonly("commit_s", &SaveReport::commit_s)
      .def_readonly("total_s", &SaveReport::total_s)
      .def_readonly("plan_cached", &SaveReport::plan_cached)
      .def_readonly("async_", &SaveReport::async)
      .def_readonly("level", &SaveReport::level, "'local' (path is then the node-local directory) or 'shared'")
      .def_readonly("persisted", &SaveReport::persisted, "local saves: the shared checkpoint also written, or ''")
      .def_readonly("replicate_s", &SaveReport::replicate_s, "local saves: time on the partner copies")
      .def_readonly("persist_s", &SaveReport::persist_s, "local saves: the shared-level write and commit")
      .def("to_dict", &save_report_dict)
      .def("__repr__", [](const SaveReport& r) { return dict_repr("SaveReport", save_report_dict(r)); });
  py::class_<LoadReport>(m, "LoadReport", "Per-call figures of this rank for a load.")
      .def_readonly("path", &LoadReport::path)
      .def_readonly("bytes_read", &LoadReport::bytes_read)
      .def_readonly("bytes_sent", &LoadReport::bytes_sent)
      .def_readonly("bytes_received", &LoadReport::bytes_received)
      .def_readonly("missing_keys", &LoadReport::missing_keys)
      .def_readonly("unexpected_keys", &LoadReport::unexpected_keys)
      .def_readonly("shape_mismatches", &LoadReport::shape_mismatches)
      .def_readonly("dtype_mismatches", &LoadReport::dtype_mismatches)
      .def_readonly("plan_s", &LoadReport::plan_s)
      .def_readonly("open_s", &LoadReport::open_s)
      .def_readonly("read_s", &LoadReport::read_s)
      .def_readonly("io_s", &LoadReport::io_s)
      .def_readonly("copy_s", &LoadReport::copy_s)
      .def_readonly("exchange_s", &LoadReport::exchange_s)
      .def_readonly("verify_threads", &LoadReport::verify_threads)
      .def_readonly("io_threads", &LoadReport::io_threads)
      .def_readonly("total_s", &LoadReport::total_s)
      .def_readonly("plan_cached", &LoadReport::plan_cached)
      .def_readonly("index_shared", &LoadReport::index_shared)
      .def_readonly("transport", &LoadReport::transport)
      .def("to_dict", &load_report_dict)
      .def("__repr__", [](const LoadReport& r) { return dict_repr("LoadReport", load_report_dict(r)); });

  py::class_<ResolvedCheckpoint>(m, "ResolvedCheckpoint", "Which checkpoint a load reads (Checkpointer.resolve).")
      .def_readonly("info", &ResolvedCheckpoint::info,
                    "its CheckpointInfo (for a local checkpoint: no data file, format_version 0)")
      .def_readonly("level", &ResolvedCheckpoint::level, "'local' or 'shared'")
      .def_readonly("reason", &ResolvedCheckpoint::reason, "which checkpoint and why")
      .def("__repr__", [](const ResolvedCheckpoint& r) {
        return "<h5ckpt.ResolvedCheckpoint " + r.level + " " + r.info.path + " step " + std::to_string(r.info.step) +
               ">";
      });

  // ---- state dict ----
  py::class_<PyStateDict>(m, "StateDict",
                          "The state a rank saves or loads: references to numpy arrays, buffer-protocol objects or\n"
                          "torch tensors (CPU, or CUDA in a CUDA build), never copies. It keeps a reference to every\n"
                          "object added. Problems with an item (a bad shard, a non-contiguous or wrongly sized\n"
                          "buffer) do not raise here: like the C++ StateDict, the next save or load reports them,\n"
                          "with the same Error on every rank.")
      .def(py::init<>())
      .def(
          "add",
          [](PyStateDict& self, const std::string& key, py::handle data, py::handle global_shape, py::handle shard,
             py::handle dtype, bool allow_shape_mismatch, py::handle device) {
            add_item(self, key, data, global_shape, shard, dtype, allow_shape_mismatch, device);
          },
          py::arg("key"), py::arg("data"), py::arg("global_shape") = py::none(), py::arg("shard") = py::none(),
          py::kw_only(), py::arg("dtype") = py::none(), py::arg("allow_shape_mismatch") = false,
          py::arg("device") = py::none(),
          "Adds this rank's part `shard` (a ShardSpec; default: the whole tensor) of a tensor of `global_shape`\n"
          "(default: the buffer's shape). `data` holds shard.numel() elements, C-contiguous. dtype defaults to\n"
          "the buffer's; give it for raw bits (a uint16 array as 'bf16'). allow_shape_mismatch: load only,\n"
          "for a vocabulary padded to another multiple.")
      .def(
          "add_replicated",
          [](PyStateDict& self, const std::string& key, py::handle data, py::handle global_shape, py::handle dtype) {
            add_item(self, key, data, global_shape, py::none(), dtype, false, py::none());
          },
          py::arg("key"), py::arg("data"), py::arg("global_shape") = py::none(), py::kw_only(),
          py::arg("dtype") = py::none(), "Adds a tensor this rank holds whole (replicated over the ranks that add it).")
      .def(
          "add_pieces",
          [](PyStateDict& self, const std::string& key, py::handle dtype, py::handle global_shape, py::handle pieces,
             py::handle data,
             py::handle device) { add_pieces_item(self, key, dtype, global_shape, pieces, data, device); },
          py::arg("key"), py::arg("dtype"), py::arg("global_shape"), py::arg("pieces"), py::arg("data"), py::kw_only(),
          py::arg("device") = py::none(),
          "Adds several pieces of one tensor of `global_shape` that live in one buffer (a fused layout, e.g. a\n"
          "SwiGLU fc1 shard [gate; up]). `pieces`: ShardPiece objects or (ShardSpec, buffer_offset_bytes) pairs;\n"
          "each piece's elements, row-major, start at that byte offset of `data` (C-contiguous, any shape).\n"
          "dtype: None for the buffer's own, or a name/DType for raw bits. Saved, loaded and resharded like\n"
          "separate shards; problems surface in the next save or load.")
      .def(
          "add_bytes",
          [](PyStateDict& self, const std::string& key, py::handle data) {
            BufferRef b = get_buffer(data);
            if (!b.error.empty())
              return self.defer(Status(ErrorCode::kInvalidArgument, "key '" + key + "': " + b.error));
            self.sd.add_bytes(key, b.ptr, static_cast<size_t>(b.numel) * b.itemsize);
            self.holds.push_back(b.hold);
            self.writable.push_back(b.writable ? 1 : 0);
          },
          py::arg("key"), py::arg("data"),
          "Adds an opaque byte blob (any contiguous buffer: bytearray, numpy array) held whole by this rank.\n"
          "A load fills it in place, so it must be writable then and of the saved size.")
      .def("__len__", [](const PyStateDict& s) { return s.sd.size(); })
      .def("__contains__", [](const PyStateDict& s, const std::string& k) { return s.sd.find(k) != nullptr; })
      .def("keys",
           [](const PyStateDict& s) {
             std::vector<std::string> k;
             for (const auto& it : s.sd.items()) k.push_back(it.key);
             return k;
           })
      .def(
          "buffer",
          [](const PyStateDict& s, const std::string& key) -> py::object {
            const auto& items = s.sd.items();
            for (size_t i = 0; i < items.size(); ++i)
              if (items[i].key == key) return s.holds[i] ? s.holds[i]->owner : py::object(py::none());
            throw py::key_error(key);
          },
          py::arg("key"), "The object whose memory item `key` references.")
      .def(
          "item",
          [](const PyStateDict& s, const std::string& key) {
            const StateItem* it = s.sd.find(key);
            if (!it) throw py::key_error(key);
            py::dict d;
            d["key"] = it->key;
            d["dtype"] = it->dtype;
            d["global_shape"] = it->global_shape;
            d["shard"] = it->shard;
            d["device"] = it->device;
            d["allow_shape_mismatch"] = it->allow_shape_mismatch;
            d["pieces"] = it->pieces;
            return d;
          },
          py::arg("key"), "The item's description as a dict (key, dtype, global_shape, shard, device, ...).")
      .def_property_readonly(
          "error",
          [](const PyStateDict& s) -> py::object {
            Status st = s.local_status(false);
            return st.ok() ? py::object(py::none()) : py::object(py::str(st.to_string()));
          },
          "This rank's first problem with an added item (the next save or load raises it), or None.")
      .def("__repr__",
           [](const PyStateDict& s) { return "<h5ckpt.StateDict with " + std::to_string(s.sd.size()) + " items>"; });

  // ---- topology ----
  py::class_<PyTopology>(
      m, "Topology",
      "The TP/DP/PP communicators of a job (duplicates, owned by the Topology). Close it (or let it\n"
      "go) before MPI finalizes; the package closes every live one at interpreter exit.")
      .def_static(
          "create",
          [](py::object comm, int tp, int dp, int pp, int cp, int ep) {
            MPI_Comm c = comm_from_py(comm);
            ParallelSizes sizes;
            sizes.tp = tp, sizes.dp = dp, sizes.pp = pp, sizes.cp = cp, sizes.ep = ep;
            std::optional<Result<Topology>> r;
            {
              py::gil_scoped_release release;
              r.emplace(Topology::create(c, sizes));
            }
            auto t = std::make_unique<PyTopology>();
            t->topo = std::make_shared<Topology>(unwrap(std::move(*r)));
            return t;
          },
          py::arg("comm") = py::none(), py::arg("tp") = 1, py::arg("dp") = 1, py::arg("pp") = 1, py::kw_only(),
          py::arg("cp") = 1, py::arg("ep") = 1,
          "Megatron rank order over `comm` (an mpi4py communicator; default COMM_WORLD): TP fastest, then CP,\n"
          "then DP, then PP (world rank = tp + TP*(cp + CP*(dp + DP*pp))). The size is tp*cp*dp*pp; experts split\n"
          "over ep (dividing dp*cp) inside each (tp, pp) position's DP x CP group. Collective.")
      .def_static(
          "from_comms",
          [](py::object world, py::object tp, py::object dp, py::object pp, py::object cp, py::object ep) {
            MPI_Comm w = comm_from_py(world), t = comm_from_py(tp), d = comm_from_py(dp), p = comm_from_py(pp);
            const bool five = !cp.is_none() || !ep.is_none();
            MPI_Comm c = cp.is_none() ? MPI_COMM_SELF : comm_from_py(cp);
            MPI_Comm e = ep.is_none() ? MPI_COMM_SELF : comm_from_py(ep);
            std::optional<Result<Topology>> r;
            {
              py::gil_scoped_release release;
              r.emplace(five ? Topology::from_comms(w, t, c, d, p, e) : Topology::from_comms(w, t, d, p));
            }
            auto out = std::make_unique<PyTopology>();
            out->topo = std::make_shared<Topology>(unwrap(std::move(*r)));
            return out;
          },
          py::arg("world"), py::arg("tp"), py::arg("dp"), py::arg("pp"), py::kw_only(), py::arg("cp") = py::none(),
          py::arg("ep") = py::none(),
          "From the caller's own TP/DP/PP communicators (mpi4py); each rank's rank in them gives its coords.\n"
          "cp, ep: context- and expert-parallel communicators too (a missing one: COMM_SELF, size 1).")
      .def_property_readonly("rank", [](const PyTopology& t) { return t.get().rank(); })
      .def_property_readonly("size", [](const PyTopology& t) { return t.get().size(); })
      .def_property_readonly("sizes", [](const PyTopology& t) { return t.get().sizes(); })
      .def_property_readonly("coords", [](const PyTopology& t) { return t.get().coords(); })
      .def_property_readonly("all_coords", [](const PyTopology& t) { return t.get().all_coords(); })
      .def(
          "world", [](const PyTopology& t) { return comm_to_py(t.get().world()); },
          "The topology's world communicator (an mpi4py Comm, valid while the Topology lives).")
      .def("tp_comm", [](const PyTopology& t) { return comm_to_py(t.get().tp_comm()); })
      .def("dp_comm", [](const PyTopology& t) { return comm_to_py(t.get().dp_comm()); })
      .def("pp_comm", [](const PyTopology& t) { return comm_to_py(t.get().pp_comm()); })
      .def(
          "cp_comm", [](const PyTopology& t) { return comm_to_py(t.get().cp_comm()); },
          "Context parallel: same (tp, dp, pp), ordered by cp.")
      .def(
          "dp_cp_comm", [](const PyTopology& t) { return comm_to_py(t.get().dp_cp_comm()); },
          "Dense DP x CP group (same tp, pp), ordered by dp * CP + cp.")
      .def(
          "ep_comm", [](const PyTopology& t) { return comm_to_py(t.get().ep_comm()); },
          "Expert parallel: same (tp, pp, edp), ordered by ep.")
      .def(
          "expert_dp_comm", [](const PyTopology& t) { return comm_to_py(t.get().expert_dp_comm()); },
          "Expert data parallel: same (tp, pp, ep), ordered by edp.")
      .def_property_readonly("closed", [](const PyTopology& t) { return !t.topo; })
      .def("close", &PyTopology::close,
           "Frees the communicators (once no Checkpointer uses them). Not collective in practice, but call it on all "
           "ranks.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyTopology& t, py::args) { t.close(); })
      .def("__repr__", [](const PyTopology& t) {
        if (!t.topo) return std::string("<h5ckpt.Topology (closed)>");
        auto s = t.topo->sizes();
        auto c = t.topo->coords();
        const bool extra = s.cp != 1 || s.ep != 1;
        return "<h5ckpt.Topology tp=" + std::to_string(s.tp) + " dp=" + std::to_string(s.dp) +
               " pp=" + std::to_string(s.pp) +
               (extra ? " cp=" + std::to_string(s.cp) + " ep=" + std::to_string(s.ep) : std::string()) + " rank " +
               std::to_string(t.topo->rank()) + " at (tp " + std::to_string(c.tp) + ", dp " + std::to_string(c.dp) +
               ", pp " + std::to_string(c.pp) +
               (extra
                    ? ", cp " + std::to_string(c.cp) + ", ep " + std::to_string(c.ep) + ", edp " + std::to_string(c.edp)
                    : std::string()) +
               ")>";
      });

  // ---- save handle ----
  py::class_<PySaveHandle>(m, "SaveHandle",
                           "An asynchronous save in flight. Keeps the state's buffers referenced until the save is\n"
                           "done (test() returned True or wait() returned).")
      .def_property_readonly("valid", [](const PySaveHandle& h) { return h.handle.valid(); })
      .def(
          "test",
          [](PySaveHandle& h) {
            const bool done = h.handle.test();
            if (done) h.holds.clear();
            return done;
          },
          "True once the save has committed or failed (never blocks).")
      .def(
          "wait",
          [](PySaveHandle& h) {
            std::optional<Result<SaveReport>> r;
            {
              py::gil_scoped_release release;
              r.emplace(h.handle.wait());
            }
            h.holds.clear();
            return unwrap(std::move(*r));
          },
          "Blocks until the save has committed or failed; returns the SaveReport or raises h5ckpt.Error\n"
          "(the same on every rank). May be called again.")
      .def_property_readonly(
          "held_buffers", [](const PySaveHandle& h) { return h.holds.size(); },
          "How many buffers the handle still keeps alive.");

  // ---- checkpointer ----
  py::class_<PyCheckpointer>(m, "Checkpointer",
                             "Saves and loads StateDicts over one Topology. Every call is collective over the\n"
                             "topology's world and raises the same h5ckpt.Error on every rank. At most one save is in\n"
                             "flight; close() (or interpreter exit) waits for it.")
      .def(py::init([](PyTopology& topo, py::object options, py::kwargs kw) {
             CheckpointerOptions opts;
             if (!options.is_none()) {
               if (py::isinstance<Config>(options)) opts = options.cast<Config>().checkpointer;
               else opts = options.cast<CheckpointerOptions>();
             }
             opts = with_kwargs(opts, kw);
             auto pc = std::make_unique<PyCheckpointer>();
             pc->topo = topo.topo;
             if (!pc->topo) raise_status(Status(ErrorCode::kInvalidArgument, "the Topology is closed"));
             {
               py::gil_scoped_release release;
               pc->ck = std::make_unique<Checkpointer>(*pc->topo, opts);
             }
             return pc;
           }),
           py::arg("topology"), py::arg("options") = py::none(),
           "options: CheckpointerOptions or Config (its .checkpointer); keyword arguments override fields.")
      .def(
          "save",
          [](PyCheckpointer& pc, PyStateDict& state, const std::string& path, py::object options, py::kwargs kw) {
            SaveOptions o = options_arg<SaveOptions>(options, kw);
            auto [r, holds] = run_collective<SaveReport>(
                pc, state, false, [&](Checkpointer& ck, StateDict& sd) { return ck.save(sd, path, o); });
            return unwrap(std::move(r));
          },
          py::arg("state"), py::arg("path"), py::arg("options") = py::none(),
          "Writes `state` as checkpoint directory `path` and commits it. Keywords set SaveOptions fields.")
      .def(
          "save_async",
          [](PyCheckpointer& pc, PyStateDict& state, const std::string& path, py::object options, py::kwargs kw) {
            SaveOptions o = options_arg<SaveOptions>(options, kw);
            auto [r, holds] = run_collective<SaveHandle>(
                pc, state, false, [&](Checkpointer& ck, StateDict& sd) { return ck.save_async(sd, path, o); });
            auto h = std::make_unique<PySaveHandle>();
            h->handle = unwrap(std::move(r));
            h->holds = std::move(holds);
            return h;
          },
          py::arg("state"), py::arg("path"), py::arg("options") = py::none(),
          "Returns a SaveHandle once this rank's part has been copied; the buffers may change then.")
      .def(
          "load",
          [](PyCheckpointer& pc, PyStateDict& state, const std::string& path, py::object options, py::kwargs kw) {
            LoadOptions o = options_arg<LoadOptions>(options, kw);
            auto [r, holds] = run_collective<LoadReport>(
                pc, state, true, [&](Checkpointer& ck, StateDict& sd) { return ck.load(sd, path, o); });
            return unwrap(std::move(r));
          },
          py::arg("state"), py::arg("path"), py::arg("options") = py::none(),
          "Fills the state's buffers from checkpoint `path` (or a directory's `latest`), whatever layout saved it.\n"
          "Keywords set LoadOptions fields.")
      .def(
          "resolve",
          [](PyCheckpointer& pc, const std::string& path) {
            Checkpointer& ck = pc.get();
            std::optional<Result<ResolvedCheckpoint>> r;
            {
              py::gil_scoped_release release;
              r.emplace(ck.resolve(path));
            }
            return unwrap(std::move(*r));
          },
          py::arg("path"),
          "The checkpoint load(state, path) would read: a ResolvedCheckpoint (info, level 'local' or 'shared',\n"
          "reason). With local_dir, the newest servable local one, else the newest shared one. Collective.")
      .def(
          "wait_pending",
          [](PyCheckpointer& pc) {
            Checkpointer& ck = pc.get();
            py::gil_scoped_release release;
            ck.wait_pending();
          },
          "Waits for the asynchronous save in flight, if any (its outcome stays on its handle).")
      .def(
          "touch_staging",
          [](PyCheckpointer& pc) {
            Checkpointer& ck = pc.get();
            py::gil_scoped_release release;
            ck.touch_staging();
          },
          "Re-reads the staging pool's pages (before timing a save_async on VMs that take idle memory back).")
      .def(
          "set_attribute",
          [](PyCheckpointer& pc, const std::string& n, const std::string& v) { pc.get().set_attribute(n, v); },
          py::arg("name"), py::arg("value"), "A string attribute stored with the next saves.")
      .def_property_readonly("closed", [](const PyCheckpointer& pc) { return !pc.ck; })
      .def("close", &PyCheckpointer::close, "Waits for the save in flight and frees the Checkpointer.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyCheckpointer& pc, py::args) { pc.close(); });

  // ---- configuration ----
  py::class_<Config>(m, "Config", "Settings from a TOML file and H5CKPT_* variables (config.h).")
      .def(py::init<>())
      .def_readwrite("checkpointer", &Config::checkpointer)
      .def_readwrite("save", &Config::save)
      .def_readwrite("load", &Config::load)
      .def_readwrite("log_level", &Config::log_level);
  m.def(
      "load_config", [](const std::string& path) { return unwrap(load_config(path)); }, py::arg("path"),
      "Defaults overlaid with the TOML file at `path`.");
  m.def(
      "parse_config",
      [](const std::string& text, const std::string& source) { return unwrap(parse_config(text, source)); },
      py::arg("text"), py::arg("source") = "<string>", "Like load_config, from TOML text.");
  m.def(
      "apply_env", [](Config& c) { check(apply_env(c)); }, py::arg("config"),
      "Overlays the H5CKPT_* environment variables on `config` in place.");
  m.def(
      "resolve_config", [](const std::string& p) { return unwrap(resolve_config(p)); }, py::arg("path") = "",
      "Defaults < file (path, else $H5CKPT_CONFIG) < environment; applies the log level.");
  m.def(
      "set_log_level", [](const std::string& l) { check(set_log_level(l)); }, py::arg("level"));
  m.def(
      "parse_byte_size", [](const std::string& t) { return unwrap(parse_byte_size(t)); }, py::arg("text"),
      "'1.5GiB' -> 1610612736.");
}

}  // namespace h5ckpt_py
