#include "storage/region_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>

#include <xxhash.h>

#include "storage/fs_traits.h"
#include "storage/posix_io.h"
#include "storage/verify_blocks.h"
#include "util/checked_math.h"
#include "util/dtype_convert.h"

namespace h5ckpt::storage {

namespace {
constexpr uint64_t kBounceBytes = 8u << 20;  // span read at once when runs are close together
// Reading through a gap costs its bytes; a separate pread costs a syscall (~a few KiB of
// bandwidth). So small gaps are read through, and large gaps only when the runs are tiny.
constexpr uint64_t kSmallGapBytes = 1u << 10;
constexpr uint64_t kTinyRunBytes = 512;
constexpr uint64_t kMaxGapForTinyRuns = 64u << 10;
// On a network file system every read that misses the client's cache waits for a round trip,
// and read-ahead does not follow strided reads, while the client fetches whole pages: gaps within
// a page cost no bytes from the server. 2 KiB runs 2 KiB apart (a TP2 column shard's rows) on
// GlusterFS here: 128 MiB in 1.7-2.6 s run by run, 0.6-2.0 s through the gaps. Wider gaps read
// through (8 KiB runs, 8 KiB apart: 1.4-2.1 s against 0.8-1.0 s for one reader) made no
// measurable difference to a 4-rank load with two readers each, and fetch more bytes.
constexpr uint64_t kNetworkGapBytes = (4u << 10) - 1;  // less than a page
// Whole verification blocks read, checked and copied out at once: cache-sized, so the checksum
// and the copy see the bytes while they are still in cache.
constexpr uint64_t kVerifyChunkBytes = 4u << 20;
// A chunk read in place with deferred checks is read at once up to this size.
constexpr uint64_t kInPlaceReadBytes = 64u << 20;

uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}
}  // namespace

// Landing buffers for chunks checked by a pool job: a job takes one while it holds the chunk's
// bytes and gives it back when copied out, so at most one per queued job exists.
struct RegionReader::Spares {
  std::mutex mu;
  std::vector<std::vector<char>> free;
  std::vector<char> take(size_t n) {
    std::vector<char> b;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!free.empty()) {
        b = std::move(free.back());
        free.pop_back();
      }
    }
    if (b.size() < n) b.resize(n);  // never shrunk: a reused buffer is not cleared again
    return b;
  }
  void give(std::vector<char> b) {
    std::lock_guard<std::mutex> lock(mu);
    free.push_back(std::move(b));
  }
};

