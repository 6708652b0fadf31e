// The one seam through which the library makes its raw file-system calls, so that tests can make
// any of them fail, transfer half of what was asked, or stall: H5CKPT_FAULT (docs/testing.md,
// "Fault injection"). Each wrapper behaves like the POSIX call it wraps (-1 and errno on failure;
// fallocate returns the error number like posix_fallocate). HDF5's own I/O (H5Fcreate, dataset
// writes through MPI-IO, H5Fopen of /meta) does not pass through here and cannot be injected.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <string>

#include "h5ckpt/status.h"

namespace h5ckpt::storage::io {

int open(const std::string& path, int flags, mode_t mode = 0);
int close(int fd);
ssize_t read(int fd, void* buf, size_t n);
ssize_t pread(int fd, void* buf, size_t n, off_t off);
ssize_t write(int fd, const void* buf, size_t n);
ssize_t pwrite(int fd, const void* buf, size_t n, off_t off);
int fsync(int fd);
int fstat(int fd, struct stat* st);
/// posix_fallocate: 0 or an error number (errno is not used).
int fallocate(int fd, off_t off, off_t len);
int ftruncate(int fd, off_t len);
int rename(const std::string& from, const std::string& to);
int mkdir(const std::string& path, mode_t mode);
int unlink(const std::string& path);
/// std::filesystem::remove_all (op "remove"): 0, or -1 with errno.
int remove_all(const std::string& path);

/// The Status of a failed call of `op` on `path` with error `err`, naming the op, the file and
/// this process's world rank: "pwrite '/x/data.h5' failed on rank 1: No space left on device", or,
/// when the calling thread's last `op` call failed by injection,
/// "pwrite '/x/data.h5' (injected fault on rank 1, call 3): No space left on device".
Status error(const char* op, const std::string& path, int err, ErrorCode code = ErrorCode::kIo);

/// Re-reads H5CKPT_FAULT (otherwise read once per process, at the first call) and restarts the
/// call counts. A malformed specification is returned as kInvalidArgument and injects nothing.
Status reload_faults_for_testing();

}  // namespace h5ckpt::storage::io
