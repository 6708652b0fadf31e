#include "comm/comm.h"

#include <algorithm>
#include <climits>
#include <atomic>
#include <cstdlib>

#include "comm/deadline.h"

namespace h5ckpt::comm {

namespace {
constexpr int kAgreePollMicros = 50;  // an agreement ends every phase: keep its latency small
constexpr int kCollPollMicros = 50;
constexpr uint64_t kDefaultChunk = 1ull << 30;  // below INT_MAX
constexpr int kGatherTag = 32001, kScatterTag = 32002;
std::atomic<uint64_t> g_chunk_for_testing{0};
std::atomic<uint64_t> g_recv_messages{0}, g_recv_bytes{0};

void count_received(uint64_t messages, uint64_t bytes) {
  g_recv_messages.fetch_add(messages, std::memory_order_relaxed);
  g_recv_bytes.fetch_add(bytes, std::memory_order_relaxed);
}

// Messages a reduction over `size` ranks delivers to each rank (binomial / recursive doubling).
uint64_t log2_ceil(int size) {
  uint64_t steps = 0;
  while ((1ll << steps) < size) ++steps;
  return steps;
}

uint64_t chunk_from_env() {
  const char* v = std::getenv("H5CKPT_TEST_CHUNK_BYTES");
  const unsigned long long n = v ? std::strtoull(v, nullptr, 10) : 0;
  return n > 0 && n <= kDefaultChunk ? n : kDefaultChunk;
}

// Posts the messages of `bytes` at `data` to or from `peer`, each at most chunk_limit() bytes;
// both sides cut at the same offsets, and MPI keeps one pair's messages in order.
Status post_chunks(bool send, char* data, uint64_t bytes, int peer, int tag, MPI_Comm comm,
                   std::vector<MPI_Request>& reqs) {
  const uint64_t chunk = chunk_limit();
  for (uint64_t off = 0; off < bytes; off += chunk) {
    MPI_Request r = MPI_REQUEST_NULL;
    const int n = static_cast<int>(std::min(chunk, bytes - off));
    const int rc = send ? MPI_Isend(data + off, n, MPI_BYTE, peer, tag, comm, &r)
                        : MPI_Irecv(data + off, n, MPI_BYTE, peer, tag, comm, &r);
    H5CKPT_RETURN_IF_ERROR(mpi_status(rc, send ? "MPI_Isend" : "MPI_Irecv"));
    if (!send) count_received(1, static_cast<uint64_t>(n));
    reqs.push_back(r);
  }
  return Status::Ok();
}

// Completes what was posted even after a posting error (the peers' halves may be matched), then
// returns the first error.
Status finish(Status posted, std::vector<MPI_Request>& reqs, const char* what, MPI_Comm comm, const Deadline& d) {
  Status done = wait_until(static_cast<int>(reqs.size()), reqs.data(), kCollPollMicros, what, comm, d);
  return posted.ok() ? done : posted;
}
// Broadcasts `n` bytes at `data` in pieces of chunk_limit() bytes, a bounded number in flight
// (every rank cuts the same pieces).
Status bcast_pieces(char* data, uint64_t n, int root, MPI_Comm comm, const Deadline& d) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  constexpr size_t kInFlight = 16;
  const uint64_t chunk = chunk_limit();
  if (rank != root) count_received((n + chunk - 1) / chunk, n);
  std::vector<MPI_Request> reqs;
  Status posted;
  for (uint64_t off = 0; off < n && posted.ok();) {
    reqs.clear();
    for (; off < n && reqs.size() < kInFlight; off += chunk) {
      MPI_Request req;
      const int len = static_cast<int>(std::min(chunk, n - off));
      posted = mpi_status(MPI_Ibcast(data + off, len, MPI_BYTE, root, comm, &req), "MPI_Ibcast");
      if (!posted.ok()) break;
      reqs.push_back(req);
    }
    H5CKPT_RETURN_IF_ERROR(finish(posted, reqs, "broadcast", comm, d));
  }
  return Status::Ok();
}
}  // namespace

