// Unit tests of the format-v2 index (storage/meta_v2.h): encode -> summary -> image -> Index.
// Expectations are computed independently of the implementation: record fields are read and
// edited at the byte offsets docs/format.md §4 documents, the summary is re-signed the documented
// way, and block checksums are arbitrary numbers the test made up.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "storage/checkpoint_commit.h"
#include "storage/meta_v2.h"
#include "storage/meta_v1.h"
#include "storage/region_reader.h"
#include "storage/verify_blocks.h"

namespace h5ckpt::storage::v2 {
namespace {

using nlohmann::json;

constexpr uint64_t kFileSize = 8u << 20;
constexpr int64_t kDataAt = 1 << 20;    // tensor bytes start here in the imaginary data file
constexpr int64_t kTablesAt = 4 << 20;  // and the tables here

// Record layouts as docs/format.md §4.2 gives them: field byte offsets and record sizes.
namespace doc {
constexpr size_t kTensor = 64, kRegion = 8, kExtent = 40, kAttribute = 24, kSavedCoords = 12;
namespace tensor {
constexpr size_t key_offset = 0, key_length = 8, dtype = 12, ndim = 13, shape_index = 16, nbytes = 24, file_offset = 32,
                 first_region = 40, region_count = 48, first_block = 56;
}
namespace region {
constexpr size_t writer = 0, extent = 4;
}
namespace extent {
constexpr size_t box_index = 0, flat_begin = 8, flat_end = 16, block_bytes = 24, ndim = 32, flat = 36;
}
namespace attribute {
constexpr size_t key_offset = 0, value_offset = 8, key_length = 16, value_length = 20;
}
}  // namespace doc

uint64_t get_le(const std::vector<char>& b, size_t at, size_t width) {
  uint64_t v = 0;
  for (size_t i = 0; i < width; ++i) v |= uint64_t{static_cast<unsigned char>(b.at(at + i))} << (8 * i);
  return v;
}
void put_le(std::vector<char>& b, size_t at, size_t width, uint64_t v) {
  for (size_t i = 0; i < width; ++i) b.at(at + i) = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t block_sum(uint64_t i) { return 0x9E3779B97F4A7C15ull * (i + 1) ^ 0x5bd1e995ull; }

TensorInfo make_tensor(std::string key, DType dtype, Shape shape, int64_t file_offset) {
  TensorInfo t;
  t.key = std::move(key);
  t.dtype = dtype;
  t.shape = std::move(shape);
  int64_t n = 1;
  for (int64_t e : t.shape) n *= e;
  t.nbytes = static_cast<uint64_t>(n) * dtype_size(dtype);
  t.file_offset = t.nbytes ? file_offset : -1;
  return t;
}

// `blocks` block checksums with numbers continuing from *next.
SavedRegion region(ShardSpec shard, int writer, uint64_t block_bytes, int blocks, uint64_t* next) {
  SavedRegion r{std::move(shard), writer, 0, block_bytes, {}};
  for (int b = 0; b < blocks; ++b) r.block_checksums.push_back(block_sum((*next)++));
  return r;
}

// Six tensors (in key order below), every kind of region, 28 verification blocks, 9 distinct
// region extents. Given out of key order: encode sorts.
CheckpointInfo rich_info() {
  uint64_t next = 0;
  CheckpointInfo info;
  info.format_version = kFormatVersion;
  info.library_version = "0.2.0";
  info.step = 42;
  info.saved_sizes = ParallelSizes{2, 2, 1};
  info.saved_coords = {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0}};
  info.attributes = {{"config", "{\"layers\": 2}"}, {"empty", ""}, {"run", "unit \xc3\xa9t\xc3\xa9"}};
  TensorInfo a = make_tensor("model/a", DType::kF32, {4, 6}, kDataAt);  // rows: 48 bytes, 24-byte blocks
  a.regions = {region(ShardSpec::box_of({0, 0}, {2, 6}), 0, 24, 2, &next),
               region(ShardSpec::box_of({2, 0}, {2, 6}), 1, 24, 2, &next)};
  TensorInfo b = make_tensor("model/b", DType::kF32, {4, 6}, kDataAt + 96);  // same extents as model/a
  b.regions = {region(ShardSpec::box_of({0, 0}, {2, 6}), 2, 24, 2, &next),
               region(ShardSpec::box_of({2, 0}, {2, 6}), 3, 24, 2, &next)};
  TensorInfo c = make_tensor("model/c", DType::kF64, {2, 3, 4}, kDataAt + 192);  // last dim split
  c.regions = {region(ShardSpec::box_of({0, 0, 0}, {2, 3, 2}), 1, 48, 2, &next),
               region(ShardSpec::box_of({0, 0, 2}, {2, 3, 2}), 2, 48, 2, &next)};
  TensorInfo empty = make_tensor("model/empty", DType::kI32, {0, 3}, -1);
  TensorInfo adam = make_tensor("optimizer/exp_avg/a", DType::kBF16, {4, 6}, kDataAt + 384);  // flat
  adam.regions = {region(ShardSpec::flat_range(Box{{0, 0}, {4, 6}}, 0, 10), 0, 8, 3, &next),
                  region(ShardSpec::flat_range(Box{{0, 0}, {4, 6}}, 10, 24), 3, 8, 4, &next)};
  TensorInfo zero = make_tensor("optimizer/zero/c", DType::kF32, {4, 2, 3}, kDataAt + 432);  // ZeRO in TP boxes
  zero.regions = {region(ShardSpec::flat_range(Box{{0, 0, 0}, {2, 2, 3}}, 0, 5), 0, 12, 2, &next),
                  region(ShardSpec::flat_range(Box{{0, 0, 0}, {2, 2, 3}}, 5, 12), 2, 12, 3, &next),
                  region(ShardSpec::flat_range(Box{{2, 0, 0}, {2, 2, 3}}, 0, 12), 1, 12, 4, &next)};
  info.tensors = {zero, c, a, empty, adam, b};
  return info;
}

const std::vector<std::string> kKeys = {"model/a",         "model/b", "model/c", "model/empty", "optimizer/exp_avg/a",
                                        "optimizer/zero/c"};

// Table offsets in the imaginary data file: one after the other from kTablesAt.
std::array<int64_t, kTableCount> table_offsets(const Encoded& e) {
  std::array<int64_t, kTableCount> at;
  int64_t next = kTablesAt;
  for (size_t i = 0; i < kTableCount; ++i) {
    at[i] = e.tables[i].empty() ? -1 : next;
    next += static_cast<int64_t>(e.tables[i].size());
  }
  return at;
}

// After editing table bytes: record counts and checksums as a writer would have made them.
void resign_tables(Encoded& e) {
  for (size_t i = 0; i < kTableCount; ++i) {
    e.records[i] = e.tables[i].size() / record_bytes(static_cast<Table>(i));
    e.summary.tables[i].bytes = e.tables[i].size();
    e.summary.tables[i].records = e.records[i];
    e.summary.tables[i].xxh3 = checksum_bytes(e.tables[i].data(), e.tables[i].size());
  }
}

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Edits the summary as JSON and re-signs it the documented way (docs/format.md §4.2).
std::string edit_summary(const std::string& text, const std::function<void(json&)>& fn) {
  json j = json::parse(text);
  j.erase("index_xxh3");
  fn(j);
  const std::string body = j.dump();
  j["index_xxh3"] = hex16(checksum_bytes(body.data(), body.size()));
  return j.dump();
}

struct Opened {
  std::vector<char> image;
  Result<Index> index = Status(ErrorCode::kInternal, "not opened");
};

// Summary text -> parse -> Index over the encoded image, validating.
Status open_status(const Encoded& e, const std::string& summary_text, uint64_t file_size = kFileSize) {
  auto s = parse_summary(summary_text);
  if (!s.ok()) return s.status();
  const std::vector<char> image = e.image();
  return Index::open(*s, image.data(), image.size(), file_size, /*validate=*/true).status();
}
Status open_status(const Encoded& e) { return open_status(e, e.summary_json(table_offsets(e))); }

Encoded encoded(const CheckpointInfo& info = rich_info()) {
  auto e = encode(info);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return std::move(e).value();
}

void expect_equal(const TensorInfo& got, const TensorInfo& want) {
  EXPECT_EQ(got.key, want.key);
  EXPECT_EQ(got.dtype, want.dtype) << want.key;
  EXPECT_EQ(got.shape, want.shape) << want.key;
  EXPECT_EQ(got.nbytes, want.nbytes) << want.key;
  EXPECT_EQ(got.file_offset, want.file_offset) << want.key;
  ASSERT_EQ(got.regions.size(), want.regions.size()) << want.key;
  for (size_t r = 0; r < want.regions.size(); ++r) {
    EXPECT_EQ(got.regions[r].shard, want.regions[r].shard) << want.key << " region " << r;
    EXPECT_EQ(got.regions[r].writer_rank, want.regions[r].writer_rank) << want.key << " region " << r;
    EXPECT_EQ(got.regions[r].checksum, 0u);
    EXPECT_EQ(got.regions[r].block_bytes, want.regions[r].block_bytes) << want.key << " region " << r;
    EXPECT_EQ(got.regions[r].block_checksums, want.regions[r].block_checksums) << want.key << " region " << r;
  }
}

std::map<std::string, TensorInfo> by_key(const CheckpointInfo& info) {
  std::map<std::string, TensorInfo> m;
  for (const auto& t : info.tensors) m[t.key] = t;
  return m;
}

// ---- round trip and lookups -----------------------------------------------------------------

TEST(MetaV2, RoundTripEqualsFieldByField) {
  const CheckpointInfo in = rich_info();
  const Encoded e = encoded(in);
  auto summary = parse_summary(e.summary_json(table_offsets(e)));
  ASSERT_TRUE(summary.ok()) << summary.status().to_string();
  const std::vector<char> image = e.image();
  auto index = Index::open(*summary, image.data(), image.size(), kFileSize, true);
  ASSERT_TRUE(index.ok()) << index.status().to_string();
  const CheckpointInfo out = index->to_info();
  EXPECT_EQ(out.format_version, 2);
  EXPECT_EQ(out.library_version, "0.2.0");
  EXPECT_EQ(out.step, 42);
  EXPECT_EQ(out.saved_sizes.tp, 2);
  EXPECT_EQ(out.saved_sizes.dp, 2);
  EXPECT_EQ(out.saved_sizes.pp, 1);
  EXPECT_EQ(out.saved_coords, in.saved_coords);
  EXPECT_EQ(out.attributes, in.attributes);
  ASSERT_EQ(out.tensors.size(), kKeys.size());
  const auto want = by_key(in);
  for (size_t i = 0; i < kKeys.size(); ++i) {
    EXPECT_EQ(out.tensors[i].key, kKeys[i]);  // sorted by key
    expect_equal(out.tensors[i], want.at(kKeys[i]));
  }
  EXPECT_EQ(out.total_bytes(), 96u + 96 + 192 + 48 + 96);
}

TEST(MetaV2, SubsetMaterializesOnlyTheGivenKeys) {
  const Encoded e = encoded();
  auto summary = parse_summary(e.summary_json(table_offsets(e)));
  ASSERT_TRUE(summary.ok());
  const std::vector<char> image = e.image();
  auto index = Index::open(*summary, image.data(), image.size(), kFileSize, true);
  ASSERT_TRUE(index.ok()) << index.status().to_string();
  const std::vector<std::string> keys = {"optimizer/zero/c", "not/there", "model/b", "model/b", "model"};
  const CheckpointInfo out = index->to_info(&keys);
  ASSERT_EQ(out.tensors.size(), 2u);
  const auto want = by_key(rich_info());
  expect_equal(out.tensors[0], want.at("model/b"));
  expect_equal(out.tensors[1], want.at("optimizer/zero/c"));
  EXPECT_EQ(out.attributes.size(), 3u);  // the checkpoint-wide fields come along
  EXPECT_EQ(out.saved_coords.size(), 4u);
  const std::vector<std::string> none;
  EXPECT_TRUE(index->to_info(&none).tensors.empty());
}

TEST(MetaV2, IndexLookupsInPlaceAtAnyAlignment) {
  const Encoded e = encoded();
  auto summary = parse_summary(e.summary_json(table_offsets(e)));
  ASSERT_TRUE(summary.ok());
  // The image one byte past an aligned address: records are read in place, never cast.
  const std::vector<char> image = e.image();
  std::vector<char> shifted(image.size() + 1);
  std::memcpy(shifted.data() + 1, image.data(), image.size());
  auto index = Index::open(*summary, shifted.data() + 1, image.size(), kFileSize, true);
  ASSERT_TRUE(index.ok()) << index.status().to_string();
  ASSERT_EQ(index->tensor_count(), kKeys.size());
  for (size_t i = 0; i < kKeys.size(); ++i) {
    EXPECT_EQ(index->key(i), kKeys[i]);
    EXPECT_EQ(index->find(kKeys[i]), std::optional<size_t>(i)) << kKeys[i];
  }
  for (const char* missing : {"", "model", "model/", "model/a0", "zzz", "a", "optimizer/zero/c/x"})
    EXPECT_EQ(index->find(missing), std::nullopt) << missing;
  const size_t c = *index->find("model/c");
  EXPECT_EQ(index->dtype(c), DType::kF64);
  EXPECT_EQ(index->shape(c), (Shape{2, 3, 4}));
  EXPECT_EQ(index->nbytes(c), 192u);
  EXPECT_EQ(index->file_offset(c), kDataAt + 192);
  EXPECT_EQ(index->region_count(c), 2u);
  EXPECT_EQ(index->file_offset(*index->find("model/empty")), -1);
  // Block ranges: model/a, model/b hold blocks 0-7, model/c 8-11, exp_avg 12-18, zero/c 19-27.
  const auto zero = index->regions(*index->find("optimizer/zero/c"));
  ASSERT_EQ(zero.size(), 3u);
  const uint64_t first[] = {19, 21, 24}, count[] = {2, 3, 4};
  const int writer[] = {0, 2, 1};
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(zero[r].first_block, first[r]);
    EXPECT_EQ(zero[r].block_count, count[r]);
    EXPECT_EQ(zero[r].writer_rank, writer[r]);
    EXPECT_EQ(zero[r].block_bytes, 12u);
  }
  EXPECT_EQ(zero[1].shard, ShardSpec::flat_range(Box{{0, 0, 0}, {2, 2, 3}}, 5, 12));
  for (uint64_t i = 0; i < 28; ++i) EXPECT_EQ(index->block_checksum(i), block_sum(i)) << i;
}

// The bytes are the documented records: decoded here with the offsets of docs/format.md §4.2.
TEST(MetaV2, TablesFollowTheDocumentedLayout) {
  const Encoded e = encoded();
  const auto& names = e.bytes(Table::kNames);
  const auto& coords = e.bytes(Table::kCoords);
  const auto& tensors = e.bytes(Table::kTensors);
  const auto& regions = e.bytes(Table::kRegions);
  const auto& extents = e.bytes(Table::kExtents);
  auto coord = [&](uint64_t i) { return static_cast<int64_t>(get_le(coords, i * 8, 8)); };
  ASSERT_EQ(tensors.size(), kKeys.size() * doc::kTensor);
  const auto want = by_key(rich_info());
  const uint8_t codes[] = {1, 1, 2, 9, 4, 1};  // f32 f32 f64 i32 bf16 f32 (§4.3)
  uint64_t next_region = 0, next_block = 0;
  for (size_t t = 0; t < kKeys.size(); ++t) {
    const size_t at = t * doc::kTensor;
    const TensorInfo& w = want.at(kKeys[t]);
    const uint64_t key_at = get_le(tensors, at + doc::tensor::key_offset, 8);
    const uint64_t key_len = get_le(tensors, at + doc::tensor::key_length, 4);
    EXPECT_EQ(std::string(names.data() + key_at, key_len), kKeys[t]);
    EXPECT_EQ(get_le(tensors, at + doc::tensor::dtype, 1), codes[t]) << kKeys[t];
    const uint64_t ndim = get_le(tensors, at + doc::tensor::ndim, 1);
    ASSERT_EQ(ndim, w.shape.size());
    const uint64_t shape_at = get_le(tensors, at + doc::tensor::shape_index, 8);
    for (uint64_t d = 0; d < ndim; ++d) EXPECT_EQ(coord(shape_at + d), w.shape[d]);
    EXPECT_EQ(get_le(tensors, at + doc::tensor::nbytes, 8), w.nbytes);
    EXPECT_EQ(static_cast<int64_t>(get_le(tensors, at + doc::tensor::file_offset, 8)), w.file_offset);
    EXPECT_EQ(get_le(tensors, at + doc::tensor::first_region, 8), next_region);
    EXPECT_EQ(get_le(tensors, at + doc::tensor::region_count, 8), w.regions.size());
    EXPECT_EQ(get_le(tensors, at + doc::tensor::first_block, 8), next_block);
    for (const SavedRegion& r : w.regions) {
      const size_t rat = next_region++ * doc::kRegion;
      EXPECT_EQ(get_le(regions, rat + doc::region::writer, 4), static_cast<uint64_t>(r.writer_rank));
      const size_t xat = get_le(regions, rat + doc::region::extent, 4) * doc::kExtent;
      EXPECT_EQ(get_le(extents, xat + doc::extent::ndim, 4), ndim);
      const uint64_t box_at = get_le(extents, xat + doc::extent::box_index, 8);
      for (uint64_t d = 0; d < ndim; ++d) {
        EXPECT_EQ(coord(box_at + d), r.shard.box.offset[d]);
        EXPECT_EQ(coord(box_at + ndim + d), r.shard.box.shape[d]);
      }
      EXPECT_EQ(get_le(extents, xat + doc::extent::flat, 4), r.shard.flat ? 1u : 0u);
      EXPECT_EQ(static_cast<int64_t>(get_le(extents, xat + doc::extent::flat_begin, 8)),
                r.shard.flat ? r.shard.flat->first : 0);
      EXPECT_EQ(static_cast<int64_t>(get_le(extents, xat + doc::extent::flat_end, 8)),
                r.shard.flat ? r.shard.flat->second : 0);
      EXPECT_EQ(get_le(extents, xat + doc::extent::block_bytes, 8), r.block_bytes);
      for (uint64_t s : r.block_checksums) EXPECT_EQ(get_le(e.bytes(Table::kBlocks), next_block++ * 8, 8), s);
    }
  }
  EXPECT_EQ(regions.size(), 11u * doc::kRegion);
  EXPECT_EQ(extents.size(), 9u * doc::kExtent);  // model/a and model/b share their two extents
  EXPECT_EQ(e.bytes(Table::kBlocks).size(), 28u * 8);
  const auto& attrs = e.bytes(Table::kAttributes);
  ASSERT_EQ(attrs.size(), 3 * doc::kAttribute);
  std::map<std::string, std::string> got;
  for (size_t a = 0; a < 3; ++a) {
    const size_t at = a * doc::kAttribute;
    got[std::string(names.data() + get_le(attrs, at + doc::attribute::key_offset, 8),
                    get_le(attrs, at + doc::attribute::key_length, 4))] =
        std::string(names.data() + get_le(attrs, at + doc::attribute::value_offset, 8),
                    get_le(attrs, at + doc::attribute::value_length, 4));
  }
  EXPECT_EQ(got, rich_info().attributes);
  const auto& ranks = e.bytes(Table::kSavedCoords);
  ASSERT_EQ(ranks.size(), 4 * doc::kSavedCoords);
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_EQ(get_le(ranks, r * 12 + 0, 4), r % 2);  // tp
    EXPECT_EQ(get_le(ranks, r * 12 + 4, 4), r / 2);  // dp
    EXPECT_EQ(get_le(ranks, r * 12 + 8, 4), 0u);     // pp
  }

