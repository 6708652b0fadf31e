// Tests of the float element conversions. Expectations come from code independent of the
// implementation: a field formula with std::ldexp for decoding, and a nearest-value search over
// a sorted table of all representable values for RNE encoding; f16 is also cross-checked
// against the compiler's _Float16 and bf16 against its "top half of an f32" definition.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "util/dtype_convert.h"

namespace h5ckpt::detail {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Fmt {
  const char* name;
  int e;         // exponent bits
  int m;         // mantissa bits
  bool has_inf;  // IEEE-like; false = "fn" (e4m3fn)
  int bits() const { return 1 + e + m; }
  uint32_t count() const { return uint32_t{1} << bits(); }
  uint32_t sign_bit() const { return uint32_t{1} << (e + m); }
  int bias() const { return (1 << (e - 1)) - 1; }
};

constexpr Fmt kBf16{"bf16", 8, 7, true};
constexpr Fmt kF16{"f16", 5, 10, true};
constexpr Fmt kE4M3{"f8e4m3", 4, 3, false};
constexpr Fmt kE5M2{"f8e5m2", 5, 2, true};
constexpr Fmt kNarrow[] = {kBf16, kF16, kE4M3, kE5M2};

// --- the library under test, indexed by format --------------------------------------------
uint32_t lib_from_f32(const Fmt& f, float v) {
  if (f.m == 7) return f32_to_bf16(v);
  if (f.m == 10) return f32_to_f16(v);
  if (f.m == 3) return f32_to_f8e4m3(v);
  return f32_to_f8e5m2(v);
}
uint32_t lib_from_f64(const Fmt& f, double v) {
  if (f.m == 7) return f64_to_bf16(v);
  if (f.m == 10) return f64_to_f16(v);
  if (f.m == 3) return f64_to_f8e4m3(v);
  return f64_to_f8e5m2(v);
}
float lib_to_f32(const Fmt& f, uint32_t p) {
  if (f.m == 7) return bf16_to_f32(static_cast<uint16_t>(p));
  if (f.m == 10) return f16_to_f32(static_cast<uint16_t>(p));
  if (f.m == 3) return f8e4m3_to_f32(static_cast<uint8_t>(p));
  return f8e5m2_to_f32(static_cast<uint8_t>(p));
}
DType dtype_of(const Fmt& f) {
  if (f.m == 7) return DType::kBF16;
  if (f.m == 10) return DType::kF16;
  if (f.m == 3) return DType::kF8E4M3;
  return DType::kF8E5M2;
}

// --- independent references -----------------------------------------------------------------
bool ref_is_nan(const Fmt& f, uint32_t p) {
  const uint32_t exp = (p >> f.m) & ((1u << f.e) - 1);
  const uint32_t man = p & ((1u << f.m) - 1);
  if (exp != (1u << f.e) - 1) return false;
  return f.has_inf ? man != 0 : man == (1u << f.m) - 1;
}

// sign * 2^(e-bias) * (1 + m/2^M), or sign * 2^(1-bias) * m/2^M for subnormals.
double ref_decode(const Fmt& f, uint32_t p) {
  const bool neg = (p & f.sign_bit()) != 0;
  const int exp = static_cast<int>((p >> f.m) & ((1u << f.e) - 1));
  const int man = static_cast<int>(p & ((1u << f.m) - 1));
  double mag;
  if (ref_is_nan(f, p)) {
    mag = kNaN;
  } else if (f.has_inf && exp == (1 << f.e) - 1) {
    mag = kInf;
  } else if (exp == 0) {
    mag = std::ldexp(static_cast<double>(man), 1 - f.bias() - f.m);
  } else {
    mag = std::ldexp(1.0 + std::ldexp(static_cast<double>(man), -f.m), exp - f.bias());
  }
  return neg ? -mag : mag;
}

// Nearest-value RNE reference: all non-negative finite values in order, plus one virtual value
// one ulp above the maximum whose pattern is the overflow result (inf, or NaN for e4m3fn).
struct RefEncoder {
  Fmt f;
  std::vector<double> vals;
  std::vector<uint32_t> pats;
  uint32_t overflow;

