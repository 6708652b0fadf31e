// Which level a load reads (engine/local_level.h, resolve): the node leaders list their local
// checkpoints, the coordinator chooses the newest one whose every file has an intact copy on a
// live node (and a server for each file), or the shared level; the servers then check what they
// will serve. Files with block sums are checked block by block as they are served
// (storage/local_files.h), so here only older manifests' files are read (whole).
#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "comm/comm.h"
#include "engine/local_level.h"
#include "engine/wire.h"
#include "logging/log.h"
#include "storage/commit.h"
#include "h5ckpt/checkpoint_info.h"
#include "util/bytes.h"
#include "util/phase.h"

namespace h5ckpt::engine::local {

namespace fs = std::filesystem;

namespace {

struct Candidate {
  std::string name;
  uint64_t id = 0;
  int64_t step = -1;
  uint64_t world = 0;
  std::vector<int> node_of_rank;            // saved node of each rank (for messages)
  std::map<int, std::vector<int>> holders;  // saved rank -> live nodes holding its file
  int manifest_node = -1;                   // a live node holding the manifest
};
using Candidates = std::map<std::pair<std::string, uint64_t>, Candidate>;
using BadFiles = std::set<std::pair<int, int>>;  // (node, saved rank) whose file failed its check

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i == 8) return s + ", ... (" + std::to_string(ranks.size()) + " in all)";
    s += (i ? "," : "") + std::to_string(ranks[i]);
  }
  return s;
}

Status merge_listing(const std::string& bytes, int node, Candidates& c) {
  auto entries = wire::decode_listing(bytes);
  if (!entries.ok()) return entries.status().with_context("the listing of node " + std::to_string(node));
  for (const auto& e : *entries) {
    Candidate& x = c[{e.name, e.manifest_id}];
    x.name = e.name, x.id = e.manifest_id, x.step = e.step, x.world = e.world;
    x.manifest_node = x.manifest_node < 0 ? node : x.manifest_node;
    for (int r : e.ranks) x.holders[r].push_back(node);
    if (!e.node_of_rank.empty()) x.node_of_rank = e.node_of_rank;
  }
  return Status::Ok();
}