  // The summary: every table with its dataset, offset, size, record count, record size, xxh3.
  const auto offsets = table_offsets(e);
  const json j = json::parse(e.summary_json(offsets));
  EXPECT_EQ(j["format"], "h5ckpt");
  EXPECT_EQ(j["format_version"], 2);
  EXPECT_EQ(j["step"], 42);
  EXPECT_EQ(j["checksums"], true);
  EXPECT_EQ(j["topology"], json::parse(R"({"tp":2,"dp":2,"pp":1,"world":4})"));
  EXPECT_EQ(j["counts"], json::parse(R"({"tensors":6,"regions":11,"blocks":28})"));
  const char* table_names[] = {"tensors", "regions", "extents",    "blocks",
                               "coords",  "names",   "attributes", "saved_coords"};
  const uint64_t sizes[] = {64, 8, 40, 8, 8, 1, 24, 12};
  for (size_t i = 0; i < kTableCount; ++i) {
    const json& t = j["tables"][table_names[i]];
    const auto& bytes = e.tables[i];
    EXPECT_EQ(t["dataset"], std::string("/meta/") + table_names[i]);
    EXPECT_EQ(t["offset"], offsets[i]);
    EXPECT_EQ(t["bytes"], bytes.size());
    EXPECT_EQ(t["record_bytes"], sizes[i]);
    EXPECT_EQ(t["records"], bytes.size() / sizes[i]);
    EXPECT_EQ(t["xxh3"], hex16(checksum_bytes(bytes.data(), bytes.size())));
  }
  // The image: tables in this order, each at the next multiple of 8.
  const std::vector<char> image = e.image();
  size_t at = 0;
  for (size_t i = 0; i < kTableCount; ++i) {
    at = (at + 7) / 8 * 8;
    EXPECT_EQ(std::vector<char>(image.begin() + at, image.begin() + at + e.tables[i].size()), e.tables[i])
        << table_names[i];
    at += e.tables[i].size();
  }
  EXPECT_EQ(image.size(), at);
}

