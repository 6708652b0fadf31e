// NCCL point-to-point between device buffers. Sends and receives are collected and issued in
// one NCCL group on the staging stream, so they follow the host-to-device copies queued before
// them, and NCCL matches each pair's messages in posting order (tags are not needed: both sides
// walk the load groups in the same order).
#include <nccl.h>

#include <vector>

#include "comm/comm.h"
#include "device/cuda/cuda_backend.h"
#include "device/cuda/cuda_staging.h"

namespace h5ckpt::device::cuda {

namespace {

Status nccl_status(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return Status::Ok();
  return Status(ErrorCode::kIo, std::string(what) + " failed: " + ncclGetErrorString(r));
}

class NcclTransport final : public comm::Transport {
 public:
  NcclTransport(ncclComm_t comm, CudaStaging& s) : comm_(comm), s_(s) {}
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
    Status ended = nccl_status(ncclGroupEnd(), "ncclGroupEnd");
    if (st.ok()) st = ended;
    ops_.clear();
    if (st.ok()) st = cuda_status(cudaStreamSynchronize(s_.stream()), "cudaStreamSynchronize");
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
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
  if (!all_ok) {
    *why = "a rank has no CUDA staging or ncclGetUniqueId failed";
    return nullptr;
  }
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm);
  cudaSetDevice(cs->device());
  ncclComm_t nc = nullptr;
  const ncclResult_t r = ncclCommInitRank(&nc, size, id, rank);
  ok = r == ncclSuccess;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
  if (!all_ok) {
    if (ok) ncclCommDestroy(nc);
    *why = ok ? "ncclCommInitRank failed on another rank"
              : std::string("ncclCommInitRank: ") + ncclGetErrorString(r);
    return nullptr;
  }
  return std::make_unique<NcclTransport>(nc, *cs);
}

}  // namespace h5ckpt::device::cuda