uint64_t chunk_limit() {
  static const uint64_t from_env = chunk_from_env();
  const uint64_t t = g_chunk_for_testing.load();
  return t ? t : from_env;
}

void set_chunk_limit_for_testing(uint64_t bytes) { g_chunk_for_testing.store(std::min(bytes, kDefaultChunk)); }

Traffic received_traffic() { return Traffic{g_recv_messages.load(), g_recv_bytes.load()}; }

Status mpi_status(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return Status::Ok();
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return Status(ErrorCode::kMpi, std::string(what) + " failed: " + std::string(msg, len));
}

Result<Comm> Comm::duplicate(MPI_Comm c) {
  Comm out;
  const BlockingGuard guard("communicator duplication (MPI_Comm_dup)", c);  // collective, blocking
  H5CKPT_RETURN_IF_ERROR(mpi_status(MPI_Comm_dup(c, &out.c_), "MPI_Comm_dup"));
  MPI_Comm_set_errhandler(out.c_, MPI_ERRORS_RETURN);
  H5CKPT_RETURN_IF_ERROR(open_side_channel(out.c_));  // on failure ~Comm frees out.c_
  return out;
}

Comm& Comm::operator=(Comm&& o) noexcept {
  if (this != &o) {
    if (c_ != MPI_COMM_NULL) {
      close_side_channel(c_);
      MPI_Comm_free(&c_);
    }
    c_ = o.c_;
    o.c_ = MPI_COMM_NULL;
  }
  return *this;
}

Comm::~Comm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (c_ != MPI_COMM_NULL && !finalized) {
    close_side_channel(c_);
    MPI_Comm_free(&c_);
  }
}

int Comm::rank() const {
  int r = 0;
  MPI_Comm_rank(c_, &r);
  return r;
}

int Comm::size() const {
  int s = 0;
  MPI_Comm_size(c_, &s);
  return s;
}

Status agree(const Status& local, MPI_Comm comm) { return agree(local, comm, nullptr, 0); }

Status agree(const Status& local, MPI_Comm comm, int* flag) { return agree(local, comm, flag, flag ? 1 : 0); }

Status agree(const Status& local, MPI_Comm comm, int* flags, int nflags) {
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // One reduction (tree-shaped inside MPI: no rank hears from O(ranks) peers, and each moves a
  // few ints): the first failing rank and the minimum of every flag.
  const size_t width = 1 + static_cast<size_t>(nflags);
  std::vector<int> mine(width), min(width);
  mine[0] = local.ok() ? INT_MAX : rank;
  for (int f = 0; f < nflags; ++f) mine[1 + f] = flags[f];
  MPI_Request req;
  H5CKPT_RETURN_IF_ERROR(
      mpi_status(MPI_Iallreduce(mine.data(), min.data(), static_cast<int>(width), MPI_INT, MPI_MIN, comm, &req),
                 "agreement (MPI_Iallreduce)"));
  H5CKPT_RETURN_IF_ERROR(wait_asleep(1, &req, kAgreePollMicros, "agreement (MPI_Iallreduce)", comm));
  count_received(log2_ceil(size), log2_ceil(size) * width * sizeof(int));
  for (int f = 0; f < nflags; ++f) flags[f] = min[1 + f];
  if (min[0] == INT_MAX) return Status::Ok();
  // Something failed (rare): who, for the message.
  const int bit = local.ok() ? 0 : 1;
  std::vector<int> all(static_cast<size_t>(size));
  H5CKPT_RETURN_IF_ERROR(
      mpi_status(MPI_Iallgather(&bit, 1, MPI_INT, all.data(), 1, MPI_INT, comm, &req), "agreement (MPI_Iallgather)"));
  H5CKPT_RETURN_IF_ERROR(wait_asleep(1, &req, kAgreePollMicros, "agreement (failing ranks)", comm));
  count_received(static_cast<uint64_t>(size - 1), static_cast<uint64_t>(size - 1) * sizeof(int));
  std::vector<int> failing;
  for (int r = 0; r < size; ++r)
    if (all[r]) failing.push_back(r);
  if (failing.empty()) return Status::Ok();
  // The first failing rank tells everyone what went wrong.
  const int teller = failing.front();
  std::string text;
  int code = 0;
  if (rank == teller) {
    text = local.message();
    code = static_cast<int>(local.code());
  }
  H5CKPT_RETURN_IF_ERROR(mpi_status(MPI_Ibcast(&code, 1, MPI_INT, teller, comm, &req), "MPI_Ibcast"));
  H5CKPT_RETURN_IF_ERROR(wait_asleep(1, &req, kAgreePollMicros, "agreement (failure code broadcast)", comm));
  if (auto st = bcast_bytes(text, teller, comm); !st.ok()) return st;
  std::string ranks;
  for (size_t i = 0; i < failing.size() && i < 16; ++i) ranks += (i ? "," : "") + std::to_string(failing[i]);
  if (failing.size() > 16) ranks += ",... (" + std::to_string(failing.size()) + " ranks)";
  return Status(static_cast<ErrorCode>(code),
                "rank " + std::to_string(teller) + ": " + text + " [failed on rank(s) " + ranks + "]");
}

