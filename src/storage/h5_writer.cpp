#include "storage/h5_writer.h"

#include "planner/box_math.h"
#include "storage/mpi_hints.h"

namespace h5ckpt::storage {

Result<ParallelWriter> ParallelWriter::create(const std::string& file, MPI_Comm comm,
                                              const std::vector<planner::TensorPlan>& tensors, uint64_t alignment,
                                              const std::map<std::string, std::string>& mpi_hints) {
  hdf5_quiet();
  // Same hints on every rank, checked before the collective create: all ranks return this error.
  H5CKPT_RETURN_IF_ERROR(validate_mpi_hints(mpi_hints));
  ParallelWriter w;
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS));
  MPI_Info info = MPI_INFO_NULL;
  if (!mpi_hints.empty()) {
    MPI_Info_create(&info);
    for (const auto& [k, v] : mpi_hints) MPI_Info_set(info, k.c_str(), v.c_str());
  }
  H5Pset_fapl_mpio(fapl.get(), comm, info);  // HDF5 keeps its own copy of the info
  if (info != MPI_INFO_NULL) MPI_Info_free(&info);
  // Metadata writes go through rank 0 collectively, instead of every rank touching the file.
  H5Pset_coll_metadata_write(fapl.get(), true);
  // Large datasets start on alignment boundaries, friendlier to striped file systems.
  if (alignment > 1) H5Pset_alignment(fapl.get(), alignment, alignment);
  w.file_ = Hid(H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
  if (!w.file_.valid()) return h5_error("cannot create HDF5 file '" + file + "'");

  Hid lcpl(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  Hid dcpl(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
  H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);  // so the offset is known before writing

  for (const auto& t : tensors) {
    std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
    Hid space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
    Hid type = h5_type_of(t.dtype);
    const std::string name = "/" + t.key;
    Hid ds(H5Dcreate2(w.file_.get(), name.c_str(), type.get(), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT));
    if (!ds.valid()) return h5_error("cannot create dataset '" + name + "'");
    H5CKPT_RETURN_IF_ERROR(write_string_attr(ds.get(), "h5ckpt_dtype", dtype_name(t.dtype)));
    const haddr_t off = H5Dget_offset(ds.get());
    w.offsets_.push_back(off == HADDR_UNDEF ? -1 : static_cast<int64_t>(off));
    w.datasets_.push_back(std::move(ds));
    w.types_.push_back(std::move(type));
  }
  w.dxpl_ = Hid(H5Pcreate(H5P_DATASET_XFER));
  // Independent: each rank writes its own pieces without per-tensor collectives, so ranks with
  // different piece counts never wait on each other; regions are mostly contiguous in the file.
  H5Pset_dxpl_mpio(w.dxpl_.get(), H5FD_MPIO_INDEPENDENT);
  return w;
}

Status ParallelWriter::write(size_t index, const ShardSpec* shard, const void* data) {
  const hid_t ds = datasets_[index].get();
  Hid fspace(H5Dget_space(ds));
  hsize_t count = 0;
  if (shard) {
    // The union of the shard's boxes, in row-major file order, equals the buffer's order.
    H5Sselect_none(fspace.get());
    for (const Box& b : planner::shard_boxes(*shard)) {
      std::vector<hsize_t> start(b.offset.begin(), b.offset.end()), len(b.shape.begin(), b.shape.end());
      if (H5Sselect_hyperslab(fspace.get(), H5S_SELECT_OR, start.data(), nullptr, len.data(), nullptr) < 0)
        return h5_error("selecting region of dataset " + std::to_string(index));
      count += static_cast<hsize_t>(b.volume());
    }
  } else {
    H5Sselect_none(fspace.get());
  }
  const hsize_t mdim = count ? count : 1;
  Hid mspace(H5Screate_simple(1, &mdim, nullptr));
  if (!count) H5Sselect_none(mspace.get());
  if (H5Dwrite(ds, types_[index].get(), mspace.get(), fspace.get(), dxpl_.get(), count ? data : nullptr) < 0)
    return h5_error("H5Dwrite of dataset " + std::to_string(index) + " failed");
  return Status::Ok();
}

Status ParallelWriter::close() {
  Status st;
  if (file_.valid() && H5Fflush(file_.get(), H5F_SCOPE_GLOBAL) < 0) st = h5_error("H5Fflush failed");
  datasets_.clear();
  types_.clear();
  dxpl_.reset();
  if (file_.valid() && H5Fclose(file_.release()) < 0 && st.ok()) st = h5_error("H5Fclose failed");
  return st;
}

Status write_meta_group(const std::string& file, const std::string& metadata_json, int format_version,
                        const std::string& library_version) {
  hdf5_quiet();
  Hid f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  if (!f.valid()) return h5_error("cannot reopen '" + file + "' to add /meta");
  Hid g(H5Gcreate2(f.get(), "/meta", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!g.valid()) return h5_error("cannot create /meta");
  H5CKPT_RETURN_IF_ERROR(write_string_attr(g.get(), "format", "h5ckpt"));
  H5CKPT_RETURN_IF_ERROR(write_int_attr(g.get(), "format_version", format_version));
  H5CKPT_RETURN_IF_ERROR(write_string_attr(g.get(), "library_version", library_version));
  // The index as one fixed-length string: h5dump -d /meta/index prints the JSON.
  Hid type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), metadata_json.size());
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  Hid space(H5Screate(H5S_SCALAR));
  Hid ds(H5Dcreate2(g.get(), "index", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!ds.valid()) return h5_error("cannot create /meta/index");
  if (H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, metadata_json.data()) < 0)
    return h5_error("cannot write /meta/index");
  ds.reset();
  g.reset();
  if (H5Fclose(f.release()) < 0) return h5_error("closing '" + file + "' after /meta failed");
  return Status::Ok();
}

}  // namespace h5ckpt::storage
