// The synthetic loader's walk and the exactly-once check (see synthetic_loader.h).
#include "extras/synthetic_loader.h"

#include <algorithm>
#include <map>
#include <set>

#include "extras/splitmix.h"
#include "loader/loader_internal.h"

namespace h5ckpt::extras {

using loader::BufferedSample;
using loader::detail::corrupt;
using loader::detail::id_str;

namespace {

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

}  // namespace

LoaderConfig default_loader_config(uint64_t seed, int32_t workers_per_rank, int64_t context_len) {
  LoaderConfig c;
  c.seed = seed;
  c.workers_per_rank = workers_per_rank;
  c.context_len = context_len;
  c.sources = {{"web", 0.6, 32, 1024}, {"code", 0.3, 64, 2048}, {"books", 0.1, 512, 4096}};
  return c;
}

int64_t sample_length(const LoaderConfig& config, SampleId id) {
  const auto& s = config.sources.at(static_cast<size_t>(id.source));
  uint64_t span = static_cast<uint64_t>(s.max_len - s.min_len + 1);
  uint64_t h = hash4(config.seed, 0x1E46u, static_cast<uint64_t>(id.source), static_cast<uint64_t>(id.record));
  return s.min_len + static_cast<int64_t>(h % span);
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

std::vector<Piece> next_window(RankLoader& loader, int worker) {
  return next_window(loader.replicated, loader.shards.at(static_cast<size_t>(worker)));
}

Status verify_exactly_once(const ReplicatedState& rep, const std::vector<ShardState>& shards,
                           const std::vector<Piece>& consumed, VerifySummary* summary) {
  std::vector<const ShardState*> by_id;
  H5CKPT_RETURN_IF_ERROR(loader::detail::check_shards(rep, shards, by_id));
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
      if (b < at)
        return corrupt("tokens [" + std::to_string(b) + ", " + std::to_string(std::min(e, at)) + ") of " + id_str(id) +
                       " consumed twice");
      if (b > at)
        return corrupt("tokens [" + std::to_string(at) + ", " + std::to_string(b) + ") of " + id_str(id) + " skipped");
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
      if (b.length != sample_length(rep.config, b.id)) return corrupt(id_str(b.id) + " buffered with a wrong length");
      auto it = prefix.find(b.id);
      int64_t c = it == prefix.end() ? 0 : it->second;
      if (c != b.offset)
        return corrupt(id_str(b.id) + ": buffer resumes at token " + std::to_string(b.offset) + " but " +
                       std::to_string(c) + " were consumed");
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
        return corrupt(id_str(id) + " lost tokens [" + std::to_string(it->second) + ", " + std::to_string(len) + ")");
      ++sum.samples_complete;
    }
  }
  if (summary) *summary = sum;
  return Status::Ok();
}

}  // namespace h5ckpt::extras
