// Data-loader state: the strided sample walk, windows, resharding and the exactly-once check.
#include "h5ckpt/loader_state.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <sstream>

namespace h5ckpt::loader {
namespace {

uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t hash4(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  return mix64(mix64(mix64(mix64(a) ^ b) ^ c) ^ d);
}

std::string id_str(SampleId id) {
  return "sample (source " + std::to_string(id.source) + ", record " + std::to_string(id.record) +
         ")";
}

Status corrupt(const std::string& what) { return Status(ErrorCode::kCorrupt, "loader state: " + what); }

// Picks the source of a shard's next walk fetch, weighted by the ratios.
int32_t choose_source(const ReplicatedState& rep, const ShardState& shard) {
  const auto& src = rep.config.sources;
  if (src.size() == 1) return 0;
  double total = 0;
  for (const auto& s : src) total += s.ratio;
  uint64_t h = hash4(rep.config.seed ^ 0x5EED5EEDull, static_cast<uint64_t>(rep.generation),
                     static_cast<uint64_t>(shard.shard), static_cast<uint64_t>(shard.draws));
  double u = static_cast<double>(h >> 11) * 0x1.0p-53 * total;
  double acc = 0;
  for (size_t k = 0; k < src.size(); ++k) {
    acc += src[k].ratio;
    if (u < acc) return static_cast<int32_t>(k);
  }
  return static_cast<int32_t>(src.size() - 1);
}

// ---- a small little-endian serializer (fixed layout, versioned by a magic) ----
class Writer {
 public:
  template <class T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    buf.insert(buf.end(), p, p + sizeof(T));
  }
  void put_str(const std::string& s) {
    put<uint64_t>(s.size());
    buf.insert(buf.end(), s.begin(), s.end());
  }
  void put_i64s(const std::vector<int64_t>& v) {
    put<uint64_t>(v.size());
    for (int64_t x : v) put(x);
  }
  std::vector<uint8_t> buf;
};

class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), end_(p + n) {}
  template <class T>
  T get() {
    T v{};
    if (static_cast<size_t>(end_ - p_) < sizeof(T)) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  // Counts are bounded so that a corrupt blob cannot ask for a huge allocation.
  uint64_t get_count(size_t elem_size) {
    uint64_t n = get<uint64_t>();
    if (!ok_ || n > static_cast<uint64_t>(end_ - p_) / std::max<size_t>(elem_size, 1)) {
      ok_ = false;
      return 0;
    }
    return n;
  }
  std::string get_str() {
    uint64_t n = get_count(1);
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  std::vector<int64_t> get_i64s() {
    uint64_t n = get_count(sizeof(int64_t));
    std::vector<int64_t> v(n);
    for (auto& x : v) x = get<int64_t>();
    return v;
  }
  bool ok() const { return ok_; }
  bool at_end() const { return p_ == end_; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  bool ok_ = true;
};

constexpr uint64_t kRepMagic = 0x3150455244414C48ull;    // "HLADREP1"
constexpr uint64_t kShardMagic = 0x3144524853444C48ull;  // "HLDSHRD1"
constexpr uint64_t kLrMagic = 0x3144454843524C48ull;     // "HLRCHED1"
constexpr uint64_t kRngMagic = 0x31474E52444C48ull;      // "HLDRNG1"

}  // namespace

// ---- config --------------------------------------------------------------------------------

LoaderConfig LoaderConfig::default_config(uint64_t seed, int32_t workers_per_rank,
                                          int64_t context_len) {
  LoaderConfig c;
  c.seed = seed;
  c.workers_per_rank = workers_per_rank;
  c.context_len = context_len;
  c.sources = {{"web", 0.6, 32, 1024}, {"code", 0.3, 64, 2048}, {"books", 0.1, 512, 4096}};
  return c;
}

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
      config.workers_per_rank != o.config.workers_per_rank ||
      config.sources.size() != o.config.sources.size())
    return false;
  for (size_t k = 0; k < config.sources.size(); ++k) {
    const auto &a = config.sources[k], &b = o.config.sources[k];
    if (a.name != b.name || a.ratio != b.ratio || a.min_len != b.min_len || a.max_len != b.max_len)
      return false;
  }
  return num_shards == o.num_shards && base == o.base && generation == o.generation;
}

// ---- the walk ------------------------------------------------------------------------------

