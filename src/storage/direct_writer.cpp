#include "storage/direct_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "h5ckpt/checkpoint_info.h"  // kDataFileName
#include "logging/log.h"
#include "planner/box_math.h"
#include "storage/posix_io.h"

namespace h5ckpt::storage {

namespace {

constexpr uint64_t kBlock = 4096;              // O_DIRECT alignment of offsets, lengths and memory
constexpr uint64_t kMinDirectRun = 256 << 10;  // shorter runs go through the page cache
constexpr uint64_t kBounceBytes = 8u << 20;

// Aligned bounce memory for sources that are not block-aligned, kept per thread across saves so
// its pages stay touched (first-touch faults on this kind of VM cost more than the copy).
char* bounce() {
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<char, Free> buf(static_cast<char*>(std::aligned_alloc(kBlock, kBounceBytes)));
  return buf.get();
}

}  // namespace

Status preallocate_file(const std::string& data_file, uint64_t bytes) {
  const int fd = io::open(data_file, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return io::error("open", data_file, errno);
  struct stat st {};
  Status result;
  if (io::fstat(fd, &st) != 0) {
    result = io::error("fstat", data_file, errno);
  } else if (bytes = std::max<uint64_t>(bytes, static_cast<uint64_t>(st.st_size)); bytes > 0) {
    int err = 0;
    while ((err = io::fallocate(fd, 0, static_cast<off_t>(bytes))) == EINTR) {
    }
    if (err == ENOSPC)
      result = Status(ErrorCode::kIo, io::error("fallocate", data_file, err).message() + " (the checkpoint needs " +
                                          std::to_string(bytes) + " bytes)");
    else if (err != 0 && err != EOPNOTSUPP && err != ENOSYS && err != EINVAL)
      result = io::error("fallocate", data_file, err);
  }
  io::close(fd);
  return result;
}

Status check_free_space(const std::string& dir, uint64_t bytes) {
  struct statvfs sv {};
  if (::statvfs(dir.c_str(), &sv) != 0 || sv.f_blocks == 0) return Status::Ok();
  const uint64_t available = static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
  if (available >= bytes) return Status::Ok();
  return Status(ErrorCode::kIo, "not enough space in '" + dir + "' for its " + kDataFileName +
                                    ": the checkpoint needs " + std::to_string(bytes) + " bytes, " +
                                    std::to_string(available) + " are available (" + std::strerror(ENOSPC) + ")");
}

Result<DirectWriter> DirectWriter::open(const std::string& data_file, bool direct_io) {
  DirectWriter w;
  w.path_ = data_file;
  w.fd_ = io::open(data_file, O_WRONLY | O_CLOEXEC);
  if (w.fd_ < 0) return io::error("open", data_file, errno);
  if (direct_io) w.direct_fd_ = io::open(data_file, O_WRONLY | O_CLOEXEC | O_DIRECT);  // -1: not supported
  return w;
}

DirectWriter::DirectWriter(DirectWriter&& o) noexcept
    : fd_(o.fd_),
      direct_fd_(o.direct_fd_),
      direct_bytes_(o.direct_bytes_),
      write_calls_(o.write_calls_),
      path_(std::move(o.path_)) {
  o.fd_ = -1;
  o.direct_fd_ = -1;
}

DirectWriter::~DirectWriter() {
  if (fd_ >= 0) io::close(fd_);
  if (direct_fd_ >= 0) io::close(direct_fd_);
}

Status DirectWriter::pwrite_all(int fd, const char* p, uint64_t left, uint64_t off) {
  while (left) {
    ssize_t w = io::pwrite(fd, p, std::min<uint64_t>(left, 1ull << 30), static_cast<off_t>(off));
    ++write_calls_;
    if (w < 0) {
      if (errno == EINTR) continue;
      return io::error("pwrite", path_, errno);
    }
    p += w;
    off += static_cast<uint64_t>(w);
    left -= static_cast<uint64_t>(w);
  }
  return Status::Ok();
}

// [off, off + len) is block-aligned; the memory is copied through the bounce buffer unless it
// is aligned too.
Status DirectWriter::write_direct(const char* p, uint64_t len, uint64_t off) {
  const bool aligned = reinterpret_cast<uintptr_t>(p) % kBlock == 0;
  char* b = aligned ? nullptr : bounce();
  if (!aligned && !b) return pwrite_all(fd_, p, len, off);
  while (len) {
    const uint64_t n = aligned ? std::min<uint64_t>(len, 1ull << 30) : std::min<uint64_t>(len, kBounceBytes);
    const char* src = p;
    if (!aligned) {
      std::memcpy(b, p, n);
      src = b;
    }
    ssize_t w = io::pwrite(direct_fd_, src, n, static_cast<off_t>(off));
    ++write_calls_;
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EINVAL) {  // the file system refuses O_DIRECT here: page cache from now on
      logging::log().debug("O_DIRECT write refused on '{}': using buffered writes", path_);
      io::close(direct_fd_);
      direct_fd_ = -1;
      return pwrite_all(fd_, p, len, off);
    }
    if (w < 0) return io::error("pwrite", path_, errno);
    const uint64_t done = static_cast<uint64_t>(w);
    direct_bytes_ += done;
    if (done < n) H5CKPT_RETURN_IF_ERROR(pwrite_all(fd_, p + done, n - done, off + done));  // short write
    p += n;
    off += n;
    len -= n;
  }
  return Status::Ok();
}

Status DirectWriter::write_run(const char* p, uint64_t len, uint64_t off) {
  if (direct_fd_ < 0 || len < kMinDirectRun) return pwrite_all(fd_, p, len, off);
  const uint64_t a0 = (off + kBlock - 1) / kBlock * kBlock, a1 = (off + len) / kBlock * kBlock;
  if (a1 <= a0) return pwrite_all(fd_, p, len, off);
  // Partial blocks at the ends share their block with neighbouring runs: page cache for them.
  H5CKPT_RETURN_IF_ERROR(pwrite_all(fd_, p, a0 - off, off));
  H5CKPT_RETURN_IF_ERROR(write_direct(p + (a0 - off), a1 - a0, a0));
  return pwrite_all(fd_, p + (a1 - off), off + len - a1, a1);
}

void for_each_file_run(int64_t dataset_offset, const Shape& shape, DType dtype, const ShardSpec& shard,
                       const std::function<void(uint64_t, uint64_t, uint64_t)>& fn) {
  const int64_t es = static_cast<int64_t>(dtype_size(dtype));
  const planner::Frame file{Box{Shape(shape.size(), 0), shape}, 0};
  const planner::Frame buf = planner::frame_of(shard);
  for (const Box& b : planner::shard_boxes(shard))
    planner::for_each_run(b, buf, file, [&](int64_t bi, int64_t fi, int64_t n) {
      fn(static_cast<uint64_t>(bi * es), static_cast<uint64_t>(dataset_offset + fi * es),
         static_cast<uint64_t>(n * es));
    });
}

Status DirectWriter::write(int64_t dataset_offset, const Shape& shape, DType dtype, const ShardSpec& shard,
                           const void* data) {
  const char* src = static_cast<const char*>(data);
  Status st;
  for_each_file_run(dataset_offset, shape, dtype, shard, [&](uint64_t at, uint64_t off, uint64_t len) {
    if (st.ok()) st = write_run(src + at, len, off);
  });
  return st;
}

Status DirectWriter::sync_and_close() {
  Status st;
  if (io::fsync(fd_) != 0) st = io::error("fsync", path_, errno);
  if (io::close(fd_) != 0 && st.ok()) st = io::error("close", path_, errno);
  fd_ = -1;
  if (direct_fd_ >= 0) io::close(direct_fd_);
  direct_fd_ = -1;
  return st;
}

}  // namespace h5ckpt::storage
