#include "storage/meta_v2.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>
#include <unordered_map>

#include "planner/box_math.h"
#include "planner/region_overlap.h"
#include "planner/save_planner.h"
#include "storage/region_reader.h"
#include "storage/auth.h"
#include "storage/signed_json.h"
#include "storage/verify_blocks.h"
#include "util/checked_math.h"

namespace h5ckpt::storage::v2 {

// Records are copied to and from the image byte for byte: the host order must be the file's.
static_assert(std::endian::native == std::endian::little, "format v2 tables are little-endian");

using nlohmann::json;

namespace {

constexpr const char* kTableNames[kTableCount] = {"tensors", "regions", "extents",    "blocks",
                                                  "coords",  "names",   "attributes", "saved_coords"};
// Bytes per record, in table order: blocks and coords are 8-byte integers, names single bytes.
constexpr uint64_t kRecordBytes[kTableCount] = {
    sizeof(TensorRecord),    sizeof(RegionRecord),     sizeof(ExtentRecord), 8, 8, 1,
    sizeof(AttributeRecord), sizeof(SavedCoordsRecord)};

// Dtype codes of the format (docs/format.md §4.3); 0 is never a dtype.
constexpr std::pair<DType, uint8_t> kDtypeCodes[] = {
    {DType::kF32, 1}, {DType::kF64, 2}, {DType::kF16, 3}, {DType::kBF16, 4}, {DType::kF8E4M3, 5}, {DType::kF8E5M2, 6},
    {DType::kI8, 7},  {DType::kI16, 8}, {DType::kI32, 9}, {DType::kI64, 10}, {DType::kU8, 11},    {DType::kBool, 12},
};

// Largest index image a summary may describe: far beyond any real index, far below overflow.
constexpr uint64_t kMaxImageBytes = uint64_t{1} << 50;

constexpr uint64_t align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

size_t slot(Table t) { return static_cast<size_t>(t); }

Status corrupt(const std::string& why) { return Status(ErrorCode::kCorrupt, "metadata: " + why); }

std::string quoted_table(Table t) { return std::string("table '") + table_name(t) + "'"; }

// `a + b <= limit` without overflow.
bool fits(uint64_t a, uint64_t b, uint64_t limit) { return a <= limit && b <= limit - a; }

// A table's sum in the summary: xxh3, or with a key a MAC bound to the table's place (tables
// cannot be swapped for one another).
uint64_t table_digest(size_t table, const void* bytes, uint64_t size) {
  return auth::enabled() ? auth::tag64(0x7461626c65000000ull | table, bytes, size) : checksum_bytes(bytes, size);
}

template <class Record>
void append_record(std::vector<char>& table, const Record& r) {
  const char* p = reinterpret_cast<const char*>(&r);
  table.insert(table.end(), p, p + sizeof r);
}

template <class T>
void append_values(std::vector<char>& table, const T* values, size_t n) {
  const char* p = reinterpret_cast<const char*>(values);
  table.insert(table.end(), p, p + n * sizeof(T));
}

template <class Record>
Record load_record(const unsigned char* table, uint64_t index) {
  Record r;
  std::memcpy(&r, table + index * sizeof(Record), sizeof r);
  return r;
}

// Interns value sequences: equal sequences get the same position in the output table. The hash
// table holds each sequence's place in the output table rather than a copy of it, so a save of
// 1.45 million regions (405B) interns their boxes without an allocation each.
class Interner {
 public:
  explicit Interner(std::vector<char>* table, size_t value_bytes) : table_(table), value_bytes_(value_bytes) {}
  uint64_t add(const void* values, size_t n) {
    const size_t bytes = n * value_bytes_;
    const uint64_t hash = checksum_bytes(values, bytes);
    if (2 * (used_ + 1) > slots_.size()) grow();
    const size_t mask = slots_.size() - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.bytes_plus_one == 0) {
        s = Slot{hash, table_->size(), bytes + 1};
        const char* p = static_cast<const char*>(values);
        table_->insert(table_->end(), p, p + bytes);
        ++used_;
        return s.at / value_bytes_;
      }
      if (s.hash == hash && s.bytes_plus_one == bytes + 1 &&
          (bytes == 0 || std::memcmp(table_->data() + s.at, values, bytes) == 0))
        return s.at / value_bytes_;
    }
  }

 private:
  struct Slot {
    uint64_t hash = 0, at = 0, bytes_plus_one = 0;  // 0: empty
  };
  void grow() {  // open addressing, at most half full
    std::vector<Slot> old(std::max<size_t>(64, 2 * slots_.size()));
    old.swap(slots_);
    const size_t mask = slots_.size() - 1;
    for (const Slot& s : old)
      if (s.bytes_plus_one != 0) {
        size_t i = s.hash & mask;
        while (slots_[i].bytes_plus_one != 0) i = (i + 1) & mask;
        slots_[i] = s;
      }
  }
  std::vector<char>* table_;
  size_t value_bytes_;
  std::vector<Slot> slots_;
  size_t used_ = 0;
};

}  // namespace

const char* table_name(Table t) { return kTableNames[slot(t)]; }
uint64_t record_bytes(Table t) { return kRecordBytes[slot(t)]; }

uint8_t dtype_code(DType t) {
  for (const auto& [dtype, code] : kDtypeCodes)
    if (dtype == t) return code;
  return 0;
}

std::optional<DType> dtype_of_code(uint8_t code) {
  for (const auto& [dtype, c] : kDtypeCodes)
    if (c == code) return dtype;
  return std::nullopt;
}

uint64_t Summary::image_offset(Table t) const {
  uint64_t at = 0;
  for (size_t i = 0; i < slot(t); ++i) at = align8(at + tables[i].bytes);
  return at;
}

