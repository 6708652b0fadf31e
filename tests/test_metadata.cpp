// Unit tests of format-v1 metadata serialization and validation (storage::metadata_to_json /
// metadata_from_json). Expectations are computed independently of the implementation: the
// metadata is edited as JSON with its self-checksum recomputed the documented way.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "planner/box_math.h"
#include "planner/region_overlap.h"
#include "planner/save_planner.h"
#include "storage/meta_v1.h"

// ---- format-v1 metadata validation ----------------------------------------------------------

namespace h5ckpt::storage {
namespace {

using nlohmann::json;

constexpr uint64_t kFileSize = 3u << 20;

// The "quickly" bounds below catch quadratic checks (minutes at these sizes), not slow machines.
// Sanitizer builds (scripts/sanitize.sh) allocate tens of times slower: their bounds are wider.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr double kSlowdown = 100;
#else
constexpr double kSlowdown = 1;
#endif

CheckpointInfo small_info() {
  CheckpointInfo info;
  info.format_version = kFormatVersionV1;
  info.library_version = "0.1.0";
  info.step = 42;
  info.saved_sizes = ParallelSizes{2, 1, 1};
  info.saved_coords = {RankCoords{0, 0, 0}, RankCoords{1, 0, 0}};
  info.attributes = {{"config", "{\"layers\": 2}"}, {"run", "unit"}};
  // Deliberately not sorted by key: the reader sorts.
  TensorInfo opt;
  opt.key = "optimizer/exp_avg/a";
  opt.dtype = DType::kBF16;
  opt.shape = {4, 6};
  opt.nbytes = 48;
  opt.file_offset = 2 << 20;
  opt.regions = {SavedRegion{ShardSpec::flat_range(Box{{0, 0}, {4, 6}}, 0, 10), 0, 0x0123456789abcdefull},
                 SavedRegion{ShardSpec::flat_range(Box{{0, 0}, {4, 6}}, 10, 24), 1, 0xfedcba9876543210ull}};
  TensorInfo a;
  a.key = "model/a";
  a.dtype = DType::kF32;
  a.shape = {4, 6};
  a.nbytes = 96;
  a.file_offset = 1 << 20;
  a.regions = {SavedRegion{ShardSpec::box_of({0, 0}, {2, 6}), 0, 0x1111},
               SavedRegion{ShardSpec::box_of({2, 0}, {2, 6}), 1, 0}};  // no checksum recorded
  TensorInfo empty;
  empty.key = "model/empty";
  empty.dtype = DType::kI32;
  empty.shape = {0, 3};
  empty.nbytes = 0;
  empty.file_offset = -1;
  info.tensors = {opt, a, empty};
  return info;
}

std::string hex16(uint64_t v) {
  static const char* kDigits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[i] = kDigits[v & 15];
  return s;
}

// Edits the metadata as JSON and re-signs it the documented way: erase index_xxh3, compact dump,
// xxh3-64, 16 lowercase hex digits.
std::string edit(const std::string& text, const std::function<void(json&)>& fn) {
  json j = json::parse(text);
  j.erase("index_xxh3");
  fn(j);
  const std::string body = j.dump();
  j["index_xxh3"] = hex16(checksum_bytes(body.data(), body.size()));
  return j.dump();
}

json& tensor(json& j, const std::string& key) {
  for (auto& t : j["tensors"])
    if (t["key"] == key) return t;
  throw std::runtime_error("no tensor " + key);
}

TEST(Metadata, RoundTrip) {
  const CheckpointInfo in = small_info();
  const std::string text = metadata_to_json(in);
  auto out = metadata_from_json(text, kFileSize);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->format_version, 1);
  EXPECT_EQ(out->library_version, "0.1.0");
  EXPECT_EQ(out->step, 42);
  EXPECT_EQ(out->data_file, "data.h5");
  EXPECT_EQ(out->saved_sizes.tp, 2);
  EXPECT_EQ(out->saved_sizes.dp, 1);
  EXPECT_EQ(out->saved_sizes.pp, 1);
  EXPECT_EQ(out->saved_coords, in.saved_coords);
  EXPECT_EQ(out->attributes, in.attributes);
  ASSERT_EQ(out->tensors.size(), 3u);
  const std::vector<std::string> sorted = {"model/a", "model/empty", "optimizer/exp_avg/a"};
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(out->tensors[i].key, sorted[i]);
  for (const auto& want : in.tensors) {
    const TensorInfo* got = out->find(want.key);
    ASSERT_NE(got, nullptr) << want.key;
    EXPECT_EQ(got->dtype, want.dtype);
    EXPECT_EQ(got->shape, want.shape);
    EXPECT_EQ(got->nbytes, want.nbytes);
    EXPECT_EQ(got->file_offset, want.file_offset);
    ASSERT_EQ(got->regions.size(), want.regions.size());
    for (size_t r = 0; r < want.regions.size(); ++r) {
      EXPECT_EQ(got->regions[r].shard, want.regions[r].shard);
      EXPECT_EQ(got->regions[r].writer_rank, want.regions[r].writer_rank);
      EXPECT_EQ(got->regions[r].checksum, want.regions[r].checksum);
    }
  }
  EXPECT_EQ(out->total_bytes(), 144u);

