#include "storage/leftovers.h"

#include <cerrno>
#include <filesystem>
#include <vector>

#include "logging/log.h"
#include "storage/commit.h"
#include "storage/posix_io.h"

namespace h5ckpt::storage {

namespace fs = std::filesystem;

int remove_leftover_temps(const std::string& committed_dir) {
  fs::path dir = fs::path(committed_dir).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();
  const fs::path parent = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
  std::error_code ec;
  std::vector<std::string> found;  // listed first: removing while iterating is unspecified
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec))
    if (is_temp_name(it->path().filename().string())) found.push_back(it->path().filename().string());
  if (ec) logging::log().warn("could not list '{}' for leftovers of failed saves: {}", parent.string(), ec.message());
  int removed = 0;
  for (const std::string& name : found) {
    const std::string suffix = ".old";
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      // An overwrite crashed between its two renames: this may be the only copy of NAME.
      std::error_code missing;
      if (!fs::exists(parent / name.substr(1, name.find(".inprogress-") - 1), missing)) continue;
    }
    const std::string path = (parent / name).string();
    if (io::remove_all(path) == 0) ++removed;
    else logging::log().warn("could not remove leftover: {}", io::error("remove", path, errno).message());
  }
  if (removed) logging::log().info("removed {} leftover temporary directories in '{}'", removed, parent.string());
  return removed;
}

}  // namespace h5ckpt::storage
