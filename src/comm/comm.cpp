#include "comm/comm.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <thread>

namespace h5ckpt::comm {

namespace {
constexpr int kAgreePollMicros = 50;  // an agreement ends every phase: keep its latency small
}  // namespace

Status mpi_status(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return Status::Ok();
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return Status(ErrorCode::kMpi, std::string(what) + " failed: " + std::string(msg, len));
}

Result<Comm> Comm::duplicate(MPI_Comm c) {
  Comm out;
  H5CKPT_RETURN_IF_ERROR(mpi_status(MPI_Comm_dup(c, &out.c_), "MPI_Comm_dup"));
  MPI_Comm_set_errhandler(out.c_, MPI_ERRORS_RETURN);
  return out;
}

Comm& Comm::operator=(Comm&& o) noexcept {
  if (this != &o) {
    if (c_ != MPI_COMM_NULL) MPI_Comm_free(&c_);
    c_ = o.c_;
    o.c_ = MPI_COMM_NULL;
  }
  return *this;
}

Comm::~Comm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (c_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&c_);
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
  const size_t width = 1 + static_cast<size_t>(nflags);
  std::vector<int> mine(width), all(width * static_cast<size_t>(size));
  mine[0] = local.ok() ? 0 : 1;
  for (int f = 0; f < nflags; ++f) mine[1 + f] = flags[f];
  MPI_Request req;
  H5CKPT_RETURN_IF_ERROR(mpi_status(MPI_Iallgather(mine.data(), static_cast<int>(width), MPI_INT, all.data(),
                                                   static_cast<int>(width), MPI_INT, comm, &req),
                                    "agreement (MPI_Iallgather)"));
  H5CKPT_RETURN_IF_ERROR(wait_asleep(1, &req, kAgreePollMicros, "agreement (MPI_Testall)"));
  std::vector<int> failing;
  for (int r = 0; r < size; ++r) {
    if (all[width * r]) failing.push_back(r);
    for (int f = 0; f < nflags; ++f) flags[f] = std::min(flags[f], all[width * r + 1 + f]);
  }
  if (failing.empty()) return Status::Ok();
  // The first failing rank tells everyone what went wrong.
  const int teller = failing.front();
  std::string text;
  int code = 0;
  if (rank == teller) {
    text = local.message();
    code = static_cast<int>(local.code());
  }
  MPI_Bcast(&code, 1, MPI_INT, teller, comm);
  if (auto st = bcast_bytes(text, teller, comm); !st.ok()) return st;
  std::string ranks;
  for (size_t i = 0; i < failing.size() && i < 16; ++i) ranks += (i ? "," : "") + std::to_string(failing[i]);
  if (failing.size() > 16) ranks += ",... (" + std::to_string(failing.size()) + " ranks)";
  return Status(static_cast<ErrorCode>(code),
                "rank " + std::to_string(teller) + ": " + text + " [failed on rank(s) " + ranks + "]");
}

Status wait_asleep(int n, MPI_Request* requests, int poll_us, const char* what) {
  for (int done = 0;;) {
    H5CKPT_RETURN_IF_ERROR(mpi_status(MPI_Testall(n, requests, &done, MPI_STATUSES_IGNORE), what));
    if (done) return Status::Ok();
    std::this_thread::sleep_for(std::chrono::microseconds(poll_us));
  }
}

Status idle_barrier(MPI_Comm comm, int poll_us) {
  MPI_Request req;
  H5CKPT_RETURN_IF_ERROR(mpi_status(MPI_Ibarrier(comm, &req), "MPI_Ibarrier"));
  return wait_asleep(1, &req, poll_us, "MPI_Test(barrier)");
}

Status bcast_bytes(std::string& bytes, int root, MPI_Comm comm) {
  uint64_t n = bytes.size();
  H5CKPT_RETURN_IF_ERROR(mpi_status(MPI_Bcast(&n, 1, MPI_UINT64_T, root, comm), "MPI_Bcast"));
  bytes.resize(n);
  // Large payloads go in pieces below INT_MAX.
  const uint64_t kPiece = 1u << 30;
  for (uint64_t off = 0; off < n; off += kPiece) {
    const int len = static_cast<int>(std::min(kPiece, n - off));
    H5CKPT_RETURN_IF_ERROR(mpi_status(MPI_Bcast(bytes.data() + off, len, MPI_BYTE, root, comm), "MPI_Bcast"));
  }
  return Status::Ok();
}

Result<std::vector<std::string>> gather_bytes(const std::string& mine, int root, MPI_Comm comm) {
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int n = static_cast<int>(mine.size());
  std::vector<int> counts(rank == root ? size : 0), displs;
  H5CKPT_RETURN_IF_ERROR(
      mpi_status(MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, root, comm), "MPI_Gather"));
  std::string all;
  if (rank == root) {
    displs.resize(size);
    int64_t total = 0;
    for (int r = 0; r < size; ++r) {
      displs[r] = static_cast<int>(total);
      total += counts[r];
    }
    if (total > INT32_MAX) return Status(ErrorCode::kUnsupported, "gathered plan exceeds 2 GiB");
    all.resize(total);
  }
  H5CKPT_RETURN_IF_ERROR(mpi_status(MPI_Gatherv(mine.data(), n, MPI_BYTE, all.data(), counts.data(),
                                                displs.data(), MPI_BYTE, root, comm),
                                    "MPI_Gatherv"));
  std::vector<std::string> out;
  if (rank == root)
    for (int r = 0; r < size; ++r) out.emplace_back(all.substr(displs[r], counts[r]));
  return out;
}

Result<std::string> scatter_bytes(const std::vector<std::string>& parts, int root, MPI_Comm comm) {
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  std::vector<int> counts, displs;
  std::string all;
  if (rank == root) {
    int64_t total = 0;
    for (const auto& p : parts) {
      counts.push_back(static_cast<int>(p.size()));
      displs.push_back(static_cast<int>(total));
      total += p.size();
      all += p;
    }
    if (total > INT32_MAX) return Status(ErrorCode::kUnsupported, "scattered plan exceeds 2 GiB");
  }
  int n = 0;
  H5CKPT_RETURN_IF_ERROR(
      mpi_status(MPI_Scatter(counts.data(), 1, MPI_INT, &n, 1, MPI_INT, root, comm), "MPI_Scatter"));
  std::string mine(n, '\0');
  H5CKPT_RETURN_IF_ERROR(mpi_status(MPI_Scatterv(all.data(), counts.data(), displs.data(), MPI_BYTE,
                                                 mine.data(), n, MPI_BYTE, root, comm),
                                    "MPI_Scatterv"));
  return mine;
}

}  // namespace h5ckpt::comm