// 64 layers x 3 tensors, each split over 8 TP boxes and 16 ZeRO ranges per box: 24,576 regions
// whose 49,152 block sums dominate the index; the layers share their region extents.
TEST(MetaV2, RegionsCostEightBytesAndExtentsAreShared) {
  CheckpointInfo info;
  info.saved_sizes = {8, 16, 1};
  for (int r = 0; r < 128; ++r) info.saved_coords.push_back({r % 8, r / 8, 0});
  uint64_t next = 0;
  int64_t offset = 64 << 20;
  std::set<std::vector<int64_t>> distinct;
  for (int layer = 0; layer < 64; ++layer)
    for (const char* name : {"fc1", "fc2", "qkv"}) {
      char key[64];
      std::snprintf(key, sizeof key, "optimizer/exp_avg/layers.%02d.%s", layer, name);
      TensorInfo t = make_tensor(key, DType::kF32, {1024, 64}, offset);
      offset += static_cast<int64_t>(t.nbytes);
      for (int tp = 0; tp < 8; ++tp)
        for (int dp = 0; dp < 16; ++dp) {
          const Box box{{tp * 128, 0}, {128, 64}};
          t.regions.push_back(
              region(ShardSpec::flat_range(box, dp * 512, (dp + 1) * 512), tp + 8 * dp, 1024, 2, &next));
          distinct.insert({tp * 128, dp * 512});
        }
      info.tensors.push_back(std::move(t));
    }
  const Encoded e = encoded(info);
  EXPECT_EQ(e.bytes(Table::kRegions).size(), 24576u * 8);
  EXPECT_EQ(e.bytes(Table::kBlocks).size(), 49152u * 8);
  EXPECT_EQ(e.records[static_cast<size_t>(Table::kExtents)], distinct.size());  // 128, not 24,576
  EXPECT_EQ(e.bytes(Table::kCoords).size(), (2u + 8 * 4) * 8);  // the shape and the 8 TP boxes, once each
  auto total = encoded_bytes(info);
  ASSERT_TRUE(total.ok());
  EXPECT_EQ(*total, e.total_bytes());
  EXPECT_LT(*total, (24576u + 49152u) * 8 + 192u * 64 + 64 * 1024);  // regions + blocks + tensors + little
  const Status st = open_status(e, e.summary_json(table_offsets(e)), 128u << 20);
  EXPECT_TRUE(st.ok()) << st.to_string();
}