uint64_t Summary::image_bytes() const {
  return image_offset(Table::kSavedCoords) + tables[slot(Table::kSavedCoords)].bytes;
}

// ---- summary ------------------------------------------------------------------------------------

Result<Summary> parse_summary(const std::string& text) {
  H5CKPT_ASSIGN_OR_RETURN(json j, parse_signed_json(text));
  Summary s;
  if (auto f = j.find("format"); f == j.end() || !f->is_string() || *f != kFormatName)
    return corrupt("format is not 'h5ckpt'");
  if (auto v = j.find("format_version");
      v != j.end() && v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(kFormatVersion))
    return newer_than_library(v->get<uint64_t>());
  if (!json_member_int(j, "format_version", &s.format_version))
    return corrupt("missing or out-of-range format_version");
  if (s.format_version != kFormatVersion)
    return corrupt("format_version " + std::to_string(s.format_version) + " is not a format-v2 summary");
  if (auto lv = j.find("library_version"); lv != j.end() && lv->is_string()) s.library_version = lv->get<std::string>();
  if (auto st = j.find("step"); st != j.end() && !json_int(*st, &s.step))
    return corrupt("step is not a 64-bit integer");
  if (auto df = j.find("data_file"); df == j.end() || !df->is_string() || *df != kDataFileName)
    return corrupt("data_file must be '" + std::string(kDataFileName) + "'");
  const auto topo = j.find("topology");
  if (topo == j.end() || !topo->is_object() || !json_member_int(*topo, "tp", &s.saved_sizes.tp) ||
      !json_member_int(*topo, "dp", &s.saved_sizes.dp) || !json_member_int(*topo, "pp", &s.saved_sizes.pp) ||
      !json_member_int(*topo, "world", &s.world) || s.world < 0 || s.world > INT32_MAX)
    return corrupt("topology (tp, dp, pp, world) missing or out of range");
  // Context and expert parallel sizes: written only when not 1 (older checkpoints have neither).
  for (auto [name, dst] : {std::pair{"cp", &s.saved_sizes.cp}, std::pair{"ep", &s.saved_sizes.ep}})
    if (topo->contains(name) && (!json_member_int(*topo, name, dst) || *dst < 1))
      return corrupt(std::string("topology ") + name + " out of range");
  const auto checksums = j.find("checksums");
  if (checksums == j.end() || !checksums->is_boolean()) return corrupt("'checksums' is not a boolean");
  s.checksums = checksums->get<bool>();
  if (j.contains("auth") && !s.checksums) return corrupt("an authenticated summary without checksums");

  const auto tables = j.find("tables");
  if (tables == j.end() || !tables->is_object()) return corrupt("missing table list");
  uint64_t image = 0;
  for (size_t i = 0; i < kTableCount; ++i) {
    const Table t = static_cast<Table>(i);
    const auto e = tables->find(table_name(t));
    if (e == tables->end() || !e->is_object()) return corrupt("missing " + quoted_table(t));
    auto bad = [&](const std::string& why) { return corrupt(quoted_table(t) + ": " + why); };
    TableRef& ref = s.tables[i];
    uint64_t rec_bytes = 0;
    if (auto ds = e->find("dataset");
        ds == e->end() || !ds->is_string() || *ds != std::string("/meta/") + table_name(t))
      return bad("dataset must be '/meta/" + std::string(table_name(t)) + "'");
    if (!json_member_int(*e, "offset", &ref.offset) || !json_member_int(*e, "bytes", &ref.bytes) ||
        !json_member_int(*e, "records", &ref.records) || !json_member_int(*e, "record_bytes", &rec_bytes))
      return bad("offset, bytes, records or record_bytes missing or out of range");
    if (rec_bytes != record_bytes(t))
      return bad("records of " + std::to_string(rec_bytes) + " bytes; format v2 has " +
                 std::to_string(record_bytes(t)));
    if (auto x = e->find("xxh3"); x == e->end() || !parse_hex64(*x, &ref.xxh3)) return bad("malformed xxh3");
    uint64_t expect = 0;
    if (__builtin_mul_overflow(ref.records, rec_bytes, &expect) || expect != ref.bytes)
      return bad(std::to_string(ref.records) + " records do not take " + std::to_string(ref.bytes) + " bytes");
    if (ref.bytes == 0 ? ref.offset != -1 : ref.offset < 0)
      return bad("offset " + std::to_string(ref.offset) + " (an empty table has offset -1, any other one >= 0)");
    if (!fits(align8(image), ref.bytes, kMaxImageBytes)) return bad("the tables are implausibly large");
    image = align8(image) + ref.bytes;
  }
  const auto counts = j.find("counts");
  uint64_t tensors = 0, regions = 0, blocks = 0;
  if (counts == j.end() || !counts->is_object() || !json_member_int(*counts, "tensors", &tensors) ||
      !json_member_int(*counts, "regions", &regions) || !json_member_int(*counts, "blocks", &blocks))
    return corrupt("counts (tensors, regions, blocks) missing or out of range");
  if (tensors != s.table(Table::kTensors).records || regions != s.table(Table::kRegions).records ||
      blocks != s.table(Table::kBlocks).records)
    return corrupt("counts do not match the tables' record counts");
  if (static_cast<uint64_t>(s.world) != s.table(Table::kSavedCoords).records)
    return corrupt("topology world " + std::to_string(s.world) + " but " +
                   std::to_string(s.table(Table::kSavedCoords).records) + " saved coordinates");
  return s;
}

// ---- writing ------------------------------------------------------------------------------------

