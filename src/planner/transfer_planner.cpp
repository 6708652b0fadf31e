#include "planner/transfer_planner.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>

#include "planner/box_math.h"
#include "planner/region_index.h"
#include "planner/region_overlap.h"
#include "util/checked_math.h"

namespace h5ckpt::planner {

namespace {

struct Holder {
  int rank, item;
};

// One distinct shard of a source key and every rank holding it (replicas).
struct UniqueShard {
  ShardSpec shard;
  std::vector<Holder> holders;
};

struct SourceKey {
  DType dtype = DType::kF32;
  Shape shape;
  int first_rank = -1;
  std::vector<UniqueShard> shards;
  std::map<std::string, size_t> by_spec;  // to_string_spec -> index into shards
  std::vector<Box> boxes;                 // every unique shard's boxes
  std::vector<size_t> box_shard;          // boxes[k] belongs to shards[box_shard[k]]
  RegionIndex index;
};

std::string rank_str(int r) { return std::to_string(r); }

// A box cut along dimension 0 into runs of at most `max_bytes` (one row at least).
void cut_rows(const Box& box, uint64_t elem_bytes, uint64_t max_bytes, std::vector<Box>* out) {
  const int64_t rows = box.shape.empty() ? 1 : box.shape[0];
  const uint64_t row_bytes = static_cast<uint64_t>(box.volume() / std::max<int64_t>(rows, 1)) * elem_bytes;
  const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(max_bytes / std::max<uint64_t>(row_bytes, 1)));
  if (box.shape.empty() || per >= rows) {
    out->push_back(box);
    return;
  }
  for (int64_t r0 = 0; r0 < rows; r0 += per) {
    Box b = box;
    b.offset[0] += r0;
    b.shape[0] = std::min(per, rows - r0);
    out->push_back(std::move(b));
  }
}

using SourceKeys = std::map<std::string, SourceKey>;

// Every source key's distinct shards and their holders; dtypes and global shapes must agree.
Result<SourceKeys> collect_sources(const std::vector<std::vector<ItemDesc>>& sources) {
  SourceKeys keys;
  for (size_t r = 0; r < sources.size(); ++r) {
    for (size_t i = 0; i < sources[r].size(); ++i) {
      const ItemDesc& d = sources[r][i];
      const std::string where = "key '" + d.key + "' on source rank " + rank_str(static_cast<int>(r));
      if (Status st = d.shard.validate(d.global_shape); !st.ok()) return st.with_context(where);
      SourceKey& k = keys[d.key];
      if (k.first_rank < 0) {
        k.dtype = d.dtype;
        k.shape = d.global_shape;
        k.first_rank = static_cast<int>(r);
      } else if (k.dtype != d.dtype) {
        return Status(ErrorCode::kDtypeMismatch, where + " is " + dtype_name(d.dtype) + ", on source rank " +
                                                     rank_str(k.first_rank) + " " + dtype_name(k.dtype));
      } else if (k.shape != d.global_shape) {
        return Status(ErrorCode::kShapeMismatch, where + " has global shape " + to_string_shape(d.global_shape) +
                                                     ", on source rank " + rank_str(k.first_rank) + " " +
                                                     to_string_shape(k.shape));
      }
      const std::string spec = to_string_spec(d.shard);
      auto [it, fresh] = k.by_spec.emplace(spec, k.shards.size());
      if (fresh) k.shards.push_back({d.shard, {}});
      k.shards[it->second].holders.push_back({static_cast<int>(r), static_cast<int>(i)});
    }
  }
  return keys;
}

// Distinct source shards of a key must be disjoint: then every element has one set of holders.
// Builds each key's box list and region index.
Status index_disjoint_shards(SourceKeys& keys) {
  for (auto& entry : keys) {  // not a structured binding: clang 14 cannot capture one (fuzz build)
    const auto& key = entry.first;
    auto& k = entry.second;
    for (size_t s = 0; s < k.shards.size(); ++s)
      for (Box& b : shard_boxes(k.shards[s].shard)) {
        k.boxes.push_back(std::move(b));
        k.box_shard.push_back(s);
      }
    H5CKPT_ASSIGN_OR_RETURN(auto overlap, find_overlap(k.shape, k.boxes));
    if (overlap) {
      const UniqueShard& a = k.shards[k.box_shard[overlap->first]];
      const UniqueShard& b = k.shards[k.box_shard[overlap->second]];
      return Status(ErrorCode::kInvalidArgument,
                    "key '" + key + "': source shards overlap without being identical: " + to_string_spec(a.shard) +
                        " on source rank " + rank_str(a.holders[0].rank) + " and " + to_string_spec(b.shard) +
                        " on source rank " + rank_str(b.holders[0].rank));
    }
    k.index = RegionIndex(k.shape, k.boxes.size(), [&](size_t j) { return ShardSpec{k.boxes[j], std::nullopt}; });
  }
  return Status::Ok();
}

// One piece a destination item wants, from one distinct source shard.
struct Candidate {
  int dst_rank, dst_item;
  const SourceKey* source;
  size_t shard;
  Box box;
  uint64_t bytes;
};

// The sources' dtype and shape against one destination item's (converted or padded where the
// options allow).
Status check_want(const SourceKey& k, const TransferWant& w, const TransferPlanOptions& options,
                  const std::string& where) {
  if (k.dtype != w.desc.dtype && !(options.convert_dtype && dtype_is_float(k.dtype) && dtype_is_float(w.desc.dtype)))
    return Status(ErrorCode::kDtypeMismatch, where + ": the sources hold " + dtype_name(k.dtype) +
                                                 ", the destination wants " + dtype_name(w.desc.dtype));
  if (k.shape != w.desc.global_shape) {
    bool padded = w.pad && k.shape.size() == w.desc.global_shape.size() && !k.shape.empty() && k.shape[0] > 0 &&
                  w.desc.global_shape[0] > 0;
    for (size_t d = 1; padded && d < k.shape.size(); ++d) padded = k.shape[d] == w.desc.global_shape[d];
    if (!padded)
      return Status(ErrorCode::kShapeMismatch, where + ": the sources have global shape " + to_string_shape(k.shape) +
                                                   ", the destination wants " + to_string_shape(w.desc.global_shape));
  }
  return Status::Ok();
}

// The pieces of one destination item (rank r, item i) from the source shards it meets, each
// cut into runs of at most max_piece bytes; every element must be held by some source.
Status add_candidates(const SourceKey& k, const TransferWant& w, int r, int i, uint64_t max_piece,
                      const std::string& where, std::vector<Candidate>* cands) {
  const uint64_t es = dtype_size(k.dtype);
  std::vector<size_t> found;
  for (const Box& full : shard_boxes(w.desc.shard)) {
    Box box = full;  // a padded destination takes only the rows the sources have
    if (!box.shape.empty() && box.offset[0] + box.shape[0] > k.shape[0])
      box.shape[0] = std::max<int64_t>(0, k.shape[0] - box.offset[0]);
    if (box.volume() == 0) continue;
    found.clear();
    k.index.find(box, &found);
    int64_t covered = 0;
    for (size_t j : found) {
      auto part = intersect(box, k.boxes[j]);
      if (!part) continue;
      covered += part->volume();
      std::vector<Box> cut;
      cut_rows(*part, es, max_piece, &cut);
      for (Box& c : cut) {
        const uint64_t bytes = static_cast<uint64_t>(c.volume()) * es;
        cands->push_back({r, i, &k, k.box_shard[j], std::move(c), bytes});
      }
    }
    if (covered != box.volume())
      return Status(ErrorCode::kNotFound, where + ": elements of offset " + to_string_shape(box.offset) + " shape " +
                                              to_string_shape(box.shape) + " are held by no source rank");
  }
  return Status::Ok();
}

// Senders: the destination itself when it holds the shard, else worst-fit by bytes over the
// holders, largest pieces first.
std::vector<Holder> choose_senders(const std::vector<Candidate>& cands, std::vector<uint64_t>& sent_by_rank) {
  std::vector<size_t> by_size(cands.size());
  std::iota(by_size.begin(), by_size.end(), size_t{0});
  std::stable_sort(by_size.begin(), by_size.end(), [&](size_t a, size_t b) { return cands[a].bytes > cands[b].bytes; });
  std::vector<Holder> sender(cands.size(), Holder{-1, -1});
  for (size_t c : by_size) {
    const Candidate& cand = cands[c];
    const auto& holders = cand.source->shards[cand.shard].holders;
    const Holder* pick = nullptr;
    for (const Holder& h : holders)
      if (h.rank == cand.dst_rank) {
        pick = &h;
        break;
      }
    if (!pick)
      for (const Holder& h : holders)
        if (!pick || sent_by_rank[h.rank] < sent_by_rank[pick->rank]) pick = &h;
    sender[c] = *pick;
    sent_by_rank[pick->rank] += cand.bytes;
  }
  return sender;
}

// Rounds: first fit, so no rank stages more than round_bytes in one round (a piece a rank sends
// to itself counts twice: received and packed).
Status assign_round(TransferPiece& p, uint64_t round_bytes, const std::string& key,
                    std::vector<std::vector<uint64_t>>& fill, int* rounds) {
  const bool self = p.src_rank == p.dst_rank;
  if ((self ? 2 : 1) * p.bytes > round_bytes)
    return Status(ErrorCode::kInvalidArgument, "key '" + key + "': one row of " + std::to_string(p.bytes) +
                                                   " bytes does not fit memory_bytes = " + std::to_string(round_bytes) +
                                                   " (received and packed bytes are staged)");
  int round = 0;
  for (;; ++round) {
    auto& fs = fill[p.src_rank];
    auto& fd = fill[p.dst_rank];
    if (fs.size() <= static_cast<size_t>(round)) fs.resize(round + 1, 0);
    if (fd.size() <= static_cast<size_t>(round)) fd.resize(round + 1, 0);
    if (self ? fs[round] + 2 * p.bytes <= round_bytes
             : fs[round] + p.bytes <= round_bytes && fd[round] + p.bytes <= round_bytes)
      break;
  }
  fill[p.src_rank][round] += p.bytes;
  fill[p.dst_rank][round] += p.bytes;
  p.round = round;
  *rounds = std::max(*rounds, round + 1);
  return Status::Ok();
}

}  // namespace