Status wait_asleep(int n, MPI_Request* requests, int poll_us, const char* what, MPI_Comm comm) {
  return wait_until(n, requests, poll_us, what, comm, Deadline());
}

Status idle_barrier(MPI_Comm comm, int poll_us) {
  MPI_Request req;
  H5CKPT_RETURN_IF_ERROR(mpi_status(MPI_Ibarrier(comm, &req), "MPI_Ibarrier"));
  return wait_asleep(1, &req, poll_us, "barrier (MPI_Ibarrier)", comm);
}

Status bcast_bytes(std::string& bytes, int root, MPI_Comm comm) {
  const Deadline d;
  uint64_t n = bytes.size();
  MPI_Request req;
  H5CKPT_RETURN_IF_ERROR(mpi_status(MPI_Ibcast(&n, 1, MPI_UINT64_T, root, comm, &req), "MPI_Ibcast"));
  H5CKPT_RETURN_IF_ERROR(wait_until(1, &req, kCollPollMicros, "broadcast (size)", comm, d));
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank != root) count_received(1, sizeof n);
  bytes.resize(n);
  return bcast_pieces(bytes.data(), n, root, comm, d);
}

Status bcast_into(char* data, uint64_t bytes, int root, MPI_Comm comm) {
  return bcast_pieces(data, bytes, root, comm, Deadline());
}

Result<NodeShared> NodeShared::allocate(uint64_t bytes, MPI_Comm node) {
  int rank = 0;
  MPI_Comm_rank(node, &rank);
  NodeShared out;
  void* base = nullptr;
  {
    const BlockingGuard guard("node shared memory (MPI_Win_allocate_shared)", node);  // collective, blocking
    // Rank 0 holds the whole buffer; 1 byte when empty, so every node has a valid address.
    const MPI_Aint mine = rank == 0 ? static_cast<MPI_Aint>(std::max<uint64_t>(bytes, 1)) : 0;
    H5CKPT_RETURN_IF_ERROR(
        mpi_status(MPI_Win_allocate_shared(mine, 1, MPI_INFO_NULL, node, &base, &out.win_), "MPI_Win_allocate_shared"));
  }
  MPI_Aint got = 0;
  int unit = 1;
  H5CKPT_RETURN_IF_ERROR(mpi_status(MPI_Win_shared_query(out.win_, 0, &got, &unit, &base), "MPI_Win_shared_query"));
  out.data_ = static_cast<char*>(base);
  out.size_ = bytes;
  return out;
}