std::vector<char> Encoded::image() const {
  std::vector<char> out(summary.image_bytes(), 0);
  for (size_t i = 0; i < kTableCount; ++i)
    std::copy(tables[i].begin(), tables[i].end(), out.begin() + summary.image_offset(static_cast<Table>(i)));
  return out;
}

uint64_t Encoded::total_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tables) n += t.size();
  return n;
}

std::string Encoded::summary_json(const std::array<int64_t, kTableCount>& offsets) const {
  json j;
  j["format"] = kFormatName;
  j["format_version"] = kFormatVersion;
  j["library_version"] = summary.library_version;
  j["step"] = summary.step;
  j["data_file"] = kDataFileName;
  j["topology"] = {{"tp", summary.saved_sizes.tp},
                   {"dp", summary.saved_sizes.dp},
                   {"pp", summary.saved_sizes.pp},
                   {"world", summary.world}};
  if (summary.saved_sizes.cp != 1) j["topology"]["cp"] = summary.saved_sizes.cp;
  if (summary.saved_sizes.ep != 1) j["topology"]["ep"] = summary.saved_sizes.ep;
  j["checksums"] = summary.checksums;
  j["counts"] = {{"tensors", records[slot(Table::kTensors)]},
                 {"regions", records[slot(Table::kRegions)]},
                 {"blocks", records[slot(Table::kBlocks)]}};
  json tables_json = json::object();
  for (size_t i = 0; i < kTableCount; ++i) {
    const Table t = static_cast<Table>(i);
    tables_json[table_name(t)] = {{"dataset", std::string("/meta/") + table_name(t)},
                                  {"offset", tables[i].empty() ? int64_t{-1} : offsets[i]},
                                  {"bytes", tables[i].size()},
                                  {"records", records[i]},
                                  {"record_bytes", record_bytes(t)},
                                  {"xxh3", hex64(summary.tables[i].xxh3)}};
  }
  j["tables"] = std::move(tables_json);
  return dump_signed_json(std::move(j));
}

namespace {

// A CheckpointInfo's tensors as a TensorSource.
class InfoTensors final : public TensorSource {
 public:
  explicit InfoTensors(const std::vector<TensorInfo>& tensors) : tensors_(tensors) {}
  size_t size() const override { return tensors_.size(); }
  Tensor tensor(size_t t) const override {
    const TensorInfo& x = tensors_[t];
    return {x.key, x.dtype, &x.shape, x.nbytes, x.file_offset, x.regions.size()};
  }
  Region region(size_t t, size_t r) const override {
    const SavedRegion& x = tensors_[t].regions[r];
    return {&x.shard.box,
            x.shard.flat,
            x.writer_rank,
            x.checksum,
            x.block_bytes,
            x.block_checksums.data(),
            x.block_checksums.size()};
  }

 private:
  const std::vector<TensorInfo>& tensors_;
};

}  // namespace

Result<Encoded> encode(const CheckpointInfo& info) { return encode(info, InfoTensors(info.tensors)); }