// The missing ranks of a candidate, as a sentence naming them and the nodes that saved them.
std::string missing_pieces(const Candidate& c, const BadFiles& bad) {
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

// A server for every saved rank of `pick`: the node that saved it when it still holds an intact
// file (the same layout then reads only its own disk), else the least busy holder; then one of
// that node's ranks in turn. `from_replicas` counts the files served from partner copies.
std::vector<int> choose_servers(const Candidate& pick, const BadFiles& bad, const NodeMap& nodes, int* from_replicas) {
  std::vector<int> load(nodes.nodes(), 0), servers(pick.world, -1);
  *from_replicas = 0;
  for (uint64_t r = 0; r < pick.world; ++r) {
    const int saved_on = r < pick.node_of_rank.size() ? pick.node_of_rank[r] : -1;
    int best = -1;
    for (int n : pick.holders.at(static_cast<int>(r))) {
      if (bad.count({n, static_cast<int>(r)})) continue;
      if (n == saved_on) {
        best = n;
        break;
      }
      if (best < 0 || load[n] < load[best]) best = n;
    }
    const auto& m = nodes.members[best];
    servers[r] = m[load[best]++ % m.size()];
    if (r < pick.node_of_rank.size() && pick.node_of_rank[r] != best) ++*from_replicas;
  }
  return servers;
}

struct SharedSide {
  Result<CheckpointInfo> info = Status(ErrorCode::kNotFound, "not read");
  int64_t step = -1;
  std::string problem;
};

// The coordinator's choice: the newest candidate at least as new as the shared level whose every
// file has an intact copy, else the shared level (an error when it has nothing either).
Result<wire::LevelChoice> choose_level(const Candidates& cands, const BadFiles& bad, const SharedSide& shared,
                                       const std::string& path, const NodeMap& nodes) {
  std::vector<const Candidate*> order;
  for (const auto& [k, c] : cands) order.push_back(&c);
  std::sort(order.begin(), order.end(), [](const Candidate* a, const Candidate* b) {
    return a->step != b->step ? a->step > b->step : a->name > b->name;
  });
  std::string why;
  for (const Candidate* c : order) {
    if (c->step < shared.step) break;  // the shared level is newer
    std::string missing = missing_pieces(*c, bad);
    if (missing.empty()) {
      wire::LevelChoice out;
      int from_replicas = 0;
      out.local = true;
      out.server = choose_servers(*c, bad, nodes, &from_replicas);
      out.reason = "local checkpoint '" + c->name + "' (step " + std::to_string(c->step) +
                   ") from node-local storage, " + std::to_string(from_replicas) + " of " + std::to_string(c->world) +
                   " ranks' files served from partner copies; the shared level's newest is " +
                   (shared.step >= 0 ? "step " + std::to_string(shared.step) : "none");
      if (!why.empty()) out.reason += " (" + why + ")";
      out.name = c->name, out.manifest_id = c->id;
      out.manifest_root = nodes.members[c->manifest_node].front();
      return out;
    }
    why += (why.empty() ? "" : "; ") + std::string("local checkpoint '") + c->name + "' (step " +
           std::to_string(c->step) + ") cannot be served: no intact copy on any live node of the files of " + missing;
  }
  wire::LevelChoice out;
  out.reason = shared.step >= 0 ? "shared checkpoint at '" + path + "' (step " + std::to_string(shared.step) + ")"
                                : "shared level at '" + path + "' (" +
                                      (shared.problem.empty() ? "nothing there" : shared.problem) + ")";
  if (!why.empty()) out.reason += ": " + why;
  else if (order.empty()) out.reason += ": no local checkpoint for it on any node";
  else out.reason += ": it is at least as new as every local checkpoint";
  logging::log().info("load of '{}' reads the {}", path, out.reason);
  if (!shared.info.ok()) return shared.info.status().with_context(out.reason);  // every rank returns it
  out.name = shared.info->path;
  return out;
}

// The chosen local checkpoint's manifest and plan, from a rank holding it, on every rank.
Status read_manifest(Resolution& res, const wire::LevelChoice& c, const Topology::Impl& topo) {
  std::string manifest;
  if (topo.world.rank() == c.manifest_root) {
    auto bytes = storage::read_whole_file((fs::path(res.dir) / storage::kLocalManifestName).string());
    if (bytes.ok() && XXH3_64bits(bytes->data(), bytes->size()) == c.manifest_id) manifest = std::move(bytes).value();
  }
  H5CKPT_RETURN_IF_ERROR(comm::bcast_bytes(manifest, c.manifest_root, topo.world.get()));
  auto m = storage::decode_local_manifest(manifest);
  Status ok = m.status();
  if (ok.ok()) {
    auto tensors = wire::decode_tensors(m->plan);
    ok = tensors.status();
    if (ok.ok()) res.tensors = std::move(tensors).value();
  }
  if (ok.ok() && m->files.size() != res.server.size())
    ok = Status(ErrorCode::kInternal, "manifest and choice disagree");
  if (ok.ok()) res.manifest = std::move(m).value();
  return comm::agree(ok, topo.world.get()).with_context("reading the local manifest of '" + c.name + "'");
}

// The files this rank serves that an older manifest describes by a whole-file checksum, checked
// whole (newer ones are checked block by block as they are served); those that fail.
std::vector<int> check_whole_files(const Resolution& res, int me) {
  std::vector<int> failed;
  for (size_t s = 0; s < res.server.size(); ++s) {
    const storage::LocalRankFile& rf = res.manifest.files[s];
    if (res.server[s] != me || rf.block_bytes != 0) continue;
    const std::string f = (fs::path(res.dir) / storage::local_rank_file(static_cast<int>(s))).string();
    auto sum = storage::file_xxh3(f, rf.bytes);
    if (!sum.ok() || *sum != rf.xxh3) {
      logging::log().warn("local checkpoint file '{}' fails its check ({}): served from another copy if any", f,
                          sum.ok() ? "checksum mismatch" : sum.status().to_string());
      failed.push_back(static_cast<int>(s));
    }
  }
  return failed;
}

// Every rank's failed files reach the coordinator (into `bad`); whether any failed, on every rank.
Result<bool> gather_failures(const std::vector<int>& failed, const Topology::Impl& topo, const NodeMap& nodes,
                             BadFiles& bad) {
  ByteWriter fw;
  for (int f : failed) fw.put<int64_t>(f);
  H5CKPT_ASSIGN_OR_RETURN(auto fails, topo.gather(fw.str()));
  bool again = false;
  if (topo.world.rank() == topo.coordinator) {
    for (size_t q = 0; q < fails.size(); ++q) {
      ByteReader fr(fails[q]);
      while (!fr.at_end() && fr.ok()) bad.insert({nodes.node_of[q], static_cast<int>(fr.get<int64_t>())});
      again = again || !fails[q].empty();
    }
  }
  std::string flag = again ? "1" : "0";
  H5CKPT_RETURN_IF_ERROR(topo.bcast(flag));
  return flag == "1";
}

}  // namespace

