#include "storage/direct_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "planner/box_math.h"

namespace h5ckpt::storage {

Result<DirectWriter> DirectWriter::open(const std::string& data_file) {
  DirectWriter w;
  w.path_ = data_file;
  w.fd_ = ::open(data_file.c_str(), O_WRONLY | O_CLOEXEC);
  if (w.fd_ < 0) return Status(ErrorCode::kIo, "cannot open '" + data_file + "' for writing: " + std::strerror(errno));
  return w;
}

DirectWriter::DirectWriter(DirectWriter&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }

DirectWriter::~DirectWriter() {
  if (fd_ >= 0) ::close(fd_);
}

Status DirectWriter::write(int64_t dataset_offset, const Shape& shape, DType dtype, const ShardSpec& shard,
                           const void* data) {
  const uint64_t es = dtype_size(dtype);
  const planner::Frame file{Box{Shape(shape.size(), 0), shape}, 0};
  const planner::Frame buf = planner::frame_of(shard);
  const char* src = static_cast<const char*>(data);
  Status st;
  for (const Box& b : planner::shard_boxes(shard)) {
    // Runs contiguous in both the buffer and the file: whole pieces for flat ranges and
    // dim-0 splits, one run per row for column splits.
    planner::for_each_run(b, buf, file, [&](int64_t bi, int64_t fi, int64_t n) {
      if (!st.ok()) return;
      const char* p = src + bi * es;
      uint64_t left = static_cast<uint64_t>(n) * es;
      off_t off = static_cast<off_t>(dataset_offset + fi * static_cast<int64_t>(es));
      while (left) {
        ssize_t w = ::pwrite(fd_, p, left, off);
        if (w < 0) {
          if (errno == EINTR) continue;
          st = Status(ErrorCode::kIo, "pwrite to '" + path_ + "' failed: " + std::strerror(errno));
          return;
        }
        p += w;
        off += w;
        left -= static_cast<uint64_t>(w);
      }
    });
  }
  return st;
}

Status DirectWriter::sync_and_close() {
  Status st;
  if (::fsync(fd_) != 0) st = Status(ErrorCode::kIo, "fsync of '" + path_ + "' failed: " + std::strerror(errno));
  if (::close(fd_) != 0 && st.ok()) st = Status(ErrorCode::kIo, "close of '" + path_ + "' failed: " + std::strerror(errno));
  fd_ = -1;
  return st;
}

}  // namespace h5ckpt::storage