  explicit RefEncoder(const Fmt& fmt) : f(fmt) {
    for (uint32_t p = 0; p < f.sign_bit(); ++p) {
      const double v = ref_decode(f, p);
      if (std::isfinite(v)) {
        vals.push_back(v);
        pats.push_back(p);
      }
    }
    const double max = vals.back(), below = vals[vals.size() - 2];
    vals.push_back(max + (max - below));
    overflow = f.has_inf ? ((1u << f.e) - 1) << f.m : f.sign_bit() - 1;
    pats.push_back(overflow);
  }

  // Returns the expected pattern; for NaN inputs a NaN pattern with the input's sign.
  uint32_t encode(double x) const {
    const uint32_t sign = std::signbit(x) ? f.sign_bit() : 0;
    if (std::isnan(x)) return sign | (f.has_inf ? overflow | 1 : overflow);
    const double a = std::fabs(x);
    if (a >= vals.back()) return sign | overflow;
    const size_t hi = static_cast<size_t>(std::upper_bound(vals.begin(), vals.end(), a) - vals.begin());
    const size_t lo = hi - 1;                      // vals[lo] <= a < vals[hi]
    const double mid = (vals[lo] + vals[hi]) / 2;  // exact: few significant bits
    size_t pick;
    if (a < mid) pick = lo;
    else if (a > mid) pick = hi;
    else pick = (pats[lo] & 1) == 0 ? lo : hi;
    return sign | pats[pick];
  }
};

const RefEncoder& ref_encoder(const Fmt& f) {
  static const RefEncoder bf16(kBf16), f16(kF16), e4m3(kE4M3), e5m2(kE5M2);
  if (f.m == 7) return bf16;
  if (f.m == 10) return f16;
  if (f.m == 3) return e4m3;
  return e5m2;
}

// Same bits, or both NaN with the same sign.
::testing::AssertionResult same_pattern(const Fmt& f, uint32_t got, uint32_t want) {
  if (got == want) return ::testing::AssertionSuccess();
  if (ref_is_nan(f, got) && ref_is_nan(f, want) && (got & f.sign_bit()) == (want & f.sign_bit())) {
    return ::testing::AssertionSuccess();
  }
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s: got 0x%x, want 0x%x", f.name, got, want);
  return ::testing::AssertionFailure() << buf;
}

// Same value and sign of zero, or both NaN with the same sign.
::testing::AssertionResult same_value(double got, double want) {
  if (std::isnan(want) ? (std::isnan(got) && std::signbit(got) == std::signbit(want))
                       : (got == want && std::signbit(got) == std::signbit(want))) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "got " << got << ", want " << want;
}

uint32_t f32_bits(float v) { return std::bit_cast<uint32_t>(v); }

// --- decoding --------------------------------------------------------------------------------

TEST(DtypeDecode, EveryPatternMatchesFieldFormula) {
  for (const Fmt& f : kNarrow) {
    for (uint32_t p = 0; p < f.count(); ++p) {
      ASSERT_TRUE(same_value(lib_to_f32(f, p), ref_decode(f, p))) << f.name << " 0x" << std::hex << p;
    }
  }
}

TEST(DtypeDecode, Bf16IsTopHalfOfF32) {
  for (uint32_t p = 0; p < 65536; ++p) {
    const float want = std::bit_cast<float>(p << 16);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(static_cast<uint16_t>(p))));
    } else {
      ASSERT_EQ(f32_bits(bf16_to_f32(static_cast<uint16_t>(p))), p << 16) << std::hex << p;
    }
  }
}

TEST(DtypeDecode, E5M2IsTopByteOfF16) {
  for (uint32_t p = 0; p < 256; ++p) {
    ASSERT_TRUE(same_value(f8e5m2_to_f32(static_cast<uint8_t>(p)), f16_to_f32(static_cast<uint16_t>(p << 8))))
        << std::hex << p;
  }
}

