// Data-loader state: resharding (split/merge over DP), serialization and checkpoint items.
// The synthetic walk that advances it lives in src/extras (synthetic_loader.h).
#include "h5ckpt/loader_state.h"

#include <algorithm>
#include <cctype>

#include "loader/loader_internal.h"

namespace h5ckpt::loader {

using detail::corrupt;
using detail::id_str;
using detail::Reader;
using detail::Writer;

namespace {

constexpr uint64_t kRepMagic = 0x3150455244414C48ull;    // "HLADREP1"
constexpr uint64_t kShardMagic = 0x3144524853444C48ull;  // "HLDSHRD1"

}  // namespace

// ---- config --------------------------------------------------------------------------------

Status LoaderConfig::validate() const {
  if (sources.empty()) return Status(ErrorCode::kInvalidArgument, "loader: no sources");
  if (context_len < 1) return Status(ErrorCode::kInvalidArgument, "loader: context_len < 1");
  if (workers_per_rank < 1) return Status(ErrorCode::kInvalidArgument, "loader: workers_per_rank < 1");
  for (const auto& s : sources) {
    if (!(s.ratio > 0) || s.min_len < 1 || s.max_len < s.min_len)
      return Status(ErrorCode::kInvalidArgument,
                    "loader: source '" + s.name + "' needs ratio > 0 and 1 <= min_len <= max_len");
  }
  return Status::Ok();
}

bool ReplicatedState::operator==(const ReplicatedState& o) const {
  if (config.seed != o.config.seed || config.context_len != o.config.context_len ||
      config.workers_per_rank != o.config.workers_per_rank || config.sources.size() != o.config.sources.size())
    return false;
  for (size_t k = 0; k < config.sources.size(); ++k) {
    const auto &a = config.sources[k], &b = o.config.sources[k];
    if (a.name != b.name || a.ratio != b.ratio || a.min_len != b.min_len || a.max_len != b.max_len) return false;
  }
  return num_shards == o.num_shards && base == o.base && generation == o.generation;
}

// ---- fresh state ---------------------------------------------------------------------------

ReplicatedState initial_replicated(const LoaderConfig& config, int64_t num_shards) {
  ReplicatedState r;
  r.config = config;
  r.num_shards = num_shards;
  r.base.assign(config.sources.size(), 0);
  return r;
}

ShardState initial_shard(const ReplicatedState& rep, int64_t shard) {
  ShardState s;
  s.shard = shard;
  s.next.resize(rep.base.size());
  for (size_t k = 0; k < rep.base.size(); ++k) s.next[k] = rep.base[k] + shard;
  return s;
}

// ---- reshard -------------------------------------------------------------------------------

namespace detail {

Status check_shards(const ReplicatedState& rep, const std::vector<ShardState>& shards,
                    std::vector<const ShardState*>& by_id) {
  const size_t K = rep.config.sources.size();
  if (rep.base.size() != K)
    return corrupt("replicated part has " + std::to_string(rep.base.size()) + " bases for " + std::to_string(K) +
                   " sources");
  if (rep.num_shards < 1) return corrupt("num_shards < 1");
  if (static_cast<int64_t>(shards.size()) != rep.num_shards)
    return corrupt("expected " + std::to_string(rep.num_shards) + " shards, got " + std::to_string(shards.size()));
  by_id.assign(static_cast<size_t>(rep.num_shards), nullptr);
  for (const auto& s : shards) {
    if (s.shard < 0 || s.shard >= rep.num_shards)
      return corrupt("shard id " + std::to_string(s.shard) + " out of range");
    if (by_id[static_cast<size_t>(s.shard)]) return corrupt("shard " + std::to_string(s.shard) + " twice");
    by_id[static_cast<size_t>(s.shard)] = &s;
    if (s.next.size() != K) return corrupt("shard " + std::to_string(s.shard) + ": wrong source count");
    for (size_t k = 0; k < K; ++k) {
      int64_t d = s.next[k] - rep.base[k];
      if (d < 0 || d % rep.num_shards != s.shard)
        return corrupt("shard " + std::to_string(s.shard) + ": next record " + std::to_string(s.next[k]) +
                       " of source " + std::to_string(k) + " is not on its walk");
    }
    for (const auto& b : s.buffer)
      if (b.id.source < 0 || static_cast<size_t>(b.id.source) >= K || b.offset < 0 || b.offset >= b.length)
        return corrupt("shard " + std::to_string(s.shard) + ": bad buffered " + id_str(b.id));
    for (const auto& p : s.pending)
      if (p.source < 0 || static_cast<size_t>(p.source) >= K)
        return corrupt("shard " + std::to_string(s.shard) + ": bad pending " + id_str(p));
  }
  return Status::Ok();
}

}  // namespace detail

Result<Resharded> reshard(const ReplicatedState& rep, const std::vector<ShardState>& old_shards,
                          int64_t new_num_shards) {
  if (new_num_shards < 1) return Status(ErrorCode::kInvalidArgument, "reshard: new shard count must be >= 1");
  std::vector<const ShardState*> by_id;
  H5CKPT_RETURN_IF_ERROR(detail::check_shards(rep, old_shards, by_id));

  Resharded out;
  out.replicated = rep;
  if (new_num_shards == rep.num_shards) {  // same walk: shards move unchanged
    for (const auto* s : by_id) out.shards.push_back(*s);
    return out;
  }
  const size_t K = rep.base.size();
  const int64_t S = rep.num_shards;
  std::vector<int64_t> new_base(K, 0);
  for (size_t k = 0; k < K; ++k)
    for (const auto* s : by_id) new_base[k] = std::max(new_base[k], s->next[k]);

  // Whole samples nobody has fetched yet below the new base, plus the old pending ones.
  std::vector<SampleId> pending;
  std::vector<BufferedSample> partial;
  for (const auto* s : by_id) {
    pending.insert(pending.end(), s->pending.begin(), s->pending.end());
    partial.insert(partial.end(), s->buffer.begin(), s->buffer.end());
    for (size_t k = 0; k < K; ++k)
      for (int64_t r = s->next[k]; r < new_base[k]; r += S) pending.push_back({static_cast<int32_t>(k), r});
  }
  // Sorted so the deal does not depend on the order the shards were given in.
  std::sort(pending.begin(), pending.end());
  std::sort(partial.begin(), partial.end(),
            [](const BufferedSample& a, const BufferedSample& b) { return a.id < b.id; });
  for (size_t i = 1; i < pending.size(); ++i)
    if (pending[i] == pending[i - 1]) return corrupt(id_str(pending[i]) + " pending twice");
  for (size_t i = 1; i < partial.size(); ++i)
    if (partial[i].id == partial[i - 1].id) return corrupt(id_str(partial[i].id) + " buffered twice");

  out.replicated.num_shards = new_num_shards;
  out.replicated.base = new_base;
  out.replicated.generation = rep.generation + 1;
  out.shards.reserve(static_cast<size_t>(new_num_shards));
  for (int64_t s = 0; s < new_num_shards; ++s) out.shards.push_back(initial_shard(out.replicated, s));
  // Partial samples first, then the pending ones continue the round robin where they stopped,
  // so token counts stay balanced.
  size_t j = 0;
  for (const auto& b : partial) out.shards[j++ % static_cast<size_t>(new_num_shards)].buffer.push_back(b);
  for (const auto& p : pending) out.shards[j++ % static_cast<size_t>(new_num_shards)].pending.push_back(p);
  return out;
}

// ---- serialization -------------------------------------------------------------------------

std::vector<uint8_t> serialize(const ReplicatedState& rep) {
  Writer w;
  w.put(kRepMagic);
  w.put<uint64_t>(rep.config.seed);
  w.put<int64_t>(rep.config.context_len);
  w.put<int32_t>(rep.config.workers_per_rank);
  w.put<uint64_t>(rep.config.sources.size());
  for (const auto& s : rep.config.sources) {
    w.put_str(s.name);
    w.put<double>(s.ratio);
    w.put<int64_t>(s.min_len);
    w.put<int64_t>(s.max_len);
  }
  w.put<int64_t>(rep.num_shards);
  w.put_i64s(rep.base);
  w.put<int64_t>(rep.generation);
  return std::move(w.buf);
}

Result<ReplicatedState> parse_replicated(const uint8_t* data, size_t size) {
  Reader r(data, size);
  if (r.get<uint64_t>() != kRepMagic) return corrupt("replicated part: bad magic");
  ReplicatedState rep;
  rep.config.seed = r.get<uint64_t>();
  rep.config.context_len = r.get<int64_t>();
  rep.config.workers_per_rank = r.get<int32_t>();
  uint64_t n = r.get_count(8);
  for (uint64_t i = 0; i < n && r.ok(); ++i) {
    SourceSpec s;
    s.name = r.get_str();
    s.ratio = r.get<double>();
    s.min_len = r.get<int64_t>();
    s.max_len = r.get<int64_t>();
    rep.config.sources.push_back(s);
  }
  rep.num_shards = r.get<int64_t>();
  rep.base = r.get_i64s();
  rep.generation = r.get<int64_t>();
  if (!r.ok() || !r.at_end()) return corrupt("replicated part: truncated or trailing bytes");
  if (Status st = rep.config.validate(); !st.ok()) return corrupt(st.message());
  if (rep.base.size() != rep.config.sources.size() || rep.num_shards < 1)
    return corrupt("replicated part: inconsistent shard count or bases");
  return rep;
}

std::vector<uint8_t> serialize(const ShardState& s) {
  Writer w;
  w.put(kShardMagic);
  w.put<int64_t>(s.shard);
  w.put_i64s(s.next);
  w.put<int64_t>(s.draws);
  w.put<uint64_t>(s.pending.size());
  for (const auto& p : s.pending) {
    w.put<int32_t>(p.source);
    w.put<int64_t>(p.record);
  }
  w.put<uint64_t>(s.buffer.size());
  for (const auto& b : s.buffer) {
    w.put<int32_t>(b.id.source);
    w.put<int64_t>(b.id.record);
    w.put<int64_t>(b.offset);
    w.put<int64_t>(b.length);
  }
  w.put<int64_t>(s.tokens_consumed);
  w.put<int64_t>(s.samples_fetched);
  return std::move(w.buf);
}

Result<ShardState> parse_shard(const uint8_t* data, size_t size) {
  Reader r(data, size);
  if (r.get<uint64_t>() != kShardMagic) return corrupt("shard: bad magic");
  ShardState s;
  s.shard = r.get<int64_t>();
  s.next = r.get_i64s();
  s.draws = r.get<int64_t>();
  uint64_t np = r.get_count(12);
  for (uint64_t i = 0; i < np && r.ok(); ++i) {
    SampleId id;
    id.source = r.get<int32_t>();
    id.record = r.get<int64_t>();
    s.pending.push_back(id);
  }
  uint64_t nb = r.get_count(28);
  for (uint64_t i = 0; i < nb && r.ok(); ++i) {
    BufferedSample b;
    b.id.source = r.get<int32_t>();
    b.id.record = r.get<int64_t>();
    b.offset = r.get<int64_t>();
    b.length = r.get<int64_t>();
    s.buffer.push_back(b);
  }
  s.tokens_consumed = r.get<int64_t>();
  s.samples_fetched = r.get<int64_t>();
  if (!r.ok() || !r.at_end()) return corrupt("shard: truncated or trailing bytes");
  return s;
}

const char* replicated_key() { return "loader/replicated"; }

std::string shard_key(int64_t dp_rank, int64_t worker) {
  return "loader/shard/dp" + std::to_string(dp_rank) + "/worker" + std::to_string(worker);
}

Result<std::pair<int64_t, int64_t>> parse_shard_key(const std::string& key) {
  auto bad = [&] { return Status(ErrorCode::kInvalidArgument, "not a loader shard key: '" + key + "'"); };
  const std::string pre = "loader/shard/dp";
  if (key.rfind(pre, 0) != 0) return bad();
  size_t slash = key.find("/worker", pre.size());
  if (slash == std::string::npos) return bad();
  auto num = [](const std::string& s, int64_t& out) {
    if (s.empty() || s.size() > 9 || !std::all_of(s.begin(), s.end(), ::isdigit)) return false;
    out = std::stoll(s);
    return true;
  };
  int64_t d = 0, w = 0;
  if (!num(key.substr(pre.size(), slash - pre.size()), d) || !num(key.substr(slash + 7), w)) return bad();
  return std::make_pair(d, w);
}

// ---- per-rank loader and its checkpoint items ----------------------------------------------

RankLoader RankLoader::fresh(const LoaderConfig& config, int dp_size, int dp_rank) {
  RankLoader l;
  l.replicated = initial_replicated(config, static_cast<int64_t>(dp_size) * config.workers_per_rank);
  for (int w = 0; w < config.workers_per_rank; ++w)
    l.shards.push_back(initial_shard(l.replicated, static_cast<int64_t>(dp_rank) * config.workers_per_rank + w));
  return l;
}

void LoaderCheckpoint::stage_save(StateDict& sd, const RankLoader& loader, int dp_rank) {
  buffers_.clear();
  buffers_[replicated_key()] = serialize(loader.replicated);
  for (size_t w = 0; w < loader.shards.size(); ++w)
    buffers_[shard_key(dp_rank, static_cast<int64_t>(w))] = serialize(loader.shards[w]);
  for (auto& [key, buf] : buffers_) sd.add_bytes(key, buf.data(), buf.size());
}

Status LoaderCheckpoint::stage_load(StateDict& sd, const CheckpointInfo& info) {
  buffers_.clear();
  for (const auto& t : info.tensors) {
    bool rep = t.key == replicated_key();
    if (!rep && t.key.rfind("loader/shard/", 0) != 0) continue;
    if (!rep && !parse_shard_key(t.key).ok()) return corrupt("unexpected item '" + t.key + "'");
    if (t.dtype != DType::kU8 || t.shape.size() != 1 || t.shape[0] < 1)
      return corrupt("item '" + t.key + "' is not a non-empty byte blob");
    buffers_[t.key].resize(static_cast<size_t>(t.shape[0]));
  }
  if (!buffers_.count(replicated_key()))
    return Status(ErrorCode::kNotFound, std::string("checkpoint has no '") + replicated_key() + "'");
  for (auto& [key, buf] : buffers_) sd.add_bytes(key, buf.data(), buf.size());
  return Status::Ok();
}

Result<ReplicatedState> LoaderCheckpoint::saved_replicated() const {
  auto it = buffers_.find(replicated_key());
  if (it == buffers_.end()) return Status(ErrorCode::kNotFound, "loader state not staged");
  return parse_replicated(it->second.data(), it->second.size());
}

Result<std::vector<ShardState>> LoaderCheckpoint::saved_shards() const {
  H5CKPT_ASSIGN_OR_RETURN(ReplicatedState rep, saved_replicated());
  std::vector<ShardState> shards;
  for (const auto& [key, buf] : buffers_) {
    if (key == replicated_key()) continue;
    H5CKPT_ASSIGN_OR_RETURN(auto dw, parse_shard_key(key));
    H5CKPT_ASSIGN_OR_RETURN(ShardState s, parse_shard(buf.data(), buf.size()));
    // The key and the content must agree, or a renamed item would be taken for another shard.
    if (s.shard != dw.first * rep.config.workers_per_rank + dw.second)
      return corrupt("item '" + key + "' holds shard " + std::to_string(s.shard));
    shards.push_back(std::move(s));
  }
  return shards;
}

Result<RankLoader> LoaderCheckpoint::finish_load(int dp_size, int dp_rank, int workers_per_rank) const {
  if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size || workers_per_rank < 1)
    return Status(ErrorCode::kInvalidArgument, "loader finish_load: bad dp_size/dp_rank/workers");
  H5CKPT_ASSIGN_OR_RETURN(ReplicatedState rep, saved_replicated());
  H5CKPT_ASSIGN_OR_RETURN(std::vector<ShardState> shards, saved_shards());
  H5CKPT_ASSIGN_OR_RETURN(Resharded rs, reshard(rep, shards, static_cast<int64_t>(dp_size) * workers_per_rank));
  RankLoader out;
  out.replicated = std::move(rs.replicated);
  out.replicated.config.workers_per_rank = workers_per_rank;
  for (int w = 0; w < workers_per_rank; ++w)
    out.shards.push_back(std::move(rs.shards[static_cast<size_t>(dp_rank) * workers_per_rank + w]));
  return out;
}

}  // namespace h5ckpt::loader
