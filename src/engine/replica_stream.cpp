#include "engine/replica_stream.h"

#include <fcntl.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <thread>

#include "storage/posix_io.h"

namespace h5ckpt::engine::local {

namespace fs = std::filesystem;

namespace {
constexpr int kReplicaTag = 0x4c52;  // "LR"
constexpr int kSizeTag = kReplicaTag - 1;
constexpr uint64_t kReplicaChunk = 8ull << 20;
// Bulk bytes: polled without sleeping (a large message advances only inside MPI calls).
std::unique_ptr<comm::Transport> bulk(MPI_Comm comm) { return comm::make_mpi_transport(comm, 0); }
}  // namespace

ReplicaStream::ReplicaStream(const NodeMap& nodes, int replicas, int me, uint64_t my_bytes, const std::string& partial,
                             const std::string& name, MPI_Comm comm)
    : my_bytes_(my_bytes), comm_(comm), name_(name) {
  targets_ = replica_targets(nodes, me, replicas);
  for (int q = 0; q < static_cast<int>(nodes.node_of.size()); ++q) {
    if (q == me) continue;
    auto t = replica_targets(nodes, q, replicas);
    if (std::find(t.begin(), t.end(), me) == t.end()) continue;
    in_.emplace_back();
    in_.back().rank = q;
  }
  // Sizes first: each origin's stream length.
  auto sizes = bulk(comm_);
  for (auto& x : in_) keep(sizes->post_recv(x.rank, &x.bytes, 8, kSizeTag));
  for (int t : targets_) keep(sizes->post_send(t, &my_bytes_, 8, kSizeTag));
  keep(sizes->wait_all());
  for (int b = 0; b < 2; ++b) out_transport_[b] = bulk(comm_);
  for (auto& x : in_) {
    x.path = (fs::path(partial) / storage::local_rank_file(x.rank)).string();
    x.fd = storage::io::open(x.path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (x.fd < 0) keep(storage::io::error("open", x.path, errno));
    x.hash = std::make_unique<storage::LocalFileHasher>(name_, x.rank, x.bytes);
    for (int b = 0; b < 2; ++b) {
      x.slot[b].transport = bulk(comm_);
      repost(x, b);
    }
  }
}

ReplicaStream::~ReplicaStream() {
  for (auto& x : in_)
    if (x.fd >= 0) storage::io::close(x.fd);
}

void ReplicaStream::push(const char* data, uint64_t n) {
  while (n) {
    if (!targets_.empty() && fill_ == 0) wait_out(cur_);  // the buffer's previous chunk is sent
    const uint64_t room = std::min<uint64_t>(kReplicaChunk, my_bytes_ - sent_) - fill_;
    if (room == 0) {  // more bytes than announced: a planning bug, the partners keep what was promised
      keep(Status(ErrorCode::kInternal, "local write longer than planned"));
      return;
    }
    const uint64_t k = std::min(room, n);
    if (!targets_.empty()) {
      out_[cur_].resize(std::max<uint64_t>(out_[cur_].size(), fill_ + k));
      std::memcpy(out_[cur_].data() + fill_, data, k);
    }
    fill_ += k, data += k, n -= k;
    if (fill_ == std::min<uint64_t>(kReplicaChunk, my_bytes_ - sent_)) flush();
    progress();
  }
}

Status ReplicaStream::finish(uint64_t* received, std::vector<Received>* copies) {
  if (sent_ + fill_ < my_bytes_) {
    keep(Status(ErrorCode::kInternal, "local write shorter than planned"));
    std::vector<char> zeros(kReplicaChunk, 0);
    while (sent_ + fill_ < my_bytes_) push(zeros.data(), std::min<uint64_t>(kReplicaChunk, my_bytes_ - sent_ - fill_));
  }
  while (true) {
    progress();
    bool done = true;
    for (auto& x : in_) done = done && x.next_write * kReplicaChunk >= x.bytes;
    if (done) break;
    std::this_thread::yield();
    check("receiving partner copies");
  }
  for (int b = 0; b < 2; ++b) keep(out_transport_[b]->wait_all());
  for (auto& x : in_) {
    *received += x.bytes;
    copies->push_back({x.rank, x.hash->finish()});
    if (x.fd >= 0) {
      keep(storage::sync_close(x.fd, x.path));
      x.fd = -1;
    }
  }
  return st_;
}

void ReplicaStream::repost(Incoming& x, int b) {
  const uint64_t at = x.next_post * kReplicaChunk;
  if (at >= x.bytes) return;
  Slot& s = x.slot[b];
  s.buf.resize(std::min(kReplicaChunk, x.bytes - at));
  keep(s.transport->post_recv(x.rank, s.buf.data(), s.buf.size(), kReplicaTag));
  s.chunk = x.next_post++;
  s.posted = true;
}

// Writes every origin's chunks that have arrived, in order, and posts the following ones.
void ReplicaStream::progress() {
  for (auto& x : in_) {
    while (x.next_write * kReplicaChunk < x.bytes) {
      Slot& s = x.slot[x.next_write % 2];
      if (!s.posted || s.chunk != x.next_write) break;
      auto done = s.transport->test();
      if (!done.ok()) {
        keep(done.status());
        return;
      }
      if (!*done) break;
      s.posted = false;
      x.hash->update(s.buf.data(), s.buf.size());
      if (st_.ok() && x.fd >= 0)
        keep(storage::write_all(x.fd, s.buf.data(), s.buf.size(), x.next_write * kReplicaChunk, x.path));
      repost(x, static_cast<int>(x.next_write++ % 2));
    }
  }
  for (int b = 0; b < 2; ++b)
    if (out_busy_[b]) {
      auto done = out_transport_[b]->test();
      if (!done.ok()) keep(done.status());
      if (!done.ok() || *done) out_busy_[b] = false;
    }
}

void ReplicaStream::flush() {
  for (int t : targets_) keep(out_transport_[cur_]->post_send(t, out_[cur_].data(), fill_, kReplicaTag));
  out_busy_[cur_] = !targets_.empty();
  sent_ += fill_;
  fill_ = 0;
  cur_ ^= 1;
}

// Keeps receiving while a send drains, so two partners never wait on each other.
void ReplicaStream::wait_out(int b) {
  while (out_busy_[b]) {
    progress();
    if (!out_busy_[b]) break;
    std::this_thread::yield();
    check("sending partner copies");
  }
}

// The deadline, and peers that passed theirs, every few ms.
void ReplicaStream::check(const char* what) {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_check_) return;
  comm::check_deadline(deadline_, what, comm_);
  next_check_ = now + std::chrono::milliseconds(5);
}

}  // namespace h5ckpt::engine::local