TEST(DtypeDecode, KnownValues) {
  EXPECT_EQ(f8e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x78), 256.0f);  // all-ones exponent is finite in e4m3fn
  EXPECT_EQ(f8e4m3_to_f32(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0xFF)) && std::signbit(f8e4m3_to_f32(0xFF)));
  EXPECT_EQ(f8e5m2_to_f32(0x7B), 57344.0f);
  EXPECT_EQ(f8e5m2_to_f32(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(f8e5m2_to_f32(0x7C), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(bf16_to_f32(0x7F7F), std::ldexp(255.0f, 120));
  EXPECT_EQ(bf16_to_f32(0x0001), std::ldexp(1.0f, -133));
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(f16_to_f32(0xC000), -2.0f);
}

#ifdef __FLT16_MANT_DIG__
TEST(DtypeDecode, F16MatchesCompilerFloat16) {
  for (uint32_t p = 0; p < 65536; ++p) {
    const auto h = std::bit_cast<_Float16>(static_cast<uint16_t>(p));
    ASSERT_TRUE(same_value(f16_to_f32(static_cast<uint16_t>(p)), static_cast<float>(h))) << std::hex << p;
  }
}
#endif

// --- round trips -----------------------------------------------------------------------------

TEST(DtypeRoundTrip, EveryPatternThroughF32) {
  for (const Fmt& f : kNarrow) {
    for (uint32_t p = 0; p < f.count(); ++p) {
      const float v = lib_to_f32(f, p);
      const uint32_t back = lib_from_f32(f, v);
      if (ref_is_nan(f, p)) {
        ASSERT_TRUE(ref_is_nan(f, back)) << f.name << std::hex << " 0x" << p << " -> 0x" << back;
        ASSERT_EQ(back & f.sign_bit(), p & f.sign_bit()) << f.name << std::hex << " 0x" << p;
      } else {
        ASSERT_EQ(back, p) << f.name << std::hex << " 0x" << p;
      }
    }
  }
}

TEST(DtypeRoundTrip, EveryPatternThroughF64WithConvertElements) {
  for (const Fmt& f : kNarrow) {
    const size_t bytes = static_cast<size_t>(f.bits()) / 8;
    std::vector<unsigned char> src(f.count() * bytes), back(src.size());
    for (uint32_t p = 0; p < f.count(); ++p) std::memcpy(&src[p * bytes], &p, bytes);  // LE
    std::vector<double> wide(f.count());
    ASSERT_TRUE(convert_elements(src.data(), dtype_of(f), wide.data(), DType::kF64, f.count()));
    ASSERT_TRUE(convert_elements(wide.data(), DType::kF64, back.data(), dtype_of(f), f.count()));
    for (uint32_t p = 0; p < f.count(); ++p) {
      ASSERT_TRUE(same_value(wide[p], ref_decode(f, p))) << f.name << std::hex << " 0x" << p;
      uint32_t q = 0;
      std::memcpy(&q, &back[p * bytes], bytes);
      if (ref_is_nan(f, p)) {
        ASSERT_TRUE(ref_is_nan(f, q) && (q & f.sign_bit()) == (p & f.sign_bit()))
            << f.name << std::hex << " 0x" << p << " -> 0x" << q;
      } else {
        ASSERT_EQ(q, p) << f.name << std::hex << " 0x" << p;
      }
    }
  }
}

// --- round to nearest even -------------------------------------------------------------------

// For adjacent values a < b (including the step from the largest finite value to the overflow
// point, and from 0 to the smallest subnormal), on both signs: the midpoint goes to the even
// pattern, one source ulp below/above it to the nearer one. Run with f32 and f64 inputs.
TEST(DtypeRne, AdjacentPairsMidpointsAndNeighbours) {
  for (const Fmt& f : kNarrow) {
    const RefEncoder& ref = ref_encoder(f);
    for (size_t i = 0; i + 1 < ref.vals.size(); ++i) {
      for (double s : {1.0, -1.0}) {
        const uint32_t sign = s < 0 ? f.sign_bit() : 0;
        const double a = s * ref.vals[i], b = s * ref.vals[i + 1];
        const uint32_t pa = sign | ref.pats[i], pb = sign | ref.pats[i + 1];
        const double mid = (a + b) / 2;
        const uint32_t even = (ref.pats[i] & 1) == 0 ? pa : pb;
        const float mid32 = static_cast<float>(mid);
        ASSERT_EQ(static_cast<double>(mid32), mid) << "midpoint must be exact in f32";
        SCOPED_TRACE(std::string(f.name) + " a=" + std::to_string(a));
        ASSERT_TRUE(same_pattern(f, lib_from_f32(f, mid32), even));
        ASSERT_TRUE(same_pattern(f, lib_from_f64(f, mid), even));
        // Towards a / towards b by one ulp of the source type.
        const float a32 = static_cast<float>(a), b32 = static_cast<float>(b);
        ASSERT_TRUE(same_pattern(f, lib_from_f32(f, std::nextafter(mid32, a32)), pa));
        ASSERT_TRUE(same_pattern(f, lib_from_f32(f, std::nextafter(mid32, b32)), pb));
        ASSERT_TRUE(same_pattern(f, lib_from_f64(f, std::nextafter(mid, a)), pa));
        ASSERT_TRUE(same_pattern(f, lib_from_f64(f, std::nextafter(mid, b)), pb));
        // The values themselves are exact.
        ASSERT_TRUE(same_pattern(f, lib_from_f64(f, a), pa));
      }
    }
  }
}

// Many f32 inputs spread over every exponent (a stride through all bit patterns) against the
// nearest-value reference.
TEST(DtypeRne, F32SweepMatchesNearestValueSearch) {
  for (const Fmt& f : kNarrow) {
    const RefEncoder& ref = ref_encoder(f);
    for (uint64_t u = 0; u <= 0xFFFFFFFFu; u += 4099) {
      const float v = std::bit_cast<float>(static_cast<uint32_t>(u));
      ASSERT_TRUE(same_pattern(f, lib_from_f32(f, v), ref.encode(v))) << std::hexfloat << v;
    }
  }
}

TEST(DtypeRne, F64RandomMatchesNearestValueSearch) {
  std::mt19937_64 rng(12345);
  for (const Fmt& f : kNarrow) {
    const RefEncoder& ref = ref_encoder(f);
    const int emax = std::ilogb(ref.vals.back());
    const int emin = 1 - f.bias() - f.m;
    std::uniform_int_distribution<int> exp_dist(emin - 3, emax + 2);
    for (int i = 0; i < 300000; ++i) {
      // Random 53-bit significand; low bits often zero so ties and near-ties occur.
      uint64_t sig = rng() >> 11;
      if (i % 3 == 0) sig &= ~((uint64_t{1} << (40 + i % 12)) - 1);
      const double mag = std::ldexp(1.0 + std::ldexp(static_cast<double>(sig), -53), exp_dist(rng));
      const double v = (rng() & 1) ? -mag : mag;
      ASSERT_TRUE(same_pattern(f, lib_from_f64(f, v), ref.encode(v))) << std::hexfloat << v;
    }
  }
}

#ifdef __FLT16_MANT_DIG__
// The compiler's (libgcc) _Float16 conversions are an independent RNE implementation.
TEST(DtypeRne, F16MatchesCompilerFloat16) {
  for (uint64_t u = 0; u <= 0xFFFFFFFFu; u += 997) {
    const float v = std::bit_cast<float>(static_cast<uint32_t>(u));
    const auto want = std::bit_cast<uint16_t>(static_cast<_Float16>(v));
    ASSERT_TRUE(same_pattern(kF16, f32_to_f16(v), want)) << std::hexfloat << v;
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const double v =
        std::ldexp(std::bit_cast<double>((rng() >> 12) | 0x3FF0000000000000ull), static_cast<int>(rng() % 48) - 30);
    const auto want = std::bit_cast<uint16_t>(static_cast<_Float16>(v));
    ASSERT_TRUE(same_pattern(kF16, f64_to_f16(v), want)) << std::hexfloat << v;
  }
}
#endif

// bf16 is the top half of an f32, so RNE on the f32 bits is a known add-and-shift.
TEST(DtypeRne, Bf16MatchesBitArithmetic) {
  for (uint64_t u = 0; u <= 0xFFFFFFFFu; u += 1021) {
    const auto bits = static_cast<uint32_t>(u);
    const float v = std::bit_cast<float>(bits);
    if (std::isnan(v)) continue;
    const uint32_t want = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16;  // inf on overflow too
    ASSERT_EQ(f32_to_bf16(v), want) << std::hexfloat << v;
  }
}

// --- no double rounding from f64 -------------------------------------------------------------

// d lies just above the midpoint between a (even) and b; rounding d to f32 first lands exactly
// on the midpoint, which then ties to a. The direct conversion must give b. And the mirror case
// just below a midpoint whose tie goes up.
TEST(DtypeF64, NoDoubleRoundingThroughF32) {
  struct Case {
    Fmt f;
    double lo;  // a value with an even pattern
    double ulp;
  };
  const Case cases[] = {{kBf16, 1.0, 0x1p-7},    {kF16, 1.0, 0x1p-10},        {kE4M3, 1.0, 0x1p-3},
                        {kE5M2, 1.0, 0x1p-2},    {kBf16, 0x1p-130, 0x1p-133},  // subnormal
                        {kF16, 0x1p-20, 0x1p-24}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.f.name);
    const uint32_t pa = lib_from_f64(c.f, c.lo);
    ASSERT_EQ(pa & 1, 0u);
    const double mid_up = c.lo + c.ulp / 2;  // tie goes down to lo (even)
    const double d_up = mid_up + mid_up * 0x1p-40;
    ASSERT_EQ(static_cast<double>(static_cast<float>(d_up)), mid_up);  // premise
    EXPECT_EQ(lib_from_f32(c.f, static_cast<float>(d_up)), pa);        // what float would give
    EXPECT_EQ(lib_from_f64(c.f, d_up), pa + 1);

    const double mid_dn = c.lo + 1.5 * c.ulp;  // between odd pa+1 and even pa+2: tie goes up
    const double d_dn = mid_dn - mid_dn * 0x1p-40;
    ASSERT_EQ(static_cast<double>(static_cast<float>(d_dn)), mid_dn);
    EXPECT_EQ(lib_from_f32(c.f, static_cast<float>(d_dn)), pa + 2);
    EXPECT_EQ(lib_from_f64(c.f, d_dn), pa + 1);

    // Same through convert_elements.
    const double in[2] = {d_up, d_dn};
    unsigned char out[4] = {};
    ASSERT_TRUE(convert_elements(in, DType::kF64, out, dtype_of(c.f), 2));
    uint32_t q0 = 0, q1 = 0;
    const size_t w = static_cast<size_t>(c.f.bits()) / 8;
    std::memcpy(&q0, out, w);
    std::memcpy(&q1, out + w, w);
    EXPECT_EQ(q0, pa + 1);
    EXPECT_EQ(q1, pa + 1);
  }
  // Overflow edge of e4m3fn: 464 ties to 448, but 464 + tiny is above the tie -> NaN.
  const double d = 464.0 + 0x1p-30;
  ASSERT_EQ(static_cast<float>(d), 464.0f);
  EXPECT_EQ(f32_to_f8e4m3(static_cast<float>(d)), 0x7E);
  EXPECT_EQ(f64_to_f8e4m3(d), 0x7F);
}

// --- special values ----------------------------------------------------------------------------

TEST(DtypeSpecial, ZerosInfinitiesNaNs) {
  const float finf = std::numeric_limits<float>::infinity();
  const float fnan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(f32_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f8e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_f8e5m2(-0.0f), 0x80);
  EXPECT_EQ(f64_to_f16(-0.0), 0x8000);
  EXPECT_TRUE(std::signbit(bf16_to_f32(0x8000)) && bf16_to_f32(0x8000) == 0.0f);

  EXPECT_EQ(f32_to_bf16(finf), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-finf), 0xFF80);
  EXPECT_EQ(f32_to_f16(finf), 0x7C00);
  EXPECT_EQ(f32_to_f16(-finf), 0xFC00);
  EXPECT_EQ(f32_to_f8e5m2(finf), 0x7C);
  EXPECT_EQ(f32_to_f8e5m2(-finf), 0xFC);
  EXPECT_EQ(f64_to_bf16(-kInf), 0xFF80);

  for (const Fmt& f : kNarrow) {
    const float snan32 = std::bit_cast<float>(0x7F800001u);
    const float neg_payload = std::bit_cast<float>(0xFFC12345u);
    for (float n : {fnan, -fnan, snan32, neg_payload}) {
      const uint32_t p = lib_from_f32(f, n);
      EXPECT_TRUE(ref_is_nan(f, p)) << f.name << std::hex << " 0x" << p;
      EXPECT_EQ((p & f.sign_bit()) != 0, std::signbit(n)) << f.name;
      EXPECT_TRUE(std::isnan(lib_to_f32(f, p)));
      EXPECT_EQ(std::signbit(lib_to_f32(f, p)), std::signbit(n));
    }
    EXPECT_TRUE(ref_is_nan(f, lib_from_f64(f, -kNaN)));
    // A signalling f64 NaN whose payload sits below the narrow mantissa must not become inf.
    const double snan = std::bit_cast<double>(uint64_t{0x7FF0000000000001});
    EXPECT_TRUE(ref_is_nan(f, lib_from_f64(f, snan))) << f.name;
  }
  // Quiet NaN payload: top 7 mantissa bits of the f32 kept, quiet bit set.
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x7FC12345u)), 0x7FC1);
  EXPECT_EQ(f32_to_f8e4m3(fnan), 0x7F);
  EXPECT_EQ(f32_to_f8e4m3(-fnan), 0xFF);
}

