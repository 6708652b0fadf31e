#include "storage/checkpoint_commit.h"

#include <filesystem>
#include <mutex>

#include "storage/commit.h"
#include "storage/h5_writer.h"
#include "storage/hdf5_util.h"
#include "storage/meta_v2.h"
#include "storage/format.h"
#include "storage/region_reader.h"

namespace h5ckpt::storage {

namespace fs = std::filesystem;

namespace {

// Everything of the metadata but the tensors.
CheckpointInfo assemble_header(const SavedCheckpoint& saved) {
  CheckpointInfo info;
  info.format_version = kFormatVersion;
  info.library_version = H5CKPT_VERSION;
  info.step = saved.step;
  info.saved_sizes = saved.sizes;
  info.saved_coords = saved.coords;
  info.attributes = saved.attributes;
  return info;
}

}  // namespace

CheckpointInfo assemble_info(const SavedCheckpoint& saved) {
  CheckpointInfo info = assemble_header(saved);
  const auto& tensors = *saved.tensors;
  for (size_t t = 0; t < tensors.size(); ++t) {
    TensorInfo ti;
    ti.key = tensors[t].key;
    ti.dtype = tensors[t].dtype;
    ti.shape = tensors[t].shape;
    ti.nbytes = tensors[t].nbytes();
    ti.file_offset = saved.offsets[t];
    for (size_t r = 0; r < tensors[t].regions.size(); ++r) {
      SavedRegion region{tensors[t].shard(r), tensors[t].regions[r].writer, 0, 0, {}};
      if (t < saved.blocks.size() && r < saved.blocks[t].size()) {
        region.block_bytes = saved.blocks[t][r].block_bytes;
        region.block_checksums = saved.blocks[t][r].sums;
      }
      ti.regions.push_back(std::move(region));
    }
    info.tensors.push_back(std::move(ti));
  }
  return info;
}

namespace {

// The save's plan, offsets and block sums as the encoder reads them: in place, where
// assemble_info would copy every region's box and sums (1.45 million regions at 405B).
class PlanTensors final : public v2::TensorSource {
 public:
  explicit PlanTensors(const SavedCheckpoint& saved) : saved_(saved) {}
  size_t size() const override { return saved_.tensors->size(); }
  Tensor tensor(size_t t) const override {
    const planner::TensorPlan& p = (*saved_.tensors)[t];
    return {p.key, p.dtype, &p.shape, p.nbytes(), saved_.offsets[t], p.regions.size()};
  }
  Region region(size_t t, size_t r) const override {
    const planner::TensorPlan& p = (*saved_.tensors)[t];
    const planner::PlannedRegion& x = p.regions[r];
    Region out;
    out.box = &p.boxes[x.box];
    if (x.flat) out.flat = std::pair{x.begin, x.end};
    out.writer = x.writer;
    if (t < saved_.blocks.size() && r < saved_.blocks[t].size()) {
      const SavedCheckpoint::Blocks& b = saved_.blocks[t][r];
      out.block_bytes = b.block_bytes;
      out.sums = b.sums.data();
      out.sum_count = b.sums.size();
    }
    return out;
  }

 private:
  const SavedCheckpoint& saved_;
};

}  // namespace

Result<v2::Encoded> encode_saved(const SavedCheckpoint& saved) {
  CheckpointInfo header = assemble_header(saved);
  return v2::encode(header, PlanTensors(saved));
}

namespace {

// The tables of the index as written: each must read back, byte for byte, at the offset the
// summary records, since readers pread them there without HDF5.
Status check_tables_read_back(const std::string& data_file, const v2::Encoded& index, const std::string& summary) {
  H5CKPT_ASSIGN_OR_RETURN(v2::Summary parsed, v2::parse_summary(summary));
  H5CKPT_ASSIGN_OR_RETURN(RegionReader reader, RegionReader::open(data_file));
  H5CKPT_ASSIGN_OR_RETURN(std::vector<char> image, v2::read_image(parsed, reader));
  if (image != index.image())
    return Status(ErrorCode::kInternal,
                  "the index tables in '" + data_file + "' do not read back at the offsets HDF5 reported for them");
  return Status::Ok();
}

}  // namespace

Status commit_checkpoint(const std::string& temp, const std::string& final_dir, const SavedCheckpoint& saved,
                         bool overwrite, bool point_latest) {
  const std::string data_file = (fs::path(temp) / kDataFileName).string();
  Result<v2::Encoded> index = encode_saved(saved);
  Status st = index.status();
  std::string summary;
  if (st.ok()) {
    auto offsets = [&] {
      std::lock_guard<std::mutex> lock(hdf5_lock());
      return write_meta_group(data_file, *index, H5CKPT_VERSION);
    }();
    st = offsets.status();
    // The file is closed: the offsets are final, and the summary that points at them can be made.
    if (st.ok()) summary = index->summary_json(*offsets);
  }
  if (st.ok()) st = check_tables_read_back(data_file, *index, summary);
  if (st.ok()) st = fsync_path(data_file);
  if (st.ok()) st = write_file_atomic((fs::path(temp) / kMetadataFileName).string(), summary);
  if (st.ok()) st = fsync_path(temp);
  if (st.ok()) st = publish_dir(temp, final_dir, overwrite);
  if (!st.ok()) {
    (void)remove_tree(temp);
    return st;
  }
  // Committed: a failed pointer update must not read as a failed save.
  if (point_latest) {
    st = update_latest(final_dir);
    if (!st.ok()) return st.with_context("checkpoint '" + final_dir + "' is committed, but updating 'latest' failed");
  }
  return Status::Ok();
}

}  // namespace h5ckpt::storage
