// Scalar codecs of the small float formats: FP8 E4M3FN and E5M2 (OCP FP8),
// FP4 E2M1 and the E8M0 scale (OCP Microscaling). One copy for the CPU
// quantizers (quant/minifloat.h) and the GPU kernels (gpu/ops/cast_ops.h), so
// both sides give the same codes by construction; TERN_HD (format/hd.h).
#pragma once

#include <cstdint>

#include "format/hd.h"

namespace tern::minifloat {

using namespace ::tern::hd;

struct MiniFormat {
  int ebits, mbits, bias;
  uint8_t max_code;
  bool has_inf;
  uint8_t nan_code;
  float max_value;
};
// 448 = 1.75 * 2^8: S.1111.110 (S.1111.111 is NaN, no Inf); 57344 = 1.75 *
// 2^15: S.11110.11 (S.11111.00 is Inf); E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
// Functions rather than constants: device code may not take the address of
// a host constant, and the formats are passed by reference.
TERN_HD constexpr MiniFormat E4M3() { return {4, 3, 7, 0x7E, false, 0x7F, 448.0f}; }
TERN_HD constexpr MiniFormat E5M2() { return {5, 2, 15, 0x7B, true, 0x7E, 57344.0f}; }
TERN_HD constexpr MiniFormat E2M1() { return {2, 1, 1, 0x7, false, 0x7, 6.0f}; }

// Rounds to nearest, ties to even, from the exact FP32 value (one rounding).
// Overflow: the largest finite code when `saturate`, otherwise Inf (E5M2) or
// NaN (E4M3FN), as PyTorch and ml_dtypes do. NaN keeps its sign.
TERN_HD uint8_t EncodeMini(float x, const MiniFormat& f, bool saturate) {
  const uint32_t u = FloatBits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 31) << (f.ebits + f.mbits));
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | f.nan_code;
  const int exp32 = static_cast<int>(a >> 23) - 127;
  const int emin = 1 - f.bias;
  uint32_t code;
  if (exp32 >= emin) {
    const int shift = 23 - f.mbits;
    const uint32_t rounded = a + ((1u << (shift - 1)) - 1u) + ((a >> shift) & 1u);
    code = (rounded >> shift) - (static_cast<uint32_t>(127 - f.bias) << f.mbits);
  } else if (exp32 < emin - f.mbits - 1) {
    code = 0;
  } else {
    const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    const int shift = 23 + emin - f.mbits - exp32;
    code = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (code & 1u))) ++code;
  }
  if (code > f.max_code) {
    if (saturate) return sign | f.max_code;
    return sign | (f.has_inf ? static_cast<uint8_t>(f.max_code + 1) : f.nan_code);
  }
  return sign | static_cast<uint8_t>(code);
}

// Every minifloat value is exact in FP32: the bits are built directly (the
// same as std::ldexp and NAN/INFINITY gave, frozen by gpu/ops/cast_ops_test.cc).
TERN_HD float DecodeMini(uint8_t code, const MiniFormat& f) {
  const int width = f.ebits + f.mbits;
  const bool neg = (code >> width) & 1u;
  const uint32_t mag = code & ((1u << width) - 1u);
  const uint32_t e = mag >> f.mbits;
  const uint32_t m = mag & ((1u << f.mbits) - 1u);
  float v;
  if (mag > f.max_code) {
    v = BitsFloat((f.has_inf && mag == f.max_code + 1u) ? 0x7F800000u : 0x7FC00000u);
  } else if (e == 0) {
    v = static_cast<float>(m) * Pow2(1 - f.bias - f.mbits);
  } else {
    v = static_cast<float>(m | (1u << f.mbits)) * Pow2(static_cast<int>(e) - f.bias - f.mbits);
  }
  return neg ? BitsFloat(FloatBits(v) ^ 0x80000000u) : v;
}

// E8M0: a biased power of two, 2^(code - 127); 0xFF is NaN.
TERN_HD float DecodeE8M0(uint8_t code) { return code == 0xFF ? BitsFloat(0x7FC00000u) : Pow2(code - 127); }

}  // namespace tern::minifloat