Result<Encoded> encode(const CheckpointInfo& info, const TensorSource& source) {
  Encoded out;
  auto& tensors = out.tables[slot(Table::kTensors)];
  auto& regions = out.tables[slot(Table::kRegions)];
  auto& extents = out.tables[slot(Table::kExtents)];
  auto& blocks = out.tables[slot(Table::kBlocks)];
  auto& names = out.tables[slot(Table::kNames)];
  Interner coords(&out.tables[slot(Table::kCoords)], sizeof(int64_t));
  Interner extent_ids(&extents, sizeof(ExtentRecord));
  auto invalid = [](const std::string& why) { return Status(ErrorCode::kInvalidArgument, "format v2 index: " + why); };
  auto add_name = [&](std::string_view s) {
    const uint64_t at = names.size();
    names.insert(names.end(), s.begin(), s.end());
    return at;
  };

  std::vector<TensorSource::Tensor> order;
  order.reserve(source.size());
  for (size_t t = 0; t < source.size(); ++t) order.push_back(source.tensor(t));
  std::vector<size_t> by_key(order.size());
  std::iota(by_key.begin(), by_key.end(), size_t{0});
  std::sort(by_key.begin(), by_key.end(), [&](size_t a, size_t b) { return order[a].key < order[b].key; });
  bool all_blocks = true;
  uint64_t region_count = 0, block_total = 0;
  for (size_t n : by_key) {
    const TensorSource::Tensor& t = order[n];
    const Shape& shape = *t.shape;
    if (shape.empty() || shape.size() > kMaxDims)
      return invalid("tensor '" + std::string(t.key) + "' has no valid rank");
    if (t.key.size() > UINT32_MAX) return invalid("a key is longer than 4 GiB");
    TensorRecord rec{};
    rec.key_offset = add_name(t.key);
    rec.key_length = static_cast<uint32_t>(t.key.size());
    rec.dtype = dtype_code(t.dtype);
    rec.ndim = static_cast<uint8_t>(shape.size());
    rec.shape_index = coords.add(shape.data(), shape.size());
    rec.nbytes = t.nbytes;
    rec.file_offset = t.nbytes ? t.file_offset : -1;
    rec.first_region = region_count;
    rec.region_count = t.regions;
    rec.first_block = block_total;
    for (size_t k = 0; k < t.regions; ++k) {
      const TensorSource::Region r = source.region(n, k);
      const Box& b = *r.box;
      auto where = [&] { return "tensor '" + std::string(t.key) + "' region " + to_string_spec(ShardSpec{b, r.flat}); };
      if (r.whole_checksum != 0)
        return invalid(where() + " has a whole-region (format v1) checksum; format v2 stores verification blocks");
      if (r.writer < 0) return invalid(where() + " has a negative writer");
      const size_t ndim = shape.size();
      if (b.offset.size() != ndim || b.shape.size() != ndim)
        return invalid(where() + " has another rank than its tensor");
      int64_t numel = 1;
      for (int64_t e : b.shape) numel *= e;
      if (r.flat) numel = r.flat->second - r.flat->first;
      const uint64_t region_bytes = static_cast<uint64_t>(numel) * dtype_size(t.dtype);
      if (r.sum_count != block_count(region_bytes, r.block_bytes))
        return invalid(where() + " has " + std::to_string(r.sum_count) + " block checksums for " +
                       std::to_string(block_count(region_bytes, r.block_bytes)) + " blocks");
      ExtentRecord ext{};
      int64_t box[2 * kMaxDims];  // offset, then shape: the box as the coords table holds it
      std::copy(b.offset.begin(), b.offset.end(), box);
      std::copy(b.shape.begin(), b.shape.end(), box + ndim);
      ext.box_index = coords.add(box, 2 * ndim);
      if (r.flat) {
        ext.flat = 1;
        ext.flat_begin = r.flat->first;
        ext.flat_end = r.flat->second;
      }
      ext.block_bytes = r.block_bytes;
      ext.ndim = static_cast<uint32_t>(ndim);
      const uint64_t extent = extent_ids.add(&ext, 1);
      if (extent > UINT32_MAX || static_cast<uint64_t>(r.writer) > UINT32_MAX)
        return invalid("more than 2^32 distinct region extents");
      append_record(regions, RegionRecord{static_cast<uint32_t>(r.writer), static_cast<uint32_t>(extent)});
      append_values(blocks, r.sums, r.sum_count);
      block_total += r.sum_count;
      all_blocks = all_blocks && r.block_bytes > 0;
      ++region_count;
    }
    append_record(tensors, rec);
  }
  auto& attributes = out.tables[slot(Table::kAttributes)];
  for (const auto& [k, v] : info.attributes) {
    if (k.size() > UINT32_MAX || v.size() > UINT32_MAX) return invalid("an attribute is longer than 4 GiB");
    AttributeRecord a{};
    a.key_offset = add_name(k);
    a.key_length = static_cast<uint32_t>(k.size());
    a.value_offset = add_name(v);
    a.value_length = static_cast<uint32_t>(v.size());
    append_record(attributes, a);
  }
  for (const RankCoords& c : info.saved_coords)
    append_record(out.tables[slot(Table::kSavedCoords)], SavedCoordsRecord{c.tp, c.dp, c.pp});

  Summary& s = out.summary;
  s.library_version = info.library_version;
  s.step = info.step;
  s.saved_sizes = info.saved_sizes;
  s.world = static_cast<int64_t>(info.saved_coords.size());
  s.checksums = all_blocks;
  // An authenticated checkpoint has no unauthenticated bytes.
  if (auth::enabled() && !all_blocks)
    return invalid("a key is configured (auth_key_file): every region must have checksums (save.checksums)");
  for (size_t i = 0; i < kTableCount; ++i) {
    out.records[i] = out.tables[i].size() / kRecordBytes[i];
    s.tables[i] =
        TableRef{-1, out.tables[i].size(), out.records[i], table_digest(i, out.tables[i].data(), out.tables[i].size())};
  }
  return out;
}

Result<uint64_t> encoded_bytes(const CheckpointInfo& info) {
  H5CKPT_ASSIGN_OR_RETURN(Encoded e, encode(info));
  return e.total_bytes();
}

// ---- reading ------------------------------------------------------------------------------------

const unsigned char* Index::table_bytes(Table t) const { return tables_[slot(t)]; }

TensorRecord Index::tensor(size_t t) const { return load_record<TensorRecord>(table_bytes(Table::kTensors), t); }

ExtentRecord Index::extent(uint64_t e) const { return load_record<ExtentRecord>(table_bytes(Table::kExtents), e); }

int64_t Index::coord(uint64_t i) const { return load_record<int64_t>(table_bytes(Table::kCoords), i); }

uint64_t Index::block_checksum(uint64_t i) const { return load_record<uint64_t>(table_bytes(Table::kBlocks), i); }

Result<Index> Index::open(const Summary& summary, const void* image, size_t size, uint64_t data_file_size,
                          bool validate) {
  if (size != summary.image_bytes())
    return corrupt("the index image has " + std::to_string(size) + " bytes; its summary describes " +
                   std::to_string(summary.image_bytes()));
  Index index;
  index.summary_ = summary;
  const auto* bytes = static_cast<const unsigned char*>(image);
  for (size_t i = 0; i < kTableCount; ++i) index.tables_[i] = bytes + summary.image_offset(static_cast<Table>(i));
  if (validate)
    for (size_t i = 0; i < kTableCount; ++i) {
      const Table t = static_cast<Table>(i);
      if (table_digest(i, index.table_bytes(t), summary.tables[i].bytes) != summary.tables[i].xxh3)
        return corrupt(quoted_table(t) + " fails its checksum (the index in the data file was modified or damaged)");
    }
  H5CKPT_RETURN_IF_ERROR(index.check_structure());
  if (validate) H5CKPT_RETURN_IF_ERROR(index.check_contents(data_file_size));
  return index;
}