Result<TransferPlan> plan_transfer(const std::vector<std::vector<ItemDesc>>& sources,
                                   const std::vector<std::vector<TransferWant>>& dests,
                                   const TransferPlanOptions& options) {
  const size_t world = std::max(sources.size(), dests.size());
  H5CKPT_ASSIGN_OR_RETURN(SourceKeys keys, collect_sources(sources));
  H5CKPT_RETURN_IF_ERROR(index_disjoint_shards(keys));

  std::vector<Candidate> cands;
  TransferPlan plan;
  plan.skipped.resize(world);
  plan.source_rows.resize(world);
  for (size_t r = 0; r < dests.size(); ++r) plan.source_rows[r].assign(dests[r].size(), -1);
  const uint64_t max_piece = options.round_bytes
                                 ? std::min(options.max_piece_bytes, std::max<uint64_t>(1, options.round_bytes / 2))
                                 : options.max_piece_bytes;
  for (size_t r = 0; r < dests.size(); ++r) {
    for (size_t i = 0; i < dests[r].size(); ++i) {
      const TransferWant& w = dests[r][i];
      const std::string where = "key '" + w.desc.key + "' on destination rank " + rank_str(static_cast<int>(r));
      if (Status st = w.desc.shard.validate(w.desc.global_shape); !st.ok()) return st.with_context(where);
      auto kit = keys.find(w.desc.key);
      if (kit == keys.end()) {
        if (!options.strict) {
          plan.skipped[r].push_back(static_cast<int>(i));
          continue;
        }
        return Status(ErrorCode::kNotFound, where + ": no source rank holds it");
      }
      const SourceKey& k = kit->second;
      plan.source_rows[r][i] = k.shape.empty() ? 1 : k.shape[0];
      H5CKPT_RETURN_IF_ERROR(check_want(k, w, options, where));
      H5CKPT_RETURN_IF_ERROR(add_candidates(k, w, static_cast<int>(r), static_cast<int>(i), max_piece, where, &cands));
    }
  }

  plan.sent_by_rank.assign(world, 0);
  const std::vector<Holder> sender = choose_senders(cands, plan.sent_by_rank);
  std::vector<std::vector<uint64_t>> fill(world);
  plan.pieces.reserve(cands.size());
  for (size_t c = 0; c < cands.size(); ++c) {
    Candidate& cand = cands[c];
    TransferPiece p;
    p.src_rank = sender[c].rank;
    p.src_item = sender[c].item;
    p.dst_rank = cand.dst_rank;
    p.dst_item = cand.dst_item;
    p.box = std::move(cand.box);
    p.src_dtype = cand.source->dtype;
    p.src_shape = cand.source->shape;
    p.bytes = cand.bytes;
    if (options.round_bytes)
      H5CKPT_RETURN_IF_ERROR(
          assign_round(p, options.round_bytes, dests[p.dst_rank][p.dst_item].desc.key, fill, &plan.rounds));
    plan.pieces.push_back(std::move(p));
  }
  return plan;
}

}  // namespace h5ckpt::planner
