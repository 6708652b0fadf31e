// The load contract's pure part (planner/load_contract.h): each item's problems, merging the
// findings of several ranks, the wire form every rank receives, and the one error built from it.
#include <gtest/gtest.h>

#include "planner/load_contract.h"

namespace h5ckpt::planner {
namespace {

LoadContract check(const std::vector<std::pair<const StoredTensor*, ContractItem>>& items, bool convert = true) {
  LoadContract c;
  for (const auto& [stored, item] : items) check_contract_item(stored, item, convert, &c);
  normalize_contract(c);
  return c;
}

TEST(LoadContractUnit, EachKindOfProblem) {
  const Shape s46{4, 6}, s48{4, 8}, s56{5, 6}, s3{3};
  const StoredTensor f32_46{DType::kF32, s46, 0}, i32_3{DType::kI32, s3, 0};
  const std::string a = "a", b = "b", c = "c", d = "d", e = "e";
  const LoadContract got = check({{&f32_46, {a, DType::kF32, s46, false}},   // fine
                                  {&f32_46, {b, DType::kF32, s48, false}},   // shape
                                  {&f32_46, {c, DType::kBF16, s56, true}},   // padded rows: fine, bf16 converts
                                  {&i32_3, {d, DType::kF32, s3, false}},     // int -> float refused
                                  {nullptr, {e, DType::kF32, s3, false}}});  // missing
  EXPECT_EQ(got.missing, std::vector<std::string>{"e"});
  EXPECT_EQ(got.shape, std::vector<std::string>{"'b': checkpoint has global shape [4,6], the state wants [4,8]"});
  EXPECT_EQ(got.dtype, std::vector<std::string>{"'d': checkpoint holds i32, the state wants f32"});
  // Without conversion a float dtype change is refused too, and says why.
  const LoadContract strict_types = check({{&f32_46, {c, DType::kBF16, s46, false}}}, false);
  EXPECT_EQ(strict_types.dtype,
            std::vector<std::string>{"'c': checkpoint holds f32, the state wants bf16 (convert_dtype is off)"});
  // allow_shape_mismatch lets only a non-empty dimension 0 differ.
  const Shape s47{4, 7};
  EXPECT_EQ(check({{&f32_46, {c, DType::kF32, s47, true}}}).shape.size(), 1u);
}

TEST(LoadContractUnit, MergeSortsAndDeduplicatesAndSurvivesTheWire) {
  LoadContract r0{{"m/z", "m/a"}, {"'x': s"}, {}, {}}, r1{{"m/a", "m/b"}, {"'x': s", "'w': s"}, {"'q': d"}, {}};
  LoadContract all;
  merge_contract(all, r0);
  merge_contract(all, r1);
  EXPECT_EQ(all.missing, (std::vector<std::string>{"m/a", "m/b", "m/z"}));
  EXPECT_EQ(all.shape, (std::vector<std::string>{"'w': s", "'x': s"}));
  all.unexpected = {"u/1"};
  const std::string bytes = encode_contract(all);
  auto back = decode_contract(bytes);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, all);
  // Every truncation and one extra byte are refused, never misread.
  for (size_t n = 0; n < bytes.size(); ++n) EXPECT_FALSE(decode_contract(bytes.substr(0, n)).ok()) << n;
  EXPECT_FALSE(decode_contract(bytes + "x").ok());
}

TEST(LoadContractUnit, OneErrorWithCountsAndTheFirstEntries) {
  LoadContract c;
  for (int i = 0; i < 12; ++i) c.missing.push_back("k" + std::to_string(10 + i));
  c.unexpected = {"u"};
  Status st = contract_status(c, true, false, 10);
  EXPECT_EQ(st.code(), ErrorCode::kNotFound);
  EXPECT_EQ(st.message(),
            "the state does not match the checkpoint: 12 keys missing from the checkpoint: 'k10', 'k11', 'k12', "
            "'k13', 'k14', 'k15', 'k16', 'k17', 'k18', 'k19' and 2 more; 1 key in the checkpoint the state does not "
            "ask for (not an error): 'u'");
  // Missing keys allowed, unexpected ones not: the code follows what fails.
  st = contract_status(c, false, true);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("12 keys missing from the checkpoint (skipped, not an error)"), std::string::npos);
  EXPECT_TRUE(contract_status(c, false, false).ok());
  c.shape = {"'s': x"};
  EXPECT_EQ(contract_status(c, false, false).code(), ErrorCode::kShapeMismatch);
  c.dtype = {"'t': y"};
  EXPECT_EQ(contract_status(c, true, false).code(), ErrorCode::kNotFound);
  EXPECT_TRUE(contract_status(LoadContract{}, true, true).ok());
}

}  // namespace
}  // namespace h5ckpt::planner
