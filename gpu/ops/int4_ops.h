// Per-group logic of the GPU INT4 quantizer, as TERN_HD functions
// (format/hd.h): the scale and zero point of one group of `g` weights along
// `in`, and the nibble of one weight. Mirrors quant/quantize_int4.cc (the
// reference; gpu/ops/cast_ops_test.cc holds the composition to tern::Quantize
// byte for byte): compressed-tensors pack-quantized (BF16 scales, symmetric
// or asymmetric) and GPTQ (F16 scales, symmetric).
#pragma once

#include <cstdint>

#include "format/hd.h"
#include "gpu/ops/cast_ops.h"

namespace tern::gpu {

// std::nearbyint in the default rounding mode (ties to even): adding and
// removing 2^23 leaves the integer nearest |x| (IEEE round to nearest
// even, no contraction: format/hd.h's rules). |x| >= 2^23 and NaN are
// returned as they are; the sign (of -0 too) is kept.
TERN_HD float RintF(float x) {
  const float a = AbsF(x);
  if (!(a < 8388608.0f)) return x;
  const float r = (a + 8388608.0f) - 8388608.0f;
  return BitsFloat(FloatBits(r) | (FloatBits(x) & 0x80000000u));
}

// std::fmin: a NaN argument loses.
TERN_HD float MinF(float a, float b) {
  if (IsNan(a)) return b;
  if (IsNan(b)) return a;
  return b < a ? b : a;
}

// F16 bits widened exactly (quant/cast_internal.h's F16ToF32Bits).
TERN_HD uint32_t F16ToF32Bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FFu;
  if (e == 0x1F) return sign | 0x7F800000u | (m != 0 ? 0x400000u : 0) | (m << 13);  // NaN: quieted, as the reference
  if (e != 0) return sign | ((e + 112) << 23) | (m << 13);
  if (m == 0) return sign;
  // Subnormal: normalise.
  int shift = 0;
  uint32_t mm = m;
  while (!(mm & 0x400u)) mm <<= 1, ++shift;
  return sign | (static_cast<uint32_t>(113 - shift) << 23) | ((mm & 0x3FFu) << 13);
}

// An INT4 scale as stored: BF16 (compressed-tensors) or F16 (GPTQ), never
// zero (the smallest positive instead).
TERN_HD uint16_t EncodeInt4Scale(float s, bool gptq) {
  uint16_t bits = gptq ? F32ToF16(FloatBits(s)) : F32ToBF16(FloatBits(s));
  if ((bits & 0x7FFF) == 0) bits = 1;
  return bits;
}
TERN_HD float DecodeInt4Scale(uint16_t bits, bool gptq) {
  return BitsFloat(gptq ? F16ToF32Bits(bits) : static_cast<uint32_t>(bits) << 16);
}

struct Int4Group {
  uint16_t scale_bits = 0;  // as stored
  int zp = 0;               // in [-8, 7]; 0 when symmetric
  bool kept = false;        // the previous scale (and zero point) kept
};

// Scale and zero point of one group; x(i), i < g, gives its weights. With
// has_prev, prev_bits/prev_zp are the stored previous state. False: the
// scale does not fit its dtype (the reference's kOutOfRange).
template <class X>
TERN_HD bool Int4GroupScale(X x, uint64_t g, bool symmetric, bool gptq, bool has_prev, uint16_t prev_bits,
                            int prev_zp, const QuantPolicy& p, Int4Group* out) {
  float lo = 0.0f, hi = 0.0f;
  for (uint64_t i = 0; i < g; ++i) {
    const float v = x(i);
    lo = MinF(lo, v);
    hi = MaxF(hi, v);
  }
  constexpr float kEps = 1.1920928955078125e-7f;  // FLT_EPSILON
  const float fresh = symmetric ? MaxF(MaxF(-lo, hi) / 7.5f, gptq ? 0.0f : kEps) : MaxF((hi - lo) / 15.0f, kEps);
  // GPTQ maps an all-zero group to [-1, 1].
  const float fresh_or_unit = (gptq && fresh == 0.0f) ? 2.0f / 15.0f : fresh;
  *out = Int4Group{};
  if (has_prev) {
    const float ps = DecodeInt4Scale(prev_bits, gptq);
    // Asymmetric: the previous grid must still cover [lo, hi].
    const bool covers = symmetric || (RintF(lo / ps) + static_cast<float>(prev_zp) >= -8.0f &&
                                      RintF(hi / ps) + static_cast<float>(prev_zp) <= 7.0f);
    if (IsFinite(ps) && covers && KeepPrevious(fresh_or_unit, ps, p)) {
      out->scale_bits = prev_bits;
      out->zp = prev_zp;
      out->kept = true;
      return true;
    }
  }
  const float target = fresh_or_unit * RescaleFactor(p);
  uint16_t s = EncodeInt4Scale(target, gptq);
  // The band rounds the stored scale up; positive BF16/F16 patterns are
  // monotonic, so +1 is the next value up.
  if (p.band && DecodeInt4Scale(s, gptq) < target) ++s;
  const float sd = DecodeInt4Scale(s, gptq);
  if (!IsFinite(sd)) return false;
  if (!symmetric) out->zp = static_cast<int>(MinF(MaxF(-8.0f - RintF(lo / sd), -8.0f), 7.0f));
  out->scale_bits = s;
  return true;
}

// The stored nibble (q + 8, q in [-8, 7]) of weight x under scale s
// (decoded) and zero point zp.
TERN_HD uint32_t Int4Nibble(float x, float s, int zp) {
  const float v = MinF(MaxF(RintF(x / s) + static_cast<float>(zp), -8.0f), 7.0f);
  return static_cast<uint32_t>(static_cast<int>(v) + 8);
}

}  // namespace tern::gpu
