// The public data model (h5ckpt/checkpoint_info.h): reading and verifying a checkpoint's
// metadata and listing the checkpoints of a directory. No MPI.
#include "h5ckpt/checkpoint_info.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "storage/auth.h"
#include "storage/commit.h"
#include "storage/format.h"
#include "storage/region_reader.h"
#include "util/checked_math.h"  // to_string_spec

namespace h5ckpt {

namespace fs = std::filesystem;

Result<storage::OpenedCheckpoint> storage::open_checkpoint(const std::string& path) {
  H5CKPT_ASSIGN_OR_RETURN(std::string dir, resolve_checkpoint_dir(path));
  H5CKPT_ASSIGN_OR_RETURN(std::string json, read_whole_file((fs::path(dir) / kMetadataFileName).string()));
  const std::string data = (fs::path(dir) / kDataFileName).string();
  H5CKPT_ASSIGN_OR_RETURN(auto reader, RegionReader::open(data));
  H5CKPT_ASSIGN_OR_RETURN(CheckpointInfo info, read_metadata(json, reader));
  info.path = dir;
  info.data_file = fs::absolute(data).string();
  return OpenedCheckpoint{std::move(info), std::move(reader)};
}

Status set_auth_key_file(const std::string& path) { return storage::auth::configure(path); }

const TensorInfo* CheckpointInfo::find(const std::string& key) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), key,
                             [](const TensorInfo& t, const std::string& k) { return t.key < k; });
  return it != tensors.end() && it->key == key ? &*it : nullptr;
}

uint64_t CheckpointInfo::total_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors) n += t.nbytes;
  return n;
}

std::string region_to_string(const ShardSpec& shard) { return to_string_spec(shard); }

Result<CheckpointInfo> read_checkpoint_info(const std::string& path) {
  H5CKPT_ASSIGN_OR_RETURN(storage::OpenedCheckpoint opened, storage::open_checkpoint(path));
  return std::move(opened.info);
}

Status verify_checkpoint(const CheckpointInfo& info, int part, int nparts) {
  H5CKPT_ASSIGN_OR_RETURN(auto reader, storage::RegionReader::open(info.data_file));
  std::vector<char> buf;
  int64_t index = 0;
  for (const auto& t : info.tensors) {
    for (size_t r = 0; r < t.regions.size(); ++r, ++index) {
      const SavedRegion& reg = t.regions[r];
      // Regions saved without checksums are skipped; a block size without its blocks is not.
      if (index % nparts != part || (reg.checksum == 0 && reg.block_bytes == 0 && reg.block_checksums.empty()))
        continue;
      buf.resize(static_cast<size_t>(reg.shard.numel()) * dtype_size(t.dtype));
      // The read checks the region's verification blocks (format v1: its whole-region sum).
      H5CKPT_RETURN_IF_ERROR(reader.read_region(t, r, buf.data()));
      if (reg.checksum != 0 && storage::checksum_bytes(buf.data(), buf.size()) != reg.checksum)
        return Status(ErrorCode::kCorrupt, "checksum mismatch in tensor '" + t.key + "' region " + std::to_string(r) +
                                               " (" + to_string_spec(reg.shard) + ", written by rank " +
                                               std::to_string(reg.writer_rank) + ")");
    }
  }
  return Status::Ok();
}

bool is_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  return fs::exists(fs::path(path) / kMetadataFileName, ec) || fs::exists(fs::path(path) / kDataFileName, ec) ||
         storage::is_temp_name(path) || storage::has_checkpoint_marker(path);
}

Result<CheckpointListing> list_checkpoints(const std::string& root) {
  CheckpointListing out;
  std::error_code ec;
  const fs::path latest_file = fs::path(root) / kLatestFileName;
  if (fs::exists(latest_file, ec)) {
    // An unreadable pointer leaves `latest` empty: the checkpoints are still worth listing.
    if (auto text = storage::read_whole_file(latest_file.string()); text.ok()) {
      out.latest = *text;
      while (!out.latest.empty() && std::isspace(static_cast<unsigned char>(out.latest.back()))) out.latest.pop_back();
    }
  }
  // Iterated with error codes: the library never throws.
  fs::directory_iterator it(root, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code entry_ec;
    if (!it->is_directory(entry_ec) || !is_checkpoint_dir(it->path().string())) continue;
    CheckpointDirEntry e;
    e.name = it->path().filename().string();
    e.path = it->path().string();
    e.in_progress = storage::is_temp_name(e.name);
    e.latest = !out.latest.empty() && e.name == out.latest;
    out.checkpoints.push_back(std::move(e));
  }
  if (ec) return Status(ErrorCode::kIo, "cannot list '" + root + "': " + ec.message());
  return out;
}

}  // namespace h5ckpt