  // The documented fields and their JSON types.
  const json j = json::parse(text);
  EXPECT_EQ(j["format"], "h5ckpt");
  EXPECT_EQ(j["format_version"], 1);
  EXPECT_TRUE(j["index_xxh3"].is_string());
  EXPECT_EQ(j["index_xxh3"].get<std::string>().size(), 16u);
  EXPECT_EQ(j["topology"]["world"], 2);
  EXPECT_EQ(j["topology"]["coords"], json::parse("[[0,0,0],[1,0,0]]"));
  const json& ja = j["tensors"][1];
  EXPECT_EQ(ja["key"], "model/a");
  EXPECT_EQ(ja["dtype"], "f32");
  EXPECT_FALSE(ja["regions"][0].contains("flat"));
  EXPECT_EQ(ja["regions"][0]["xxh3"], "0000000000001111");
  EXPECT_FALSE(ja["regions"][1].contains("xxh3"));
  EXPECT_EQ(j["tensors"][0]["regions"][1]["flat"], json::parse("[10,24]"));
}

TEST(Metadata, ReSigningIsIdentityAndEditsNeedIt) {
  const std::string text = metadata_to_json(small_info());
  // Our independent re-signing reproduces the library's text exactly.
  EXPECT_EQ(edit(text, [](json&) {}), text);
  // An edit without re-signing is caught by the self-checksum.
  json j = json::parse(text);
  j["step"] = 43;
  auto r = metadata_from_json(j.dump(), kFileSize);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(r.status().message().find("checksum"), std::string::npos) << r.status().message();
  // The same edit re-signed is accepted.
  auto ok = metadata_from_json(edit(text, [](json& j) { j["step"] = 43; }), kFileSize);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->step, 43);
}

struct Corruption {
  const char* name;
  std::function<void(json&)> fn;
  const char* needle;  // expected in the message
};

