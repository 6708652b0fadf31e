#include "storage/local_files.h"

#include <fcntl.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "logging/log.h"
#include "storage/posix_io.h"
#include "storage/verify_blocks.h"

namespace h5ckpt::storage {

namespace fs = std::filesystem;

uint64_t local_block_bytes() { return kVerifyBlockTarget; }

uint64_t local_file_identity(const std::string& name, int rank) {
  const std::string id = std::string("h5ckpt-local") + '\0' + name + '\0' + local_rank_file(rank);
  return XXH3_64bits(id.data(), id.size());
}

Status write_all(int fd, const char* data, uint64_t n, uint64_t off, const std::string& path) {
  while (n) {
    const ssize_t w = io::pwrite(fd, data, std::min<uint64_t>(n, 1ull << 30), static_cast<off_t>(off));
    if (w < 0) return io::error("pwrite", path, errno);
    if (w == 0) return io::error("pwrite", path, EIO);
    data += w, n -= static_cast<uint64_t>(w), off += static_cast<uint64_t>(w);
  }
  return Status::Ok();
}

Status read_all(int fd, char* data, uint64_t n, uint64_t off, const std::string& path) {
  while (n) {
    const ssize_t r = io::pread(fd, data, std::min<uint64_t>(n, 1ull << 30), static_cast<off_t>(off));
    if (r < 0) return io::error("pread", path, errno);
    if (r == 0) return Status(ErrorCode::kCorrupt, "'" + path + "' is shorter than its manifest says");
    data += r, n -= static_cast<uint64_t>(r), off += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

Status sync_close(int fd, const std::string& path) {
  Status st;
  if (io::fsync(fd) != 0) st = io::error("fsync", path, errno);
  io::close(fd);
  return st;
}

// Local files' blocks are hashed with unkeyed xxh3 whether or not a key is configured (format
// §11): they never leave the job's nodes, and a job restarted with another key (or none) must
// still read them rather than take every block for damaged.
struct LocalFileHasher::State {
  explicit State(uint64_t id) : identity(id) {}
  uint64_t identity;
  XXH3_state_t* xxh = XXH3_createState();
  uint64_t in_block = 0;
  std::vector<uint64_t> sums;
  void start() {
    XXH3_64bits_reset_withSeed(xxh, block_seed(identity, sums.size()));
    in_block = 0;
  }
};

LocalFileHasher::LocalFileHasher(const std::string& name, int rank, uint64_t bytes)
    : bytes_(bytes), state_(new State(local_file_identity(name, rank))) {
  state_->start();
}

LocalFileHasher::~LocalFileHasher() {
  XXH3_freeState(state_->xxh);
  delete state_;
}

void LocalFileHasher::update(const char* data, uint64_t n) {
  const uint64_t block = local_block_bytes();
  while (n) {
    const uint64_t k = std::min(n, block - state_->in_block);
    XXH3_64bits_update(state_->xxh, data, k);
    data += k, n -= k, state_->in_block += k;
    if (state_->in_block == block) {
      state_->sums.push_back(XXH3_64bits_digest(state_->xxh));
      state_->start();
    }
  }
}

LocalRankFile LocalFileHasher::finish() {
  if (state_->in_block > 0) {
    state_->sums.push_back(XXH3_64bits_digest(state_->xxh));
    state_->start();
  }
  LocalRankFile f;
  f.bytes = bytes_;
  f.block_bytes = local_block_bytes();
  f.blocks = std::move(state_->sums);
  state_->sums.clear();
  return f;
}

LocalFileReader::LocalFileReader(std::string dir, const LocalManifest& manifest, char* cache, uint64_t cache_bytes)
    : dir_(std::move(dir)), manifest_(manifest), cache_(cache), cache_bytes_(cache ? cache_bytes : 0) {}

LocalFileReader::~LocalFileReader() {
  for (auto& [w, f] : files_)
    if (f.fd >= 0) io::close(f.fd);
}

Result<LocalFileReader::File*> LocalFileReader::open(int writer) {
  auto it = files_.find(writer);
  if (it != files_.end()) return &it->second;
  if (writer < 0 || static_cast<size_t>(writer) >= manifest_.files.size())
    return Status(ErrorCode::kInternal, "no saved rank " + std::to_string(writer) + " in the local manifest");
  File f;
  f.path = (fs::path(dir_) / local_rank_file(writer)).string();
  f.fd = io::open(f.path, O_RDONLY);
  if (f.fd < 0) return io::error("open", f.path, errno);
  const LocalRankFile& rf = manifest_.files[static_cast<size_t>(writer)];
  f.checked.assign(rf.block_bytes ? rf.blocks.size() : 0, false);
  return &files_.emplace(writer, std::move(f)).first->second;
}

// Reads block `block` of the file whole (into the cache when it fits, else through it in pieces)
// and compares its checksum with the manifest's.
Status LocalFileReader::check_block(int writer, File& f, uint64_t block) {
  const LocalRankFile& rf = manifest_.files[static_cast<size_t>(writer)];
  const uint64_t start = block * rf.block_bytes, len = std::min(rf.block_bytes, rf.bytes - start);
  const uint64_t seed = block_seed(local_file_identity(manifest_.name, writer), block);
  uint64_t sum = 0;
  cached_writer_ = -1;
  if (len <= cache_bytes_) {
    H5CKPT_RETURN_IF_ERROR(read_all(f.fd, cache_, len, start, f.path));
    sum = XXH3_64bits_withSeed(cache_, len, seed);
    cached_writer_ = writer, cached_block_ = block;
  } else {  // a budget smaller than a block: stream it through the cache to check it
    if (cache_bytes_ == 0) return Status(ErrorCode::kInternal, "local file reader without a cache");
    XXH3_state_t* h = XXH3_createState();
    XXH3_64bits_reset_withSeed(h, seed);
    Status st;
    for (uint64_t at = 0; at < len && st.ok(); at += cache_bytes_) {
      const uint64_t n = std::min(cache_bytes_, len - at);
      st = read_all(f.fd, cache_, n, start + at, f.path);
      if (st.ok()) XXH3_64bits_update(h, cache_, n);
    }
    sum = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    H5CKPT_RETURN_IF_ERROR(st);
  }
  bytes_read_ += len;
  if (sum != rf.blocks[block]) {
    if (std::find(corrupt_.begin(), corrupt_.end(), writer) == corrupt_.end()) corrupt_.push_back(writer);
    cached_writer_ = -1;
    return Status(ErrorCode::kCorrupt, "'" + f.path + "' (saved rank " + std::to_string(writer) +
                                           ") fails the check of block " + std::to_string(block) + " (bytes " +
                                           std::to_string(start) + ".." + std::to_string(start + len) + ")");
  }
  f.checked[block] = true;
  return Status::Ok();
}

Status LocalFileReader::read(int writer, char* to, uint64_t n, uint64_t offset) {
  H5CKPT_ASSIGN_OR_RETURN(File * f, open(writer));
  const LocalRankFile& rf = manifest_.files[static_cast<size_t>(writer)];
  if (offset > rf.bytes || n > rf.bytes - offset)
    return Status(ErrorCode::kInternal, "a read beyond '" + f->path + "' (" + std::to_string(rf.bytes) + " bytes)");
  if (rf.block_bytes == 0) {  // an older manifest: the file was checked whole at resolve
    bytes_read_ += n;
    return read_all(f->fd, to, n, offset, f->path);
  }
  while (n) {
    const uint64_t block = offset / rf.block_bytes, start = block * rf.block_bytes;
    const uint64_t k = std::min(n, std::min(rf.block_bytes, rf.bytes - start) - (offset - start));
    if (!(cached_writer_ == writer && cached_block_ == block) && !f->checked[block])
      H5CKPT_RETURN_IF_ERROR(check_block(writer, *f, block));
    if (cached_writer_ == writer && cached_block_ == block) {
      std::memcpy(to, cache_ + (offset - start), k);
    } else {  // checked earlier (or streamed): the part asked for, most likely from the page cache
      H5CKPT_RETURN_IF_ERROR(read_all(f->fd, to, k, offset, f->path));
      bytes_read_ += k;
    }
    to += k, offset += k, n -= k;
  }
  return Status::Ok();
}

Status quarantine_local_file(const std::string& dir, int rank) {
  const std::string f = (fs::path(dir) / local_rank_file(rank)).string();
  if (io::rename(f, f + ".corrupt") != 0) return io::error("rename", f + "' to '" + f + ".corrupt", errno);
  logging::log().warn("local checkpoint file '{}' failed its check: moved aside to '{}.corrupt'", f, f);
  return Status::Ok();
}

}  // namespace h5ckpt::storage
