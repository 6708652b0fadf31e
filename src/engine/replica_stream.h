// The partner copies of a local save, moved while each rank writes its own file (engine/
// local_level.h): every rank's byte stream goes to its targets in chunks, and every stream it
// is a target of arrives into two posted receives per origin and is written to
// <partial>/rank-<origin>.bin as each chunk completes, its blocks hashed for the manifest's check.
// Point-to-point through comm::Transport (one per buffer slot, so each chunk completes alone).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/deadline.h"
#include "comm/transport.h"
#include "engine/local_level.h"
#include "storage/local_files.h"

namespace h5ckpt::engine::local {

class ReplicaStream {
 public:
  /// Collective over `comm` (exchanges the streams' lengths). `name`: the checkpoint's name,
  /// which seeds the block sums.
  ReplicaStream(const NodeMap& nodes, int replicas, int me, uint64_t my_bytes, const std::string& partial,
                const std::string& name, MPI_Comm comm);
  ~ReplicaStream();
  ReplicaStream(const ReplicaStream&) = delete;
  ReplicaStream& operator=(const ReplicaStream&) = delete;

  /// The next bytes of this rank's stream (in file order).
  void push(const char* data, uint64_t n);

  /// A copy received, as its block sums describe it (compared with the manifest's).
  struct Received {
    int origin;
    storage::LocalRankFile file;
  };
  /// Completes the exchange: pads a short stream, waits for every chunk both ways, syncs the
  /// copies. A rank whose own write failed still sends and receives every chunk, so no peer waits
  /// for it; its error (and any here) fails the agreement after the write phase.
  Status finish(uint64_t* received, std::vector<Received>* copies);

 private:
  struct Slot {
    std::unique_ptr<comm::Transport> transport;
    std::vector<char> buf;
    uint64_t chunk = 0;
    bool posted = false;
  };
  struct Incoming {
    int rank = -1;
    uint64_t bytes = 0;
    std::string path;
    int fd = -1;
    std::unique_ptr<storage::LocalFileHasher> hash;
    Slot slot[2];
    uint64_t next_post = 0, next_write = 0;
  };
  void repost(Incoming& x, int b);
  void progress();
  void flush();
  void wait_out(int b);
  void check(const char* what);
  void keep(const Status& s) {
    if (st_.ok() && !s.ok()) st_ = s;
  }

  comm::Deadline deadline_;
  std::chrono::steady_clock::time_point next_check_{};
  uint64_t my_bytes_;
  MPI_Comm comm_;
  std::string name_;
  std::vector<int> targets_;
  std::vector<Incoming> in_;
  std::vector<char> out_[2];
  std::unique_ptr<comm::Transport> out_transport_[2];
  bool out_busy_[2] = {false, false};
  int cur_ = 0;
  uint64_t fill_ = 0, sent_ = 0;
  Status st_;
};

}  // namespace h5ckpt::engine::local