// The commit encodes the plan in place (encode_saved); the same checkpoint assembled into a
// CheckpointInfo first must give the same bytes, table by table: flat and whole regions, boxes
// shared within and across tensors, an empty tensor, tensors out of key order.
TEST(MetaV2, CommitEncodesThePlanAsTheAssembledInfoWould) {
  std::vector<planner::TensorPlan> plan(4);
  plan[0].key = "model/b";
  plan[0].shape = {4, 6};
  plan[0].add_region(ShardSpec::box_of({0, 0}, {2, 6}), 0);
  plan[0].add_region(ShardSpec::box_of({2, 0}, {2, 6}), 1);
  plan[1].key = "model/a";
  plan[1].dtype = DType::kBF16;
  plan[1].shape = {4, 6};
  plan[1].add_region(ShardSpec::flat_range(Box{{0, 0}, {4, 6}}, 10, 24), 3);
  plan[1].add_region(ShardSpec::flat_range(Box{{0, 0}, {4, 6}}, 0, 10), 0);
  plan[2].key = "optimizer/zero/c";
  plan[2].shape = {4, 2, 3};
  plan[2].add_region(ShardSpec::flat_range(Box{{0, 0, 0}, {2, 2, 3}}, 0, 5), 0);
  plan[2].add_region(ShardSpec::flat_range(Box{{0, 0, 0}, {2, 2, 3}}, 5, 12), 2);
  plan[2].add_region(ShardSpec::box_of({2, 0, 0}, {2, 2, 3}), 1);
  plan[3].key = "model/empty";
  plan[3].dtype = DType::kI32;
  plan[3].shape = {0, 3};
  storage::SavedCheckpoint saved;
  saved.tensors = &plan;
  saved.offsets = {kDataAt, kDataAt + 96, kDataAt + 144, -1};
  saved.step = 7;
  saved.sizes = ParallelSizes{2, 2, 1};
  saved.coords = {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0}};
  saved.attributes = {{"config", "{}"}};
  uint64_t next = 0;
  saved.blocks.resize(plan.size());
  for (size_t t = 0; t < plan.size(); ++t)
    for (size_t r = 0; r < plan[t].regions.size(); ++r) {
      auto& b = saved.blocks[t].emplace_back();
      b.block_bytes = storage::choose_block_bytes(plan[t].shard(r), plan[t].dtype, 16);
      const uint64_t bytes = static_cast<uint64_t>(plan[t].regions[r].numel()) * dtype_size(plan[t].dtype);
      for (uint64_t k = 0; k < storage::block_count(bytes, b.block_bytes); ++k) b.sums.push_back(block_sum(next++));
    }
  auto in_place = storage::encode_saved(saved);
  auto assembled = encode(storage::assemble_info(saved));
  ASSERT_TRUE(in_place.ok()) << in_place.status().to_string();
  ASSERT_TRUE(assembled.ok()) << assembled.status().to_string();
  for (size_t i = 0; i < kTableCount; ++i) {
    EXPECT_EQ(in_place->tables[i], assembled->tables[i]) << table_name(static_cast<Table>(i));
    EXPECT_EQ(in_place->summary.tables[i].xxh3, assembled->summary.tables[i].xxh3);
  }
  EXPECT_EQ(in_place->records[static_cast<size_t>(Table::kExtents)], 7u);  // 2 + 2 + 3 regions, none alike
  EXPECT_EQ(in_place->records[static_cast<size_t>(Table::kBlocks)], next);
  EXPECT_TRUE(in_place->summary.checksums);
  EXPECT_EQ(in_place->summary_json(table_offsets(*in_place)), assembled->summary_json(table_offsets(*assembled)));

  // What the format refuses, refused alike: a region whose sums miss a block.
  saved.blocks[2][1].sums.pop_back();
  const Status a = storage::encode_saved(saved).status(), b = encode(storage::assemble_info(saved)).status();
  EXPECT_EQ(a.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(a.to_string(), b.to_string());
  EXPECT_NE(a.message().find("tensor 'optimizer/zero/c' region offset [0,0,0] shape [2,2,3] flat [5,12) has"),
            std::string::npos)
      << a.message();
}

// ---- every validation failure ---------------------------------------------------------------

struct Case {
  const char* name;
  std::function<void(Encoded&)> mutate;  // table bytes; re-signed afterwards
  std::string expect;                    // part of the error text
};

// Position of tensor `key` in the tensors table (keys sorted).
size_t pos(const std::string& key) { return std::find(kKeys.begin(), kKeys.end(), key) - kKeys.begin(); }
std::vector<char>& table(Encoded& e, Table t) { return e.tables[static_cast<size_t>(t)]; }
size_t tensor_field(const std::string& key, size_t field) { return pos(key) * doc::kTensor + field; }
// Extent index of region `r` of the regions table.
size_t extent_of(Encoded& e, size_t r) { return get_le(table(e, Table::kRegions), r * 8 + doc::region::extent, 4); }