TEST(Metadata, MalformedVariantsRejectedAsCorrupt) {
  const std::string text = metadata_to_json(small_info());
  const std::vector<Corruption> cases = {
      {"region outside shape",
       [](json& j) {
         tensor(j, "model/a")["regions"][1]["offset"] = {3, 0};
       },
       "outside"},
      {"overlapping regions",
       [](json& j) {
         tensor(j, "model/a")["regions"][1]["offset"] = {1, 0};
       },
       "overlap"},
      {"overlapping flat ranges",
       [](json& j) {
         tensor(j, "optimizer/exp_avg/a")["regions"][1]["flat"] = {9, 23};
       },
       "overlap"},
      {"incomplete coverage",
       [](json& j) {
         tensor(j, "model/a")["regions"][1]["shape"] = {1, 6};
       },
       "cover"},
      {"incomplete flat coverage",
       [](json& j) {
         tensor(j, "optimizer/exp_avg/a")["regions"][1]["flat"] = {11, 24};
       },
       "cover"},
      {"nbytes mismatch", [](json& j) { tensor(j, "model/a")["nbytes"] = 95; }, "nbytes"},
      {"dataset beyond file", [](json& j) { tensor(j, "optimizer/exp_avg/a")["file_offset"] = kFileSize - 40; },
       "outside the data file"},
      {"negative file offset", [](json& j) { tensor(j, "model/a")["file_offset"] = -8; }, "outside the data file"},
      {"datasets overlap in file", [](json& j) { tensor(j, "optimizer/exp_avg/a")["file_offset"] = (1 << 20) + 64; },
       "overlap"},
      {"unknown dtype", [](json& j) { tensor(j, "model/a")["dtype"] = "f12"; }, "f12"},
      {"negative writer", [](json& j) { tensor(j, "model/a")["regions"][0]["writer"] = -1; }, "writer"},
      {"writer beyond world", [](json& j) { tensor(j, "model/a")["regions"][0]["writer"] = 2; }, "writer"},
      {"region listed twice",
       [](json& j) {
         auto& regs = tensor(j, "model/a")["regions"];
         regs.push_back(regs[0]);
       },
       "twice"},
      {"flat range beyond box",
       [](json& j) {
         tensor(j, "optimizer/exp_avg/a")["regions"][1]["flat"] = {10, 25};
       },
       "flat range"},
      {"malformed flat", [](json& j) { tensor(j, "optimizer/exp_avg/a")["regions"][1]["flat"] = {10}; }, "flat"},
      {"negative extent",
       [](json& j) {
         tensor(j, "model/a")["shape"] = {-4, 6};
       },
       "shape"},
      {"malformed region checksum", [](json& j) { tensor(j, "model/a")["regions"][0]["xxh3"] = "XYZ"; }, "checksum"},
      {"duplicate tensor", [](json& j) { j["tensors"].push_back(tensor(j, "model/empty")); }, "twice"},
      {"reserved key", [](json& j) { tensor(j, "model/empty")["key"] = "meta/x"; }, "reserved"},
      {"wrong format name", [](json& j) { j["format"] = "other"; }, "format"},
      {"missing tensors", [](json& j) { j.erase("tensors"); }, "tensor"},
      {"missing topology", [](json& j) { j.erase("topology"); }, "topology"},
      {"other data file", [](json& j) { j["data_file"] = "../x.h5"; }, "data_file"},
      {"shape as string", [](json& j) { tensor(j, "model/a")["shape"] = "4,6"; }, "shape"},
  };
  for (const auto& c : cases) {
    auto r = metadata_from_json(edit(text, c.fn), kFileSize);
    ASSERT_FALSE(r.ok()) << c.name << ": accepted";
    EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt) << c.name << ": " << r.status().to_string();
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos)
        << c.name << ": message '" << r.status().message() << "' lacks '" << c.needle << "'";
  }
  // Damaged or truncated text, and a file too small for the recorded datasets.
  for (const std::string& bad :
       {text.substr(0, text.size() / 2), std::string("[]"), std::string(""), std::string("{\"format\":\"h5ckpt\"}")}) {
    auto r = metadata_from_json(bad, kFileSize);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt) << r.status().to_string();
  }
  auto truncated = metadata_from_json(text, (2u << 20) + 40);
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(truncated.status().message().find("optimizer/exp_avg/a"), std::string::npos);
}

TEST(Metadata, UnknownFieldsIgnored) {
  const CheckpointInfo in = small_info();
  const std::string text = metadata_to_json(in);
  const std::string extended = edit(text, [](json& j) {
    j["future_index"] = {{"kind", "bloom"}, {"bits", 1024}};
    j["topology"]["ep"] = 4;
    j["attributes"]["numeric"] = 7;  // non-string attributes are skipped
    tensor(j, "model/a")["compression"] = "none";
    tensor(j, "model/a")["regions"][0]["crc32c"] = "abcd";
  });
  auto out = metadata_from_json(extended, kFileSize);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->tensors.size(), 3u);
  EXPECT_EQ(out->attributes, in.attributes);
  ASSERT_NE(out->find("model/a"), nullptr);
  EXPECT_EQ(out->find("model/a")->regions[0].checksum, 0x1111u);
}

