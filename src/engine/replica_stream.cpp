#include "engine/replica_stream.h"

#include <fcntl.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <thread>

#include "logging/log.h"
#include "storage/posix_io.h"

namespace h5ckpt::engine::local {

namespace fs = std::filesystem;

namespace {
constexpr int kReplicaTag = 0x4c52;  // "LR"
constexpr int kSizeTag = kReplicaTag - 1;
constexpr uint64_t kReplicaChunk = 8ull << 20;
constexpr uint64_t kLine = 64;
// Bulk bytes: polled without sleeping (a large message advances only inside MPI calls).
std::unique_ptr<comm::Transport> bulk(MPI_Comm comm) { return comm::make_mpi_transport(comm, 0); }

// Adds the seconds since construction to `to` when the scope ends.
struct Timed {
  double& to;
  double from = logging::now_s();
  ~Timed() { to += logging::now_s() - from; }
};
}  // namespace

std::vector<int> replica_origins(const NodeMap& nodes, int me, int replicas) {
  std::vector<int> out;
  for (int q = 0; q < static_cast<int>(nodes.node_of.size()); ++q) {
    if (q == me) continue;
    auto t = replica_targets(nodes, q, replicas);
    if (std::find(t.begin(), t.end(), me) != t.end()) out.push_back(q);
  }
  return out;
}

uint64_t replica_chunk_bytes(const NodeMap& nodes, int replicas, uint64_t memory_bytes) {
  if (memory_bytes == 0) return kReplicaChunk;
  size_t most = 0;  // the most receive slots any rank needs: every rank computes the same
  for (int q = 0; q < static_cast<int>(nodes.node_of.size()); ++q)
    most = std::max(most, replica_origins(nodes, q, replicas).size());
  const uint64_t slots = 2 + 2 * static_cast<uint64_t>(most);
  return std::clamp<uint64_t>(memory_bytes / 4 / slots / kLine * kLine, kLine, kReplicaChunk);
}

uint64_t replica_stream_chunk(uint64_t bytes, uint64_t largest) {
  return std::min(largest, std::max<uint64_t>(kLine, (bytes + kLine - 1) / kLine * kLine));
}

uint64_t ReplicaWindow::bytes_for(uint64_t send_chunk, const std::vector<uint64_t>& recv_chunks) {
  uint64_t n = 2 * send_chunk;
  for (uint64_t c : recv_chunks) n += 2 * c;
  return n;
}

Status ReplicaWindow::ensure(uint64_t send_chunk, const std::vector<uint64_t>& recv_chunks, MemoryBudget* budget) {
  const uint64_t need = bytes_for(send_chunk, recv_chunks);
  send_chunk_ = send_chunk;
  recv_chunks_ = recv_chunks;
  recv_at_.clear();
  for (uint64_t at = 2 * send_chunk, i = 0; i < recv_chunks.size(); at += 2 * recv_chunks[i++]) recv_at_.push_back(at);
  if (need <= bytes_ && base_) return Status::Ok();
  release();
  if (budget && !budget->try_reserve(need))
    return Status(ErrorCode::kInvalidArgument,
                  "the partner copies need " + std::to_string(need) + " bytes of buffers beside the " +
                      std::to_string(budget->in_use()) + " bytes already leased, more than memory_bytes = " +
                      std::to_string(budget->limit()) + " holds: raise memory_bytes (H5CKPT_MEMORY_BYTES)");
  lease_ = MemoryBudget::Lease(budget, budget ? need : 0);
  base_.reset(new char[std::max<uint64_t>(need, 1)]);
  bytes_ = need;
  // Touched now, once: on a VM the first touch of fresh pages costs more than the bytes moved.
  std::memset(base_.get(), 0, need);
  return Status::Ok();
}

void ReplicaWindow::release() {
  base_.reset();
  bytes_ = 0;
  lease_.reset();
}

ReplicaStream::ReplicaStream(const NodeMap& nodes, int replicas, int me, uint64_t my_bytes, const std::string& partial,
                             const std::string& name, uint64_t largest, ReplicaWindow& window, MemoryBudget* budget,
                             MPI_Comm comm)
    : chunk_(replica_stream_chunk(my_bytes, largest)), my_bytes_(my_bytes), comm_(comm), name_(name) {
  Timed timed{prof_.setup};
  targets_ = replica_targets(nodes, me, replicas);
  for (int q : replica_origins(nodes, me, replicas)) {
    in_.emplace_back();
    in_.back().rank = q;
  }
  // Sizes first: each origin's stream length.
  auto sizes = bulk(comm_);
  for (auto& x : in_) keep(sizes->post_recv(x.rank, &x.bytes, 8, kSizeTag));
  for (int t : targets_) keep(sizes->post_send(t, &my_bytes_, 8, kSizeTag));
  keep(sizes->wait_all());
  std::vector<uint64_t> recv_chunks;
  for (auto& x : in_) recv_chunks.push_back(x.chunk = replica_stream_chunk(x.bytes, largest));
  const uint64_t send_chunk = targets_.empty() ? 0 : chunk_;
  if (Status leased = window.ensure(send_chunk, recv_chunks, budget); !leased.ok()) {
    keep(leased);
    (void)window.ensure(send_chunk, recv_chunks, nullptr);  // carries this save's bytes, then is freed
  }
  out_[0] = window.send_slot(0), out_[1] = window.send_slot(1);
  for (int b = 0; b < 2; ++b) out_transport_[b] = bulk(comm_);
  for (auto& x : in_) {
    x.path = (fs::path(partial) / storage::local_rank_file(x.rank)).string();
    x.fd = storage::io::open(x.path, O_CREAT | O_WRONLY, 0644);  // a spare file is overwritten, then cut
    if (x.fd < 0) keep(storage::io::error("open", x.path, errno));
    x.hash = std::make_unique<storage::LocalFileHasher>(name_, x.rank, x.bytes);
    const size_t index = static_cast<size_t>(&x - in_.data());
    for (int b = 0; b < 2; ++b) {
      x.slot[b].transport = bulk(comm_);
      x.slot[b].buf = window.recv_slot(index, b);
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
    const uint64_t room = std::min<uint64_t>(chunk_, my_bytes_ - sent_) - fill_;
    if (room == 0) {  // more bytes than announced: a planning bug, the partners keep what was promised
      keep(Status(ErrorCode::kInternal, "local write longer than planned"));
      return;
    }
    const uint64_t k = std::min(room, n);
    if (!targets_.empty()) {
      Timed timed{prof_.copy};
      std::memcpy(out_[cur_] + fill_, data, k);
    }
    fill_ += k, data += k, n -= k;
    if (fill_ == std::min<uint64_t>(chunk_, my_bytes_ - sent_)) flush();
    progress();
  }
}

Status ReplicaStream::finish(uint64_t* received, std::vector<Received>* copies) {
  if (sent_ + fill_ < my_bytes_) {
    keep(Status(ErrorCode::kInternal, "local write shorter than planned"));
    std::vector<char> zeros(chunk_, 0);
    while (sent_ + fill_ < my_bytes_) push(zeros.data(), std::min<uint64_t>(chunk_, my_bytes_ - sent_ - fill_));
  }
  const double t_drain = logging::now_s();
  while (true) {
    progress();
    bool done = true;
    for (auto& x : in_) done = done && x.next_write * x.chunk >= x.bytes;
    if (done) break;
    std::this_thread::yield();
    check("receiving partner copies");
  }
  for (int b = 0; b < 2; ++b) keep(out_transport_[b]->wait_all());
  prof_.drain = logging::now_s() - t_drain;
  Timed timed{prof_.recv_sync};
  for (auto& x : in_) {
    *received += x.bytes;
    copies->push_back({x.rank, x.hash->finish()});
    if (x.fd >= 0) {
      if (storage::io::ftruncate(x.fd, static_cast<off_t>(x.bytes)) != 0)
        keep(storage::io::error("ftruncate", x.path, errno));
      keep(storage::sync_close(x.fd, x.path));
      x.fd = -1;
    }
  }
  return st_;
}

void ReplicaStream::repost(Incoming& x, int b) {
  const uint64_t at = x.next_post * x.chunk;
  if (at >= x.bytes) return;
  Slot& s = x.slot[b];
  s.bytes = std::min(x.chunk, x.bytes - at);
  keep(s.transport->post_recv(x.rank, s.buf, s.bytes, kReplicaTag));
  s.chunk = x.next_post++;
  s.posted = true;
}

// Writes every origin's chunks that have arrived, in order, and posts the following ones.
void ReplicaStream::progress() {
  for (auto& x : in_) {
    while (x.next_write * x.chunk < x.bytes) {
      Slot& s = x.slot[x.next_write % 2];
      if (!s.posted || s.chunk != x.next_write) break;
      auto done = s.transport->test();
      if (!done.ok()) {
        keep(done.status());
        return;
      }
      if (!*done) break;
      s.posted = false;
      {
        Timed timed{prof_.recv_hash};
        x.hash->update(s.buf, s.bytes);
      }
      Timed timed{prof_.recv_write};
      if (st_.ok() && x.fd >= 0) keep(storage::write_all(x.fd, s.buf, s.bytes, x.next_write * x.chunk, x.path));
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
  for (int t : targets_) keep(out_transport_[cur_]->post_send(t, out_[cur_], fill_, kReplicaTag));
  out_busy_[cur_] = !targets_.empty();
  sent_ += fill_;
  fill_ = 0;
  cur_ ^= 1;
}

// Keeps receiving while a send drains, so two partners never wait on each other.
void ReplicaStream::wait_out(int b) {
  Timed timed{prof_.send_wait};
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
