// The files of a node-local checkpoint as the engine reads and writes them (docs/format.md §11):
// whole-buffer positioned I/O, the per-block checksums a save records for each rank's file, and
// the reader a server uses to serve a local load, which checks each block the first time it
// reads it. No MPI here.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "h5ckpt/status.h"
#include "storage/local_store.h"

namespace h5ckpt::storage {

/// Block size of the local files' checksums: the shared level's verification block target. A
/// block's sum is xxh3-64 seeded as the shared level seeds its blocks (block_seed), never keyed.
uint64_t local_block_bytes();

/// The seed of saved rank `rank`'s blocks in local checkpoint `name`: a file swapped with another
/// rank's, or left from another checkpoint, fails its blocks' checks.
uint64_t local_file_identity(const std::string& name, int rank);

/// All of `n` bytes at `off`, or an error naming `path` (a short file is kCorrupt).
Status write_all(int fd, const char* data, uint64_t n, uint64_t off, const std::string& path);
Status read_all(int fd, char* data, uint64_t n, uint64_t off, const std::string& path);
/// fsync then close; the fsync's error, if any.
Status sync_close(int fd, const std::string& path);

/// Hashes one rank's file as its bytes stream past (the save, a partner copy being received)
/// into the block sums its manifest entry records.
class LocalFileHasher {
 public:
  LocalFileHasher(const std::string& name, int rank, uint64_t bytes);
  ~LocalFileHasher();
  LocalFileHasher(const LocalFileHasher&) = delete;
  LocalFileHasher& operator=(const LocalFileHasher&) = delete;
  void update(const char* data, uint64_t n);
  /// The manifest entry: size, block size and every block's checksum.
  LocalRankFile finish();

 private:
  struct State;
  uint64_t bytes_;
  State* state_;
};

/// The saved ranks' files of one local checkpoint, as the rank serving them reads them. Each file
/// is opened once. With block sums in the manifest, every block is checked the first time any of
/// its bytes is read: read whole into `cache` (which then serves the following reads of that
/// block) when it fits, else streamed through `cache` to check it and read again in the parts
/// asked for. A block that fails names the file and the block (kCorrupt) and marks the file
/// corrupt(). Files of older manifests (without block sums) were checked whole when resolved.
class LocalFileReader {
 public:
  LocalFileReader(std::string dir, const LocalManifest& manifest, char* cache, uint64_t cache_bytes);
  LocalFileReader(const LocalFileReader&) = delete;
  LocalFileReader& operator=(const LocalFileReader&) = delete;
  ~LocalFileReader();
  /// `n` bytes at `offset` of saved rank `writer`'s file.
  Status read(int writer, char* to, uint64_t n, uint64_t offset);
  /// Saved ranks whose file failed a block check.
  const std::vector<int>& corrupt() const { return corrupt_; }
  /// Bytes read from the files (blocks checked whole count once).
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  struct File {
    int fd = -1;
    std::string path;
    std::vector<bool> checked;
  };
  Result<File*> open(int writer);
  Status check_block(int writer, File& f, uint64_t block);
  std::string dir_;
  const LocalManifest& manifest_;
  char* cache_;
  uint64_t cache_bytes_;
  int cached_writer_ = -1;
  uint64_t cached_block_ = 0;
  std::map<int, File> files_;
  std::vector<int> corrupt_;
  uint64_t bytes_read_ = 0;
};

/// Moves a file that failed its check aside ("<file>.corrupt"), so that no listing offers it
/// again; the next resolution serves that rank from another copy or another level.
Status quarantine_local_file(const std::string& dir, int rank);

}  // namespace h5ckpt::storage