TEST(Metadata, NonUtf8AttributeDoesNotThrow) {
  // Checkpointer::set_attribute takes any std::string. Serializing the metadata runs on the
  // coordinator inside the collective commit, so it must not throw (an exception there leaves the
  // other ranks waiting in the agreement).
  CheckpointInfo info = small_info();
  info.attributes["blob"] = std::string("\xff\xfe not UTF-8");
  std::string text;
  EXPECT_NO_THROW(text = metadata_to_json(info));
}

TEST(Metadata, NewerFormatVersionUnsupported) {
  const std::string text = metadata_to_json(small_info());
  auto r = metadata_from_json(edit(text, [](json& j) { j["format_version"] = 3; }), kFileSize);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kUnsupported) << r.status().to_string();
  EXPECT_NE(r.status().message().find("format version 3 is newer than this library's (2)"), std::string::npos)
      << r.status().message();
  // Version 2 keeps its index in the data file: the v1 JSON reader does not take it.
  auto v2 = metadata_from_json(edit(text, [](json& j) { j["format_version"] = 2; }), kFileSize);
  ASSERT_FALSE(v2.ok());
  EXPECT_EQ(v2.status().code(), ErrorCode::kUnsupported) << v2.status().to_string();
  EXPECT_NE(v2.status().message().find("format version 2 is not the JSON index"), std::string::npos);
}

// ---- hostile metadata (issue "never hang, never lose") -------------------------------------

// A signed document with an unknown member nested `depth` deep, written by hand: nlohmann's dump()
// recurses per level, so the test itself must not build it through json.
std::string deeply_nested(int depth) {
  const std::string nest = std::string(depth, '[') + std::string(depth, ']');
  const std::string body = "{\"format\":\"h5ckpt\",\"x\":" + nest + "}";
  return "{\"format\":\"h5ckpt\",\"index_xxh3\":\"" + hex16(checksum_bytes(body.data(), body.size())) +
         "\",\"x\":" + nest + "}";
}

TEST(MetadataHostile, DeepNestingRejectedBeforeParsing) {
  // Without the pre-scan this overflows the stack (the checksum's dump() recurses 100k deep).
  auto r = metadata_from_json(deeply_nested(100000), kFileSize);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(r.status().message().find("nested"), std::string::npos) << r.status().message();
  // Unbalanced garbage too.
  EXPECT_FALSE(metadata_from_json(std::string(1 << 20, '{'), kFileSize).ok());
  // Moderate nesting in unknown fields, and brackets inside strings, are fine.
  const std::string text = metadata_to_json(small_info());
  auto ok = metadata_from_json(edit(text,
                                    [](json& j) {
                                      json v = 1;
                                      for (int i = 0; i < 20; ++i) v = json::array({v});
                                      j["future"] = v;
                                      j["attributes"]["brackets"] = std::string(5000, '[') + "\\\"{";
                                    }),
                               kFileSize);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->attributes.at("brackets").size(), 5003u);
}