TEST(DtypeSpecial, OverflowAndUnderflow) {
  // bf16: max 0x7F7F = (2 - 2^-7) * 2^127; FLT_MAX is above the max..2^128 midpoint -> inf.
  EXPECT_EQ(f32_to_bf16(FLT_MAX), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-FLT_MAX), 0xFF80);
  EXPECT_EQ(f64_to_bf16(0x1.ffp127), 0x7F80);  // midpoint: ties to even = inf
  EXPECT_EQ(f64_to_bf16(std::nextafter(0x1.ffp127, 0.0)), 0x7F7F);
  EXPECT_EQ(f64_to_bf16(1e300), 0x7F80);
  EXPECT_EQ(f64_to_bf16(-1e300), 0xFF80);
  EXPECT_EQ(f32_to_bf16(0x1p-133f), 0x0001);
  EXPECT_EQ(f32_to_bf16(0x1p-134f), 0x0000);  // tie with 0 -> 0
  EXPECT_EQ(f32_to_bf16(0x1.8p-134f), 0x0001);
  EXPECT_EQ(f32_to_bf16(-0x1p-140f), 0x8000);
  EXPECT_EQ(f32_to_bf16(0x1p-126f - 0x1p-134f), 0x0080);  // max subnormal tie -> min normal
  EXPECT_EQ(f64_to_bf16(1e-300), 0x0000);
  EXPECT_EQ(f64_to_bf16(-5e-324), 0x8000);  // double subnormal

  // f16: max 65504, overflow threshold 65520.
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65519.996f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(f32_to_f16(-70000.0f), 0xFC00);
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);
  EXPECT_EQ(f32_to_f16(0x1.000002p-25f), 0x0001);
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400);
  EXPECT_EQ(f32_to_f16(1e-8f), 0x0000);
  EXPECT_EQ(f32_to_f16(-1e-8f), 0x8000);

  // e5m2: max 57344 (0x7B); the 57344..65536 midpoint 61440 ties to inf.
  EXPECT_EQ(f32_to_f8e5m2(57344.0f), 0x7B);
  EXPECT_EQ(f32_to_f8e5m2(61439.0f), 0x7B);
  EXPECT_EQ(f32_to_f8e5m2(61440.0f), 0x7C);
  EXPECT_EQ(f32_to_f8e5m2(-1e6f), 0xFC);
  EXPECT_EQ(f32_to_f8e5m2(0x1p-16f), 0x01);
  EXPECT_EQ(f32_to_f8e5m2(0x1p-17f), 0x00);
  EXPECT_EQ(f32_to_f8e5m2(0x1.8p-17f), 0x01);
}