// Every index between tables, every range and the geometry each accessor relies on: linear, no
// allocation per region.
Status Index::check_structure() const {
  const uint64_t names = summary_.table(Table::kNames).bytes;
  const uint64_t coords = summary_.table(Table::kCoords).records;
  const uint64_t n_extents = summary_.table(Table::kExtents).records;
  const uint64_t n_regions = summary_.table(Table::kRegions).records;
  const uint64_t n_blocks = summary_.table(Table::kBlocks).records;
  const unsigned char* attributes = table_bytes(Table::kAttributes);
  for (uint64_t a = 0; a < summary_.table(Table::kAttributes).records; ++a) {
    const auto rec = load_record<AttributeRecord>(attributes, a);
    if (!fits(rec.key_offset, rec.key_length, names) || !fits(rec.value_offset, rec.value_length, names))
      return corrupt("attribute " + std::to_string(a) + " lies outside the names table");
  }
  for (uint64_t e = 0; e < n_extents; ++e) {
    const ExtentRecord x = extent(e);
    const std::string which = "region extent " + std::to_string(e);
    if (x.ndim < 1 || x.ndim > kMaxDims) return corrupt(which + " has rank " + std::to_string(x.ndim));
    if (!fits(x.box_index, 2 * uint64_t{x.ndim}, coords)) return corrupt(which + " lies outside the coords table");
    if (x.flat > 1) return corrupt(which + " has flat flag " + std::to_string(x.flat));
    int64_t volume = 1;
    for (uint32_t d = 0; d < x.ndim; ++d) {
      const int64_t off = coord(x.box_index + d), ext = coord(x.box_index + x.ndim + d);
      if (off < 0 || ext < 0 || !checked_mul(volume, ext, &volume))
        return corrupt(which + " has a negative or overflowing box");
    }
    if (x.flat ? !(0 <= x.flat_begin && x.flat_begin <= x.flat_end && x.flat_end <= volume)
               : (x.flat_begin != 0 || x.flat_end != 0))
      return corrupt(which + " has flat range [" + std::to_string(x.flat_begin) + "," + std::to_string(x.flat_end) +
                     ") in a box of " + std::to_string(volume) + " elements");
    if ((x.flat ? x.flat_end - x.flat_begin : volume) == 0) return corrupt(which + " is empty");
  }
  const unsigned char* region_table = table_bytes(Table::kRegions);
  uint64_t next_region = 0, next_block = 0;
  // A region's geometry depends only on its extent, its tensor's shape and rank, and the element
  // size. Extents are shared by the regions of many tensors of one shape (every layer's), so each
  // (extent, shape, element size) is checked once and its block count kept: checked region by
  // region, the 1.45 million regions of a 405B index took each rank's open 0.028 s.
  struct Checked {
    uint64_t shape_index = ~uint64_t{0}, rank_and_size = 0, blocks = 0;
  };
  std::vector<Checked> checked(n_extents);
  for (size_t t = 0; t < tensor_count(); ++t) {
    const TensorRecord rec = tensor(t);
    if (!fits(rec.key_offset, rec.key_length, names))
      return corrupt("tensor " + std::to_string(t) + ": key lies outside the names table");
    auto where = [&] { return "tensor '" + printable(key(t)) + "': "; };  // error paths only
    const auto dtype = dtype_of_code(rec.dtype);
    if (!dtype) return corrupt(where() + "unknown dtype code " + std::to_string(rec.dtype));
    if (rec.ndim < 1 || rec.ndim > kMaxDims) return corrupt(where() + "rank " + std::to_string(rec.ndim));
    if (!fits(rec.shape_index, rec.ndim, coords)) return corrupt(where() + "shape lies outside the coords table");
    int64_t numel = 1;
    for (uint32_t d = 0; d < rec.ndim; ++d)
      if (coord(rec.shape_index + d) < 0 || !checked_mul(numel, coord(rec.shape_index + d), &numel))
        return corrupt(where() + "shape " + to_string_shape(shape(t)) + " invalid");
    if (rec.first_region != next_region || !fits(rec.first_region, rec.region_count, n_regions))
      return corrupt(where() + "regions [" + std::to_string(rec.first_region) + ", +" +
                     std::to_string(rec.region_count) + ") do not follow the previous tensor's in the regions table");
    if (rec.first_block != next_block)
      return corrupt(where() + "first block " + std::to_string(rec.first_block) + ", expected " +
                     std::to_string(next_block) + " (block counts inconsistent)");
    next_region += rec.region_count;
    const uint64_t rank_and_size = rec.ndim | uint64_t{dtype_size(*dtype)} << 8;
    for (uint64_t r = rec.first_region; r < next_region; ++r) {
      const auto reg = load_record<RegionRecord>(region_table, r);
      if (reg.extent >= n_extents) return corrupt(where() + "region " + std::to_string(r) + " names a missing extent");
      if (summary_.world > 0 && reg.writer >= static_cast<uint64_t>(summary_.world))
        return corrupt(where() + "region writer rank " + std::to_string(reg.writer) + " invalid");
      Checked& c = checked[reg.extent];
      if (c.shape_index != rec.shape_index || c.rank_and_size != rank_and_size) {
        const ExtentRecord x = extent(reg.extent);
        if (x.ndim != rec.ndim) return corrupt(where() + "a region has another rank than the tensor");
        int64_t region_numel = 1;
        for (uint32_t d = 0; d < rec.ndim; ++d) {
          const int64_t off = coord(x.box_index + d), ext = coord(x.box_index + rec.ndim + d);
          int64_t end = 0;
          if (!checked_add(off, ext, &end) || end > coord(rec.shape_index + d))
            return corrupt(where() + "a region lies outside the tensor");
          region_numel *= ext;  // no overflow: inside the tensor
        }
        if (x.flat) region_numel = x.flat_end - x.flat_begin;
        uint64_t region_bytes = 0;
        if (__builtin_mul_overflow(static_cast<uint64_t>(region_numel), dtype_size(*dtype), &region_bytes))
          return corrupt(where() + "a region's size overflows");
        // A block size beyond what any save chooses would make element counts negative where they
        // are signed; the block count below is then exactly ceil(region bytes / block bytes).
        uint64_t slab = dtype_size(*dtype);
        for (uint32_t d = 1; d < rec.ndim && !x.flat; ++d)
          slab *= static_cast<uint64_t>(coord(x.box_index + rec.ndim + d));
        if (x.block_bytes > max_block_bytes(std::max<uint64_t>(slab, 1)))
          return corrupt(where() + "region " + std::to_string(r) + " has verification blocks of " +
                         std::to_string(x.block_bytes) + " bytes (at most " +
                         std::to_string(max_block_bytes(std::max<uint64_t>(slab, 1))) + " are written)");
        c = Checked{rec.shape_index, rank_and_size, block_count(region_bytes, x.block_bytes)};
      }
      if (!fits(next_block, c.blocks, n_blocks))
        return corrupt(where() + "its regions need more block checksums than the blocks table holds");
      next_block += c.blocks;
    }
  }
  if (next_region != n_regions)
    return corrupt(std::to_string(n_regions - next_region) + " regions belong to no tensor");
  if (next_block != n_blocks)
    return corrupt(std::to_string(n_blocks - next_block) + " block checksums belong to no region");
  return Status::Ok();
}