void set_tensor(Encoded& e, const std::string& key, size_t field, size_t width, uint64_t v) {
  put_le(table(e, Table::kTensors), tensor_field(key, field), width, v);
}
void set_extent(Encoded& e, size_t region_index, size_t field, size_t width, uint64_t v) {
  put_le(table(e, Table::kExtents), extent_of(e, region_index) * doc::kExtent + field, width, v);
}
// Appends `values` to the coords table and returns where they start.
uint64_t add_coords(Encoded& e, std::vector<int64_t> values) {
  auto& c = table(e, Table::kCoords);
  const uint64_t at = c.size() / 8;
  for (int64_t v : values) {
    c.resize(c.size() + 8);
    put_le(c, c.size() - 8, 8, static_cast<uint64_t>(v));
  }
  return at;
}
// A new extent (box at coords `box`) for region `r`.
void new_extent(Encoded& e, size_t r, uint64_t box, uint32_t ndim, uint32_t flat, int64_t b, int64_t end,
                uint64_t block_bytes) {
  auto& x = table(e, Table::kExtents);
  const uint64_t id = x.size() / doc::kExtent;
  x.resize(x.size() + doc::kExtent);
  const size_t at = id * doc::kExtent;
  put_le(x, at + doc::extent::box_index, 8, box);
  put_le(x, at + doc::extent::flat_begin, 8, static_cast<uint64_t>(b));
  put_le(x, at + doc::extent::flat_end, 8, static_cast<uint64_t>(end));
  put_le(x, at + doc::extent::block_bytes, 8, block_bytes);
  put_le(x, at + doc::extent::ndim, 4, ndim);
  put_le(x, at + doc::extent::flat, 4, flat);
  put_le(table(e, Table::kRegions), r * 8 + doc::region::extent, 4, id);
}

// Regions of the rich info in table order: model/a 0-1, model/b 2-3, model/c 4-5, exp_avg 6-7,
// zero/c 8-10.
std::vector<Case> table_cases() {
  return {
      {"attribute outside names",
       [](Encoded& e) { put_le(table(e, Table::kAttributes), doc::attribute::value_offset, 8, 1 << 20); },
       "attribute 0 lies outside the names table"},
      {"extent rank 0", [](Encoded& e) { set_extent(e, 0, doc::extent::ndim, 4, 0); }, "has rank 0"},
      {"extent box outside coords", [](Encoded& e) { set_extent(e, 0, doc::extent::box_index, 8, 1u << 30); },
       "lies outside the coords table"},
      {"extent flat flag 2", [](Encoded& e) { set_extent(e, 6, doc::extent::flat, 4, 2); }, "flat flag 2"},
      {"flat range past the box", [](Encoded& e) { set_extent(e, 7, doc::extent::flat_end, 8, 25); },
       "has flat range [10,25)"},
      {"flat range reversed", [](Encoded& e) { set_extent(e, 7, doc::extent::flat_begin, 8, 30); },
       "has flat range [30,24)"},
      {"flat range on a box region", [](Encoded& e) { set_extent(e, 0, doc::extent::flat_end, 8, 3); },
       "has flat range [0,3)"},
      {"negative box",
       [](Encoded& e) {
         new_extent(e, 0, add_coords(e, {-2, 0, 2, 6}), 2, 0, 0, 0, 24);
       },
       "negative or overflowing box"},
      {"empty region",
       [](Encoded& e) {
         new_extent(e, 0, add_coords(e, {0, 0, 0, 6}), 2, 0, 0, 0, 24);
       },
       "is empty"},
      {"key outside names", [](Encoded& e) { set_tensor(e, "model/b", doc::tensor::key_length, 4, 1 << 20); },
       "tensor 1: key lies outside the names table"},
      {"unknown dtype", [](Encoded& e) { set_tensor(e, "model/a", doc::tensor::dtype, 1, 99); },
       "unknown dtype code 99"},
      {"dtype code 0", [](Encoded& e) { set_tensor(e, "model/a", doc::tensor::dtype, 1, 0); }, "unknown dtype code 0"},
      {"rank 33", [](Encoded& e) { set_tensor(e, "model/a", doc::tensor::ndim, 1, 33); }, "'model/a': rank 33"},
      {"shape outside coords", [](Encoded& e) { set_tensor(e, "model/c", doc::tensor::shape_index, 8, ~0ull - 1); },
       "shape lies outside the coords table"},
      {"shape overflows",
       [](Encoded& e) {
         set_tensor(e, "model/c", doc::tensor::shape_index, 8, add_coords(e, {1ll << 31, 1ll << 31, 1ll << 31}));
       },
       "'model/c': shape [2147483648,2147483648,2147483648] invalid"},
      {"regions not in tensor order", [](Encoded& e) { set_tensor(e, "model/b", doc::tensor::first_region, 8, 0); },
       "do not follow the previous tensor's"},
      {"region count past the table",
       [](Encoded& e) { set_tensor(e, "optimizer/zero/c", doc::tensor::region_count, 8, 4); },
       "do not follow the previous tensor's"},
      {"first block wrong", [](Encoded& e) { set_tensor(e, "model/c", doc::tensor::first_block, 8, 7); },
       "first block 7, expected 8 (block counts inconsistent)"},
      {"missing extent", [](Encoded& e) { put_le(table(e, Table::kRegions), 3 * 8 + doc::region::extent, 4, 9); },
       "names a missing extent"},
      {"writer past world", [](Encoded& e) { put_le(table(e, Table::kRegions), 5 * 8 + doc::region::writer, 4, 4); },
       "region writer rank 4 invalid"},
      {"region of another rank",
       [](Encoded& e) {
         put_le(table(e, Table::kRegions), 0 * 8 + doc::region::extent, 4, extent_of(e, 4));  // model/c's 3-D extent
       },
       "another rank than the tensor"},
      {"region outside the tensor",
       [](Encoded& e) {
         new_extent(e, 1, add_coords(e, {3, 0, 2, 6}), 2, 0, 0, 0, 24);
       },
       "'model/a': a region lies outside the tensor"},
      {"a block too few", [](Encoded& e) { table(e, Table::kBlocks).resize(27 * 8); }, "need more block checksums"},
      {"a block too many", [](Encoded& e) { table(e, Table::kBlocks).resize(29 * 8); },
       "1 block checksums belong to no region"},
      {"block bytes change the block count", [](Encoded& e) { set_extent(e, 4, doc::extent::block_bytes, 8, 96); },
       "block counts inconsistent"},
      {"a region too many", [](Encoded& e) { table(e, Table::kRegions).resize(12 * 8); },
       "1 regions belong to no tensor"},
      // Checks of what a reader must not trust (Index::open with validate).
      {"invalid key",
       [](Encoded& e) {
         auto& n = table(e, Table::kNames);
         const uint64_t at = n.size();
         const std::string k = "model/../etc";
         n.insert(n.end(), k.begin(), k.end());
         set_tensor(e, "model/b", doc::tensor::key_offset, 8, at);
         set_tensor(e, "model/b", doc::tensor::key_length, 4, k.size());
       },
       "key 'model/../etc': '.' and '..' components not allowed"},
      {"keys not sorted",
       [](Encoded& e) {
         auto& t = table(e, Table::kTensors);
         for (size_t f : {doc::tensor::key_offset, doc::tensor::key_length}) {
           const size_t w = f == doc::tensor::key_length ? 4 : 8;
           const uint64_t a = get_le(t, tensor_field("model/a", f), w), b = get_le(t, tensor_field("model/b", f), w);
           put_le(t, tensor_field("model/a", f), w, b);
           put_le(t, tensor_field("model/b", f), w, a);
         }
       },
       "tensors are not sorted by key ('model/a')"},
      {"key twice",
       [](Encoded& e) {
         auto& t = table(e, Table::kTensors);
         put_le(t, tensor_field("model/b", doc::tensor::key_offset), 8,
                get_le(t, tensor_field("model/a", doc::tensor::key_offset), 8));
       },
       "key 'model/a' twice"},
      {"nbytes", [](Encoded& e) { set_tensor(e, "model/a", doc::tensor::nbytes, 8, 100); },
       "'model/a': nbytes 100 does not match shape and dtype"},
      {"empty tensor with an offset", [](Encoded& e) { set_tensor(e, "model/empty", doc::tensor::file_offset, 8, 0); },
       "an empty tensor has file offset -1"},
      {"tensor past the file",
       [](Encoded& e) { set_tensor(e, "model/c", doc::tensor::file_offset, 8, kFileSize - 100); },
       "'model/c': bytes [8388508, 8388700) lie outside the data file of 8388608 bytes"},
      {"negative offset", [](Encoded& e) { set_tensor(e, "model/c", doc::tensor::file_offset, 8, ~0ull); },
       "'model/c': bytes [-1,"},
      {"tensors overlap", [](Encoded& e) { set_tensor(e, "model/b", doc::tensor::file_offset, 8, kDataAt + 48); },
       "tensor 'model/a' and tensor 'model/b' overlap in the data file"},
      {"tensor over a table", [](Encoded& e) { set_tensor(e, "model/c", doc::tensor::file_offset, 8, kTablesAt - 8); },
       "tensor 'model/c' and table 'tensors' overlap in the data file"},
      {"blocks not whole slabs",
       [](Encoded& e) {
         // model/c's first region: 96 bytes in 50-byte blocks (2 blocks, like before) cut its 48-byte slabs
         set_extent(e, 4, doc::extent::block_bytes, 8, 50);
       },
       "'model/c': malformed verification blocks of region offset [0,0,0] shape [2,3,2]"},
      {"region without blocks in a checksummed checkpoint",
       [](Encoded& e) {
         new_extent(e, 6, get_le(table(e, Table::kExtents), extent_of(e, 6) * doc::kExtent, 8), 2, 1, 0, 10, 0);
         table(e, Table::kBlocks)
             .erase(table(e, Table::kBlocks).begin() + 12 * 8, table(e, Table::kBlocks).begin() + 15 * 8);
         for (const char* k : {"optimizer/zero/c"}) set_tensor(e, k, doc::tensor::first_block, 8, 16);
       },
       "has no checksum in a checkpoint saved with checksums"},
      {"region listed twice",
       [](Encoded& e) { put_le(table(e, Table::kRegions), 1 * 8 + doc::region::extent, 4, extent_of(e, 0)); },
       "'model/a': a region is listed twice: offset [0,0] shape [2,6]"},
      {"regions overlap",
       [](Encoded& e) {
         new_extent(e, 1, add_coords(e, {1, 0, 2, 6}), 2, 0, 0, 0, 24);
       },
       "'model/a': regions offset [0,0] shape [2,6] and offset [1,0] shape [2,6] overlap"},
      {"flat ranges overlap", [](Encoded& e) { set_extent(e, 7, doc::extent::flat_begin, 8, 9); },
       "regions offset [0,0] shape [4,6] flat [0,10) and offset [0,0] shape [4,6] flat [9,24) overlap"},
      // The check groups regions by their box's place in the coords table: one box written twice
      // must not hide an overlap, even where the element count still adds up (rows 23 left out).
      {"a box repeated in the coords hides no overlap",
       [](Encoded& e) {
         new_extent(e, 7, add_coords(e, {0, 0, 4, 6}), 2, 1, 9, 23, 8);
       },
       "'optimizer/exp_avg/a': regions offset [0,0] shape [4,6] flat [0,10) and offset [0,0] shape [4,6] flat [9,23) "
       "overlap"},
      // A whole box and a flat range of the same box: 24 elements counted, rows 2-3 never stored.
      {"a box and a flat range of it",
       [](Encoded& e) {
         const uint64_t box0 =
             get_le(table(e, Table::kExtents), extent_of(e, 0) * doc::kExtent + doc::extent::box_index, 8);
         new_extent(e, 1, box0, 2, 1, 0, 12, 24);
       },
       "'model/a': regions offset [0,0] shape [2,6] and offset [0,0] shape [2,6] flat [0,12) overlap"},
      {"regions leave a gap",
       [](Encoded& e) {
         set_extent(e, 7, doc::extent::flat_begin, 8, 11);  // 13 elements of bf16: still 4 blocks of 8 bytes
       },
       "'optimizer/exp_avg/a': regions cover 23 of 24 elements"},
      {"attributes not sorted",
       [](Encoded& e) {
         auto& a = table(e, Table::kAttributes);
         std::vector<char> first(a.begin(), a.begin() + doc::kAttribute);
         std::copy(a.begin() + 2 * doc::kAttribute, a.end(), a.begin());
         std::copy(first.begin(), first.end(), a.begin() + 2 * doc::kAttribute);
       },
       "attribute keys are not sorted and unique"},
  };
}