int64_t sample_length(const LoaderConfig& config, SampleId id) {
  const auto& s = config.sources.at(static_cast<size_t>(id.source));
  uint64_t span = static_cast<uint64_t>(s.max_len - s.min_len + 1);
  uint64_t h = hash4(config.seed, 0x1E46u, static_cast<uint64_t>(id.source),
                     static_cast<uint64_t>(id.record));
  return s.min_len + static_cast<int64_t>(h % span);
}

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

std::vector<Piece> next_window(const ReplicatedState& rep, ShardState& shard) {
  const int64_t want = rep.config.context_len;
  int64_t buffered = 0;
  for (const auto& b : shard.buffer) buffered += b.length - b.offset;
  size_t pending_used = 0;
  while (buffered < want) {
    SampleId id;
    if (pending_used < shard.pending.size()) {
      id = shard.pending[pending_used++];
    } else {
      int32_t k = choose_source(rep, shard);
      id = {k, shard.next[static_cast<size_t>(k)]};
      shard.next[static_cast<size_t>(k)] += rep.num_shards;
      ++shard.draws;
    }
    int64_t len = sample_length(rep.config, id);
    shard.buffer.push_back({id, 0, len});
    buffered += len;
    ++shard.samples_fetched;
  }
  shard.pending.erase(shard.pending.begin(), shard.pending.begin() + static_cast<long>(pending_used));

  std::vector<Piece> pieces;
  int64_t need = want;
  size_t done = 0;  // buffer entries fully consumed
  while (need > 0) {
    BufferedSample& b = shard.buffer[done];
    int64_t take = std::min(need, b.length - b.offset);
    pieces.push_back({b.id, b.offset, b.offset + take});
    b.offset += take;
    need -= take;
    if (b.offset == b.length) ++done;
  }
  shard.buffer.erase(shard.buffer.begin(), shard.buffer.begin() + static_cast<long>(done));
  shard.tokens_consumed += want;
  return pieces;
}

// ---- reshard -------------------------------------------------------------------------------

namespace {

Status check_shards(const ReplicatedState& rep, const std::vector<ShardState>& shards,
                    std::vector<const ShardState*>& by_id) {
  const size_t K = rep.config.sources.size();
  if (rep.base.size() != K) return corrupt("replicated part has " + std::to_string(rep.base.size()) +
                                           " bases for " + std::to_string(K) + " sources");
  if (rep.num_shards < 1) return corrupt("num_shards < 1");
  if (static_cast<int64_t>(shards.size()) != rep.num_shards)
    return corrupt("expected " + std::to_string(rep.num_shards) + " shards, got " +
                   std::to_string(shards.size()));
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
        return corrupt("shard " + std::to_string(s.shard) + ": next record " +
                       std::to_string(s.next[k]) + " of source " + std::to_string(k) +
                       " is not on its walk");
    }
    for (const auto& b : s.buffer)
      if (b.id.source < 0 || static_cast<size_t>(b.id.source) >= K || b.offset < 0 ||
          b.offset >= b.length)
        return corrupt("shard " + std::to_string(s.shard) + ": bad buffered " + id_str(b.id));
    for (const auto& p : s.pending)
      if (p.source < 0 || static_cast<size_t>(p.source) >= K)
        return corrupt("shard " + std::to_string(s.shard) + ": bad pending " + id_str(p));
  }
  return Status::Ok();
}

}  // namespace