// Regions that are neither identical nor disjoint, or that leave elements out. Coverage is
// counted; disjointness is checked as the save planner checks it: the regions of one box must have
// disjoint ranges (neighbours once sorted), and the distinct boxes, a few per tensor (the TP
// shards), must be disjoint. Only when two distinct boxes meet (or an index repeats a box under
// two positions) are all the regions' pieces compared, which is exact but allocates per region.
// At 405B (1.45 million regions) this keeps a validation of the index to a linear pass. The
// reasons come back without the "metadata: tensor '<key>'" prefix, which the caller adds.
Status Index::check_regions(size_t t, const Shape& shape, RegionScratch& scratch) const {
  const TensorRecord rec = tensor(t);
  const DType dtype = *dtype_of_code(rec.dtype);
  const uint64_t es = dtype_size(dtype);
  const unsigned char* region_table = table_bytes(Table::kRegions);
  auto spec = [&](size_t r) { return to_string_spec(regions(t)[r].shard); };  // error paths only
  std::vector<RegionRange>& ranges = scratch.ranges;
  ranges.clear();
  int64_t covered = 0;
  for (uint64_t r = 0; r < rec.region_count; ++r) {
    const auto reg = load_record<RegionRecord>(region_table, rec.first_region + r);
    const ExtentRecord x = extent(reg.extent);
    int64_t volume = 1;
    uint64_t slab = es;
    for (uint32_t d = 0; d < x.ndim; ++d) {
      const int64_t ext = coord(x.box_index + x.ndim + d);
      volume *= ext;  // no overflow: check_structure
      if (d >= 1 && !x.flat) slab *= static_cast<uint64_t>(ext);
    }
    if (x.block_bytes % std::max<uint64_t>(slab, 1) != 0)  // region_slab_bytes
      return Status(ErrorCode::kCorrupt, "malformed verification blocks of region " + spec(r));
    if (summary_.checksums && x.block_bytes == 0)
      return Status(ErrorCode::kCorrupt, "region " + spec(r) + " has no checksum in a checkpoint saved with checksums");
    const int64_t begin = x.flat ? x.flat_begin : 0, end = x.flat ? x.flat_end : volume;
    if (!checked_add(covered, end - begin, &covered)) covered = INT64_MAX;
    ranges.push_back({x.box_index, begin, end, r});
  }
  auto overlapping = [&](size_t a, size_t b) {
    const std::vector<RegionView> regs = regions(t);
    if (a > b) std::swap(a, b);
    const std::string why =
        regs[a].shard == regs[b].shard
            ? "a region is listed twice: " + to_string_spec(regs[a].shard)
            : "regions " + to_string_spec(regs[a].shard) + " and " + to_string_spec(regs[b].shard) + " overlap";
    return Status(ErrorCode::kCorrupt, why);
  };
  auto by_box_then_begin = [](const RegionRange& a, const RegionRange& b) {
    return a.box != b.box ? a.box < b.box : a.begin < b.begin;
  };
  if (!std::is_sorted(ranges.begin(), ranges.end(), by_box_then_begin))
    std::sort(ranges.begin(), ranges.end(), by_box_then_begin);
  std::vector<Box>& boxes = scratch.boxes;
  size_t distinct = 0;
  for (size_t k = 0; k < ranges.size(); ++k) {
    if (k > 0 && ranges[k - 1].box == ranges[k].box) {
      if (ranges[k - 1].end > ranges[k].begin) return overlapping(ranges[k - 1].region, ranges[k].region);
      continue;
    }
    if (boxes.size() <= distinct) boxes.emplace_back();  // the scratch's vectors: no allocation once grown
    const uint64_t at = ranges[k].box, ndim = shape.size();
    boxes[distinct].offset.resize(ndim);
    boxes[distinct].shape.resize(ndim);
    for (uint64_t d = 0; d < ndim; ++d) {
      boxes[distinct].offset[d] = coord(at + d);
      boxes[distinct].shape[d] = coord(at + ndim + d);
    }
    ++distinct;
  }
  if (distinct >= 2) {
    boxes.resize(distinct);
    auto boxes_meet = planner::find_overlap(shape, boxes);
    if (!boxes_meet.ok() || *boxes_meet) {  // the ranges may still avoid each other: compare the pieces
      const std::vector<RegionView> regs = regions(t);
      std::vector<Box> pieces;
      std::vector<size_t> region_of;
      for (size_t r = 0; r < regs.size(); ++r)
        for (auto& b : planner::shard_boxes(regs[r].shard)) {
          pieces.push_back(std::move(b));
          region_of.push_back(r);
        }
      auto pair = planner::find_overlap(shape, pieces);
      if (!pair.ok()) return pair.status();  // too fragmented to check
      if (*pair) return overlapping(region_of[(*pair)->first], region_of[(*pair)->second]);
    }
  }
  int64_t numel = 1;
  for (int64_t e : shape) numel *= e;  // checked by check_structure
  if (covered != numel)
    return Status(ErrorCode::kCorrupt,
                  "regions cover " + std::to_string(covered) + " of " + std::to_string(numel) + " elements");
  return Status::Ok();
}

