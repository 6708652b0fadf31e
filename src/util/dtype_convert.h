// Conversions between the floating-point element types (f32, f64, f16, bf16, fp8).
//
// Conventions (all narrow targets):
// - Round to nearest, ties to even, applied exactly once to the exact input value: every f32,
//   f16, bf16 and fp8 value is exactly a double, so all paths go through one double-based
//   encoder and f64 inputs are never pre-rounded to f32 (no double rounding).
// - Subnormals are produced and decoded; the sign of zero is kept.
// - NaN stays NaN with its sign. f16/bf16/e5m2 keep the top payload bits and set the quiet bit;
//   e4m3fn has a single NaN per sign (S.1111.111).
// - f16, bf16, e5m2 (IEEE-like, with infinities): a value whose RNE result is above the largest
//   finite value becomes infinity (so the exact midpoint max..2^(emax+1) goes to inf).
// - fp8 e4m3fn (OCP, bias 7, no infinities, max 448): the value is rounded first (RNE, unbounded
//   exponent); if the rounded magnitude exceeds 448 the result is NaN, and +-inf become NaN with
//   their sign. Hence 464 (the tie between 448 and 480) -> 448, anything above 464 -> NaN. This
//   matches PyTorch's float8_e4m3fn cast and the OCP non-saturating mode; nothing saturates.
#pragma once

#include <cstddef>
#include <cstdint>

#include "h5ckpt/types.h"

namespace h5ckpt::detail {

/// Encodes `v` into a 1 + exp_bits + man_bits bit float (sign in the top bit, bias
/// 2^(exp_bits-1)-1), RNE. has_inf = true: IEEE-like (all-ones exponent = inf/NaN);
/// has_inf = false: "fn" style (only all-ones exponent and mantissa is NaN; no inf).
/// Valid for 2 <= exp_bits <= 8, 1 <= man_bits <= 23.
uint32_t encode_minifloat(double v, int exp_bits, int man_bits, bool has_inf);
/// Exact value of a pattern produced by encode_minifloat with the same parameters.
double decode_minifloat(uint32_t bits, int exp_bits, int man_bits, bool has_inf);

uint16_t f32_to_bf16(float v);
float bf16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float v);
float f16_to_f32(uint16_t bits);
uint8_t f32_to_f8e4m3(float v);
float f8e4m3_to_f32(uint8_t bits);
uint8_t f32_to_f8e5m2(float v);
float f8e5m2_to_f32(uint8_t bits);

// Direct (single-rounding) conversions from double.
uint16_t f64_to_bf16(double v);
uint16_t f64_to_f16(double v);
uint8_t f64_to_f8e4m3(double v);
uint8_t f64_to_f8e5m2(double v);

/// Converts n elements between any two float dtypes (f32, f64, f16, bf16, f8e4m3, f8e5m2)
/// with the conventions above; same type is a plain copy (memmove). Returns false, writing
/// nothing, if either type is not a float type or a pointer is null while n > 0.
/// src and dst must not overlap unless the types are equal.
bool convert_elements(const void* src, DType src_type, void* dst, DType dst_type, size_t n);

}  // namespace h5ckpt::detail
