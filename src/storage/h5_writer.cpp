#include "storage/h5_writer.h"

#include <cstddef>
#include <tuple>

#include "planner/box_math.h"
#include "storage/mpi_hints.h"

namespace h5ckpt::storage {

namespace {
constexpr hsize_t kPackBlockBytes = 1u << 20;
}  // namespace

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
  // Object headers together in blocks of their own, and the small datasets' bytes together in
  // others (HDF5 packs both in 2 KiB blocks by default, interleaved): the small tensors then form
  // one contiguous stretch that the save writes in one request, not one short write per tensor
  // between headers (each a round trip through a network file system's client).
  H5Pset_meta_block_size(fapl.get(), kPackBlockBytes);
  H5Pset_small_data_block_size(fapl.get(), kPackBlockBytes);
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

namespace {

// HDF5 types of the v2 tables: the records' exact little-endian layouts (meta_v2.h), so the
// bytes written are the records as they are and h5dump / h5py print their fields.
Hid compound(size_t size, std::initializer_list<std::tuple<const char*, size_t, hid_t>> members) {
  Hid t(H5Tcreate(H5T_COMPOUND, size));
  for (const auto& [name, offset, type] : members) H5Tinsert(t.get(), name, offset, type);
  return t;
}

// The dtype code as an enumeration: h5dump prints "bf16" rather than 4.
Hid dtype_enum() {
  Hid t(H5Tenum_create(H5T_STD_U8LE));
  for (int d = 0; d <= static_cast<int>(DType::kBool); ++d) {
    const uint8_t code = v2::dtype_code(static_cast<DType>(d));
    H5Tenum_insert(t.get(), dtype_name(static_cast<DType>(d)), &code);
  }
  return t;
}

Hid table_type(v2::Table table) {
  using v2::AttributeRecord;
  using v2::ExtentRecord;
  using v2::RegionRecord;
  using v2::SavedCoordsRecord;
  using v2::TensorRecord;
  switch (table) {
    case v2::Table::kTensors: {
      Hid dtype = dtype_enum();
      return compound(sizeof(TensorRecord), {{"key_offset", offsetof(TensorRecord, key_offset), H5T_STD_U64LE},
                                             {"key_length", offsetof(TensorRecord, key_length), H5T_STD_U32LE},
                                             {"dtype", offsetof(TensorRecord, dtype), dtype.get()},
                                             {"ndim", offsetof(TensorRecord, ndim), H5T_STD_U8LE},
                                             {"reserved", offsetof(TensorRecord, reserved), H5T_STD_U16LE},
                                             {"shape_index", offsetof(TensorRecord, shape_index), H5T_STD_U64LE},
                                             {"nbytes", offsetof(TensorRecord, nbytes), H5T_STD_U64LE},
                                             {"file_offset", offsetof(TensorRecord, file_offset), H5T_STD_I64LE},
                                             {"first_region", offsetof(TensorRecord, first_region), H5T_STD_U64LE},
                                             {"region_count", offsetof(TensorRecord, region_count), H5T_STD_U64LE},
                                             {"first_block", offsetof(TensorRecord, first_block), H5T_STD_U64LE}});
    }
    case v2::Table::kRegions:
      return compound(sizeof(RegionRecord), {{"writer", offsetof(RegionRecord, writer), H5T_STD_U32LE},
                                             {"extent", offsetof(RegionRecord, extent), H5T_STD_U32LE}});
    case v2::Table::kExtents:
      return compound(sizeof(ExtentRecord), {{"box_index", offsetof(ExtentRecord, box_index), H5T_STD_U64LE},
                                             {"flat_begin", offsetof(ExtentRecord, flat_begin), H5T_STD_I64LE},
                                             {"flat_end", offsetof(ExtentRecord, flat_end), H5T_STD_I64LE},
                                             {"block_bytes", offsetof(ExtentRecord, block_bytes), H5T_STD_U64LE},
                                             {"ndim", offsetof(ExtentRecord, ndim), H5T_STD_U32LE},
                                             {"flat", offsetof(ExtentRecord, flat), H5T_STD_U32LE}});
    case v2::Table::kAttributes:
      return compound(sizeof(AttributeRecord),
                      {{"key_offset", offsetof(AttributeRecord, key_offset), H5T_STD_U64LE},
                       {"value_offset", offsetof(AttributeRecord, value_offset), H5T_STD_U64LE},
                       {"key_length", offsetof(AttributeRecord, key_length), H5T_STD_U32LE},
                       {"value_length", offsetof(AttributeRecord, value_length), H5T_STD_U32LE}});
    case v2::Table::kSavedCoords:
      return compound(sizeof(SavedCoordsRecord), {{"tp", offsetof(SavedCoordsRecord, tp), H5T_STD_I32LE},
                                                  {"dp", offsetof(SavedCoordsRecord, dp), H5T_STD_I32LE},
                                                  {"pp", offsetof(SavedCoordsRecord, pp), H5T_STD_I32LE}});
    case v2::Table::kBlocks: return Hid(H5Tcopy(H5T_STD_U64LE));
    case v2::Table::kCoords: return Hid(H5Tcopy(H5T_STD_I64LE));
    case v2::Table::kNames: return Hid(H5Tcopy(H5T_STD_U8LE));
  }
  return Hid();
}

}  // namespace

Result<std::array<int64_t, v2::kTableCount>> write_meta_group(const std::string& file, const v2::Encoded& index,
                                                              const std::string& library_version) {
  hdf5_quiet();
  std::array<int64_t, v2::kTableCount> offsets;
  offsets.fill(-1);
  Hid f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  if (!f.valid()) return h5_error("cannot reopen '" + file + "' to add /meta");
  Hid g(H5Gcreate2(f.get(), "/meta", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!g.valid()) return h5_error("cannot create /meta");
  H5CKPT_RETURN_IF_ERROR(write_string_attr(g.get(), "format", "h5ckpt"));
  H5CKPT_RETURN_IF_ERROR(write_int_attr(g.get(), "format_version", v2::kFormatVersion));
  H5CKPT_RETURN_IF_ERROR(write_string_attr(g.get(), "library_version", library_version));
  // Contiguous, allocated at creation: each table's bytes lie unchanged at one offset, which the
  // summary records and readers pread (no HDF5 needed to read the index).
  Hid dcpl(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);
  H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);
  for (size_t i = 0; i < v2::kTableCount; ++i) {
    const auto table = static_cast<v2::Table>(i);
    const std::string name = v2::table_name(table);
    Hid type = table_type(table);
    const hsize_t records = index.records[i];
    Hid space(H5Screate_simple(1, &records, nullptr));
    Hid ds(H5Dcreate2(g.get(), name.c_str(), type.get(), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
    if (!type.valid() || !ds.valid()) return h5_error("cannot create /meta/" + name);
    if (records == 0) continue;  // no storage, offset -1
    if (H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, index.tables[i].data()) < 0)
      return h5_error("cannot write /meta/" + name);
    const haddr_t off = H5Dget_offset(ds.get());
    if (off == HADDR_UNDEF) return h5_error("/meta/" + name + " has no contiguous storage");
    offsets[i] = static_cast<int64_t>(off);
  }
  g.reset();
  if (H5Fclose(f.release()) < 0) return h5_error("closing '" + file + "' after /meta failed");
  return offsets;
}

}  // namespace h5ckpt::storage
