// The node-local level's save (engine/local_level.h): the local write with its partner copies
// (engine/replica_stream.h), the manifest, the commit and the persist; and the node map both
// saves and loads use. Resolution is in local_resolve.cpp, loads in local_load.cpp.
#include "engine/local_level.h"

#include <fcntl.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>

#include "comm/deadline.h"
#include "engine/replica_stream.h"
#include "engine/wire.h"
#include "logging/log.h"
#include "storage/commit.h"
#include "storage/local_files.h"
#include "storage/posix_io.h"
#include "util/bytes.h"
#include "util/phase.h"
#include "util/test_points.h"

namespace h5ckpt::engine::local {

namespace fs = std::filesystem;
using logging::now_s;

namespace {

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
    if (status_.ok() && w.bytes) status_ = storage::read_all(fd_, buf_.data(), w.bytes, at_, path_);
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

namespace {

// The paths and communicators of one local save.
struct SaveContext {
  const Topology::Impl& comms;
  SaveJob& job;
  const CheckpointerOptions& copts;
  LocalSave& local;
  MPI_Comm world;
  int me;
  bool leader;
  std::string partial, final_dir, mine;
};

// The files this node's ranks write in a save: their own and the copies they receive.
std::vector<std::string> files_of_my_node(const SaveContext& c) {
  std::vector<std::string> out;
  for (int r : c.local.nodes->members[static_cast<size_t>(c.local.nodes->my_node)]) {
    out.push_back(storage::local_rank_file(r));
    for (int q : replica_origins(*c.local.nodes, r, c.copts.local_replicas)) out.push_back(storage::local_rank_file(q));
  }
  return out;
}

// 1. This node's partial directory, made by its leader (a stale one of a crashed save goes),
// after checking that no other node shares the local directory; from the spare's files when
// there is one (storage::make_partial_dir). Collective.
Status make_partial(const SaveContext& c) {
  Status st;
  if (c.leader) {
    std::error_code ec;
    fs::create_directories(c.local.dir, ec);
    if (ec) st = Status(ErrorCode::kIo, "cannot create '" + c.local.dir + "': " + ec.message());
  }
  if (c.local.check_private) {  // a directory that several nodes share would mix their files
    H5CKPT_RETURN_IF_ERROR(comm::agree(st, c.world));
    H5CKPT_RETURN_IF_ERROR(comm::agree(check_node_local(c.local.dir, *c.local.nodes, c.leader, c.world), c.world));
  }
  if (c.leader) {
    if (st.ok()) st = storage::remove_tree(c.partial);
    if (st.ok()) st = storage::make_partial_dir(c.local.dir, c.partial, files_of_my_node(c));
  }
  return comm::agree(st, c.world);
}

// 2. This rank's planned bytes, in plan order, to its own file (its blocks hashed), streamed to
// the partner nodes as they are written, and the partners' streams received into their copies.
// Not collective by itself: the caller agrees.
Status write_and_replicate(const SaveContext& c, WriteSource& source, storage::LocalRankFile* file,
                           std::vector<ReplicaStream::Received>* copies, uint64_t* received) {
  SaveReport& report = c.job.report;
  const double t0 = now_s();
  Status st;
  const int k = c.copts.local_replicas;
  ReplicaStream stream(*c.local.nodes, k, c.me, c.local.my_bytes, c.partial, c.local.name,
                       replica_chunk_bytes(*c.local.nodes, k, c.copts.memory_bytes), *c.local.window, c.local.budget,
                       c.world);
  storage::LocalFileHasher hash(c.local.name, c.me, c.local.my_bytes);
  // No O_TRUNC: a file kept from the spare is overwritten in place, then cut to its size.
  const int fd = storage::io::open(c.mine, O_CREAT | O_WRONLY, 0644);
  if (fd < 0) st = storage::io::error("open", c.mine, errno);
  uint64_t written = 0;
  double t_source = 0, t_write = 0, t_hash = 0, t_push = 0;
  double t = now_s();
  while (auto w = source.next()) {
    t_source += now_s() - t;
    if (st.ok()) st = source.status();
    if (w->write->bytes) {
      t = now_s();
      if (st.ok()) st = storage::write_all(fd, w->data, w->write->bytes, written, c.mine);
      const double t_written = now_s();
      if (written + w->write->bytes <= c.local.my_bytes) hash.update(w->data, w->write->bytes);
      const double t_hashed = now_s();
      stream.push(w->data, w->write->bytes);
      t_write += t_written - t, t_hash += t_hashed - t_written, t_push += now_s() - t_hashed;
    }
    written += w->write->bytes;
    source.done(*w);
    t = now_s();
  }
  t_source += now_s() - t;
  if (written != c.local.my_bytes && st.ok())
    st = Status(ErrorCode::kInternal, "local write of " + std::to_string(written) + " bytes, " +
                                          std::to_string(c.local.my_bytes) + " planned");
  *file = hash.finish();
  file->bytes = written;
  const double t_sync = now_s();
  if (fd >= 0) {
    if (st.ok() && storage::io::ftruncate(fd, static_cast<off_t>(written)) != 0)
      st = storage::io::error("ftruncate", c.mine, errno);
    Status closed = storage::sync_close(fd, c.mine);
    if (st.ok()) st = closed;
  }
  report.write_s = now_s() - t0;
  const double own_sync = now_s() - t_sync;
  const double t_rep = now_s();
  Status streamed = stream.finish(received, copies);
  if (st.ok()) st = streamed;
  report.replicate_s = now_s() - t_rep;
  const ReplicaStream::Profile& p = stream.profile();
  logging::log().debug(
      "local write: stream setup {:.3f}s, source {:.3f}s, own write {:.3f}s, own hash {:.3f}s, push {:.3f}s "
      "(copy {:.3f}s, waiting for a send slot {:.3f}s), own fsync {:.3f}s; replicas: drain {:.3f}s, "
      "received writes {:.3f}s, hashes {:.3f}s, fsyncs {:.3f}s",
      p.setup, t_source, t_write, t_hash, t_push, p.copy, p.send_wait, own_sync, p.drain, p.recv_write, p.recv_hash,
      p.recv_sync);
  report.bytes_written = written;
  return st;
}

// 3. The manifest: every rank's file (size and block sums) to the coordinator, the whole
// manifest to everyone (its file bytes, decoded in `out`). Collective.
Result<std::string> share_manifest(const SaveContext& c, const storage::LocalRankFile& file,
                                   storage::LocalManifest* out) {
  ByteWriter w;
  w.put<uint64_t>(file.bytes), w.put<uint64_t>(file.block_bytes), w.put<uint64_t>(file.blocks.size());
  for (uint64_t b : file.blocks) w.put<uint64_t>(b);
  H5CKPT_ASSIGN_OR_RETURN(auto gathered, c.comms.gather(w.str()));
  Result<std::string> manifest_bytes = std::string();
  if (c.me == c.comms.coordinator) {
    storage::LocalManifest m;
    m.name = c.local.name;
    m.shared_path = storage::canonical_path(c.job.path);
    m.step = c.job.options.step;
    m.library_version = H5CKPT_VERSION;
    m.sizes = c.comms.sizes;
    m.coords = c.comms.all_coords;
    m.node_of_rank = c.local.nodes->node_of;
    m.attributes = c.job.attributes;
    m.plan = wire::encode_tensors(*c.job.plan);
    for (const std::string& g : gathered) {
      ByteReader r(g);
      storage::LocalRankFile f;
      f.bytes = r.get<uint64_t>(), f.block_bytes = r.get<uint64_t>();
      const uint64_t n = r.get_count(8);
      for (uint64_t i = 0; i < n && r.ok(); ++i) f.blocks.push_back(r.get<uint64_t>());
      if (!(r.ok() && r.at_end())) manifest_bytes = Status(ErrorCode::kInternal, "malformed file record");
      m.files.push_back(std::move(f));
    }
    if (manifest_bytes.ok()) manifest_bytes = storage::encode_local_manifest(m);
  }
  H5CKPT_ASSIGN_OR_RETURN(std::string shared, bcast_outcome(manifest_bytes, c.comms));
  H5CKPT_ASSIGN_OR_RETURN(*out, storage::decode_local_manifest(shared));
  return shared;
}

// 4. Every partner copy received must be the file its origin wrote, block by block.
Status check_copies(const SaveContext& c, const std::vector<ReplicaStream::Received>& copies,
                    const storage::LocalManifest& m) {
  for (const auto& [origin, file] : copies) {
    const storage::LocalRankFile& want = m.files.at(static_cast<size_t>(origin));
    if (file.bytes != want.bytes || file.block_bytes != want.block_bytes || file.blocks != want.blocks)
      return Status(ErrorCode::kCorrupt, "the copy of rank " + std::to_string(origin) + "'s file received on rank " +
                                             std::to_string(c.me) + " does not match its block checksums");
  }
  return Status::Ok();
}

// 5. Commit: manifests written on every node first, then every node renames its directory.
// Collective; the previous local checkpoint stays the newest committed one until the renames.
Status commit(const SaveContext& c, const std::string& manifest) {
  Status st;
  if (c.leader) st = storage::write_file_atomic((fs::path(c.partial) / storage::kLocalManifestName).string(), manifest);
  H5CKPT_RETURN_IF_ERROR(comm::agree(st, c.world));
  if (c.leader) {
    std::error_code ec;
    if (fs::exists(c.final_dir, ec)) st = storage::remove_tree(c.final_dir);  // a re-save of the same step
    util::test_point("local_commit", c.me);
    if (st.ok() && storage::io::rename(c.partial, c.final_dir) != 0)
      st = storage::io::error("rename", c.partial + "' to '" + c.final_dir, errno);
    if (st.ok()) st = storage::fsync_path(c.local.dir);
  }
  H5CKPT_RETURN_IF_ERROR(comm::agree(st, c.world));
  if (c.leader) storage::retain_local(c.local.dir, std::max<int64_t>(c.copts.local_keep, 1), c.local.name);
  return Status::Ok();
}

// 6. Persist from the local copy: the normal shared checkpoint, same plan, same writes.
Result<SaveReport> persist(const SaveContext& c) {
  const double t_persist = now_s();
  H5CKPT_RETURN_IF_ERROR(prepare_shared_dir(c.comms, c.job));
  LocalFileSource from_file((fs::path(c.final_dir) / storage::local_rank_file(c.me)).string(), c.local.persist_writes);
  SaveReport local_report = c.job.report;
  c.job.report.bytes_written = 0;
  util::test_point("persist_write", c.me);
  H5CKPT_RETURN_IF_ERROR(save_write(c.comms, c.job, c.copts, from_file));
  auto shared = save_commit(c.comms, c.job, c.copts);
  if (!shared.ok()) return shared.status().with_context("persisting local checkpoint '" + c.final_dir + "'");
  local_report.persisted = shared->path;
  local_report.persist_s = now_s() - t_persist;
  local_report.total_s = now_s() - c.job.t0;
  return local_report;
}

}  // namespace

Result<SaveReport> save_local(const Topology::Impl& comms, SaveJob& job, const CheckpointerOptions& copts,
                              LocalSave& local, WriteSource& source) {
  const std::string partial = storage::local_partial_dir(local.dir, local.name);
  const SaveContext c{comms,
                      job,
                      copts,
                      local,
                      comms.world.get(),
                      comms.world.rank(),
                      comms.leader(),
                      partial,
                      (fs::path(local.dir) / local.name).string(),
                      (fs::path(partial) / storage::local_rank_file(comms.world.rank())).string()};
  SaveReport& report = job.report;
  auto fail = [&](const Status& st) {
    while (auto w = source.next()) source.done(*w);  // the async snapshot must not wait for us
    if (c.leader) (void)storage::remove_tree(partial);
    (void)comm::idle_barrier(comms.node.get());  // every failure is collective: return once it is gone
    return st.with_context("local save of '" + job.path + "' to '" + local.dir + "'");
  };
  PhaseScope scope("save_local", "write");
  const double t_partial = now_s();
  if (Status a = make_partial(c); !a.ok()) return fail(a);
  const double partial_s = now_s() - t_partial;
  storage::LocalRankFile file;
  std::vector<ReplicaStream::Received> copies;
  uint64_t received = 0;
  Status st = write_and_replicate(c, source, &file, &copies, &received);
  util::test_point("local_write", c.me);
  util::test_point("local_replica", c.me);
  const double t_agree = now_s();
  if (Status a = comm::agree(st, c.world); !a.ok()) return fail(a);
  const double agree_s = now_s() - t_agree;
  storage::LocalManifest manifest;
  auto manifest_bytes = share_manifest(c, file, &manifest);
  if (!manifest_bytes.ok()) return fail(manifest_bytes.status());
  if (Status a = comm::agree(check_copies(c, copies, manifest), c.world); !a.ok()) return fail(a);
  logging::log().debug("local save: partial dir {:.3f}s, agreement after the write {:.3f}s, manifest {:.3f}s",
                       partial_s, agree_s, now_s() - t_agree - agree_s);

  PhaseScope commit_scope("save_local", "commit");
  const double t_commit = now_s();
  if (Status a = commit(c, *manifest_bytes); !a.ok()) return fail(a);
  report.commit_s = now_s() - t_commit;
  report.path = c.final_dir;
  report.level = "local";
  report.bytes_total = 0;
  for (const auto& t : *job.plan) report.bytes_total += t.nbytes();
  logging::log().info(
      "local save '{}' committed: {} bytes here, {} bytes of replicas received, write {:.3f}s "
      "replicas {:.3f}s commit {:.3f}s",
      c.final_dir, file.bytes, received, report.write_s, report.replicate_s, report.commit_s);
  if (!local.persist) {
    report.total_s = now_s() - job.t0;
    return report;
  }
  return persist(c);
}

}  // namespace h5ckpt::engine::local