// What a reader must check of untrusted bytes beyond check_structure (docs/format.md §6).
Status Index::check_contents(uint64_t data_file_size) const {
  struct Span {
    uint64_t begin, end;
    std::string what;
  };
  std::vector<Span> spans;
  for (size_t i = 0; i < kTableCount; ++i) {
    const TableRef& ref = summary_.tables[i];
    if (ref.bytes == 0) continue;
    const uint64_t begin = static_cast<uint64_t>(ref.offset);
    if (!fits(begin, ref.bytes, data_file_size))
      return corrupt(quoted_table(static_cast<Table>(i)) + " lies outside the data file of " +
                     std::to_string(data_file_size) + " bytes (truncated file?)");
    spans.push_back({begin, begin + ref.bytes, quoted_table(static_cast<Table>(i))});
  }
  RegionScratch scratch;
  std::string_view previous;
  for (size_t t = 0; t < tensor_count(); ++t) {
    const TensorRecord rec = tensor(t);
    const std::string k(key(t));
    if (auto st = planner::validate_key(k); !st.ok()) return corrupt(st.message());
    if (t > 0 && key(t) <= previous)
      return corrupt(key(t) == previous ? "key '" + k + "' twice" : "tensors are not sorted by key ('" + k + "')");
    previous = key(t);
    auto bad = [&](const std::string& why) { return corrupt("tensor '" + k + "': " + why); };
    const DType dtype = *dtype_of_code(rec.dtype);
    const Shape shp = shape(t);
    int64_t numel = 1, nbytes = 0;
    for (int64_t e : shp) numel *= e;  // checked by check_structure
    if (!checked_mul(numel, static_cast<int64_t>(dtype_size(dtype)), &nbytes) ||
        static_cast<uint64_t>(nbytes) != rec.nbytes)
      return bad("nbytes " + std::to_string(rec.nbytes) + " does not match shape and dtype");
    if (rec.nbytes == 0 && rec.file_offset != -1) return bad("an empty tensor has file offset -1");
    if (rec.nbytes > 0) {
      if (rec.file_offset < 0 || !fits(static_cast<uint64_t>(rec.file_offset), rec.nbytes, data_file_size))
        return Status(ErrorCode::kCorrupt, "tensor '" + k + "': bytes [" + std::to_string(rec.file_offset) + ", " +
                                               std::to_string(static_cast<uint64_t>(rec.file_offset) + rec.nbytes) +
                                               ") lie outside the data file of " + std::to_string(data_file_size) +
                                               " bytes (truncated file?)");
      spans.push_back({static_cast<uint64_t>(rec.file_offset), static_cast<uint64_t>(rec.file_offset) + rec.nbytes,
                       "tensor '" + k + "'"});
    }
    if (Status st = check_regions(t, shp, scratch); !st.ok()) return st.with_context("metadata: tensor '" + k + "'");
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].begin < spans[i - 1].end)
      return corrupt(spans[i - 1].what + " and " + spans[i].what + " overlap in the data file");
  const unsigned char* attributes = table_bytes(Table::kAttributes);
  const unsigned char* names = table_bytes(Table::kNames);
  std::string_view previous_attribute;
  for (uint64_t a = 0; a < summary_.table(Table::kAttributes).records; ++a) {
    const auto rec = load_record<AttributeRecord>(attributes, a);
    const std::string_view k(reinterpret_cast<const char*>(names) + rec.key_offset, rec.key_length);
    if (a > 0 && k <= previous_attribute) return corrupt("attribute keys are not sorted and unique");
    previous_attribute = k;
  }
  return Status::Ok();
}

std::optional<size_t> Index::find(std::string_view k) const {
  size_t lo = 0, hi = tensor_count();
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (key(mid) < k) lo = mid + 1;
    else hi = mid;
  }
  if (lo < tensor_count() && key(lo) == k) return lo;
  return std::nullopt;
}

std::string_view Index::key(size_t t) const {
  const TensorRecord rec = tensor(t);
  return {reinterpret_cast<const char*>(table_bytes(Table::kNames)) + rec.key_offset, rec.key_length};
}

DType Index::dtype(size_t t) const { return *dtype_of_code(tensor(t).dtype); }

Shape Index::shape(size_t t) const {
  const TensorRecord rec = tensor(t);
  Shape s(rec.ndim);
  for (uint32_t d = 0; d < rec.ndim; ++d) s[d] = coord(rec.shape_index + d);
  return s;
}

uint64_t Index::nbytes(size_t t) const { return tensor(t).nbytes; }
int64_t Index::file_offset(size_t t) const { return tensor(t).file_offset; }
size_t Index::region_count(size_t t) const { return static_cast<size_t>(tensor(t).region_count); }