TEST(MetaV2, EveryTableCheckNamesTheProblem) {
  for (const Case& c : table_cases()) {
    Encoded e = encoded();
    c.mutate(e);
    resign_tables(e);
    const Status st = open_status(e);
    EXPECT_FALSE(st.ok()) << c.name << ": accepted";
    EXPECT_EQ(st.code(), ErrorCode::kCorrupt) << c.name << ": " << st.to_string();
    EXPECT_NE(st.message().find(c.expect), std::string::npos) << c.name << ": " << st.message();
  }
}

// The structure check keeps each extent's block count per (tensor shape, rank, element size):
// one extent shared by tensors of two dtypes, or of two shapes, or of two ranks must be checked
// for each. Tensors, in key order (each extent's last check is then by the tensor before):
// b16 bf16 [4,6] rows 0-1 and 2-3; f32 f32 [4,6] on the same two extents (blocks of 24 bytes are
// whole slabs of both); g f32 [2,6] columns 0-2 and 3-5; h f32 [4] whole.
TEST(MetaV2, SharedExtentsAreCheckedForEachTensorShapeRankAndElementSize) {
  uint64_t next = 0;
  CheckpointInfo info;
  info.saved_sizes = ParallelSizes{2, 1, 1};
  info.saved_coords = {{0, 0, 0}, {1, 0, 0}};
  TensorInfo b16 = make_tensor("b16", DType::kBF16, {4, 6}, kDataAt);
  b16.regions = {region(ShardSpec::box_of({0, 0}, {2, 6}), 0, 24, 1, &next),
                 region(ShardSpec::box_of({2, 0}, {2, 6}), 1, 24, 1, &next)};
  TensorInfo f32 = make_tensor("f32", DType::kF32, {4, 6}, kDataAt + 48);
  f32.regions = {region(ShardSpec::box_of({0, 0}, {2, 6}), 0, 24, 2, &next),
                 region(ShardSpec::box_of({2, 0}, {2, 6}), 1, 24, 2, &next)};
  TensorInfo g = make_tensor("g", DType::kF32, {2, 6}, kDataAt + 144);
  g.regions = {region(ShardSpec::box_of({0, 0}, {2, 3}), 0, 12, 2, &next),
               region(ShardSpec::box_of({0, 3}, {2, 3}), 1, 12, 2, &next)};
  TensorInfo h = make_tensor("h", DType::kF32, {4}, kDataAt + 192);
  h.regions = {region(ShardSpec::whole({4}), 1, 16, 1, &next)};
  info.tensors = {b16, f32, g, h};
  Encoded good = encoded(info);
  ASSERT_EQ(good.records[static_cast<size_t>(Table::kExtents)], 5u);
  ASSERT_EQ(extent_of(good, 0), extent_of(good, 2));  // b16 and f32 share rows 0-1
  // Valid: f32's regions, on b16's extents, have 2 blocks each, not b16's 1.
  {
    auto summary = parse_summary(good.summary_json(table_offsets(good)));
    ASSERT_TRUE(summary.ok());
    const std::vector<char> image = good.image();
    auto index = Index::open(*summary, image.data(), image.size(), kFileSize, /*validate=*/true);
    ASSERT_TRUE(index.ok()) << index.status().to_string();
    const auto regions = index->regions(*index->find("f32"));
    ASSERT_EQ(regions.size(), 2u);
    EXPECT_EQ(regions[0].first_block, 2u);
    EXPECT_EQ(regions[0].block_count, 2u);
    EXPECT_EQ(regions[1].first_block, 4u);
    EXPECT_EQ(index->block_checksum(5), block_sum(5));
  }
  auto tensor_at = [](size_t t, size_t field) { return t * doc::kTensor + field; };
  // g's first region moved onto rows 2-3 (2 blocks of 24 bytes, as its own 2 of 12): outside g.
  Encoded e = good;
  put_le(table(e, Table::kRegions), 4 * 8 + doc::region::extent, 4, extent_of(e, 3));
  resign_tables(e);
  Status st = open_status(e);
  EXPECT_NE(st.message().find("tensor 'g': a region lies outside the tensor"), std::string::npos) << st.to_string();
  // h given f32's shape position (1-D, it reads [4]) and its region rows 0-1, of rank 2.
  e = good;
  put_le(table(e, Table::kTensors), tensor_at(3, doc::tensor::shape_index), 8,
         get_le(table(e, Table::kTensors), tensor_at(1, doc::tensor::shape_index), 8));
  put_le(table(e, Table::kRegions), 6 * 8 + doc::region::extent, 4, extent_of(e, 2));
  resign_tables(e);
  st = open_status(e);
  EXPECT_NE(st.message().find("tensor 'h': a region has another rank than the tensor"), std::string::npos)
      << st.to_string();
}