Result<RegionReader> RegionReader::open(const std::string& data_file) {
  RegionReader r;
  r.path_ = data_file;
  // O_NONBLOCK: a FIFO or device planted as the data file must not block the open (a reader of
  // a regular file is unaffected by the flag); anything but a regular file is refused.
  r.fd_ = io::open(data_file, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (r.fd_ < 0) {
    int err = errno;
    return io::error("open", data_file, err, err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo);
  }
  struct stat st {};
  if (io::fstat(r.fd_, &st) != 0) return io::error("fstat", data_file, errno);
  if (!S_ISREG(st.st_mode)) return Status(ErrorCode::kCorrupt, "'" + data_file + "' is not a regular file");
  r.size_ = static_cast<uint64_t>(st.st_size);
  // identity(): which file this is, and when it was last written or had its inode changed.
  const int64_t stamp[] = {static_cast<int64_t>(st.st_dev),          static_cast<int64_t>(st.st_ino),
                           static_cast<int64_t>(st.st_size),         static_cast<int64_t>(st.st_mtim.tv_sec),
                           static_cast<int64_t>(st.st_mtim.tv_nsec), static_cast<int64_t>(st.st_ctim.tv_sec),
                           static_cast<int64_t>(st.st_ctim.tv_nsec)};
  r.identity_ = XXH3_64bits(stamp, sizeof stamp);
  r.network_ = network_file_system(data_file);
  return r;
}

bool RegionReader::holds(uint64_t bytes) {
  if (size_ >= bytes || !names_cached_per_client(path_)) return size_ >= bytes;
  for (int waited_ms = 0; size_ < bytes && waited_ms < kClientCacheWaitMs; waited_ms += kClientCacheStepMs) {
    ::usleep(kClientCacheStepMs * 1000);
    struct stat st {};
    if (io::fstat(fd_, &st) != 0) break;
    size_ = static_cast<uint64_t>(st.st_size);
  }
  return size_ >= bytes;
}

RegionReader::RegionReader(RegionReader&& o) noexcept
    : fd_(o.fd_),
      verify_(o.verify_),
      network_(o.network_),
      widened_bytes_(o.widened_bytes_),
      verify_buf_(std::move(o.verify_buf_)),
      sink_(std::move(o.sink_)),
      check_ns_(o.check_ns_),
      io_ns_(o.io_ns_),
      copy_ns_(o.copy_ns_),
      spares_(std::move(o.spares_)),
      size_(o.size_),
      identity_(o.identity_),
      bytes_read_(o.bytes_read_),
      path_(std::move(o.path_)),
      bounce_(std::move(o.bounce_)),
      lookup_(o.lookup_) {
  o.fd_ = -1;
}

RegionReader::~RegionReader() {
  if (fd_ >= 0) io::close(fd_);
}

Status RegionReader::pread_exact(void* buf, uint64_t len, uint64_t off) {
  if (off + len < off || !holds(off + len))
    return Status(ErrorCode::kCorrupt, "read of bytes [" + std::to_string(off) + ", " + std::to_string(off + len) +
                                           ") past the end of '" + path_ + "' (" + std::to_string(size_) +
                                           " bytes): truncated file");
  auto* p = static_cast<char*>(buf);
  uint64_t done = 0;
  const uint64_t t0 = now_ns();
  while (done < len) {
    ssize_t n = io::pread(fd_, p + done, len - done, static_cast<off_t>(off + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return io::error("pread", path_, errno);
    }
    if (n == 0) return Status(ErrorCode::kCorrupt, "unexpected end of '" + path_ + "' (truncated file)");
    done += static_cast<uint64_t>(n);
  }
  io_ns_ += now_ns() - t0;
  bytes_read_ += len;
  return Status::Ok();
}

Status RegionReader::read(const TensorInfo& t, const Box& region, const planner::Frame& frame, DType dst_type,
                          void* dst) {
  delivered_ = 0;
  bool checked = false;
  if (verify_ && t.file_offset >= 0)
    for (const SavedRegion& r : t.regions) checked = checked || region_blocks(t, r).verified;
  H5CKPT_RETURN_IF_ERROR(checked ? read_checked(t, region, frame, dst_type, dst)
                                 : read_plain(t, region, frame, dst_type, dst));
  // Every wanted element must have come from the file: a read that delivered less (an index
  // whose regions do not cover the box, an empty span from a lying size) is corrupt, never zeros.
  const int64_t wanted = region.volume();
  if (delivered_ != wanted)
    return Status(ErrorCode::kCorrupt, "tensor '" + t.key + "': a read of " + to_string_shape(region.offset) + "+" +
                                           to_string_shape(region.shape) + " delivered " + std::to_string(delivered_) +
                                           " of " + std::to_string(wanted) + " elements from '" + path_ +
                                           "' (the index does not describe the data)");
  return Status::Ok();
}

Status RegionReader::read_checked(const TensorInfo& t, const Box& want, const planner::Frame& frame, DType dst_type,
                                  void* dst) {
  if (t.dtype != dst_type && !(dtype_is_float(t.dtype) && dtype_is_float(dst_type)))
    return Status(ErrorCode::kDtypeMismatch,
                  std::string("cannot convert ") + dtype_name(t.dtype) + " to " + dtype_name(dst_type));
  H5CKPT_ASSIGN_OR_RETURN(std::vector<CheckedSpan> spans, checked_spans(t, want, lookup_ ? lookup_->of(t) : nullptr));
  const uint64_t es = dtype_size(t.dtype);
  for (const CheckedSpan& span : spans) {
    if (!span.verified) {  // saved without checksums: read just the wanted part
      for (const Box& piece : span_boxes(t, span))
        if (auto p = planner::intersect(piece, want)) H5CKPT_RETURN_IF_ERROR(read_plain(t, *p, frame, dst_type, dst));
      continue;
    }
    widened_bytes_ += span.widened;
    // Through a cache-sized buffer, whole blocks at a time: read, check, copy out. A chunk that
    // lands in place with its checks deferred is read in one larger pread (as an unverified load
    // reads: small preads cost read speed, not just syscalls) and checked in cache-sized parts.
    const RegionBlocks rb = region_blocks(t, t.regions[span.region]);
    const int64_t be = static_cast<int64_t>(rb.block_bytes / es);
    const int64_t step = std::max<int64_t>(1, static_cast<int64_t>(kVerifyChunkBytes / rb.block_bytes)) * be;
    const bool deferred = sink_.pool != nullptr;
    const int64_t big_step =
        deferred ? std::max<int64_t>(1, static_cast<int64_t>(kInPlaceReadBytes / rb.block_bytes)) * be : step;
    // When the whole chunk is wanted and is a plain shift of `dst` in the stored dtype (a load in
    // the saving layout), it is read in place and checked there: no extra copy. *shift: where.
    auto lands_in_place = [&](const std::vector<Box>& pieces, const planner::Frame& f, int64_t* shift) {
      bool in_place = t.dtype == dst_type;
      bool first = true;
      for (const Box& piece : pieces) {
        if (!in_place) break;
        const auto p = planner::intersect(piece, want);
        if (!p || p->shape != piece.shape) return false;
        planner::for_each_run(piece, f, frame, [&](int64_t si, int64_t di, int64_t) {
          if (first) *shift = di - si;
          in_place = in_place && di - si == *shift;
          first = false;
        });
      }
      return in_place && !first && *shift >= 0;
    };
    for (int64_t c0 = span.begin; c0 < span.end;) {
      CheckedSpan chunk{span.region, c0, std::min(span.end, c0 + big_step), true, 0};
      planner::Frame f = span_frame(t, chunk);
      std::vector<Box> pieces = span_boxes(t, chunk);
      int64_t shift = 0;
      bool in_place = lands_in_place(pieces, f, &shift);
      if (!in_place && chunk.end - chunk.begin > step) {  // through a landing buffer: cache-sized
        chunk.end = std::min(span.end, c0 + step);
        f = span_frame(t, chunk);
        pieces = span_boxes(t, chunk);
        in_place = lands_in_place(pieces, f, &shift);
      }
      c0 = chunk.end;
      const size_t chunk_bytes = static_cast<size_t>(chunk.end - chunk.begin) * es;
      std::shared_ptr<std::vector<char>> held;  // a deferred check's own landing buffer
      char* land = nullptr;
      if (in_place) {
        land = static_cast<char*>(dst) + shift * es;
      } else if (deferred) {
        if (!spares_) spares_ = std::make_shared<Spares>();
        held = std::make_shared<std::vector<char>>(spares_->take(chunk_bytes));
        land = held->data();
      } else {
        verify_buf_.resize(chunk_bytes);
        land = verify_buf_.data();
      }
      // The gaps between this region's rows are other regions' columns; when the wanted box
      // reaches into them, those regions' spans read them, so they are not read through here.
      const Box& rbox = t.regions[span.region].shard.box;
      bool exact = false;
      for (size_t d = 1; d < rbox.shape.size(); ++d)
        exact =
            exact || want.offset[d] < rbox.offset[d] || want.offset[d] + want.shape[d] > rbox.offset[d] + rbox.shape[d];
      const int64_t before = delivered_;  // landing reads fill the chunk, not the destination
      for (const Box& piece : pieces) H5CKPT_RETURN_IF_ERROR(read_plain(t, piece, f, t.dtype, land, exact));
      delivered_ = before;
      for (const Box& piece : pieces)
        if (const auto p = planner::intersect(piece, want)) delivered_ += p->volume();
      if (deferred) {  // checked (and copied out) by pool jobs while the next chunk is read
        const TensorInfo* tensor = &t;
        std::atomic<uint64_t>* busy = sink_.busy_ns;
        std::shared_ptr<Spares> spares = spares_;
        for (int64_t p0 = chunk.begin; p0 < chunk.end; p0 += step) {  // one job per cache-sized part
          const CheckedSpan part{chunk.region, p0, std::min(chunk.end, p0 + step), true, 0};
          const char* bytes = land + (p0 - chunk.begin) * static_cast<int64_t>(es);
          sink_.pool->submit(
              sink_.group,
              [=]() mutable {
                const uint64_t t0 = now_ns();
                Status st = check_span(*tensor, part, bytes);
                if (st.ok() && held) copy_span_out(*tensor, part, bytes, want, frame, dst_type, dst);
                if (held) spares->give(std::move(*held));
                if (busy) *busy += now_ns() - t0;
                return st;
              },
              /*holds_buffer=*/held != nullptr);  // in place: the next read need not wait for it
        }
        continue;
      }
      const uint64_t t0 = now_ns();
      Status checked = check_span(t, chunk, land);
      if (checked.ok() && !in_place) copy_span_out(t, chunk, land, want, frame, dst_type, dst);
      check_ns_ += now_ns() - t0;
      H5CKPT_RETURN_IF_ERROR(checked);
    }
  }
  return Status::Ok();
}

Status RegionReader::read_plain(const TensorInfo& t, const Box& region, const planner::Frame& frame, DType dst_type,
                                void* dst, bool exact) {
  const uint64_t es = dtype_size(t.dtype), ds = dtype_size(dst_type);
  const bool convert = t.dtype != dst_type;
  if (convert && !(dtype_is_float(t.dtype) && dtype_is_float(dst_type)))
    return Status(ErrorCode::kDtypeMismatch,
                  std::string("cannot convert ") + dtype_name(t.dtype) + " to " + dtype_name(dst_type));
  if (t.file_offset < 0) return Status::Ok();  // empty tensor
  const planner::Frame src{Box{Shape(t.shape.size(), 0), t.shape}, 0};
  auto* out = static_cast<char*>(dst);
  if (bounce_.empty()) bounce_.resize(kBounceBytes);

  // Runs are batched into one span read when they lie close together in the file.
  struct Run {
    uint64_t file_off;
    int64_t dst_idx;
    int64_t count;
  };
  std::vector<Run> group;
  uint64_t group_start = 0, group_end = 0;
  Status st;
  auto emit = [&](const Run& r, const char* src_bytes) {
    char* d = out + r.dst_idx * ds;
    if (!convert) std::memcpy(d, src_bytes, r.count * es);
    else detail::convert_elements(src_bytes, t.dtype, d, dst_type, r.count);
  };
  // A bounce buffer's runs into the destination, timed as one copy (copy_s).
  auto emit_all = [&](const char* base) {
    const uint64_t t0 = now_ns();
    for (const Run& r : group) emit(r, base + (r.file_off - group_start));
    copy_ns_ += now_ns() - t0;
  };
  auto flush = [&]() -> Status {
    if (group.empty()) return Status::Ok();
    if (group.size() == 1) {
      const Run& r = group[0];
      if (!convert) {
        H5CKPT_RETURN_IF_ERROR(pread_exact(out + r.dst_idx * ds, r.count * es, r.file_off));
      } else {  // long run with conversion: through the bounce buffer in pieces
        const int64_t per = static_cast<int64_t>(kBounceBytes / es);
        for (int64_t done = 0; done < r.count; done += per) {
          const int64_t n = std::min(per, r.count - done);
          H5CKPT_RETURN_IF_ERROR(pread_exact(bounce_.data(), n * es, r.file_off + done * es));
          const uint64_t t0 = now_ns();
          emit(Run{0, r.dst_idx + done, n}, bounce_.data());
          copy_ns_ += now_ns() - t0;
        }
      }
    } else {
      H5CKPT_RETURN_IF_ERROR(pread_exact(bounce_.data(), group_end - group_start, group_start));
      emit_all(bounce_.data());
    }
    group.clear();
    return Status::Ok();
  };
  planner::for_each_run(region, src, frame, [&](int64_t si, int64_t di, int64_t n) {
    if (!st.ok()) return;
    delivered_ += n;
    const Run r{static_cast<uint64_t>(t.file_offset) + static_cast<uint64_t>(si) * es, di, n};
    const uint64_t end = r.file_off + static_cast<uint64_t>(n) * es;
    const uint64_t run_bytes = static_cast<uint64_t>(n) * es;
    const uint64_t max_gap = exact                        ? 0
                             : run_bytes <= kTinyRunBytes ? kMaxGapForTinyRuns
                             : network_                   ? kNetworkGapBytes
                                                          : kSmallGapBytes;
    const bool fits = !group.empty() && end - group_start <= kBounceBytes && r.file_off >= group_end &&
                      r.file_off - group_end <= max_gap;
    if (!fits) {
      st = flush();
      group_start = r.file_off;
    }
    group.push_back(r);
    group_end = end;
  });
  H5CKPT_RETURN_IF_ERROR(st);
  return flush();
}

Status RegionReader::read_region(const TensorInfo& t, size_t index, void* dst) {
  if (index >= t.regions.size())
    return Status(ErrorCode::kInvalidArgument, "tensor '" + t.key + "' has no region " + std::to_string(index));
  delivered_ = 0;
  const SavedRegion& reg = t.regions[index];
  const int64_t n = reg.shard.numel();
  const uint64_t es = dtype_size(t.dtype);
  const RegionBlocks rb = region_blocks(t, reg);
  const bool checked = verify_ && rb.verified;
  // The region's own stream, whole blocks at a time: no other region's bytes are looked at, so
  // verifying every region of a tensor is linear in its regions.
  const int64_t be = checked ? static_cast<int64_t>(rb.block_bytes / es) : n;
  if (checked && !blocks_fit(t, reg, rb))
    return Status(ErrorCode::kCorrupt, "verification blocks of tensor '" + t.key + "' region " + std::to_string(index) +
                                           " do not fit the region");
  const int64_t step = checked ? std::max<int64_t>(1, static_cast<int64_t>(kVerifyChunkBytes / rb.block_bytes)) * be
                               : std::max<int64_t>(n, 1);
  for (int64_t c0 = 0; c0 < n; c0 += step) {
    const CheckedSpan chunk{index, c0, std::min(n, c0 + step), checked, 0};
    const planner::Frame f = span_frame(t, chunk);
    char* land = static_cast<char*>(dst) + c0 * static_cast<int64_t>(es);
    for (const Box& piece : span_boxes(t, chunk)) H5CKPT_RETURN_IF_ERROR(read_plain(t, piece, f, t.dtype, land));
    H5CKPT_RETURN_IF_ERROR(check_span(t, chunk, land));
  }
  if (delivered_ != n)
    return Status(ErrorCode::kCorrupt, "tensor '" + t.key + "' region " + std::to_string(index) +
                                           ": the read delivered " + std::to_string(delivered_) + " of " +
                                           std::to_string(n) + " elements");
  return Status::Ok();
}

Status RegionReader::read_shard(const TensorInfo& t, const ShardSpec& shard, DType dst_type, void* dst) {
  const planner::Frame frame = planner::frame_of(shard);
  for (const Box& b : planner::shard_boxes(shard)) H5CKPT_RETURN_IF_ERROR(read(t, b, frame, dst_type, dst));
  return Status::Ok();
}

}  // namespace h5ckpt::storage
