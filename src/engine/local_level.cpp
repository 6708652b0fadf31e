#include "engine/local_level.h"
#include "engine/memory_budget.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <map>
#include <set>
#include <thread>

#include "comm/deadline.h"
#include "device/staging.h"
#include "engine/pieces.h"
#include "logging/log.h"
#include "planner/box_math.h"
#include "storage/commit.h"
#include "storage/posix_io.h"
#include "util/bytes.h"
#include "util/dtype_convert.h"
#include "util/phase.h"

namespace h5ckpt::engine::local {

namespace fs = std::filesystem;
using logging::now_s;

namespace {

constexpr int kReplicaTag = 0x4c52;  // "LR"
constexpr int kServeTag = 0x4c53;
constexpr uint64_t kReplicaChunk = 8ull << 20;

// Tests: H5CKPT_TEST_KILL_AT=point[:rank[:nth]] kills this process with SIGKILL the nth time (default
// first) it reaches `point` (on `rank` only, when given), as a node failure would: no destructor,
// no flush, no message to the others.
void kill_point(const char* point, int rank) {
  const char* at = std::getenv("H5CKPT_TEST_KILL_AT");
  if (at == nullptr) return;
  static std::map<std::string, int> reached;  // only the thread running the save calls this
  std::string spec(at);
  std::vector<std::string> f;
  for (size_t b = 0, e; b <= spec.size(); b = e + 1) {
    e = spec.find(':', b);
    if (e == std::string::npos) e = spec.size();
    f.push_back(spec.substr(b, e - b));
  }
  if (f[0] != point || (f.size() > 1 && !f[1].empty() && std::atoi(f[1].c_str()) != rank)) return;
  const int nth = f.size() > 2 ? std::atoi(f[2].c_str()) : 1;
  if (++reached[point] != nth) return;
  std::fprintf(stderr, "h5ckpt: H5CKPT_TEST_KILL_AT=%s: rank %d kills itself\n", at, rank);
  std::fflush(stderr);
  ::raise(SIGKILL);
}

Status write_all(int fd, const char* data, uint64_t n, uint64_t off, const std::string& path) {
  while (n) {
    const ssize_t w = storage::io::pwrite(fd, data, std::min<uint64_t>(n, 1ull << 30), static_cast<off_t>(off));
    if (w < 0) return storage::io::error("pwrite", path, errno);
    if (w == 0) return storage::io::error("pwrite", path, EIO);
    data += w, n -= static_cast<uint64_t>(w), off += static_cast<uint64_t>(w);
  }
  return Status::Ok();
}

Status read_all(int fd, char* data, uint64_t n, uint64_t off, const std::string& path) {
  while (n) {
    const ssize_t r = storage::io::pread(fd, data, std::min<uint64_t>(n, 1ull << 30), static_cast<off_t>(off));
    if (r < 0) return storage::io::error("pread", path, errno);
    if (r == 0) return Status(ErrorCode::kCorrupt, "'" + path + "' is shorter than its manifest says");
    data += r, n -= static_cast<uint64_t>(r), off += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

Status sync_close(int fd, const std::string& path) {
  Status st;
  if (storage::io::fsync(fd) != 0) st = storage::io::error("fsync", path, errno);
  storage::io::close(fd);
  return st;
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i == 8) return s + ", ... (" + std::to_string(ranks.size()) + " in all)";
    s += (i ? "," : "") + std::to_string(ranks[i]);
  }
  return s;
}

// Non-blocking collectives and point-to-point messages bounded by the deadline.
Status wait_all(std::vector<MPI_Request>& reqs, const char* what, MPI_Comm comm) {
  if (reqs.empty()) return Status::Ok();
  // Bulk bytes: polled without sleeping (a large message advances only inside MPI calls).
  Status st = comm::wait_asleep(static_cast<int>(reqs.size()), reqs.data(), 0, what, comm);
  reqs.clear();
  return st;
}

// Messages of up to comm::chunk_limit() bytes: `n` bytes at `p` to/from `peer`.
void post_chunks(bool send, char* p, uint64_t n, int peer, int tag, MPI_Comm comm, std::vector<MPI_Request>& reqs,
                 Status& st) {
  const uint64_t limit = std::min<uint64_t>(comm::chunk_limit(), 1ull << 30);
  for (uint64_t at = 0; at < n && st.ok(); at += limit) {
    const int count = static_cast<int>(std::min(limit, n - at));
    MPI_Request r;
    const int rc = send ? MPI_Isend(p + at, count, MPI_BYTE, peer, tag, comm, &r)
                        : MPI_Irecv(p + at, count, MPI_BYTE, peer, tag, comm, &r);
    if (rc != MPI_SUCCESS) st = comm::mpi_status(rc, send ? "MPI_Isend" : "MPI_Irecv");
    else reqs.push_back(r);
  }
}

// ---- element runs between a saved region and a wanted shard ---------------------------------

// fn(src, dst, n): elements [src, src+n) of `region`'s bytes go to [dst, dst+n) of `want`'s
// buffer. The wanted part is cut to the stored shape (padded items); both sides of a transfer
// call this with the same arguments and so agree on the order and sizes.
template <class Fn>
void for_each_overlap(const Shape& stored, const ShardSpec& region, const ShardSpec& want, Fn&& fn) {
  const Box whole{Shape(stored.size(), 0), stored};
  const planner::Frame src = planner::frame_of(region), dst = planner::frame_of(want);
  const std::vector<Box> rboxes = planner::shard_boxes(region);
  for (const Box& wb : planner::shard_boxes(want)) {
    if (wb.ndim() != stored.size()) continue;
    auto clip = planner::intersect(wb, whole);
    if (!clip) continue;
    for (const Box& rb : rboxes)
      if (auto x = planner::intersect(*clip, rb)) planner::for_each_run(*x, src, dst, fn);
  }
}


// Byte offset of every region in its writer's local file: regions in plan order, per writer.
std::vector<std::vector<uint64_t>> region_file_offsets(const std::vector<planner::TensorPlan>& tensors, size_t world) {
  std::vector<uint64_t> running(world, 0);
  std::vector<std::vector<uint64_t>> off(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    const uint64_t esize = dtype_size(tensors[t].dtype);
    for (const auto& r : tensors[t].regions) {
      const size_t w = static_cast<size_t>(r.writer) < world ? static_cast<size_t>(r.writer) : 0;
      off[t].push_back(running[w]);
      running[w] += static_cast<uint64_t>(r.shard.numel()) * esize;
    }
  }
  return off;
}

// Reads a local file's pieces in order for the persist (a WriteSource over the local copy).
class LocalFileSource : public WriteSource {
 public:
  LocalFileSource(std::string path, const std::vector<planner::WriteItem>& writes)
      : path_(std::move(path)), writes_(writes) {
    uint64_t most = 0;
    for (const auto& w : writes_) most = std::max(most, w.bytes);
    buf_.resize(most);
    if (most) {
      fd_ = storage::io::open(path_, O_RDONLY);
      if (fd_ < 0) status_ = storage::io::error("open", path_, errno);
    }
  }
  ~LocalFileSource() override {
    if (fd_ >= 0) storage::io::close(fd_);
  }
  std::optional<SourcedWrite> next() override {
    if (i_ == writes_.size()) return std::nullopt;
    const planner::WriteItem& w = writes_[i_++];
    if (status_.ok() && w.bytes) status_ = read_all(fd_, buf_.data(), w.bytes, at_, path_);
    at_ += w.bytes;
    return SourcedWrite{&w, buf_.data(), false};
  }
  Status status() override { return status_; }