Result<Resharded> reshard(const ReplicatedState& rep, const std::vector<ShardState>& old_shards,
                          int64_t new_num_shards) {
  if (new_num_shards < 1)
    return Status(ErrorCode::kInvalidArgument, "reshard: new shard count must be >= 1");
  std::vector<const ShardState*> by_id;
  H5CKPT_RETURN_IF_ERROR(check_shards(rep, old_shards, by_id));

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
      for (int64_t r = s->next[k]; r < new_base[k]; r += S)
        pending.push_back({static_cast<int32_t>(k), r});
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

// ---- verification --------------------------------------------------------------------------

Status verify_exactly_once(const ReplicatedState& rep, const std::vector<ShardState>& shards,
                           const std::vector<Piece>& consumed, VerifySummary* summary) {
  std::vector<const ShardState*> by_id;
  H5CKPT_RETURN_IF_ERROR(check_shards(rep, shards, by_id));
  const size_t K = rep.base.size();
  const int64_t S = rep.num_shards;

  // Consumed prefix per sample; pieces of a sample must tile [0, c).
  std::map<SampleId, std::vector<std::pair<int64_t, int64_t>>> pieces;
  int64_t tokens = 0;
  for (const auto& p : consumed) {
    if (p.id.source < 0 || static_cast<size_t>(p.id.source) >= K || p.begin < 0 || p.end <= p.begin)
      return corrupt("malformed consumed piece of " + id_str(p.id));
    pieces[p.id].push_back({p.begin, p.end});
    tokens += p.end - p.begin;
  }
  std::map<SampleId, int64_t> prefix;
  for (auto& [id, iv] : pieces) {
    std::sort(iv.begin(), iv.end());
    int64_t at = 0;
    for (const auto& [b, e] : iv) {
      if (b < at) return corrupt("tokens [" + std::to_string(b) + ", " + std::to_string(std::min(e, at)) +
                                 ") of " + id_str(id) + " consumed twice");
      if (b > at) return corrupt("tokens [" + std::to_string(at) + ", " + std::to_string(b) + ") of " +
                                 id_str(id) + " skipped");
      at = e;
    }
    int64_t len = sample_length(rep.config, id);
    if (at > len) return corrupt(id_str(id) + " consumed past its length " + std::to_string(len));
    prefix[id] = at;
  }

  // Where each not-fully-consumed sample waits.
  std::map<SampleId, int64_t> buffered;  // id -> offset
  std::set<SampleId> pending;
  for (const auto* s : by_id) {
    for (const auto& b : s->buffer) {
      if (!buffered.emplace(b.id, b.offset).second) return corrupt(id_str(b.id) + " buffered twice");
      if (b.length != sample_length(rep.config, b.id))
        return corrupt(id_str(b.id) + " buffered with a wrong length");
      auto it = prefix.find(b.id);
      int64_t c = it == prefix.end() ? 0 : it->second;
      if (c != b.offset)
        return corrupt(id_str(b.id) + ": buffer resumes at token " + std::to_string(b.offset) +
                       " but " + std::to_string(c) + " were consumed");
    }
    for (const auto& p : s->pending) {
      if (!pending.insert(p).second) return corrupt(id_str(p) + " pending twice");
      if (buffered.count(p)) return corrupt(id_str(p) + " both pending and buffered");
      if (prefix.count(p)) return corrupt(id_str(p) + " pending but already (partly) consumed");
    }
  }

  auto ahead_of_walk = [&](SampleId id) {
    size_t k = static_cast<size_t>(id.source);
    if (id.record < rep.base[k]) return false;
    int64_t owner = (id.record - rep.base[k]) % S;
    return id.record >= by_id[static_cast<size_t>(owner)]->next[k];
  };
  for (const auto& [id, c] : prefix)
    if (ahead_of_walk(id)) return corrupt(id_str(id) + " consumed but still ahead of a walk (would repeat)");
  for (const auto& [id, off] : buffered)
    if (ahead_of_walk(id)) return corrupt(id_str(id) + " buffered but still ahead of a walk");
  for (const auto& id : pending)
    if (ahead_of_walk(id)) return corrupt(id_str(id) + " pending but still ahead of a walk");

  // Every record below the furthest walk position must be accounted for.
  VerifySummary sum;
  sum.tokens_consumed = tokens;
  for (size_t k = 0; k < K; ++k) {
    int64_t top = 0;
    for (const auto* s : by_id) top = std::max(top, s->next[k]);
    for (int64_t r = 0; r < top; ++r) {
      SampleId id{static_cast<int32_t>(k), r};
      if (ahead_of_walk(id)) continue;
      if (pending.count(id)) {
        ++sum.samples_pending;
        continue;
      }
      if (buffered.count(id)) {
        ++sum.samples_partial;
        continue;
      }
      auto it = prefix.find(id);
      int64_t len = sample_length(rep.config, id);
      if (it == prefix.end()) return corrupt(id_str(id) + " lost: never consumed and not pending");
      if (it->second != len)
        return corrupt(id_str(id) + " lost tokens [" + std::to_string(it->second) + ", " +
                       std::to_string(len) + ")");
      ++sum.samples_complete;
    }
  }
  if (summary) *summary = sum;
  return Status::Ok();
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

std::vector<Piece> RankLoader::next_window(int worker) {
  return loader::next_window(replicated, shards.at(static_cast<size_t>(worker)));
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

// ---- extra states --------------------------------------------------------------------------

uint64_t RngState::next_u64() {
  ++draws;
  state += 0x9E3779B97F4A7C15ull;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

RngState derive_rank_rng(uint64_t seed, int64_t step, RankCoords c) {
  RngState r;
  r.state = hash4(seed ^ 0x52A4D0ull, static_cast<uint64_t>(step),
                  (static_cast<uint64_t>(static_cast<uint32_t>(c.tp)) << 32) | static_cast<uint32_t>(c.dp),
                  static_cast<uint64_t>(static_cast<uint32_t>(c.pp)));
  r.draws = 0;
  return r;
}

std::string rng_key(RankCoords c) {
  return "extra/rng/tp" + std::to_string(c.tp) + "_dp" + std::to_string(c.dp) + "_pp" + std::to_string(c.pp);
}

float LrSchedulerState::lr(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps)
    return static_cast<float>(base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps));
  if (decay_steps > 0) {
    double p = std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps));
    return static_cast<float>(min_lr + 0.5 * (base_lr - min_lr) * (1.0 + std::cos(3.14159265358979323846 * p)));
  }
  return static_cast<float>(base_lr);
}