NodeShared& NodeShared::operator=(NodeShared&& o) noexcept {
  if (this != &o) {
    release();
    win_ = o.win_;
    data_ = o.data_;
    size_ = o.size_;
    o.win_ = MPI_WIN_NULL;
  }
  return *this;
}

NodeShared::~NodeShared() { release(); }

void NodeShared::release() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (win_ != MPI_WIN_NULL && !finalized) {
    const BlockingGuard guard("node shared memory (MPI_Win_free)", MPI_COMM_NULL);  // collective, blocking
    MPI_Win_free(&win_);
  }
}

Status NodeShared::sync(MPI_Comm node) {
  // Shared memory needs no copy, only ordering: rank 0's stores before everyone's loads.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return idle_barrier(node, kCollPollMicros);
}

Result<std::vector<std::string>> gather_bytes(const std::string& mine, int root, MPI_Comm comm) {
  const Deadline d;
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  uint64_t n = mine.size();
  std::vector<uint64_t> sizes(rank == root ? size : 0);
  MPI_Request req;
  H5CKPT_RETURN_IF_ERROR(
      mpi_status(MPI_Igather(&n, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, root, comm, &req), "MPI_Igather"));
  H5CKPT_RETURN_IF_ERROR(wait_until(1, &req, kCollPollMicros, "gather (sizes)", comm, d));
  if (rank == root) count_received(static_cast<uint64_t>(size - 1), static_cast<uint64_t>(size - 1) * sizeof n);
  // Point to point in pieces: the root receives each rank's bytes straight into its string.
  std::vector<std::string> out;
  std::vector<MPI_Request> reqs;
  Status posted;
  if (rank == root) {
    out.resize(size);
    for (int r = 0; r < size && posted.ok(); ++r) {
      if (r == root) {
        out[r] = mine;
        continue;
      }
      out[r].resize(sizes[r]);
      posted = post_chunks(false, out[r].data(), sizes[r], r, kGatherTag, comm, reqs);
    }
  } else {
    posted = post_chunks(true, const_cast<char*>(mine.data()), n, root, kGatherTag, comm, reqs);
  }
  H5CKPT_RETURN_IF_ERROR(finish(posted, reqs, "gather", comm, d));
  return out;
}

Result<std::string> scatter_bytes(const std::vector<std::string>& parts, int root, MPI_Comm comm) {
  const Deadline d;
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  std::vector<uint64_t> sizes;
  if (rank == root)
    for (int r = 0; r < size; ++r) sizes.push_back(r < static_cast<int>(parts.size()) ? parts[r].size() : 0);
  uint64_t n = 0;
  MPI_Request req;
  H5CKPT_RETURN_IF_ERROR(
      mpi_status(MPI_Iscatter(sizes.data(), 1, MPI_UINT64_T, &n, 1, MPI_UINT64_T, root, comm, &req), "MPI_Iscatter"));
  H5CKPT_RETURN_IF_ERROR(wait_until(1, &req, kCollPollMicros, "scatter (sizes)", comm, d));
  if (rank != root) count_received(1, sizeof n);
  std::string mine;
  std::vector<MPI_Request> reqs;
  Status posted;
  if (rank == root) {
    for (int r = 0; r < size && posted.ok(); ++r) {
      if (r != root && sizes[r] > 0)
        posted = post_chunks(true, const_cast<char*>(parts[r].data()), sizes[r], r, kScatterTag, comm, reqs);
    }
    if (root < static_cast<int>(parts.size())) mine = parts[root];
  } else {
    mine.resize(n);
    posted = post_chunks(false, mine.data(), n, root, kScatterTag, comm, reqs);
  }
  H5CKPT_RETURN_IF_ERROR(finish(posted, reqs, "scatter", comm, d));
  if (rank == root && static_cast<int>(parts.size()) != size)
    return Status(ErrorCode::kInternal,
                  "scatter_bytes: " + std::to_string(parts.size()) + " parts for " + std::to_string(size) + " ranks");
  return mine;
}

}  // namespace h5ckpt::comm