// e4m3fn convention implemented: RNE first (unbounded exponent), then any result above 448 is
// NaN (sign kept); infinities are NaN. Same as PyTorch float8_e4m3fn / OCP non-saturating.
TEST(DtypeSpecial, E4M3fnOverflowIsNaN) {
  const float finf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_f8e4m3(448.0f), 0x7E);
  EXPECT_EQ(f32_to_f8e4m3(-448.0f), 0xFE);
  EXPECT_EQ(f32_to_f8e4m3(450.0f), 0x7E);
  EXPECT_EQ(f32_to_f8e4m3(464.0f), 0x7E);  // tie between 448 (even) and 480: rounds to 448
  EXPECT_EQ(f32_to_f8e4m3(std::nextafter(464.0f, 500.0f)), 0x7F);
  EXPECT_EQ(f32_to_f8e4m3(470.0f), 0x7F);
  EXPECT_EQ(f32_to_f8e4m3(480.0f), 0x7F);
  EXPECT_EQ(f32_to_f8e4m3(-480.0f), 0xFF);
  EXPECT_EQ(f32_to_f8e4m3(1e6f), 0x7F);
  EXPECT_EQ(f32_to_f8e4m3(FLT_MAX), 0x7F);
  EXPECT_EQ(f32_to_f8e4m3(finf), 0x7F);
  EXPECT_EQ(f32_to_f8e4m3(-finf), 0xFF);
  EXPECT_EQ(f64_to_f8e4m3(1e300), 0x7F);
  EXPECT_EQ(f32_to_f8e4m3(256.0f), 0x78);  // the all-ones exponent holds finite values
  EXPECT_EQ(f32_to_f8e4m3(0x1p-9f), 0x01);
  EXPECT_EQ(f32_to_f8e4m3(0x1p-10f), 0x00);
  EXPECT_EQ(f32_to_f8e4m3(0x1.8p-10f), 0x01);
  EXPECT_EQ(f32_to_f8e4m3(0x1.cp-7f), 0x07);  // max subnormal 0.875 * 2^-6
  EXPECT_EQ(f32_to_f8e4m3(0x1.ep-7f), 0x08);  // its tie with 2^-6 -> even (min normal)
}