void ExtraStates::stage_save(StateDict& sd, RankCoords coords) {
  step_buf_ = global_step;
  sd.add_replicated("extra/global_step", DType::kI64, {1}, &step_buf_);
  Writer w;
  w.put(kLrMagic);
  w.put(scheduler.base_lr);
  w.put(scheduler.min_lr);
  w.put(scheduler.warmup_steps);
  w.put(scheduler.decay_steps);
  w.put(scheduler.last_step);
  sched_buf_ = std::move(w.buf);
  sd.add_bytes("extra/lr_scheduler", sched_buf_.data(), sched_buf_.size());
  Writer r;
  r.put(kRngMagic);
  r.put(rng.state);
  r.put(rng.draws);
  rng_buf_ = std::move(r.buf);
  sd.add_bytes(rng_key(coords), rng_buf_.data(), rng_buf_.size());
}

Status ExtraStates::stage_load(StateDict& sd, const CheckpointInfo& info, RankCoords coords) {
  const TensorInfo* step = info.find("extra/global_step");
  const TensorInfo* sched = info.find("extra/lr_scheduler");
  if (!step || !sched) return Status(ErrorCode::kNotFound, "checkpoint has no extra/global_step or extra/lr_scheduler");
  if (step->dtype != DType::kI64 || step->shape != Shape{1}) return corrupt("extra/global_step is not int64[1]");
  if (sched->shape.size() != 1) return corrupt("extra/lr_scheduler is not a byte blob");
  sd.add_replicated("extra/global_step", DType::kI64, {1}, &step_buf_);
  sched_buf_.assign(static_cast<size_t>(sched->shape[0]), 0);
  sd.add_bytes("extra/lr_scheduler", sched_buf_.data(), sched_buf_.size());
  const TensorInfo* rng_item = info.find(rng_key(coords));
  rng_staged_ = rng_item && rng_item->shape.size() == 1;
  if (rng_staged_) {
    rng_buf_.assign(static_cast<size_t>(rng_item->shape[0]), 0);
    sd.add_bytes(rng_key(coords), rng_buf_.data(), rng_buf_.size());
  }
  return Status::Ok();
}

Result<bool> ExtraStates::finish_load(uint64_t seed, RankCoords coords) {
  global_step = step_buf_;
  Reader s(sched_buf_.data(), sched_buf_.size());
  if (s.get<uint64_t>() != kLrMagic) return corrupt("extra/lr_scheduler: bad magic");
  LrSchedulerState st;
  st.base_lr = s.get<double>();
  st.min_lr = s.get<double>();
  st.warmup_steps = s.get<int64_t>();
  st.decay_steps = s.get<int64_t>();
  st.last_step = s.get<int64_t>();
  if (!s.ok() || !s.at_end()) return corrupt("extra/lr_scheduler: truncated");
  scheduler = st;
  if (!rng_staged_) {
    rng = derive_rank_rng(seed, global_step, coords);
    return false;
  }
  Reader r(rng_buf_.data(), rng_buf_.size());
  if (r.get<uint64_t>() != kRngMagic) return corrupt(rng_key(coords) + ": bad magic");
  rng.state = r.get<uint64_t>();
  rng.draws = r.get<uint64_t>();
  if (!r.ok() || !r.at_end()) return corrupt(rng_key(coords) + ": truncated");
  return true;
}

}  // namespace h5ckpt::loader
