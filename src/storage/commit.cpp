#include "storage/commit.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "storage/metadata.h"

namespace h5ckpt::storage {

namespace fs = std::filesystem;

namespace {

Status errno_status(const std::string& what, int err) {
  return Status(ErrorCode::kIo, what + ": " + std::strerror(err));
}

std::string parent_of(const std::string& p) {
  fs::path parent = fs::path(p).lexically_normal().parent_path();
  return parent.empty() ? "." : parent.string();
}

std::string base_of(const std::string& p) {
  fs::path n = fs::path(p).lexically_normal();
  if (n.filename().empty()) n = n.parent_path();
  return n.filename().string();
}

constexpr const char* kTempMarker = ".inprogress-";

}  // namespace

std::string temp_dir_for(const std::string& final_dir, const std::string& nonce) {
  return (fs::path(parent_of(final_dir)) / ("." + base_of(final_dir) + kTempMarker + nonce)).string();
}

bool is_temp_name(const std::string& dir) {
  const std::string b = base_of(dir);
  return !b.empty() && b[0] == '.' && b.find(kTempMarker) != std::string::npos;
}

Status make_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0) return errno_status("cannot create directory '" + dir + "'", errno);
  return Status::Ok();
}

Status fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return errno_status("cannot open '" + path + "' for fsync", errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems refuse fsync on directories (EINVAL); that is not a data-loss risk.
  if (rc != 0 && err != EINVAL) return errno_status("fsync of '" + path + "' failed", err);
  return Status::Ok();
}

Status write_file_atomic(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return errno_status("cannot create '" + tmp + "'", errno);
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return errno_status("writing '" + tmp + "' failed", err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return errno_status("fsync of '" + tmp + "' failed", err);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return errno_status("rename to '" + path + "' failed", err);
  }
  return fsync_path(parent_of(path));
}

Result<std::string> read_whole_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    int err = errno;
    return Status(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
                  "cannot open '" + path + "': " + std::strerror(err));
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return errno_status("reading '" + path + "' failed", err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

Status remove_tree(const std::string& dir) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (ec) return Status(ErrorCode::kIo, "cannot remove '" + dir + "': " + ec.message());
  return Status::Ok();
}

Status publish_dir(const std::string& temp, const std::string& final_dir, bool overwrite) {
  std::error_code ec;
  std::string aside;
  if (fs::exists(final_dir, ec)) {
    if (!overwrite)
      return Status(ErrorCode::kAlreadyExists,
                    "checkpoint '" + final_dir + "' already exists (pass overwrite to replace it)");
    aside = temp + ".old";
    if (::rename(final_dir.c_str(), aside.c_str()) != 0)
      return errno_status("cannot move old checkpoint '" + final_dir + "' aside", errno);
  }
  if (::rename(temp.c_str(), final_dir.c_str()) != 0) {
    int err = errno;
    if (!aside.empty()) ::rename(aside.c_str(), final_dir.c_str());  // put the old one back
    return errno_status("cannot rename '" + temp + "' to '" + final_dir + "'", err);
  }
  H5CKPT_RETURN_IF_ERROR(fsync_path(parent_of(final_dir)));
  if (!aside.empty()) return remove_tree(aside);
  return Status::Ok();
}

Status update_latest(const std::string& dir) {
  return write_file_atomic((fs::path(parent_of(dir)) / kLatestFileName).string(), base_of(dir) + "\n");
}

Result<std::string> resolve_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec))
    return Status(ErrorCode::kNotFound, "checkpoint '" + path + "' does not exist or is not a directory");
  std::string dir = path;
  if (!fs::exists(fs::path(dir) / kMetadataFileName, ec)) {
    const fs::path latest = fs::path(dir) / kLatestFileName;
    if (fs::exists(latest, ec)) {
      H5CKPT_ASSIGN_OR_RETURN(std::string name, read_whole_file(latest.string()));
      while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) name.pop_back();
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
        return Status(ErrorCode::kCorrupt, "'" + latest.string() + "' does not name a checkpoint");
      dir = (fs::path(dir) / name).string();
      if (!fs::is_directory(dir, ec))
        return Status(ErrorCode::kNotFound, "'" + latest.string() + "' points at missing checkpoint '" + dir + "'");
    }
  }
  if (is_temp_name(dir))
    return Status(ErrorCode::kNotCommitted, "'" + dir + "' is an in-progress save that was never committed");
  if (!fs::exists(fs::path(dir) / kMetadataFileName, ec)) {
    if (fs::exists(fs::path(dir) / kDataFileName, ec))
      return Status(ErrorCode::kNotCommitted, "checkpoint '" + dir + "' has data but no " +
                                                  kMetadataFileName + ": it was never committed");
    return Status(ErrorCode::kNotFound, "'" + path + "' holds no checkpoint (no " + kMetadataFileName + " or " +
                                            kLatestFileName + ")");
  }
  return dir;
}

}  // namespace h5ckpt::storage
