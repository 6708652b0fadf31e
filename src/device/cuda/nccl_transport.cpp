// NCCL point-to-point between device buffers. Sends and receives are collected and issued in
// one NCCL group on the staging stream, so they follow the host-to-device copies queued before
// them, and NCCL matches each pair's messages in posting order (tags are not needed: both sides
// walk the load groups in the same order).
#include <nccl.h>

#include <chrono>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "comm/deadline.h"
#include "device/cuda/cuda_backend.h"
#include "device/cuda/cuda_staging.h"

namespace h5ckpt::device::cuda {

namespace {

constexpr int kPollMicros = 50;

Status nccl_status(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return Status::Ok();
  return Status(ErrorCode::kIo, std::string(what) + " failed: " + ncclGetErrorString(r));
}

// The communicator is non-blocking, so no NCCL call can hang: its state is polled here until it
// leaves ncclInProgress, within the timeout (comm/deadline.h) and with `mpi` for the report.
ncclResult_t settle(ncclComm_t comm, ncclResult_t r, const char* what, MPI_Comm mpi) {
  const comm::Deadline d;
  while (r == ncclInProgress) {
    comm::check_deadline(d, what, mpi);
    std::this_thread::sleep_for(std::chrono::microseconds(kPollMicros));
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return ncclInternalError;
  }
  return r;
}

// MPI_MIN of `v` over `comm`, within the timeout.
int all_min(int v, MPI_Comm comm) {
  int out = 0;
  MPI_Request req;
  if (MPI_Iallreduce(&v, &out, 1, MPI_INT, MPI_MIN, comm, &req) != MPI_SUCCESS) return 0;
  return comm::wait_asleep(1, &req, kPollMicros, "NCCL set-up (agreement)", comm).ok() ? out : 0;
}

class NcclTransport final : public comm::Transport {
 public:
  NcclTransport(ncclComm_t comm, CudaStaging& s, MPI_Comm mpi) : comm_(comm), s_(s), mpi_(mpi) {}
  ~NcclTransport() override {
    if (!ops_.empty()) (void)wait_all();
    ncclCommDestroy(comm_);
  }
  const char* name() const override { return "nccl"; }
  Status post_send(int peer, const void* data, uint64_t bytes, int) override {
    ops_.push_back(Op{true, peer, const_cast<void*>(data), bytes});
    return Status::Ok();
  }
  Status post_recv(int peer, void* data, uint64_t bytes, int) override {
    ops_.push_back(Op{false, peer, data, bytes});
    return Status::Ok();
  }
  Status progress() override { return Status::Ok(); }
  Status wait_all() override {
    if (ops_.empty()) return Status::Ok();
    Status st = nccl_status(ncclGroupStart(), "ncclGroupStart");
    for (const Op& op : ops_) {
      if (!st.ok()) break;
      st = op.send ? nccl_status(ncclSend(op.data, op.bytes, ncclUint8, op.peer, comm_, s_.stream()), "ncclSend")
                   : nccl_status(ncclRecv(op.data, op.bytes, ncclUint8, op.peer, comm_, s_.stream()), "ncclRecv");
    }
    Status ended = nccl_status(settle(comm_, ncclGroupEnd(), "NCCL transfers (ncclGroupEnd)", mpi_), "ncclGroupEnd");
    if (st.ok()) st = ended;
    ops_.clear();
    // Polled rather than synchronized: a peer that never posts its half would block forever.
    const comm::Deadline d;
    cudaError_t q = cudaErrorNotReady;
    while (st.ok() && (q = cudaStreamQuery(s_.stream())) == cudaErrorNotReady) {
      comm::check_deadline(d, "NCCL transfers (stream)", mpi_);
      std::this_thread::sleep_for(std::chrono::microseconds(kPollMicros));
    }
    if (st.ok()) st = cuda_status(q, "cudaStreamQuery");
    return st;
  }

 private:
  struct Op {
    bool send;
    int peer;
    void* data;
    uint64_t bytes;
  };
  ncclComm_t comm_;
  CudaStaging& s_;
  MPI_Comm mpi_;  // for the timeout report only
  std::vector<Op> ops_;
};

}  // namespace

std::unique_ptr<comm::Transport> make_nccl_transport(MPI_Comm comm, Staging& s, std::string* why) {
  auto* cs = dynamic_cast<CudaStaging*>(&s);
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // Every step is agreed, so either all ranks end up with a communicator or none does.
  ncclUniqueId id{};
  int ok = cs != nullptr;
  if (rank == 0 && ok) ok = ncclGetUniqueId(&id) == ncclSuccess;
  if (!all_min(ok, comm)) {
    *why = "a rank has no CUDA staging or ncclGetUniqueId failed";
    return nullptr;
  }
  MPI_Request req;
  if (MPI_Ibcast(&id, sizeof id, MPI_BYTE, 0, comm, &req) != MPI_SUCCESS ||
      !comm::wait_asleep(1, &req, kPollMicros, "NCCL set-up (unique id broadcast)", comm).ok()) {
    *why = "broadcasting the NCCL unique id failed";  // an MPI error: every rank's MPI fails the job
    return nullptr;
  }
  cudaSetDevice(cs->device());
  ncclComm_t nc = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init returns at once; settle() waits for the peers within the timeout
  ncclResult_t r = ncclCommInitRankConfig(&nc, size, id, rank, &config);
  if (nc != nullptr) r = settle(nc, r, "NCCL set-up (ncclCommInitRank)", comm);
  ok = r == ncclSuccess;
  const int all_ok = all_min(ok, comm);
  if (!all_ok) {
    if (ok) ncclCommDestroy(nc);
    *why = ok ? "ncclCommInitRank failed on another rank" : std::string("ncclCommInitRank: ") + ncclGetErrorString(r);
    return nullptr;
  }
  return std::make_unique<NcclTransport>(nc, *cs, comm);
}

}  // namespace h5ckpt::device::cuda