TEST(MetadataHostile, RegionsMustCoverAndCarryChecksums) {
  CheckpointInfo info = small_info();
  for (auto& t : info.tensors)
    for (auto& r : t.regions) r.checksum = r.checksum ? r.checksum : 0x2222;
  const std::string text = metadata_to_json(info);
  EXPECT_EQ(json::parse(text)["checksums"], true);
  ASSERT_TRUE(metadata_from_json(text, kFileSize).ok());
  EXPECT_EQ(json::parse(metadata_to_json(small_info()))["checksums"], false);  // one region without

  auto expect_corrupt = [&](const std::string& name, const std::string& t, const char* needle) {
    auto r = metadata_from_json(t, kFileSize);
    ASSERT_FALSE(r.ok()) << name << ": accepted";
    EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt) << name;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << name << ": " << r.status().message();
  };
  // "regions": [] used to pass (no region, nothing to compare) and switched checksums off.
  expect_corrupt("empty region list", edit(text, [](json& j) { tensor(j, "model/a")["regions"] = json::array(); }),
                 "cover 0 of 24");
  expect_corrupt("checksum dropped", edit(text, [](json& j) { tensor(j, "model/a")["regions"][1].erase("xxh3"); }),
                 "no checksum");
  expect_corrupt("checksums flag not boolean", edit(text, [](json& j) { j["checksums"] = 1; }), "checksums");
  // A file from before the flag: one checksum anywhere means all regions need one.
  expect_corrupt("pre-flag file, one checksum dropped",
                 edit(text,
                      [](json& j) {
                        j.erase("checksums");
                        tensor(j, "optimizer/exp_avg/a")["regions"][0].erase("xxh3");
                      }),
                 "no checksum");
  auto none = metadata_from_json(edit(text,
                                      [](json& j) {
                                        j.erase("checksums");
                                        for (auto& t : j["tensors"])
                                          for (auto& r : t["regions"]) r.erase("xxh3");
                                      }),
                                 kFileSize);
  EXPECT_TRUE(none.ok()) << none.status().to_string();  // saved with checksums = false
}

TEST(MetadataHostile, OutOfRangeIntegersRejected) {
  const std::string text = metadata_to_json(small_info());
  const uint64_t big32 = (uint64_t{1} << 32) + 1, big63 = uint64_t{1} << 63;
  struct Case {
    const char* name;
    std::function<void(json&)> fn;
  };
  const std::vector<Case> cases = {
      {"writer 2^32+1 (wrapped to 1)", [&](json& j) { tensor(j, "model/a")["regions"][1]["writer"] = big32; }},
      {"tp 2^32+2", [&](json& j) { j["topology"]["tp"] = big32 + 1; }},
      {"coords 2^32", [&](json& j) { j["topology"]["coords"][0][0] = big32 - 1; }},
      {"shape 2^63", [&](json& j) { tensor(j, "model/empty")["shape"][0] = big63; }},
      {"nbytes negative", [&](json& j) { tensor(j, "model/empty")["nbytes"] = -1; }},
      {"file_offset 2^63", [&](json& j) { tensor(j, "model/a")["file_offset"] = big63; }},
      {"flat end 2^64-1", [&](json& j) { tensor(j, "optimizer/exp_avg/a")["regions"][1]["flat"][1] = ~uint64_t{0}; }},
      {"step 2^63", [&](json& j) { j["step"] = big63; }},
      {"writer as float", [&](json& j) { tensor(j, "model/a")["regions"][1]["writer"] = 1.0; }},
      {"format_version -2^40", [&](json& j) { j["format_version"] = -(int64_t{1} << 40); }},
      {"format_version 1.0", [&](json& j) { j["format_version"] = 1.0; }},
  };
  for (const auto& c : cases) {
    auto r = metadata_from_json(edit(text, c.fn), kFileSize);
    ASSERT_FALSE(r.ok()) << c.name << ": accepted";
    EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt) << c.name << ": " << r.status().to_string();
  }
  // 2^32+1 used to wrap to 1 and load as version 1; it is a newer version, named as such.
  auto r = metadata_from_json(edit(text, [&](json& j) { j["format_version"] = big32; }), kFileSize);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(r.status().message().find("4294967297"), std::string::npos) << r.status().message();
}

