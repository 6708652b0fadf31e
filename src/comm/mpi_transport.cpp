#include <algorithm>
#include <vector>

#include "comm/comm.h"
#include "comm/transport.h"

namespace h5ckpt::comm {

namespace {

class MpiTransport final : public Transport {
 public:
  MpiTransport(MPI_Comm comm, int poll_us) : comm_(comm), poll_us_(poll_us) {}
  ~MpiTransport() override {
    if (!requests_.empty()) (void)wait_all();
  }
  const char* name() const override { return "mpi"; }

  Status post_send(int peer, const void* data, uint64_t bytes, int tag) override {
    const char* p = static_cast<const char*>(data);
    const uint64_t piece = chunk_limit();  // MPI counts are int: large buffers go in pieces
    for (uint64_t off = 0; off < bytes; off += piece) {
      MPI_Request req;
      const int n = static_cast<int>(std::min(piece, bytes - off));
      H5CKPT_RETURN_IF_ERROR(mpi_status(MPI_Isend(p + off, n, MPI_BYTE, peer, tag, comm_, &req), "MPI_Isend"));
      requests_.push_back(req);
    }
    return Status::Ok();
  }

  Status post_recv(int peer, void* data, uint64_t bytes, int tag) override {
    char* p = static_cast<char*>(data);
    const uint64_t piece = chunk_limit();  // MPI counts are int: large buffers go in pieces
    for (uint64_t off = 0; off < bytes; off += piece) {
      MPI_Request req;
      const int n = static_cast<int>(std::min(piece, bytes - off));
      H5CKPT_RETURN_IF_ERROR(mpi_status(MPI_Irecv(p + off, n, MPI_BYTE, peer, tag, comm_, &req), "MPI_Irecv"));
      requests_.push_back(req);
    }
    return Status::Ok();
  }

  Status progress() override {
    if (requests_.empty()) return Status::Ok();
    int flag = 0;
    return mpi_status(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag, MPI_STATUSES_IGNORE),
                      "MPI_Testall");
  }

  Result<bool> test() override {
    if (requests_.empty()) return true;
    int flag = 0;
    H5CKPT_RETURN_IF_ERROR(mpi_status(
        MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag, MPI_STATUSES_IGNORE), "MPI_Testall"));
    if (flag) requests_.clear();
    return flag != 0;
  }

  // Asleep: a rank that has finished its reads waits here for transfers that need its peers'
  // reads first. A bulk transfer hardly notices the sleeps.
  Status wait_all() override {
    Status st = wait_asleep(static_cast<int>(requests_.size()), requests_.data(), poll_us_,
                            "transfers (MPI_Isend/MPI_Irecv)", comm_);
    requests_.clear();
    return st;
  }

 private:
  MPI_Comm comm_;
  int poll_us_;
  std::vector<MPI_Request> requests_;
};

}  // namespace

std::unique_ptr<Transport> make_mpi_transport(MPI_Comm comm, int poll_us) {
  return std::make_unique<MpiTransport>(comm, poll_us);
}

}  // namespace h5ckpt::comm
