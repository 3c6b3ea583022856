// Scalar codecs for the small float formats the quantizers emit: FP8 E4M3FN
// and E5M2 (OCP FP8), FP4 E2M1 and the E8M0 scale (OCP Microscaling).
// Internal; header-only so the quantizer loops can inline them.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tern::quant_internal {

struct MiniFloat {
  int ebits;
  int mbits;
  int bias;
  uint8_t max_code;  // largest finite magnitude code
  bool has_inf;      // E5M2: exponent all-ones, mantissa 0 is Inf
  uint8_t nan_code;  // magnitude code written for NaN (and for overflow
                     // without saturation when !has_inf)
  float max_value;
};

// 448 = 1.75 * 2^8: S.1111.110 (S.1111.111 is NaN, no Inf).
inline constexpr MiniFloat kE4M3 = {4, 3, 7, 0x7E, false, 0x7F, 448.0f};
// 57344 = 1.75 * 2^15: S.11110.11; S.11111.00 is Inf.
inline constexpr MiniFloat kE5M2 = {5, 2, 15, 0x7B, true, 0x7E, 57344.0f};
// Values 0, 0.5, 1, 1.5, 2, 3, 4, 6; no Inf or NaN.
inline constexpr MiniFloat kE2M1 = {2, 1, 1, 0x7, false, 0x7, 6.0f};

// Rounds to nearest, ties to even, from the exact FP32 value (one rounding).
// Overflow: the largest finite code when `saturate`, otherwise Inf (E5M2) or
// NaN (E4M3FN), as PyTorch and ml_dtypes do. NaN keeps its sign.
inline uint8_t EncodeMini(float x, const MiniFloat& f, bool saturate) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
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
    code = 0;  // below half the smallest subnormal (FP32 subnormals land here)
  } else {
    const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    const int shift = 23 + emin - f.mbits - exp32;  // 23 - mbits + 1 .. 24
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

inline float DecodeMini(uint8_t code, const MiniFloat& f) {
  const int width = f.ebits + f.mbits;
  const bool neg = (code >> width) & 1u;
  const uint32_t mag = code & ((1u << width) - 1u);
  const uint32_t e = mag >> f.mbits;
  const uint32_t m = mag & ((1u << f.mbits) - 1u);
  float v;
  if (mag > f.max_code) {
    v = (f.has_inf && mag == f.max_code + 1u) ? INFINITY : NAN;
  } else if (e == 0) {
    v = std::ldexp(static_cast<float>(m), 1 - f.bias - f.mbits);
  } else {
    v = std::ldexp(static_cast<float>(m | (1u << f.mbits)), static_cast<int>(e) - f.bias - f.mbits);
  }
  return neg ? -v : v;
}

// E8M0: a biased power of two, 2^(code - 127); 0xFF is NaN.
inline float DecodeE8M0(uint8_t code) {
  return code == 0xFF ? NAN : std::ldexp(1.0f, static_cast<int>(code) - 127);
}

}  // namespace tern::quant_internal