TEST(MetaV2, EverySummaryCheckNamesTheProblem) {
  const Encoded e = encoded();
  const std::string good = e.summary_json(table_offsets(e));
  ASSERT_TRUE(open_status(e, good).ok()) << open_status(e, good).to_string();
  struct SummaryCase {
    const char* name;
    std::function<void(json&)> edit;
    std::string expect;
    ErrorCode code = ErrorCode::kCorrupt;
  };
  const std::vector<SummaryCase> cases = {
      {"format", [](json& j) { j["format"] = "h5ckpt2"; }, "format is not 'h5ckpt'"},
      {"newer version", [](json& j) { j["format_version"] = 3; }, "format version 3 is newer than this library's (2)",
       ErrorCode::kUnsupported},
      {"version 2^32+2", [](json& j) { j["format_version"] = (int64_t{1} << 32) + 2; }, "4294967298 is newer",
       ErrorCode::kUnsupported},
      {"version 1", [](json& j) { j["format_version"] = 1; }, "format_version 1 is not a format-v2 summary"},
      {"version missing", [](json& j) { j.erase("format_version"); }, "missing or out-of-range format_version"},
      {"step", [](json& j) { j["step"] = 1.5; }, "step is not a 64-bit integer"},
      {"data_file", [](json& j) { j["data_file"] = "../x.h5"; }, "data_file must be 'data.h5'"},
      {"topology", [](json& j) { j["topology"].erase("world"); }, "topology (tp, dp, pp, world) missing"},
      {"tp 2^32", [](json& j) { j["topology"]["tp"] = int64_t{1} << 32; }, "topology (tp, dp, pp, world) missing"},
      {"checksums flag", [](json& j) { j["checksums"] = "yes"; }, "'checksums' is not a boolean"},
      {"tables", [](json& j) { j.erase("tables"); }, "missing table list"},
      {"table missing", [](json& j) { j["tables"].erase("blocks"); }, "missing table 'blocks'"},
      {"dataset", [](json& j) { j["tables"]["regions"]["dataset"] = "/meta/other"; },
       "table 'regions': dataset must be '/meta/regions'"},
      {"record size", [](json& j) { j["tables"]["tensors"]["record_bytes"] = 32; },
       "table 'tensors': records of 32 bytes; format v2 has 64"},
      {"bytes vs records", [](json& j) { j["tables"]["regions"]["records"] = 12; },
       "table 'regions': 12 records do not take 88 bytes"},
      {"records overflow",
       [](json& j) {
         j["tables"]["regions"]["records"] = uint64_t{1} << 61;
         j["tables"]["regions"]["bytes"] = 0;
       },
       "records do not take 0 bytes"},
      {"offset of a non-empty table", [](json& j) { j["tables"]["names"]["offset"] = -1; }, "table 'names': offset -1"},
      {"offset negative", [](json& j) { j["tables"]["names"]["offset"] = -5; }, "table 'names': offset -5"},
      {"xxh3", [](json& j) { j["tables"]["blocks"]["xxh3"] = "XYZ"; }, "table 'blocks': malformed xxh3"},
      {"counts", [](json& j) { j["counts"]["regions"] = 12; }, "counts do not match the tables' record counts"},
      {"counts missing", [](json& j) { j.erase("counts"); }, "counts (tensors, regions, blocks) missing"},
      {"world", [](json& j) { j["topology"]["world"] = 5; }, "topology world 5 but 4 saved coordinates"},
      {"huge table",
       [](json& j) {
         j["tables"]["names"]["bytes"] = uint64_t{1} << 62;
         j["tables"]["names"]["records"] = uint64_t{1} << 62;
       },
       "table 'names': the tables are implausibly large"},
      // The image and the data file (Index::open).
      {"table checksum", [](json& j) { j["tables"]["regions"]["xxh3"] = "0123456789abcdef"; },
       "table 'regions' fails its checksum"},
      {"table past the file", [](json& j) { j["tables"]["blocks"]["offset"] = kFileSize - 8; },
       "table 'blocks' lies outside the data file of 8388608 bytes"},
      {"tables overlap", [](json& j) { j["tables"]["coords"]["offset"] = j["tables"]["blocks"]["offset"]; },
       "overlap in the data file"},
      {"table over a tensor", [](json& j) { j["tables"]["names"]["offset"] = kDataAt + 100; },
       "tensor 'model/b' and table 'names' overlap in the data file"},
  };
  for (const auto& c : cases) {
    const Status st = open_status(e, edit_summary(good, c.edit));
    EXPECT_FALSE(st.ok()) << c.name << ": accepted";
    EXPECT_EQ(st.code(), c.code) << c.name << ": " << st.to_string();
    EXPECT_NE(st.message().find(c.expect), std::string::npos) << c.name << ": " << st.message();
  }
  // Not re-signed: the summary's own checksum.
  std::string flipped = good;
  flipped[flipped.find("\"step\":42") + 8] = '3';
  const Status st = open_status(e, flipped);
  EXPECT_EQ(st.code(), ErrorCode::kCorrupt);
  EXPECT_NE(st.message().find("checksum mismatch"), std::string::npos) << st.message();
  // The image must be exactly what the summary describes.
  auto summary = parse_summary(good);
  ASSERT_TRUE(summary.ok());
  const std::vector<char> image = e.image();
  auto shorter = Index::open(*summary, image.data(), image.size() - 1, kFileSize, true);
  ASSERT_FALSE(shorter.ok());
  EXPECT_NE(shorter.status().message().find("the index image has " + std::to_string(image.size() - 1) + " bytes"),
            std::string::npos);
}