 private:
  std::string path_;
  const std::vector<planner::WriteItem>& writes_;
  std::vector<char> buf_;
  int fd_ = -1;
  size_t i_ = 0;
  uint64_t at_ = 0;
  Status status_;
};

// The partner copies, moved while this rank writes its own file: its byte stream goes to its
// targets in chunks of kReplicaChunk (two buffers, so filling one overlaps sending the other),
// and every origin's stream arrives into two posted receives per origin and is written to
// <partial>/rank-<origin>.bin as it completes. MPI keeps the messages of one sender in order, so
// chunks arrive in file order. A rank whose own write failed still sends and receives every
// chunk, so no peer waits for it; the agreement after the write phase fails the save.
class ReplicaStream {
 public:
  ReplicaStream(const NodeMap& nodes, int replicas, int me, uint64_t my_bytes, const std::string& partial,
                MPI_Comm comm)
      : my_bytes_(my_bytes), comm_(comm) {
    targets_ = replica_targets(nodes, me, replicas);
    for (int q = 0; q < static_cast<int>(nodes.node_of.size()); ++q) {
      if (q == me) continue;
      auto t = replica_targets(nodes, q, replicas);
      if (std::find(t.begin(), t.end(), me) != t.end()) in_.push_back(Incoming{q});
    }
    // Sizes first: each origin's stream length.
    std::vector<MPI_Request> reqs;
    for (auto& x : in_) post(false, &x.bytes, 8, x.rank, kReplicaTag - 1, reqs);
    for (int t : targets_) post(true, &my_bytes_, 8, t, kReplicaTag - 1, reqs);
    if (Status w = wait_all(reqs, "exchanging partner-copy sizes", comm_); !w.ok()) st_ = w;
    for (auto& x : in_) {
      x.path = (fs::path(partial) / storage::local_rank_file(x.rank)).string();
      x.fd = storage::io::open(x.path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
      if (x.fd < 0 && st_.ok()) st_ = storage::io::error("open", x.path, errno);
      x.hash = XXH3_createState();
      XXH3_64bits_reset(x.hash);
      for (int b = 0; b < 2; ++b) repost(x, b);
    }
  }
  ~ReplicaStream() {
    for (auto& x : in_) {
      if (x.fd >= 0) storage::io::close(x.fd);
      if (x.hash) XXH3_freeState(x.hash);
    }
  }
  /// The next bytes of this rank's stream (in file order).
  void push(const char* data, uint64_t n) {
    while (n) {
      if (!targets_.empty() && fill_ == 0) wait_out(cur_);  // the buffer's previous chunk is sent
      const uint64_t room = std::min<uint64_t>(kReplicaChunk, my_bytes_ - sent_) - fill_;
      if (room == 0) {  // more bytes than announced: a planning bug, the partners keep what was promised
        if (st_.ok()) st_ = Status(ErrorCode::kInternal, "local write longer than planned");
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

  /// Completes the exchange: pads a short stream, waits for every chunk both ways, checks sizes.
  Status finish(uint64_t* received, std::vector<std::pair<int, uint64_t>>* sums) {
    if (sent_ + fill_ < my_bytes_) {
      if (st_.ok()) st_ = Status(ErrorCode::kInternal, "local write shorter than planned");
      std::vector<char> zeros(kReplicaChunk, 0);
      while (sent_ + fill_ < my_bytes_) push(zeros.data(), std::min<uint64_t>(kReplicaChunk, my_bytes_ - sent_ - fill_));
    }
    std::vector<MPI_Request> reqs;
    for (int b = 0; b < 2; ++b)
      for (auto& r : out_req_[b]) reqs.push_back(r);
    for (int b = 0; b < 2; ++b) out_req_[b].clear();
    while (true) {
      progress();
      bool done = true;
      for (auto& x : in_) done = done && x.next_write * kReplicaChunk >= x.bytes;
      if (done) break;
      std::this_thread::yield();
      check("receiving partner copies");
    }
    if (Status w = wait_all(reqs, "sending partner copies", comm_); !w.ok() && st_.ok()) st_ = w;
    for (auto& x : in_) {
      *received += x.bytes;
      sums->push_back({x.rank, XXH3_64bits_digest(x.hash)});
      if (x.fd >= 0) {
        Status closed = sync_close(x.fd, x.path);
        x.fd = -1;
        if (st_.ok()) st_ = closed;
      }
    }
    return st_;
  }

 private:
  struct Incoming {
    int rank;
    uint64_t bytes = 0;
    std::string path;
    int fd = -1;
    XXH3_state_t* hash = nullptr;
    std::vector<char> buf[2];
    MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    uint64_t chunk_of[2] = {0, 0};
    uint64_t next_post = 0, next_write = 0;
  };
  void post(bool send, void* p, uint64_t n, int peer, int tag, std::vector<MPI_Request>& reqs) {
    post_chunks(send, static_cast<char*>(p), n, peer, tag, comm_, reqs, st_);
  }
  void repost(Incoming& x, int b) {
    const uint64_t at = x.next_post * kReplicaChunk;
    if (at >= x.bytes) return;
    const uint64_t n = std::min(kReplicaChunk, x.bytes - at);
    x.buf[b].resize(n);
    const int rc = MPI_Irecv(x.buf[b].data(), static_cast<int>(n), MPI_BYTE, x.rank, kReplicaTag, comm_, &x.req[b]);
    if (rc != MPI_SUCCESS && st_.ok()) st_ = comm::mpi_status(rc, "MPI_Irecv");
    x.chunk_of[b] = x.next_post++;
  }
  // Writes every origin's chunks that have arrived, in order, and posts the following ones.
  void progress() {
    for (auto& x : in_) {
      while (x.next_write * kReplicaChunk < x.bytes) {
        const int b = static_cast<int>(x.next_write % 2);
        if (x.req[b] == MPI_REQUEST_NULL || x.chunk_of[b] != x.next_write) break;
        int flag = 0;
        const int rc = MPI_Test(&x.req[b], &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
          if (st_.ok()) st_ = comm::mpi_status(rc, "MPI_Test");
          return;
        }
        if (!flag) break;
        const uint64_t at = x.next_write * kReplicaChunk;
        XXH3_64bits_update(x.hash, x.buf[b].data(), x.buf[b].size());
        if (st_.ok() && x.fd >= 0) st_ = write_all(x.fd, x.buf[b].data(), x.buf[b].size(), at, x.path);
        ++x.next_write;
        repost(x, b);
      }
    }
    for (int b = 0; b < 2; ++b)
      if (!out_req_[b].empty()) {
        int flag = 0;
        MPI_Testall(static_cast<int>(out_req_[b].size()), out_req_[b].data(), &flag, MPI_STATUSES_IGNORE);
        if (flag) out_req_[b].clear();
      }
  }
  void flush() {
    if (!targets_.empty())
      for (int t : targets_) post_chunks(true, out_[cur_].data(), fill_, t, kReplicaTag, comm_, out_req_[cur_], st_);
    sent_ += fill_;
    fill_ = 0;
    cur_ ^= 1;
  }
  void wait_out(int b) {  // keeps receiving while a send drains, so two partners never wait on each other
    while (!out_req_[b].empty()) {
      progress();
      if (out_req_[b].empty()) break;
      std::this_thread::yield();
      check("sending partner copies");
    }
  }

  void check(const char* what) {  // the deadline, and peers that passed theirs, every few ms
    const auto now = std::chrono::steady_clock::now();
    if (now < next_check_) return;
    comm::check_deadline(deadline_, what, comm_);
    next_check_ = now + std::chrono::milliseconds(5);
  }

  comm::Deadline deadline_;
  std::chrono::steady_clock::time_point next_check_{};
  uint64_t my_bytes_;
  MPI_Comm comm_;
  std::vector<int> targets_;
  std::vector<Incoming> in_;
  std::vector<char> out_[2];
  std::vector<MPI_Request> out_req_[2];
  int cur_ = 0;
  uint64_t fill_ = 0, sent_ = 0;
  Status st_;
};

// Each node's leader leaves a marker named after its node; one that sees another node's marker
// shares the directory with that node (a shared file system without "{node}"), which is refused:
// the nodes would write the same partial directory and claim each other's files. Collective.
Status check_node_local(const std::string& dir, const NodeMap& nodes, bool leader, MPI_Comm world) {
  auto marker = [&](int n) { return (fs::path(dir) / (".h5ckpt-node-" + std::to_string(n))).string(); };
  Status st;
  if (leader) {
    const int fd = storage::io::open(marker(nodes.my_node), O_CREAT | O_WRONLY, 0644);
    if (fd < 0) st = storage::io::error("open", marker(nodes.my_node), errno);
    else storage::io::close(fd);
  }
  st = comm::agree(st, world);
  Status shared;
  if (st.ok() && leader) {
    for (int n = 0; n < nodes.nodes() && shared.ok(); ++n) {
      std::error_code ec;
      if (n != nodes.my_node && fs::exists(marker(n), ec))
        shared = Status(ErrorCode::kInvalidArgument,
                        "local_dir '" + dir + "' is shared by nodes " + std::to_string(std::min(n, nodes.my_node)) +
                            " and " + std::to_string(std::max(n, nodes.my_node)) +
                            ": it must be node-local storage, or contain \"{node}\" to give each node its own");
    }
  }
  Status both = comm::agree(st.ok() ? shared : st, world);  // everyone has looked before anyone removes
  if (leader) (void)storage::io::unlink(marker(nodes.my_node));
  return both;
}

}  // namespace

Result<std::shared_ptr<const NodeMap>> make_node_map(const Topology::Impl& topo) {
  const MPI_Comm world = topo.world.get();
  const int size = topo.world.size();
  int leader = topo.node_ranks.empty() ? topo.world.rank() : topo.node_ranks.front();
  std::vector<int> leaders(size);
  MPI_Request req;
  int rc = MPI_Iallgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, world, &req);
  if (rc != MPI_SUCCESS) return comm::mpi_status(rc, "MPI_Iallgather");
  H5CKPT_RETURN_IF_ERROR(comm::wait_asleep(1, &req, 100, "exchanging the node map", world));
  std::vector<int> distinct = leaders;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  auto map = std::make_shared<NodeMap>();
  map->members.resize(distinct.size());
  map->node_of.resize(size);
  for (int r = 0; r < size; ++r) {
    const int n = static_cast<int>(std::lower_bound(distinct.begin(), distinct.end(), leaders[r]) - distinct.begin());
    map->node_of[r] = n;
    map->members[n].push_back(r);
  }
  map->my_node = map->node_of[topo.world.rank()];
  return std::shared_ptr<const NodeMap>(std::move(map));
}

std::vector<int> replica_targets(const NodeMap& nodes, int rank, int replicas) {
  std::vector<int> out;
  const int n = nodes.node_of[rank];
  const auto& mine = nodes.members[n];
  const int index = static_cast<int>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  for (int k = 1; k <= std::min(replicas, nodes.nodes() - 1); ++k) {
    const auto& other = nodes.members[(n + k) % nodes.nodes()];
    out.push_back(other[index % other.size()]);
  }
  return out;
}

bool should_persist(const SaveOptions& options, const CheckpointerOptions& copts, int64_t count) {
  if (options.persist) return true;
  if (copts.persist_every <= 0) return false;
  const int64_t n = options.step >= 0 ? options.step : count;
  return n % copts.persist_every == 0;
}

Result<SaveReport> save_local(const Topology::Impl& comms, SaveJob& job, const CheckpointerOptions& copts,
                              LocalSave& local, WriteSource& source) {
  const MPI_Comm world = comms.world.get();
  const int me = comms.world.rank();
  const bool coordinator = me == comms.coordinator;
  const bool leader = comms.leader();
  const std::string partial = storage::local_partial_dir(local.dir, local.name);
  const std::string final_dir = (fs::path(local.dir) / local.name).string();
  const std::string mine = (fs::path(partial) / storage::local_rank_file(me)).string();
  SaveReport& report = job.report;
  auto fail = [&](const Status& st) {
    while (auto w = source.next()) source.done(*w);  // the async snapshot must not wait for us
    if (leader) (void)storage::remove_tree(partial);
    (void)comm::idle_barrier(comms.node.get());  // every failure is collective: return once it is gone
    return st.with_context("local save of '" + job.path + "' to '" + local.dir + "'");
  };

  // 1. This node's partial directory, made by its leader; stale ones of crashed saves go too.
  PhaseScope scope("save_local", "write");
  const double t0 = now_s();
  Status st;
  if (leader) {
    std::error_code ec;
    fs::create_directories(local.dir, ec);
    if (ec) st = Status(ErrorCode::kIo, "cannot create '" + local.dir + "': " + ec.message());
  }
  if (local.check_private) {  // a directory that several nodes share would mix their files
    if (Status a = comm::agree(st, world); !a.ok()) return fail(a);
    st = check_node_local(local.dir, *local.nodes, leader, world);
    if (Status a = comm::agree(st, world); !a.ok()) return fail(a);
  }
  if (leader) {
    if (st.ok()) st = storage::remove_tree(partial);
    if (st.ok()) st = storage::make_dir(partial);
  }
  if (Status a = comm::agree(st, world); !a.ok()) return fail(a);

  // 2. This rank's planned bytes, in plan order, to its own file, streamed to the partner nodes
  // as they are written (and the partners' streams received into their copies).
  storage::LocalRankFile file;
  uint64_t received = 0;
  std::vector<std::pair<int, uint64_t>> replica_sums;
  {
    ReplicaStream stream(*local.nodes, copts.local_replicas, me, local.my_bytes, partial, world);
    const int fd = storage::io::open(mine, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0) st = storage::io::error("open", mine, errno);
    XXH3_state_t* h = XXH3_createState();
    XXH3_64bits_reset(h);
    while (auto w = source.next()) {
      if (st.ok()) st = source.status();
      if (w->write->bytes) {
        if (st.ok()) st = write_all(fd, w->data, w->write->bytes, file.bytes, mine);
        XXH3_64bits_update(h, w->data, w->write->bytes);
        stream.push(w->data, w->write->bytes);
      }
      file.bytes += w->write->bytes;
      source.done(*w);
    }
    file.xxh3 = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    if (fd >= 0) {
      Status closed = sync_close(fd, mine);
      if (st.ok()) st = closed;
    }
    report.write_s = now_s() - t0;
    const double t_rep = now_s();
    Status streamed = stream.finish(&received, &replica_sums);
    if (st.ok()) st = streamed;
    report.replicate_s = now_s() - t_rep;
  }
  report.bytes_written = file.bytes;
  kill_point("local_write", me);
  kill_point("local_replica", me);
  if (Status a = comm::agree(st, world); !a.ok()) return fail(a);

  // 3. The manifest: sizes and checksums to the coordinator, the whole manifest to everyone.
  ByteWriter w;
  w.put<uint64_t>(file.bytes), w.put<uint64_t>(file.xxh3);
  auto gathered = comms.gather(w.str());
  if (!gathered.ok()) return fail(gathered.status());
  Result<std::string> manifest_bytes = std::string();
  if (coordinator) {
    storage::LocalManifest m;
    m.name = local.name;
    m.shared_path = storage::canonical_path(job.path);
    m.step = job.options.step;
    m.library_version = H5CKPT_VERSION;
    m.sizes = comms.sizes;
    m.coords = comms.all_coords;
    m.node_of_rank = local.nodes->node_of;
    m.attributes = job.attributes;
    m.plan = wire::encode_tensors(*job.plan);
    for (const std::string& g : *gathered) {
      ByteReader r(g);
      storage::LocalRankFile f{r.get<uint64_t>(), r.get<uint64_t>()};
      if (!(r.ok() && r.at_end())) manifest_bytes = Status(ErrorCode::kInternal, "malformed file record");
      m.files.push_back(f);
    }
    if (manifest_bytes.ok()) manifest_bytes = storage::encode_local_manifest(m);
  }
  auto shared_manifest = bcast_outcome(manifest_bytes, comms);
  if (!shared_manifest.ok()) return fail(shared_manifest.status());
  auto manifest = storage::decode_local_manifest(*shared_manifest);
  if (!manifest.ok()) return fail(manifest.status());

  // 4. Every partner copy received must be the file its origin wrote.
  st = Status::Ok();
  for (const auto& [origin, sum] : replica_sums)
    if (st.ok() && sum != manifest->files[static_cast<size_t>(origin)].xxh3)
      st = Status(ErrorCode::kCorrupt, "the copy of rank " + std::to_string(origin) + "'s file received on rank " +
                                           std::to_string(me) + " does not match its checksum");
  if (Status a = comm::agree(st, world); !a.ok()) return fail(a);

  // 5. Commit: manifests written everywhere first, then every node renames its directory.
  PhaseScope commit_scope("save_local", "commit");
  const double t_commit = now_s();
  if (leader)
    st = storage::write_file_atomic((fs::path(partial) / storage::kLocalManifestName).string(), *shared_manifest);
  if (Status a = comm::agree(st, world); !a.ok()) return fail(a);
  if (leader) {
    st = Status::Ok();
    std::error_code ec;
    if (fs::exists(final_dir, ec)) st = storage::remove_tree(final_dir);  // a re-save of the same step
    kill_point("local_commit", me);
    if (st.ok() && storage::io::rename(partial, final_dir) != 0)
      st = storage::io::error("rename", partial + "' to '" + final_dir, errno);
    if (st.ok()) st = storage::fsync_path(local.dir);
  }
  if (Status a = comm::agree(st, world); !a.ok()) return fail(a);
  if (leader) storage::retain_local(local.dir, std::max<int64_t>(copts.local_keep, 1), local.name);
  report.commit_s = now_s() - t_commit;
  report.path = final_dir;
  report.level = "local";
  report.bytes_total = 0;
  for (const auto& t : *job.plan) report.bytes_total += t.nbytes();
  logging::log().info("local save '{}' committed: {} bytes here, {} bytes of replicas received, write {:.3f}s "
                      "replicas {:.3f}s commit {:.3f}s",
                      final_dir, file.bytes, received, report.write_s, report.replicate_s, report.commit_s);
  if (!local.persist) {
    report.total_s = now_s() - job.t0;
    return report;
  }

  // 6. Persist from the local copy: the normal shared checkpoint, same plan, same writes.
  const double t_persist = now_s();
  H5CKPT_RETURN_IF_ERROR(prepare_shared_dir(comms, job));
  LocalFileSource from_file((fs::path(final_dir) / storage::local_rank_file(me)).string(), local.persist_writes);
  SaveReport local_report = report;
  job.report.bytes_written = 0;
  kill_point("persist_write", me);
  H5CKPT_RETURN_IF_ERROR(save_write(comms, job, copts, from_file));
  auto shared = save_commit(comms, job, copts);
  if (!shared.ok()) return shared.status().with_context("persisting local checkpoint '" + final_dir + "'");
  local_report.persisted = shared->path;
  local_report.persist_s = now_s() - t_persist;
  local_report.total_s = now_s() - job.t0;
  return local_report;
}

// ---- resolution across levels ---------------------------------------------------------------

namespace {

struct Candidate {
  std::string name;
  uint64_t id = 0;
  int64_t step = -1;
  uint64_t world = 0;
  std::vector<int> node_of_rank;                // saved node of each rank (for messages)
  std::map<int, std::vector<int>> holders;      // saved rank -> live nodes holding its file
  int manifest_node = -1;                       // a live node holding the manifest
};

std::string encode_listing(const std::vector<storage::LocalEntry>& entries) {
  ByteWriter w;
  w.put<uint64_t>(entries.size());
  for (const auto& e : entries) {
    w.put_string(e.name);
    w.put<uint64_t>(e.manifest_id);
    w.put<int64_t>(e.step);
    w.put<uint64_t>(e.world);
    w.put<uint64_t>(e.ranks.size());
    for (int r : e.ranks) w.put<int64_t>(r);
    w.put<uint64_t>(e.node_of_rank.size());
    for (int n : e.node_of_rank) w.put<int64_t>(n);
  }
  return w.str();
}

Status decode_listing(const std::string& bytes, int node, std::map<std::pair<std::string, uint64_t>, Candidate>& c) {
  ByteReader r(bytes);
  const uint64_t n = r.get<uint64_t>();
  for (uint64_t i = 0; i < n && r.ok(); ++i) {
    std::string name = r.get_string();
    const uint64_t id = r.get<uint64_t>();
    const int64_t step = r.get<int64_t>();
    const uint64_t world = r.get<uint64_t>();
    Candidate& x = c[{name, id}];
    x.name = name, x.id = id, x.step = step, x.world = world;
    x.manifest_node = x.manifest_node < 0 ? node : x.manifest_node;
    const uint64_t k = r.get<uint64_t>();
    for (uint64_t j = 0; j < k && r.ok(); ++j) x.holders[static_cast<int>(r.get<int64_t>())].push_back(node);
    const uint64_t m = r.get<uint64_t>();
    std::vector<int> nodes;
    for (uint64_t j = 0; j < m && r.ok(); ++j) nodes.push_back(static_cast<int>(r.get<int64_t>()));
    if (!nodes.empty()) x.node_of_rank = std::move(nodes);
  }
  if (!(r.ok() && r.at_end())) return Status(ErrorCode::kInternal, "malformed local listing from node " + std::to_string(node));
  return Status::Ok();
}

// The missing ranks of a candidate, as a sentence naming them and the nodes that saved them.
std::string missing_pieces(const Candidate& c, const std::set<std::pair<int, int>>& bad) {
  std::map<int, std::vector<int>> by_node;
  for (uint64_t r = 0; r < c.world; ++r) {
    auto it = c.holders.find(static_cast<int>(r));
    bool any = false;
    if (it != c.holders.end())
      for (int n : it->second) any = any || !bad.count({n, static_cast<int>(r)});
    if (!any) by_node[r < c.node_of_rank.size() ? c.node_of_rank[r] : -1].push_back(static_cast<int>(r));
  }
  std::string s;
  for (const auto& [node, ranks] : by_node)
    s += std::string(s.empty() ? "" : "; ") + "ranks " + join_ranks(ranks) + " (saved on node " + std::to_string(node) +
         ")";
  return s;
}

}  // namespace

Result<Resolution> resolve(const Topology::Impl& topo, const std::string& path, const CheckpointerOptions& copts,
                           const NodeMap& nodes, bool with_info) {
  PhaseScope scope("load", "resolve_levels");
  const MPI_Comm world = topo.world.get();
  const int me = topo.world.rank();
  const bool coordinator = me == topo.coordinator;
  const std::string dir = storage::expand_local_dir(copts.local_dir, nodes.my_node);

  // Every node leader lists its local checkpoints for `path`.
  std::string listing;
  if (topo.leader()) {
    listing = encode_listing(storage::list_local_checkpoints(dir, path));
  }
  H5CKPT_ASSIGN_OR_RETURN(auto lists, topo.gather(listing));

  std::map<std::pair<std::string, uint64_t>, Candidate> cands;
  // The shared level, read once by the coordinator: its step for the choice, its directory (after
  // `latest`) for the load, or why there is none.
  Result<CheckpointInfo> shared = Status(ErrorCode::kNotFound, "not read");
  int64_t shared_step = -1;
  std::string shared_problem;
  Status st;
  if (coordinator) {
    for (size_t r = 0; r < lists.size() && st.ok(); ++r)
      if (!lists[r].empty()) st = decode_listing(lists[r], nodes.node_of[r], cands);
    shared = read_checkpoint_info(path);
    if (shared.ok()) shared_step = shared->step;
    else shared_problem = shared.status().message();
  }
  std::set<std::pair<int, int>> bad;  // (node, saved rank) whose file failed its check
  for (int round = 0; round < 4; ++round) {
    // The coordinator chooses; the choice (or "shared") goes to every rank.
    Result<std::string> choice = std::string();
    if (coordinator && st.ok()) {
      std::vector<const Candidate*> order;
      for (const auto& [k, c] : cands) order.push_back(&c);
      std::sort(order.begin(), order.end(), [](const Candidate* a, const Candidate* b) {
        return a->step != b->step ? a->step > b->step : a->name > b->name;
      });
      std::string why;
      ByteWriter w;
      const Candidate* pick = nullptr;
      for (const Candidate* c : order) {
        if (c->step < shared_step) break;  // the shared level is newer
        std::string missing = missing_pieces(*c, bad);
        if (missing.empty()) {
          pick = c;
          break;
        }
        why += (why.empty() ? "" : "; ") + std::string("local checkpoint '") + c->name + "' (step " +
               std::to_string(c->step) + ") cannot be served: no intact copy on any live node of the files of " +
               missing;
      }
      if (pick) {
        // A server for every saved rank: the node that saved it when it still holds the file
        // (the same layout then reads only its own disk), else the least busy holder; then one
        // of that node's ranks in turn.
        std::vector<int> load(nodes.nodes(), 0), servers(pick->world, -1);
        int from_replicas = 0;
        for (uint64_t r = 0; r < pick->world; ++r) {
          const int saved_on = r < pick->node_of_rank.size() ? pick->node_of_rank[r] : -1;
          int best = -1;
          for (int n : pick->holders.at(static_cast<int>(r))) {
            if (bad.count({n, static_cast<int>(r)})) continue;
            if (n == saved_on) {
              best = n;
              break;
            }
            if (best < 0 || load[n] < load[best]) best = n;
          }
          const auto& m = nodes.members[best];
          servers[r] = m[load[best]++ % m.size()];
          if (r < pick->node_of_rank.size() && pick->node_of_rank[r] != best) ++from_replicas;
        }
        std::string reason = "local checkpoint '" + pick->name + "' (step " + std::to_string(pick->step) +
                             ") from node-local storage, " + std::to_string(from_replicas) + " of " +
                             std::to_string(pick->world) + " ranks' files served from partner copies; the shared "
                             "level's newest is " +
                             (shared_step >= 0 ? "step " + std::to_string(shared_step) : "none");
        if (!why.empty()) reason += " (" + why + ")";
        w.put<uint64_t>(1), w.put_string(reason), w.put_string(pick->name), w.put<uint64_t>(pick->id);
        w.put<int64_t>(nodes.members[pick->manifest_node].front());
        w.put<uint64_t>(servers.size());
        for (int s : servers) w.put<int64_t>(s);
      } else {
        std::string reason = shared_step >= 0
                                 ? "shared checkpoint at '" + path + "' (step " + std::to_string(shared_step) + ")"
                                 : "shared level at '" + path + "' (" +
                                       (shared_problem.empty() ? "nothing there" : shared_problem) + ")";
        if (!why.empty()) reason += ": " + why;
        else if (order.empty()) reason += ": no local checkpoint for it on any node";
        else reason += ": it is at least as new as every local checkpoint";
        logging::log().info("load of '{}' reads the {}", path, reason);
        w.put<uint64_t>(0), w.put_string(reason), w.put_string(shared.ok() ? shared->path : std::string());
        if (!shared.ok()) choice = shared.status().with_context(reason);  // every rank returns it
      }
      if (choice.ok()) choice = w.str();
    }
    if (!st.ok()) choice = st;
    H5CKPT_ASSIGN_OR_RETURN(std::string msg, bcast_outcome(choice, topo));
    ByteReader r(msg);
    Resolution res;
    res.local = r.get<uint64_t>() != 0;
    res.reason = r.get_string();
    if (!res.local) {
      res.info.path = r.get_string();  // the shared checkpoint the ordinary load then reads
      res.load_path = res.info.path;
      if (!with_info) return res;
      auto info = read_checkpoint_info(res.info.path);  // every rank: the caller builds its state from it
      if (!info.ok()) return info.status().with_context(res.reason);
      res.info = std::move(info).value();
      return res;
    }
    const std::string name = r.get_string();
    const uint64_t id = r.get<uint64_t>();
    const int manifest_root = static_cast<int>(r.get<int64_t>());
    const uint64_t n = r.get<uint64_t>();
    for (uint64_t i = 0; i < n; ++i) res.server.push_back(static_cast<int>(r.get<int64_t>()));
    if (!(r.ok() && r.at_end())) return Status(ErrorCode::kInternal, "malformed level choice");
    res.dir = (fs::path(dir) / name).string();

    // The manifest from a node that has it; every rank decodes it.
    std::string manifest;
    if (me == manifest_root) {
      auto bytes = storage::read_whole_file((fs::path(res.dir) / storage::kLocalManifestName).string());
      if (bytes.ok() && XXH3_64bits(bytes->data(), bytes->size()) == id) manifest = std::move(bytes).value();
    }
    H5CKPT_RETURN_IF_ERROR(comm::bcast_bytes(manifest, manifest_root, world));
    auto m = storage::decode_local_manifest(manifest);
    Status ok = m.status();
    Result<std::vector<planner::TensorPlan>> tensors = ok;
    if (ok.ok()) tensors = wire::decode_tensors(m->plan);
    ok = tensors.status();
    if (ok.ok() && m->files.size() != res.server.size()) ok = Status(ErrorCode::kInternal, "manifest and choice disagree");
    // The servers check the files they will serve.
    std::vector<int> failed;
    for (size_t s = 0; ok.ok() && s < res.server.size(); ++s) {
      if (res.server[s] != me) continue;
      const std::string f = (fs::path(res.dir) / storage::local_rank_file(static_cast<int>(s))).string();
      auto sum = storage::file_xxh3(f, m->files[s].bytes);
      if (!sum.ok() || *sum != m->files[s].xxh3) {
        logging::log().warn("local checkpoint file '{}' fails its check ({}): served from another copy if any", f,
                            sum.ok() ? "checksum mismatch" : sum.status().to_string());
        failed.push_back(static_cast<int>(s));
      }
    }
    if (Status a = comm::agree(ok, world); !a.ok()) return a.with_context("reading the local manifest of '" + name + "'");
    ByteWriter fw;
    for (int f : failed) fw.put<int64_t>(f);
    H5CKPT_ASSIGN_OR_RETURN(auto fails, topo.gather(fw.str()));
    int again = 0;
    if (coordinator) {
      for (size_t q = 0; q < fails.size(); ++q) {
        ByteReader fr(fails[q]);
        while (!fr.at_end() && fr.ok()) bad.insert({nodes.node_of[q], static_cast<int>(fr.get<int64_t>())});
        again = again || !fails[q].empty();
      }
    }
    std::string flag = again ? "1" : "0";
    H5CKPT_RETURN_IF_ERROR(topo.bcast(flag));
    if (flag == "1") continue;  // choose again without the files that failed
    if (coordinator) logging::log().info("load of '{}' reads the {}", path, res.reason);
    res.manifest = std::move(m).value();
    res.tensors = std::move(tensors).value();
    res.info = storage::local_info(res.manifest, res.tensors, res.dir);
    return res;
  }
  return Status(ErrorCode::kCorrupt, "local checkpoints of '" + path + "' keep failing their checks");
}

// ---- loading from the local level -----------------------------------------------------------

namespace {

// ---- the served streams of a local load ------------------------------------------------------

// A run of a server's stream to one requester: `bytes` at `offset` of saved rank `writer`'s file.
struct ServedRun {
  int writer;
  uint64_t offset, bytes, esize;
};
// The same run at the requester: into element `dst` of dests[dest]'s landing buffer.
struct LandingRun {
  size_t dest;
  uint64_t dst, bytes, esize;
};
struct RunCursor {
  size_t run = 0;
  uint64_t within = 0;  // bytes of runs[run] already done
};
// The smallest chunk: above any element, a multiple of every element size.
constexpr int64_t kMinChunk = 64;

// The next piece of a chunk that has `room` bytes left: the rest of the run, or as many of its
// whole elements as fit (0: the chunk ends here). Both sides of a stream cut with this alone.
template <class Run>
uint64_t next_piece(const Run& run, uint64_t within, uint64_t room) {
  const uint64_t left = run.bytes - within;
  return left <= room ? left : room / run.esize * run.esize;
}

// The byte sizes of the chunks a stream of `runs` is cut into (none for an empty stream).
template <class Run>
std::vector<uint64_t> cut_chunks(const std::vector<Run>& runs, uint64_t chunk) {
  std::vector<uint64_t> out;
  RunCursor c;
  while (c.run < runs.size()) {
    uint64_t n = 0;
    while (c.run < runs.size()) {
      const uint64_t p = next_piece(runs[c.run], c.within, chunk - n);
      if (!p) break;
      n += p, c.within += p;
      if (c.within == runs[c.run].bytes) ++c.run, c.within = 0;
    }
    out.push_back(n);
  }
  return out;
}

// The saved ranks' files of one local checkpoint, opened once each.
class LocalFiles {
 public:
  explicit LocalFiles(std::string dir) : dir_(std::move(dir)) {}
  LocalFiles(const LocalFiles&) = delete;
  LocalFiles& operator=(const LocalFiles&) = delete;
  ~LocalFiles() {
    for (auto& [w, fd] : fds_) storage::io::close(fd);
  }
  Status read(int writer, char* to, uint64_t n, uint64_t offset) {
    auto it = fds_.find(writer);
    const std::string name = storage::local_rank_file(writer);
    if (it == fds_.end()) {
      const std::string f = (fs::path(dir_) / name).string();
      const int fd = storage::io::open(f, O_RDONLY);
      if (fd < 0) return storage::io::error("open", f, errno);
      it = fds_.emplace(writer, fd).first;
    }
    return read_all(it->second, to, n, offset, name);
  }

 private:
  std::string dir_;
  std::map<int, int> fds_;
};

// Reads the next `n` bytes of a server's stream into `out`, advancing `at`.
Status fill_chunk(const std::vector<ServedRun>& runs, RunCursor& at, char* out, uint64_t n, LocalFiles& files) {
  Status st;
  for (uint64_t done = 0; done < n;) {
    const ServedRun& r = runs[at.run];
    const uint64_t p = next_piece(r, at.within, n - done);
    if (st.ok()) st = files.read(r.writer, out + done, p, r.offset + at.within);
    done += p, at.within += p;
    if (at.within == r.bytes) ++at.run, at.within = 0;
  }
  return st;
}

// Hands the next `n` bytes of a requester's stream to put(run, bytes of it done, data, bytes).
template <class Put>
void drain_chunk(const std::vector<LandingRun>& runs, RunCursor& at, const char* in, uint64_t n, Put&& put) {
  for (uint64_t done = 0; done < n;) {
    const LandingRun& r = runs[at.run];
    const uint64_t p = next_piece(r, at.within, n - done);
    put(r, at.within, in + done, p);
    done += p, at.within += p;
    if (at.within == r.bytes) ++at.run, at.within = 0;
  }
}

// MPI_MAX over int64 values on every rank, bounded by the deadline.
Status allreduce_max(int64_t* values, int n, const char* what, MPI_Comm world) {
  std::vector<int64_t> in(values, values + n);
  MPI_Request req;
  const int rc = MPI_Iallreduce(in.data(), values, n, MPI_INT64_T, MPI_MAX, world, &req);
  if (rc != MPI_SUCCESS) return comm::mpi_status(rc, "MPI_Iallreduce");
  return comm::wait_asleep(1, &req, 100, what, world);
}

}  // namespace

Result<LoadReport> load_local(const Topology::Impl& topo, StateDict& state, const Resolution& res,
                              const LoadOptions& options, StagingPool& pool) {
  PhaseScope scope("load", "local");
  const double t0 = now_s();
  const MPI_Comm world = topo.world.get();
  const int me = topo.world.rank();
  const int size = topo.world.size();
  LoadReport report;
  report.path = res.dir;
  report.transport = "mpi-local";
  auto fail = [&](const Status& s) { return s.with_context("load from local checkpoint '" + res.dir + "'"); };

  // Local checks, then one agreement: what each item wants and where it lands.
  ExpandedState expanded(state);
  StateDict& items = expanded.state();
  std::map<std::string, size_t> by_key;
  for (size_t t = 0; t < res.tensors.size(); ++t) by_key[res.tensors[t].key] = t;
  struct Dest {
    size_t item;
    size_t tensor;
    char* landing;            // where the bytes land (the item's buffer, or `staging`)
    uint64_t staging_bytes = 0;  // a device item's host staging, in the item's dtype
    char* staging = nullptr;     // in the load's arena (below)
    bool convert = false;     // stored in another dtype: converted run by run as it lands
  };
  std::vector<Dest> dests;
  Status st = expanded.status();
  for (size_t i = 0; i < items.size() && st.ok(); ++i) {
    StateItem& it = items.items()[i];
    const std::string ctx = expanded.context(i);
    auto found = by_key.find(it.key);
    if (found == by_key.end()) {
      // LoadStrictness: only the allow-missing modes skip (the shared level's load contract, with
      // its merged lists and unexpected keys, is not applied to local checkpoints yet).
      if (options.strict && options.strictness != LoadStrictness::kAllowMissing)
        st = Status(ErrorCode::kNotFound, ctx + " is not in the checkpoint");
      else if (std::find(report.missing_keys.begin(), report.missing_keys.end(), it.key) == report.missing_keys.end())
        report.missing_keys.push_back(it.key);
      continue;
    }
    const planner::TensorPlan& t = res.tensors[found->second];
    st = check_item_buffer(it).with_context(ctx);
    if (st.ok() && t.shape != it.global_shape && !(it.allow_shape_mismatch && t.shape.size() == it.global_shape.size()))
      st = Status(ErrorCode::kShapeMismatch, ctx + ": the checkpoint's global shape differs");
    const bool convert = st.ok() && t.dtype != it.dtype;
    if (convert && !(options.convert_dtype && dtype_is_float(t.dtype) && dtype_is_float(it.dtype)))
      st = Status(ErrorCode::kDtypeMismatch, ctx + ": saved as " + dtype_name(t.dtype) + ", wanted as " +
                                                 dtype_name(it.dtype));
    if (!st.ok()) break;
    Dest d{i, found->second, static_cast<char*>(it.data), 0, nullptr, convert};
    const uint64_t n = static_cast<uint64_t>(it.shard.numel());
    if (device::is_device_item(it)) {  // host staging in the item's dtype (conversions land converted)
      d.staging_bytes = n * dtype_size(it.dtype);
    } else if (t.shape != it.global_shape && n) {
      std::memset(it.data, 0, n * dtype_size(it.dtype));  // the part outside the stored shape stays zero
    }
    dests.push_back(std::move(d));
  }
  if (Status a = comm::agree(st, world); !a.ok()) return fail(a);

  // Requests: for each wanted region, its server; the exchange tells every server what to send.
  std::vector<ByteWriter> to(size);
  std::vector<std::vector<LandingRun>> land(size);  // per server: runs into the landing buffers
  for (size_t di = 0; di < dests.size(); ++di) {
    const Dest& d = dests[di];
    const StateItem& it = items.items()[d.item];
    const planner::TensorPlan& t = res.tensors[d.tensor];
    const uint64_t esize = dtype_size(t.dtype);
    for (size_t g = 0; g < t.regions.size(); ++g) {
      const int s = res.server.at(static_cast<size_t>(t.regions[g].writer));
      const size_t before = land[s].size();
      for_each_overlap(t.shape, t.regions[g].shard, it.shard, [&](int64_t, int64_t dst, int64_t n) {
        land[s].push_back({di, static_cast<uint64_t>(dst), static_cast<uint64_t>(n) * esize, esize});
      });
      if (land[s].size() == before) continue;  // nothing of this region is wanted
      to[s].put<uint64_t>(d.tensor), to[s].put<uint64_t>(g);
      wire::put_shard(to[s], it.shard);
    }
  }
  std::vector<int> send_counts(size), recv_counts(size), sdispl(size), rdispl(size);
  std::string sendbuf;
  for (int q = 0; q < size; ++q) {
    sdispl[q] = static_cast<int>(sendbuf.size());
    send_counts[q] = static_cast<int>(to[q].str().size());
    sendbuf += to[q].str();
  }
  MPI_Request req;
  int rc = MPI_Ialltoall(send_counts.data(), 1, MPI_INT, recv_counts.data(), 1, MPI_INT, world, &req);
  if (rc != MPI_SUCCESS) return fail(comm::mpi_status(rc, "MPI_Ialltoall"));
  H5CKPT_RETURN_IF_ERROR(comm::wait_asleep(1, &req, 100, "exchanging local-level requests", world));
  int total = 0;
  for (int q = 0; q < size; ++q) rdispl[q] = total, total += recv_counts[q];
  std::string recvbuf(static_cast<size_t>(total), '\0');
  rc = MPI_Ialltoallv(sendbuf.data(), send_counts.data(), sdispl.data(), MPI_BYTE, recvbuf.data(), recv_counts.data(),
                      rdispl.data(), MPI_BYTE, world, &req);
  if (rc != MPI_SUCCESS) return fail(comm::mpi_status(rc, "MPI_Ialltoallv"));
  H5CKPT_RETURN_IF_ERROR(comm::wait_asleep(1, &req, 100, "exchanging local-level requests", world));
  report.plan_s = now_s() - t0;

  // Serving, in rounds through a bounded window: every (server, requester) pair's bytes form one
  // stream, the requested runs in request order, cut into chunks that both sides compute alike.
  const double t_read = now_s();
  auto offsets = region_file_offsets(res.tensors, res.manifest.files.size());
  std::vector<std::vector<ServedRun>> serve(size);  // per requester: runs read from the local files
  st = Status::Ok();
  bool malformed = false;
  for (int q = 0; q < size && !malformed; ++q) {
    const std::string part = recvbuf.substr(static_cast<size_t>(rdispl[q]), static_cast<size_t>(recv_counts[q]));
    ByteReader r(part);
    while (!r.at_end()) {
      const uint64_t t = r.get<uint64_t>(), g = r.get<uint64_t>();
      const ShardSpec want = wire::get_shard(r);
      if (!r.ok() || t >= res.tensors.size() || g >= res.tensors[t].regions.size() ||
          res.server.at(static_cast<size_t>(res.tensors[t].regions[g].writer)) != me) {
        // A bug: the sizes the requester expects are unknown here, so its wait ends at the deadline.
        st = Status(ErrorCode::kInternal, "malformed local-level request from rank " + std::to_string(q));
        malformed = true;
        break;
      }
      const planner::TensorPlan& tp = res.tensors[t];
      const int writer = tp.regions[g].writer;
      const uint64_t esize = dtype_size(tp.dtype), base = offsets[t][g];
      for_each_overlap(tp.shape, tp.regions[g].shard, want, [&](int64_t src, int64_t, int64_t n) {
        serve[q].push_back({writer, base + static_cast<uint64_t>(src) * esize, static_cast<uint64_t>(n) * esize, esize});
      });
    }
  }
  // The window: the budget (else kUnboundedWindow) less the device items' staging, split over a
  // send and a receive slot per peer; the smallest proposal on any rank is the chunk everywhere.
  constexpr uint64_t kUnboundedWindow = 256ull << 20;
  MemoryBudget* budget = pool.budget();
  const bool bounded = budget && budget->bounded();
  uint64_t staging = 0;
  for (const Dest& d : dests) staging += d.staging_bytes;
  uint64_t window = bounded ? budget->limit() : kUnboundedWindow;
  window -= std::min(window, staging);
  int64_t chunk = static_cast<int64_t>(std::min<uint64_t>(window / (2 * static_cast<uint64_t>(size)),
                                                           std::min<uint64_t>(comm::chunk_limit(), 1ull << 30)));
  chunk = std::max<int64_t>(kMinChunk, chunk & ~int64_t{15});
  int64_t smallest = -chunk;
  if (Status a = allreduce_max(&smallest, 1, "agreeing on the local-level load window", world); !a.ok())
    return fail(a);
  chunk = -smallest;
  // Both sides of a pair cut its stream alike, so they agree on every chunk's size; the k-th
  // message between two ranks is chunk k (MPI keeps their order). A rank runs as many rounds as
  // its longest stream needs: no rank waits for another's rounds beyond its own.
  std::vector<std::vector<uint64_t>> out_chunks(size), in_chunks(size);
  int64_t rounds = 0;
  for (int q = 0; q < size; ++q) {
    out_chunks[q] = cut_chunks(serve[q], static_cast<uint64_t>(chunk));
    in_chunks[q] = cut_chunks(land[q], static_cast<uint64_t>(chunk));
    rounds = std::max<int64_t>(rounds, static_cast<int64_t>(std::max(out_chunks[q].size(), in_chunks[q].size())));
  }

  // Memory, one arena: a send and a receive slot per peer with bytes (each as large as its
  // stream's largest chunk) and the device items' staging. Under a budget the arena is the
  // staging pool, whose capacity is leased from it; else a buffer of this load's own (counted).
  auto largest = [](const std::vector<uint64_t>& c) { return c.empty() ? 0 : *std::max_element(c.begin(), c.end()); };
  uint64_t need = staging;
  for (int q = 0; q < size; ++q) {
    need += largest(out_chunks[q]);
    if (q != me) need += largest(in_chunks[q]);
  }
  std::unique_ptr<char[]> own;
  MemoryBudget::Lease lease;
  char* arena = nullptr;
  if (bounded) {
    pool.reserve(need);
    if (pool.capacity() >= need) arena = pool.base();
    else if (st.ok())
      st = Status(ErrorCode::kInvalidArgument,
                  "the local-level load needs " + std::to_string(need) + " bytes of staging (device items: " +
                      std::to_string(staging) + "), more than memory_bytes = " + std::to_string(budget->limit()) +
                      " holds: raise memory_bytes (H5CKPT_MEMORY_BYTES)");
  } else if (need) {
    own.reset(new char[need]);  // not zeroed: slots are filled before use, staging zeroed below
    arena = own.get();
    if (budget) lease = MemoryBudget::Lease(budget, budget->try_reserve(need) ? need : 0);
  }
  if (Status a = comm::agree(st, world); !a.ok()) return fail(a);
  std::vector<char*> out_slot(size, nullptr), in_slot(size, nullptr);
  for (Dest& d : dests) {
    if (!d.staging_bytes) continue;
    d.staging = d.landing = arena;
    std::memset(arena, 0, d.staging_bytes);  // the part outside the stored shape stays zero
    arena += d.staging_bytes;
  }
  for (int q = 0; q < size; ++q) {
    out_slot[q] = arena, arena += largest(out_chunks[q]);
    if (q != me) in_slot[q] = arena, arena += largest(in_chunks[q]);
  }
  LocalFiles files(res.dir);
  std::vector<RunCursor> out_at(size), in_at(size);
  auto drain = [&](int s, const char* in, uint64_t n) {
    drain_chunk(land[s], in_at[s], in, n, [&](const LandingRun& run, uint64_t within, const char* p, uint64_t bytes) {
      Dest& d = dests[run.dest];
      const StateItem& it = items.items()[d.item];
      if (d.convert) {  // straight into the item's dtype (or its device staging), element by element
        const uint64_t isize = dtype_size(it.dtype);
        char* to = (d.staging ? d.staging : static_cast<char*>(it.data)) +
                   (run.dst + within / run.esize) * isize;
        if (!detail::convert_elements(p, res.tensors[d.tensor].dtype, to, it.dtype, bytes / run.esize) && st.ok())
          st = Status(ErrorCode::kDtypeMismatch, expanded.context(d.item) + ": no conversion");
      } else {
        std::memcpy(d.landing + run.dst * run.esize + within, p, bytes);
      }
    });
  };
  for (int64_t k = 0; k < rounds; ++k) {
    std::vector<MPI_Request> reqs;
    Status posted;
    for (int s = 0; s < size; ++s) {
      if (s == me || static_cast<size_t>(k) >= in_chunks[s].size()) continue;
      post_chunks(false, in_slot[s], in_chunks[s][k], s, kServeTag, world, reqs, posted);
    }
    for (int q = 0; q < size; ++q) {
      if (static_cast<size_t>(k) >= out_chunks[q].size()) continue;
      // A failed read still sends (garbage) so every rank finishes the round; the agreement fails it.
      Status read = fill_chunk(serve[q], out_at[q], out_slot[q], out_chunks[q][k], files);
      if (st.ok()) st = read;
      report.bytes_read += out_chunks[q][k];
      if (q == me) {
        drain(me, out_slot[q], out_chunks[q][k]);
      } else {
        report.bytes_sent += out_chunks[q][k];
        post_chunks(true, out_slot[q], out_chunks[q][k], q, kServeTag, world, reqs, posted);
      }
    }
    Status waited = wait_all(reqs, "serving local-level bytes", world);
    if (st.ok()) st = posted;
    if (st.ok()) st = waited;
    if (!waited.ok() || !posted.ok()) break;  // the deadline or MPI failed: the agreement below says so
    for (int s = 0; s < size; ++s) {
      if (s == me || static_cast<size_t>(k) >= in_chunks[s].size()) continue;
      drain(s, in_slot[s], in_chunks[s][k]);
      report.bytes_received += in_chunks[s][k];
    }
  }
  report.read_s = now_s() - t_read;
  if (Status a = comm::agree(st, world); !a.ok()) return fail(a);

  // Device copies of items staged on the host (converted already).
  const double t_x = now_s();
  st = Status::Ok();
  for (Dest& d : dests) {
    const StateItem& it = items.items()[d.item];
    if (!d.staging) continue;
    const size_t n = static_cast<size_t>(it.shard.numel());
    st = device::staging().copy_to_device(it.data, d.staging, n * dtype_size(it.dtype));
    if (st.ok()) st = device::staging().synchronize();
    if (!st.ok()) break;
  }
  if (Status a = comm::agree(st, world); !a.ok()) return fail(a);
  report.exchange_s = now_s() - t_x;
  report.total_s = now_s() - t0;
  logging::log().info("loaded from local checkpoint '{}': {} bytes read here, {} received, {:.3f}s (requests "
                      "{:.3f}s, reads and transfers {:.3f}s, unpacking {:.3f}s)",
                      res.dir, report.bytes_read, report.bytes_received, report.total_s, report.plan_s, report.read_s,
                      report.exchange_s);
  return report;
}

}  // namespace h5ckpt::engine::local