// --- convert_elements --------------------------------------------------------------------------

const DType kFloatTypes[] = {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2};

size_t test_size(DType t) {
  switch (t) {
    case DType::kF64: return 8;
    case DType::kF32: return 4;
    case DType::kF16:
    case DType::kBF16: return 2;
    default: return 1;
  }
}
const Fmt* fmt_of(DType t) {
  switch (t) {
    case DType::kF16: return &kF16;
    case DType::kBF16: return &kBf16;
    case DType::kF8E4M3: return &kE4M3;
    case DType::kF8E5M2: return &kE5M2;
    default: return nullptr;
  }
}

// Reference encode of an exact double into dtype t, as little-endian bytes.
void ref_store(DType t, double v, unsigned char* out) {
  if (t == DType::kF64) {
    std::memcpy(out, &v, 8);
  } else if (t == DType::kF32) {
    const float f = static_cast<float>(v);
    std::memcpy(out, &f, 4);
  } else {
    const uint32_t p = ref_encoder(*fmt_of(t)).encode(v);
    std::memcpy(out, &p, test_size(t));
  }
}
double ref_load(DType t, const unsigned char* in) {
  if (t == DType::kF64) {
    double d;
    std::memcpy(&d, in, 8);
    return d;
  }
  if (t == DType::kF32) {
    float f;
    std::memcpy(&f, in, 4);
    return f;
  }
  uint32_t p = 0;
  std::memcpy(&p, in, test_size(t));
  return ref_decode(*fmt_of(t), p);
}