std::vector<RegionView> Index::regions(size_t t) const {
  const TensorRecord rec = tensor(t);
  const size_t es = dtype_size(dtype(t));
  const unsigned char* region_table = table_bytes(Table::kRegions);
  std::vector<RegionView> out;
  out.reserve(rec.region_count);
  uint64_t block = rec.first_block;
  for (uint64_t r = rec.first_region; r < rec.first_region + rec.region_count; ++r) {
    const auto reg = load_record<RegionRecord>(region_table, r);
    const ExtentRecord x = extent(reg.extent);
    RegionView v;
    v.shard.box.offset.resize(x.ndim);
    v.shard.box.shape.resize(x.ndim);
    for (uint32_t d = 0; d < x.ndim; ++d) {
      v.shard.box.offset[d] = coord(x.box_index + d);
      v.shard.box.shape[d] = coord(x.box_index + x.ndim + d);
    }
    if (x.flat) v.shard.flat = std::make_pair(x.flat_begin, x.flat_end);
    v.writer_rank = static_cast<int>(reg.writer);
    v.block_bytes = x.block_bytes;
    v.first_block = block;
    v.block_count = block_count(static_cast<uint64_t>(v.shard.numel()) * es, x.block_bytes);
    block += v.block_count;
    out.push_back(std::move(v));
  }
  return out;
}

TensorInfo Index::materialize(size_t t) const {
  TensorInfo ti;
  ti.key = std::string(key(t));
  ti.dtype = dtype(t);
  ti.shape = shape(t);
  ti.nbytes = nbytes(t);
  ti.file_offset = file_offset(t);
  for (RegionView& v : regions(t)) {
    SavedRegion r;
    r.shard = std::move(v.shard);
    r.writer_rank = v.writer_rank;
    r.block_bytes = v.block_bytes;
    r.block_checksums.resize(v.block_count);
    for (uint64_t b = 0; b < v.block_count; ++b) r.block_checksums[b] = block_checksum(v.first_block + b);
    ti.regions.push_back(std::move(r));
  }
  return ti;
}

CheckpointInfo Index::to_info(const std::vector<std::string>* only_keys) const {
  CheckpointInfo info;
  info.format_version = summary_.format_version;
  info.library_version = summary_.library_version;
  info.step = summary_.step;
  info.saved_sizes = summary_.saved_sizes;
  const unsigned char* coords = table_bytes(Table::kSavedCoords);
  for (uint64_t i = 0; i < summary_.table(Table::kSavedCoords).records; ++i) {
    const auto c = load_record<SavedCoordsRecord>(coords, i);
    info.saved_coords.push_back({c.tp, c.dp, c.pp});
  }
  const char* names = reinterpret_cast<const char*>(table_bytes(Table::kNames));
  const unsigned char* attributes = table_bytes(Table::kAttributes);
  for (uint64_t a = 0; a < summary_.table(Table::kAttributes).records; ++a) {
    const auto rec = load_record<AttributeRecord>(attributes, a);
    info.attributes.emplace(std::string(names + rec.key_offset, rec.key_length),
                            std::string(names + rec.value_offset, rec.value_length));
  }
  std::vector<size_t> wanted;
  if (only_keys) {
    for (const std::string& k : *only_keys)
      if (auto t = find(k)) wanted.push_back(*t);
    std::sort(wanted.begin(), wanted.end());  // positions follow key order
    wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
  } else {
    wanted.resize(tensor_count());
    for (size_t t = 0; t < wanted.size(); ++t) wanted[t] = t;
  }
  info.tensors.reserve(wanted.size());
  for (size_t t : wanted) info.tensors.push_back(materialize(t));
  return info;
}

Result<std::vector<char>> read_image(const Summary& summary, RegionReader& data) {
  // Bounds and overlaps first: the allocation below is then at most the file's size.
  std::vector<std::pair<uint64_t, size_t>> starts;
  for (size_t i = 0; i < kTableCount; ++i) {
    const TableRef& ref = summary.tables[i];
    if (ref.bytes == 0) continue;
    // The tables are the file's last bytes: a client that cached its size before they were
    // written is given time to see them (RegionReader::holds).
    const uint64_t end = static_cast<uint64_t>(ref.offset) + ref.bytes;
    if (ref.offset < 0 || end < ref.bytes || !data.holds(end))
      return corrupt(quoted_table(static_cast<Table>(i)) + " [" + std::to_string(ref.offset) + ", +" +
                     std::to_string(ref.bytes) + ") lies outside the data file of " + std::to_string(data.file_size()) +
                     " bytes (truncated file?)");
    starts.emplace_back(static_cast<uint64_t>(ref.offset), i);
  }
  std::sort(starts.begin(), starts.end());
  for (size_t k = 1; k < starts.size(); ++k) {
    const TableRef& prev = summary.tables[starts[k - 1].second];
    if (starts[k].first < static_cast<uint64_t>(prev.offset) + prev.bytes)
      return corrupt(quoted_table(static_cast<Table>(starts[k - 1].second)) + " and " +
                     quoted_table(static_cast<Table>(starts[k].second)) + " overlap in the data file");
  }
  std::vector<char> image(summary.image_bytes(), 0);
  for (size_t i = 0; i < kTableCount; ++i) {
    const TableRef& ref = summary.tables[i];
    if (ref.bytes == 0) continue;
    const Table t = static_cast<Table>(i);
    H5CKPT_RETURN_IF_ERROR(
        data.read_bytes(image.data() + summary.image_offset(t), ref.bytes, static_cast<uint64_t>(ref.offset))
            .with_context("reading the index " + quoted_table(t)));
  }
  return image;
}

}  // namespace h5ckpt::storage::v2