// One tensor of `n` regions, each one row (rows = true) or one column of a 2-D tensor.
CheckpointInfo sliced(int64_t n, bool rows) {
  CheckpointInfo info = small_info();
  info.saved_coords = {RankCoords{0, 0, 0}};
  info.saved_sizes = ParallelSizes{1, 1, 1};
  TensorInfo t;
  t.key = "model/sliced";
  t.dtype = DType::kU8;
  t.shape = rows ? Shape{n, 4} : Shape{4, n};
  t.nbytes = static_cast<uint64_t>(4 * n);
  t.file_offset = 0;
  for (int64_t i = 0; i < n; ++i)
    t.regions.push_back(SavedRegion{rows ? ShardSpec::box_of({i, 0}, {1, 4}) : ShardSpec::box_of({0, i}, {4, 1}), 0,
                                    static_cast<uint64_t>(i + 1)});
  info.tensors = {t};
  return info;
}

TEST(MetadataHostile, ManyOneRowRegionsValidateQuickly) {
  for (int64_t n : {16384, 100000}) {
    for (bool rows : {true, false}) {
      const std::string text = metadata_to_json(sliced(n, rows));
      const auto t0 = std::chrono::steady_clock::now();
      auto r = metadata_from_json(text, kFileSize);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      EXPECT_EQ(r->tensors[0].regions.size(), static_cast<size_t>(n));
      EXPECT_LT(s, 1.0 * kSlowdown) << n << (rows ? " rows" : " columns");  // was minutes (quadratic) at 16k
      // The same layout with the last two slices overlapping is still caught.
      auto overlapped = metadata_from_json(edit(text,
                                                [&](json& j) {
                                                  auto& last = j["tensors"][0]["regions"][n - 1];
                                                  last["offset"][rows ? 0 : 1] = n - 2;
                                                }),
                                           kFileSize);
      ASSERT_FALSE(overlapped.ok());
      EXPECT_NE(overlapped.status().message().find("twice"), std::string::npos) << overlapped.status().message();
    }
  }
}

TEST(MetadataHostile, PlannerChecksManyColumnShardsQuickly) {
  // 4096 ranks, one column each: every shard spans all rows, which the old sweep along dim 0
  // compared pairwise.
  const int64_t n = 4096;
  std::vector<std::vector<planner::ItemDesc>> ranks;
  for (int64_t i = 0; i < n; ++i)
    ranks.push_back({planner::ItemDesc{"model/w", DType::kF32, {64, n}, ShardSpec::box_of({0, i}, {64, 1})}});
  const auto t0 = std::chrono::steady_clock::now();
  auto plan = planner::plan_save(ranks);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_LT(s, 2.0 * kSlowdown);
  ranks[7][0].shard = ShardSpec::box_of({0, 6}, {64, 2});
  auto bad = planner::plan_save(ranks);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("overlaps"), std::string::npos) << bad.status().message();
}

// find_overlap against brute force on random boxes: planar layouts, and 3-D column splits that
// take the general sweep.
TEST(MetadataHostile, FindOverlapAgreesWithBruteForce) {
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 3000; ++iter) {
    const size_t d = 1 + iter % 3;
    Shape shape(d);
    for (auto& s : shape) s = 1 + static_cast<int64_t>(rng() % 6);
    std::vector<Box> boxes(1 + rng() % 6);
    for (auto& b : boxes) {
      b.offset.resize(d);
      b.shape.resize(d);
      for (size_t e = 0; e < d; ++e) {
        const bool full = e > 0 && rng() % 2;  // full trailing dims keep many cases planar
        b.offset[e] = full ? 0 : static_cast<int64_t>(rng() % shape[e]);
        b.shape[e] = full ? shape[e] : 1 + static_cast<int64_t>(rng() % (shape[e] - b.offset[e]));
      }
    }
    bool brute = false;
    for (size_t i = 0; i < boxes.size(); ++i)
      for (size_t k = i + 1; k < boxes.size(); ++k) brute = brute || planner::intersect(boxes[i], boxes[k]);
    auto got = planner::find_overlap(shape, boxes);
    ASSERT_TRUE(got.ok());
    ASSERT_EQ(got->has_value(), brute) << "iteration " << iter;
    if (*got) EXPECT_TRUE(planner::intersect(boxes[(*got)->first], boxes[(*got)->second]));
  }
}

}  // namespace
}  // namespace h5ckpt::storage