TEST(DtypeConvertElements, EveryPairOfFloatTypes) {
  std::vector<double> values = {0.0,
                                -0.0,
                                1.0,
                                -1.0,
                                0.1,
                                -2.5,
                                3.14159265358979,
                                1e-3,
                                1e-6,
                                1e-9,
                                1e-30,
                                1e-40,
                                100.0,
                                448.0,
                                464.0,
                                465.0,
                                500.0,
                                57344.0,
                                61440.0,
                                65504.0,
                                65520.0,
                                1e5,
                                3e38,
                                1e300,
                                -1e300,
                                kInf,
                                -kInf,
                                kNaN,
                                -kNaN,
                                1.0 + 0x1p-8 + 0x1p-40,
                                0x1p-24,
                                0x1p-25,
                                0x1p-133,
                                0x1p-9,
                                0x1p-16};
  std::mt19937_64 rng(99);
  for (int i = 0; i < 500; ++i) {
    const int exp = static_cast<int>(rng() % 40) - 20;
    const double mag = std::ldexp(static_cast<double>(rng() >> 11), exp - 53);
    values.push_back((rng() & 1) ? -mag : mag);
  }
  const size_t n = values.size();
  for (DType s : kFloatTypes) {
    // Source buffer at an odd offset to exercise unaligned access.
    std::vector<unsigned char> src(n * test_size(s) + 1);
    for (size_t i = 0; i < n; ++i) ref_store(s, values[i], &src[1 + i * test_size(s)]);
    for (DType d : kFloatTypes) {
      SCOPED_TRACE("src " + std::to_string(int(s)) + " dst " + std::to_string(int(d)));
      std::vector<unsigned char> dst(n * test_size(d) + 1, 0xAB), want(n * test_size(d));
      ASSERT_TRUE(convert_elements(&src[1], s, &dst[1], d, n));
      for (size_t i = 0; i < n; ++i) {
        const double exact = ref_load(s, &src[1 + i * test_size(s)]);
        ref_store(d, exact, &want[i * test_size(d)]);
        const double got = ref_load(d, &dst[1 + i * test_size(d)]);
        const double exp = ref_load(d, &want[i * test_size(d)]);
        ASSERT_TRUE(same_value(got, exp)) << "element " << i << " exact " << exact;
      }
      EXPECT_EQ(dst[0], 0xAB);  // nothing written before the buffer
    }
  }
}