Result<Resolution> resolve(const Topology::Impl& topo, const std::string& path, const CheckpointerOptions& copts,
                           const NodeMap& nodes, bool with_info) {
  PhaseScope scope("load", "resolve_levels");
  const bool coordinator = topo.world.rank() == topo.coordinator;
  const std::string dir = storage::expand_local_dir(copts.local_dir, nodes.my_node);
  // Every node leader lists its local checkpoints for `path`.
  std::string listing;
  if (topo.leader()) listing = wire::encode_listing(storage::list_local_checkpoints(dir, path));
  H5CKPT_ASSIGN_OR_RETURN(auto lists, topo.gather(listing));
  // The shared level, read once by the coordinator: its step for the choice, its directory (after
  // `latest`) for the load, or why there is none.
  Candidates cands;
  SharedSide shared;
  Status st;
  if (coordinator) {
    for (size_t r = 0; r < lists.size() && st.ok(); ++r)
      if (!lists[r].empty()) st = merge_listing(lists[r], nodes.node_of[r], cands);
    shared.info = read_checkpoint_info(path);
    if (shared.info.ok()) shared.step = shared.info->step;
    else shared.problem = shared.info.status().message();
  }
  BadFiles bad;
  for (int round = 0; round < 4; ++round) {
    // The coordinator chooses; the choice (or its error) goes to every rank.
    Result<std::string> choice = std::string();
    if (coordinator && st.ok()) {
      auto c = choose_level(cands, bad, shared, path, nodes);
      choice = c.ok() ? Result<std::string>(wire::encode_choice(*c)) : Result<std::string>(c.status());
    }
    if (!st.ok()) choice = st;
    H5CKPT_ASSIGN_OR_RETURN(std::string msg, bcast_outcome(choice, topo));
    H5CKPT_ASSIGN_OR_RETURN(wire::LevelChoice c, wire::decode_choice(msg));
    Resolution res;
    res.local = c.local;
    res.reason = c.reason;
    if (!res.local) {
      res.info.path = c.name;  // the shared checkpoint the ordinary load then reads
      res.load_path = res.info.path;
      if (!with_info) return res;
      auto info = read_checkpoint_info(res.info.path);  // every rank: the caller builds its state from it
      if (!info.ok()) return info.status().with_context(res.reason);
      res.info = std::move(info).value();
      return res;
    }
    res.server = c.server;
    res.dir = (fs::path(dir) / c.name).string();
    H5CKPT_RETURN_IF_ERROR(read_manifest(res, c, topo));
    H5CKPT_ASSIGN_OR_RETURN(bool again, gather_failures(check_whole_files(res, topo.world.rank()), topo, nodes, bad));
    if (again) continue;  // choose again without the files that failed
    if (coordinator) logging::log().info("load of '{}' reads the {}", path, res.reason);
    res.info = storage::local_info(res.manifest, res.tensors, res.dir);
    return res;
  }
  return Status(ErrorCode::kCorrupt, "local checkpoints of '" + path + "' keep failing their checks");
}

}  // namespace h5ckpt::engine::local