// Without `validate` (bytes another rank validated): what keeps accessors inside the image is
// still checked, the rest is not.
TEST(MetaV2, OpenWithoutValidateStillChecksStructure) {
  Encoded e = encoded();
  const std::string summary_text = e.summary_json(table_offsets(e));
  auto summary = parse_summary(summary_text);
  ASSERT_TRUE(summary.ok());
  std::vector<char> image = e.image();
  image[summary->image_offset(Table::kBlocks)] ^= 1;  // a damaged block sum: only the checksum says so
  EXPECT_TRUE(Index::open(*summary, image.data(), image.size(), kFileSize, false).ok());
  EXPECT_FALSE(Index::open(*summary, image.data(), image.size(), kFileSize, true).ok());
  // A region naming a missing extent is refused either way.
  image = e.image();
  put_le(image, summary->image_offset(Table::kRegions) + doc::region::extent, 4, 1000);
  auto r = Index::open(*summary, image.data(), image.size(), kFileSize, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("names a missing extent"), std::string::npos) << r.status().message();
}

TEST(MetaV2, EncodeRefusesWhatTheFormatCannotHold) {
  auto refused = [](const std::function<void(CheckpointInfo&)>& fn, const std::string& expect) {
    CheckpointInfo info = rich_info();
    fn(info);
    auto e = encode(info);
    ASSERT_FALSE(e.ok()) << expect;
    EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(e.status().message().find(expect), std::string::npos) << e.status().message();
  };
  refused([](CheckpointInfo& i) { i.tensors[1].regions[0].checksum = 0x1234; }, "whole-region (format v1) checksum");
  refused([](CheckpointInfo& i) { i.tensors[1].regions[0].writer_rank = -1; }, "negative writer");
  refused([](CheckpointInfo& i) { i.tensors[1].regions[0].block_checksums.pop_back(); },
          "has 1 block checksums for 2 blocks");
  refused([](CheckpointInfo& i) { i.tensors[1].shape.clear(); }, "has no valid rank");
}

TEST(MetaV2, WithoutChecksumsEveryRegionMayLackBlocks) {
  CheckpointInfo info = rich_info();
  for (auto& t : info.tensors)
    for (auto& r : t.regions) {
      r.block_bytes = 0;
      r.block_checksums.clear();
    }
  const Encoded e = encoded(info);
  EXPECT_FALSE(e.summary.checksums);
  EXPECT_TRUE(e.bytes(Table::kBlocks).empty());
  EXPECT_EQ(json::parse(e.summary_json(table_offsets(e)))["tables"]["blocks"]["offset"], -1);
  EXPECT_TRUE(open_status(e).ok()) << open_status(e).to_string();
}

// ---- reading from a data file, and the v1/v2 entry ------------------------------------------

class MetaV2File : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() / ("h5ckpt_meta_v2_" + std::to_string(::getpid()) + "_" +
                                                       ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                .string();
  }
  void TearDown() override { std::filesystem::remove(path_); }
  // A data file of kFileSize bytes holding the tables at `offsets`.
  void write_file(const Encoded& e, const std::array<int64_t, kTableCount>& offsets, uint64_t size = kFileSize) {
    std::vector<char> bytes(size, 0);
    for (size_t i = 0; i < kTableCount; ++i)
      if (offsets[i] >= 0 && static_cast<uint64_t>(offsets[i]) + e.tables[i].size() <= size)
        std::copy(e.tables[i].begin(), e.tables[i].end(), bytes.begin() + offsets[i]);
    FILE* f = std::fopen(path_.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    std::fclose(f);
  }
  std::string path_;
};

TEST_F(MetaV2File, ReadMetadataReadsTheTablesFromTheDataFile) {
  const CheckpointInfo in = rich_info();
  const Encoded e = encoded(in);
  const auto offsets = table_offsets(e);
  write_file(e, offsets);
  auto reader = RegionReader::open(path_);
  ASSERT_TRUE(reader.ok());
  const std::string summary = e.summary_json(offsets);
  auto out = read_metadata(summary, *reader);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->tensors.size(), kKeys.size());
  const auto want = by_key(in);
  for (const auto& t : out->tensors) expect_equal(t, want.at(t.key));
  const std::vector<std::string> keys = {"model/c"};
  auto one = read_metadata(summary, *reader, &keys);
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->tensors.size(), 1u);
  expect_equal(one->tensors[0], want.at("model/c"));

  // The same metadata as format v1 JSON goes through the v1 reader (its whole-region sums too).
  CheckpointInfo v1 = in;
  v1.tensors[0].regions[0].checksum = 0xabcdef;
  auto legacy = read_metadata(metadata_to_json(v1), *reader);
  ASSERT_TRUE(legacy.ok()) << legacy.status().to_string();
  EXPECT_EQ(legacy->format_version, 1);
  ASSERT_EQ(legacy->tensors.size(), kKeys.size());
  EXPECT_EQ(legacy->find("optimizer/zero/c")->regions[0].checksum, 0xabcdefu);
  EXPECT_EQ(legacy->find("model/c")->regions[1].block_checksums, want.at("model/c").regions[1].block_checksums);

  // A summary of a newer version is refused as such by the entry too.
  auto newer = read_metadata(edit_summary(summary, [](json& j) { j["format_version"] = 3; }), *reader);
  EXPECT_EQ(newer.status().code(), ErrorCode::kUnsupported);
}

TEST_F(MetaV2File, TruncatedOrDamagedTablesAreNamed) {
  const Encoded e = encoded();
  const auto offsets = table_offsets(e);
  const std::string summary = e.summary_json(offsets);
  // The file ends inside the last table.
  const uint64_t end = offsets[static_cast<size_t>(Table::kSavedCoords)] + 6;
  write_file(e, offsets, end);
  auto reader = RegionReader::open(path_);
  ASSERT_TRUE(reader.ok());
  auto r = read_metadata(summary, *reader);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(r.status().message().find("table 'saved_coords'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("lies outside the data file of " + std::to_string(end) + " bytes"),
            std::string::npos)
      << r.status().message();
  // A flipped byte inside a table.
  write_file(e, offsets);
  {
    FILE* f = std::fopen(path_.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, offsets[static_cast<size_t>(Table::kExtents)] + 3, SEEK_SET);
    std::fputc(0x7f, f);
    std::fclose(f);
  }
  auto reader2 = RegionReader::open(path_);
  ASSERT_TRUE(reader2.ok());
  auto flipped = read_metadata(summary, *reader2);
  ASSERT_FALSE(flipped.ok());
  EXPECT_NE(flipped.status().message().find("table 'extents' fails its checksum"), std::string::npos)
      << flipped.status().message();
}

}  // namespace
}  // namespace h5ckpt::storage::v2
