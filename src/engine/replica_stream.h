// The partner copies of a local save, moved while each rank writes its own file (engine/
// local_level.h): every rank's byte stream goes to its targets in chunks, and every stream it
// is a target of arrives into two posted receives per origin and is written to
// <partial>/rank-<origin>.bin as each chunk completes, its blocks hashed for the manifest's check.
// Point-to-point through comm::Transport (one per buffer slot, so each chunk completes alone).
// The chunk buffers are a ReplicaWindow the level keeps between saves: fresh buffers on every
// save cost more in first-touch page faults than the transfer itself on a VM (docs/performance.md).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/deadline.h"
#include "comm/transport.h"
#include "engine/local_level.h"
#include "engine/memory_budget.h"
#include "storage/local_files.h"

namespace h5ckpt::engine::local {

/// The ranks whose files `me` receives copies of (those that have `me` among their targets).
std::vector<int> replica_origins(const NodeMap& nodes, int me, int replicas);

/// The largest chunk of the partner streams: 8 MiB; under memory_bytes a quarter of the budget
/// spread over the most slots any rank needs, in whole 64-byte lines. The same on every rank.
uint64_t replica_chunk_bytes(const NodeMap& nodes, int replicas, uint64_t memory_bytes);

/// The chunk of a stream of `bytes` bytes: the largest chunk, or the whole stream when shorter.
/// Sender and receiver both know the stream's length, so both cut it the same way.
uint64_t replica_stream_chunk(uint64_t bytes, uint64_t largest);

/// The buffers of a ReplicaStream: two send slots, then two receive slots per origin. Allocated
/// and touched once, then reused by every save they are large enough for; leased from the
/// Checkpointer's budget for as long as they are held.
class ReplicaWindow {
 public:
  /// Bytes two send slots of `send_chunk` and two receive slots of each `recv_chunks` take.
  static uint64_t bytes_for(uint64_t send_chunk, const std::vector<uint64_t>& recv_chunks);
  /// Lays the slots out, reallocating when the window is too small. An error (and no window)
  /// when the budget cannot lease it.
  Status ensure(uint64_t send_chunk, const std::vector<uint64_t>& recv_chunks, MemoryBudget* budget);
  /// Frees the memory and its lease (a bounded Checkpointer gives it back between saves).
  void release();
  char* send_slot(int b) { return base_.get() + static_cast<uint64_t>(b) * send_chunk_; }
  char* recv_slot(size_t origin, int b) {
    return base_.get() + recv_at_[origin] + static_cast<uint64_t>(b) * recv_chunks_[origin];
  }

 private:
  std::unique_ptr<char[]> base_;
  uint64_t bytes_ = 0, send_chunk_ = 0;
  std::vector<uint64_t> recv_chunks_, recv_at_;
  MemoryBudget::Lease lease_;
};

class ReplicaStream {
 public:
  /// Collective over `comm` (exchanges the streams' lengths, then lays `window` out for them,
  /// leased from `budget`). `name`: the checkpoint's name, which seeds the block sums. `largest`:
  /// replica_chunk_bytes. `window` must outlive the stream. A window the budget cannot lease is
  /// allocated outside it for this save, which then fails (finish's status): no peer waits.
  ReplicaStream(const NodeMap& nodes, int replicas, int me, uint64_t my_bytes, const std::string& partial,
                const std::string& name, uint64_t largest, ReplicaWindow& window, MemoryBudget* budget, MPI_Comm comm);
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

  /// Where the stream's time went (seconds, wall clock), for the save's debug log.
  struct Profile {
    double setup = 0;       ///< the lengths' exchange and the copies' files opened
    double copy = 0;        ///< this rank's bytes into the send slots
    double send_wait = 0;   ///< waiting for a send slot (receiving meanwhile)
    double drain = 0;       ///< finish(): the last chunks both ways
    double recv_write = 0;  ///< copies written to their files
    double recv_hash = 0;   ///< copies' block sums
    double recv_sync = 0;   ///< copies' fsyncs
  };
  const Profile& profile() const { return prof_; }

 private:
  struct Slot {
    std::unique_ptr<comm::Transport> transport;
    char* buf = nullptr;  // in the window
    uint64_t bytes = 0;   // of the chunk posted
    uint64_t chunk = 0;
    bool posted = false;
  };
  struct Incoming {
    int rank = -1;
    uint64_t bytes = 0, chunk = 0;
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
  uint64_t chunk_;
  std::chrono::steady_clock::time_point next_check_{};
  uint64_t my_bytes_;
  MPI_Comm comm_;
  std::string name_;
  std::vector<int> targets_;
  std::vector<Incoming> in_;
  char* out_[2] = {nullptr, nullptr};  // send slots in the window
  std::unique_ptr<comm::Transport> out_transport_[2];
  bool out_busy_[2] = {false, false};
  int cur_ = 0;
  uint64_t fill_ = 0, sent_ = 0;
  Status st_;
  Profile prof_;
};

}  // namespace h5ckpt::engine::local
