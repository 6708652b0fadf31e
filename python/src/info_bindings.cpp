// Checkpoint metadata, listing, verification and retention (checkpoint_info.h), and the read API
// (reader.h): no MPI needed.
#include <mutex>

#include "common.h"

namespace h5ckpt_py {

using namespace h5ckpt;

namespace {

struct PyReader {
  std::optional<CheckpointReader> reader;
  std::mutex mu;  // one reader serves one thread at a time
  CheckpointReader& get() {
    if (!reader) raise_status(Status(ErrorCode::kInvalidArgument, "this CheckpointReader is closed"));
    return *reader;
  }
};

// Numpy element type a read returns by default: the stored one when numpy has it, else f32
// (bf16 and fp8 widen to f32 exactly).
DType default_read_dtype(DType stored) {
  switch (stored) {
    case DType::kBF16:
    case DType::kF8E4M3:
    case DType::kF8E5M2: return DType::kF32;
    default: return stored;
  }
}

// Reads into `out` (a writable buffer or tensor) or into a new numpy array of `shape`.
template <class F>
py::object read_into(py::handle out, py::handle dtype, DType stored, const Shape& shape, int64_t numel,
                     const std::string& key, F&& do_read) {
  if (out.is_none()) {
    std::optional<DType> want = dtype_arg(dtype);
    const DType dst = want ? *want : default_read_dtype(stored);
    std::vector<py::ssize_t> dims(shape.begin(), shape.end());
    py::array arr(numpy_dtype(dst), dims);
    void* ptr = arr.mutable_data();
    Status st;
    {
      py::gil_scoped_release release;
      st = do_read(dst, ptr);
    }
    check(st);
    return py::object(std::move(arr));
  }
  BufferRef b = get_buffer(out);
  if (!b.error.empty()) raise_status(Status(ErrorCode::kInvalidArgument, "out: " + b.error));
  if (!b.writable) raise_status(Status(ErrorCode::kInvalidArgument, "out: the buffer is read-only"));
  if (b.device != Device::kHost)
    raise_status(Status(ErrorCode::kUnsupported, "out: the reader fills host memory only"));
  if (b.numel != numel)
    raise_status(Status(ErrorCode::kShapeMismatch, "out: key '" + key + "' needs " + std::to_string(numel) +
                                                       " elements, the buffer has " + std::to_string(b.numel)));
  DType dst = unwrap(resolve_dtype(b, dtype_arg(dtype)));
  Status st;
  {
    py::gil_scoped_release release;
    st = do_read(dst, b.ptr);
  }
  check(st);
  return py::reinterpret_borrow<py::object>(out);
}

const TensorInfo& find_or_raise(PyReader& r, const std::string& key) {
  const TensorInfo* t = r.get().find(key);
  if (!t) raise_status(Status(ErrorCode::kNotFound, "no tensor '" + key + "' in checkpoint " + r.get().info().path));
  return *t;
}

}  // namespace

void bind_info(py::module_& m) {
  py::class_<SavedRegion>(m, "SavedRegion", "One saved region of a tensor as the metadata records it.")
      .def_readonly("shard", &SavedRegion::shard)
      .def_readonly("writer_rank", &SavedRegion::writer_rank)
      .def_readonly("checksum", &SavedRegion::checksum, "xxh3-64 of the whole region (format v1; 0: none)")
      .def_readonly("block_bytes", &SavedRegion::block_bytes, "bytes per verification block (0: no blocks)")
      .def_readonly("block_checksums", &SavedRegion::block_checksums, "xxh3-64 of each verification block")
      .def("__repr__", [](const SavedRegion& r) {
        return "SavedRegion(" + region_to_string(r.shard) + ", writer_rank=" + std::to_string(r.writer_rank) + ")";
      });
  py::class_<TensorInfo>(m, "TensorInfo", "What the metadata says about one stored tensor.")
      .def_readonly("key", &TensorInfo::key)
      .def_readonly("dtype", &TensorInfo::dtype)
      .def_readonly("shape", &TensorInfo::shape)
      .def_readonly("nbytes", &TensorInfo::nbytes)
      .def_readonly("file_offset", &TensorInfo::file_offset)
      .def_readonly("regions", &TensorInfo::regions)
      .def("__repr__", [](const TensorInfo& t) {
        std::string s = "TensorInfo('" + t.key + "', " + dtype_name(t.dtype) + ", [";
        for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
        return s + "], " + std::to_string(t.regions.size()) + " regions)";
      });
  py::class_<CheckpointInfo>(m, "CheckpointInfo", "A checkpoint's validated global metadata.")
      .def_readonly("path", &CheckpointInfo::path)
      .def_readonly("data_file", &CheckpointInfo::data_file)
      .def_readonly("format_version", &CheckpointInfo::format_version)
      .def_readonly("library_version", &CheckpointInfo::library_version)
      .def_readonly("step", &CheckpointInfo::step)
      .def_readonly("saved_sizes", &CheckpointInfo::saved_sizes)
      .def_readonly("saved_coords", &CheckpointInfo::saved_coords)
      .def_readonly("tensors", &CheckpointInfo::tensors)
      .def_readonly("attributes", &CheckpointInfo::attributes)
      .def(
          "find", [](const CheckpointInfo& i, const std::string& k) { return i.find(k); }, py::arg("key"),
          py::return_value_policy::reference_internal, "The stored tensor `key`, or None.")
      .def("keys",
           [](const CheckpointInfo& i) {
             std::vector<std::string> k;
             for (const auto& t : i.tensors) k.push_back(t.key);
             return k;
           })
      .def("total_bytes", &CheckpointInfo::total_bytes)
      .def("__repr__", [](const CheckpointInfo& i) {
        return "<h5ckpt.CheckpointInfo " + i.path + " step " + std::to_string(i.step) + ", " +
               std::to_string(i.tensors.size()) + " tensors>";
      });

  m.def(
      "read_checkpoint_info",
      [](const std::string& path) {
        std::optional<Result<CheckpointInfo>> r;
        {
          py::gil_scoped_release release;
          r.emplace(read_checkpoint_info(path));
        }
        return unwrap(std::move(*r));
      },
      py::arg("path"),
      "Validated metadata of a checkpoint, or of what a directory's `latest` names (as load selects). No MPI.");
  m.def(
      "verify_checkpoint",
      [](const CheckpointInfo& info, int part, int nparts) {
        Status st;
        {
          py::gil_scoped_release release;
          st = verify_checkpoint(info, part, nparts);
        }
        check(st);
      },
      py::arg("info"), py::arg("part") = 0, py::arg("nparts") = 1,
      "Re-reads the saved regions with index % nparts == part and checks their checksums; raises on a mismatch.");
  m.def("is_checkpoint_dir", &is_checkpoint_dir, py::arg("path"));
  m.def("region_to_string", &region_to_string, py::arg("shard"));

  py::class_<CheckpointDirEntry>(m, "CheckpointDirEntry")
      .def_readonly("name", &CheckpointDirEntry::name)
      .def_readonly("path", &CheckpointDirEntry::path)
      .def_readonly("in_progress", &CheckpointDirEntry::in_progress)
      .def_readonly("latest", &CheckpointDirEntry::latest)
      .def("__repr__", [](const CheckpointDirEntry& e) {
        return "CheckpointDirEntry('" + e.name + "'" + (e.latest ? ", latest" : "") +
               (e.in_progress ? ", in progress" : "") + ")";
      });
  py::class_<CheckpointListing>(m, "CheckpointListing")
      .def_readonly("latest", &CheckpointListing::latest)
      .def_readonly("checkpoints", &CheckpointListing::checkpoints);
  m.def(
      "list_checkpoints", [](const std::string& root) { return unwrap(list_checkpoints(root)); }, py::arg("root"),
      "The checkpoint directories directly under `root` and its `latest` pointer.");

  py::class_<PruneOptions>(m, "PruneOptions")
      .def(py::init([](py::kwargs kw) { return with_kwargs(PruneOptions{}, kw); }))
      .def_readwrite("keep_last", &PruneOptions::keep_last)
      .def_readwrite("keep_every", &PruneOptions::keep_every)
      .def_readwrite("dry_run", &PruneOptions::dry_run);
  py::class_<PruneResult>(m, "PruneResult")
      .def_readonly("deleted", &PruneResult::deleted)
      .def_readonly("kept", &PruneResult::kept);
  m.def(
      "prune_checkpoints",
      [](const std::string& root, py::object options, py::kwargs kw) {
        PruneOptions o = with_kwargs(options.is_none() ? PruneOptions{} : options.cast<PruneOptions>(), kw);
        std::optional<Result<PruneResult>> r;
        {
          py::gil_scoped_release release;
          r.emplace(prune_checkpoints(root, o));
        }
        return unwrap(std::move(*r));
      },
      py::arg("root"), py::arg("options") = py::none(),
      "Deletes the committed checkpoints under `root` the retention rule does not keep (keywords: keep_last,\n"
      "keep_every, dry_run).");

  // ---- reader ----
  py::class_<PyReader>(m, "CheckpointReader",
                       "One committed checkpoint opened for reading any box of any tensor, without MPI. Bytes come\n"
                       "from the data file at the offsets its validated metadata records.")
      .def_static(
          "open",
          [](const std::string& path) {
            std::optional<Result<CheckpointReader>> r;
            {
              py::gil_scoped_release release;
              r.emplace(CheckpointReader::open(path));
            }
            auto out = std::make_unique<PyReader>();
            out->reader.emplace(unwrap(std::move(*r)));
            return out;
          },
          py::arg("path"), "Opens a checkpoint directory, or a directory whose `latest` names one.")
      .def_property_readonly("info", [](PyReader& r) { return r.get().info(); })
      .def("keys", [](PyReader& r) { return r.get().keys(); })
      .def(
          "find",
          [](PyReader& r, const std::string& k) -> py::object {
            const TensorInfo* t = r.get().find(k);
            return t ? py::cast(*t) : py::object(py::none());
          },
          py::arg("key"))
      .def(
          "read",
          [](PyReader& r, const std::string& key, py::object box, py::object dtype, py::object out) {
            std::lock_guard<std::mutex> lock(r.mu);
            const TensorInfo& t = find_or_raise(r, key);
            Box b = box.is_none() ? ShardSpec::whole(t.shape).box : box.cast<Box>();
            CheckpointReader& rd = r.get();
            return read_into(out, dtype, t.dtype, b.shape, b.volume(), key,
                             [&](DType dst, void* ptr) { return rd.read(key, b, dst, ptr); });
          },
          py::arg("key"), py::arg("box") = py::none(), py::kw_only(), py::arg("dtype") = py::none(),
          py::arg("out") = py::none(),
          "Reads `box` (default: the whole tensor) of tensor `key`. Into `out` (a writable array or CPU tensor of\n"
          "box.volume() elements; its dtype, or `dtype` for raw bits) when given, else into a new numpy array\n"
          "of the box's shape in `dtype` (default: the stored dtype; bf16/fp8 as float32). Float dtypes convert\n"
          "with round-to-nearest-even.")
      .def(
          "read_shard",
          [](PyReader& r, const std::string& key, const ShardSpec& shard, py::object dtype, py::object out) {
            std::lock_guard<std::mutex> lock(r.mu);
            const TensorInfo& t = find_or_raise(r, key);
            Shape shape = shard.flat ? Shape{shard.numel()} : shard.box.shape;
            CheckpointReader& rd = r.get();
            return read_into(out, dtype, t.dtype, shape, shard.numel(), key,
                             [&](DType dst, void* ptr) { return rd.read_shard(key, shard, dst, ptr); });
          },
          py::arg("key"), py::arg("shard"), py::kw_only(), py::arg("dtype") = py::none(), py::arg("out") = py::none(),
          "Reads what `shard` names, laid out as that shard's StateDict buffer (a box's shape, or 1-D for a flat "
          "range).")
      .def_property_readonly("bytes_read", [](PyReader& r) { return r.get().bytes_read(); })
      .def("close",
           [](PyReader& r) {
             std::lock_guard<std::mutex> lock(r.mu);
             r.reader.reset();
           })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyReader& r, py::args) {
        std::lock_guard<std::mutex> lock(r.mu);
        r.reader.reset();
      });

  m.def(
      "convert_elements",
      [](py::object src, py::object dst, py::object src_dtype, py::object dst_dtype) {
        BufferRef s = get_buffer(src), d = get_buffer(dst);
        if (!s.error.empty()) raise_status(Status(ErrorCode::kInvalidArgument, "src: " + s.error));
        if (!d.error.empty()) raise_status(Status(ErrorCode::kInvalidArgument, "dst: " + d.error));
        if (!d.writable) raise_status(Status(ErrorCode::kInvalidArgument, "dst: the buffer is read-only"));
        if (s.device != Device::kHost || d.device != Device::kHost)
          raise_status(Status(ErrorCode::kUnsupported, "convert_elements works on host memory"));
        if (s.numel != d.numel)
          raise_status(Status(ErrorCode::kShapeMismatch,
                              "src has " + std::to_string(s.numel) + " elements, dst " + std::to_string(d.numel)));
        DType st = unwrap(resolve_dtype(s, dtype_arg(src_dtype)));
        DType dt = unwrap(resolve_dtype(d, dtype_arg(dst_dtype)));
        Status r;
        {
          py::gil_scoped_release release;
          r = convert_elements(s.ptr, st, d.ptr, dt, static_cast<size_t>(s.numel));
        }
        check(r);
      },
      py::arg("src"), py::arg("dst"), py::arg("src_dtype") = py::none(), py::arg("dst_dtype") = py::none(),
      "Converts between float dtypes with the rounding loads use (nearest even); dtypes default to the\n"
      "buffers' own (give them for raw bits: a uint16 array as 'bf16').");
}

}  // namespace h5ckpt_py