TEST(DtypeConvertElements, KnownF32ToBf16) {
  const float in[] = {1.0f, -2.5f, 0.1f, 3.0e38f, 1.00390625f, 1.01171875f};
  uint16_t out[6] = {};
  ASSERT_TRUE(convert_elements(in, DType::kF32, out, DType::kBF16, 6));
  EXPECT_EQ(out[0], 0x3F80);
  EXPECT_EQ(out[1], 0xC020);
  EXPECT_EQ(out[2], 0x3DCD);  // 0x3DCCCCCD: lower half 0xCCCD > 0x8000 rounds up
  EXPECT_EQ(out[3], 0x7F62);  // 3e38 = 0x7F61B1E6
  EXPECT_EQ(out[4], 0x3F80);  // 1 + 2^-8: tie -> even
  EXPECT_EQ(out[5], 0x3F82);  // 1 + 3*2^-8: tie -> even
}

TEST(DtypeConvertElements, SameTypeCopiesAndZeroCount) {
  const double in[3] = {1.5, -kInf, 0x1p-1070};
  double out[3] = {};
  ASSERT_TRUE(convert_elements(in, DType::kF64, out, DType::kF64, 3));
  EXPECT_EQ(std::memcmp(in, out, sizeof in), 0);
  const uint16_t h[2] = {0x7E01, 0x1234};  // a NaN payload is copied verbatim
  uint16_t h2[2] = {};
  ASSERT_TRUE(convert_elements(h, DType::kF16, h2, DType::kF16, 2));
  EXPECT_EQ(h2[0], 0x7E01);
  EXPECT_EQ(h2[1], 0x1234);
  EXPECT_TRUE(convert_elements(nullptr, DType::kF32, nullptr, DType::kBF16, 0));
  EXPECT_FALSE(convert_elements(nullptr, DType::kF32, h2, DType::kBF16, 1));
}

TEST(DtypeConvertElements, RejectsNonFloatTypes) {
  const DType non_float[] = {DType::kI8, DType::kI16, DType::kI32, DType::kI64, DType::kU8, DType::kBool};
  const int64_t in[2] = {1, 2};
  int64_t out[2] = {7, 7};
  for (DType t : non_float) {
    for (DType f : kFloatTypes) {
      EXPECT_FALSE(convert_elements(in, t, out, f, 2));
      EXPECT_FALSE(convert_elements(in, f, out, t, 2));
    }
    EXPECT_FALSE(convert_elements(in, t, out, t, 2));
    // Rejected by type even when there is nothing to convert.
    EXPECT_FALSE(convert_elements(in, DType::kF32, out, t, 0));
    EXPECT_FALSE(convert_elements(in, t, out, DType::kF32, 0));
  }
  EXPECT_EQ(out[0], 7);
  EXPECT_EQ(out[1], 7);
}

}  // namespace
}  // namespace h5ckpt::detail
