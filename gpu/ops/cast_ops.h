// Per-element and per-group logic of the GPU cast and quantize kernels, as
// TERN_HD functions (format/hd.h). Each mirrors a CPU reference in quant/
// (float_cast.h, quant/quantize_fp8.cc, quantize_fp4.cc) except the
// minifloat codecs, which both sides share (format/minifloat.h)
// and gpu/ops/cast_ops_test.cc checks it against that reference bit for bit,
// exhaustively where the domain allows (every BF16/FP16/FP8 code, every
// E2M1/E8M0 code, edge FP32 patterns). The reference is the contract; any
// difference here is a bug here.
#pragma once

#include <cstdint>

#include "format/hd.h"
#include "format/minifloat.h"

namespace tern::gpu {

// ---- FP32 -> 16-bit casts (float_cast.h's contract) ----------------------

TERN_HD uint16_t F32ToBF16(uint32_t u) {
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0xFFFF;  // PyTorch's vector kernels
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

TERN_HD uint16_t F32ToF16(uint32_t u) {
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7E00u;
  if (a >= 0x477FF000u) return sign | 0x7C00u;
  if (a >= 0x38800000u) {
    const uint32_t rounded = a + 0xFFFu + ((a >> 13) & 1u);
    return sign | static_cast<uint16_t>((rounded - (112u << 23)) >> 13);
  }
  const uint32_t exp = a >> 23;
  if (exp < 102) return sign;
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126 - exp;
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return sign | static_cast<uint16_t>(q);
}

// BF16 masters widen exactly.
TERN_HD uint32_t BF16ToF32Bits(uint16_t b) { return static_cast<uint32_t>(b) << 16; }

// ---- Minifloats: FP8 E4M3FN / E5M2, FP4 E2M1, E8M0 -----------------------

// One copy, shared with quant/ (format/minifloat.h).
using ::tern::minifloat::DecodeE8M0;
using ::tern::minifloat::DecodeMini;
using ::tern::minifloat::E2M1;
using ::tern::minifloat::E4M3;
using ::tern::minifloat::E5M2;
using ::tern::minifloat::EncodeMini;
using ::tern::minifloat::MiniFormat;

// floor(log2(x)) for x > 0 as the reference's frexp-based FloorLog2; for
// +Inf glibc's frexp leaves the exponent 0, so the reference answers -1.
TERN_HD int FloorLog2(float x) {
  const uint32_t a = FloatBits(x) & 0x7FFFFFFFu;
  const int exp = static_cast<int>(a >> 23);
  if (exp == 0xFF) return -1;
  if (exp != 0) return exp - 127;
  return (63 - Clz64(a)) - 149;  // subnormal
}

// ---- Scale policy (tern::ScalePolicy, as a device-copyable value) --------

struct QuantPolicy {
  bool band = true;  // ScalePolicy::Kind::kBand
  float band_low = 0.9f;
  float headroom = 1.01f;
};

TERN_HD bool KeepPrevious(float fresh, float prev, const QuantPolicy& p) {
  return p.band && prev > 0.0f && fresh <= prev && fresh >= p.band_low * prev;
}
TERN_HD float RescaleFactor(const QuantPolicy& p) { return p.band ? p.headroom : 1.0f; }

// ---- FP8 with tensor / channel / 128x128 block scales ----------------------

enum class Fp8Scheme : uint8_t { kTensor, kChannel, kBlock128 };

// Element (row r of the [lead*out, in] matrix, column i) is in scale group
// RowGroup(r) * col_groups + i / col_width (quantize_fp8.cc's Grouping).
struct Fp8Grouping {
  Fp8Scheme scheme = Fp8Scheme::kTensor;
  uint64_t out = 0, in = 0, lead = 1;
  uint64_t row_groups = 1, col_groups = 1, col_width = 0, out_blocks = 1;

  TERN_HD uint64_t RowGroup(uint64_t r) const {
    if (scheme == Fp8Scheme::kTensor) return 0;
    if (scheme == Fp8Scheme::kChannel) return r;
    return (r / out) * out_blocks + (r % out) / 128;
  }
  TERN_HD uint64_t Group(uint64_t element) const {
    const uint64_t r = element / in, i = element % in;
    return RowGroup(r) * col_groups + i / col_width;
  }
  TERN_HD uint64_t groups() const { return row_groups * col_groups; }
};

inline Fp8Grouping MakeFp8Grouping(Fp8Scheme scheme, uint64_t lead, uint64_t out, uint64_t in) {
  Fp8Grouping g;
  g.scheme = scheme;
  g.lead = lead;
  g.out = out;
  g.in = in;
  g.col_width = in;
  if (scheme == Fp8Scheme::kChannel) g.row_groups = lead * out;
  if (scheme == Fp8Scheme::kBlock128) {
    g.out_blocks = (out + 127) / 128;
    g.row_groups = lead * g.out_blocks;
    g.col_groups = (in + 127) / 128;
    g.col_width = 128;
  }
  return g;
}

// The FP32 scale of one group from its amax and the previous stored scale
// (has_prev false: none). *kept: the previous scale was reused.
TERN_HD float ChooseFp8Scale(float amax, bool has_prev, float old, const MiniFormat& fmt,
                             const QuantPolicy& p, bool* kept) {
  const float fresh = amax > 0.0f ? amax / fmt.max_value : 1.0f;
  const float fit = (has_prev && amax == 0.0f && old > 0.0f) ? old : fresh;
  float s;
  *kept = false;
  if (!p.band) {
    s = fit;
  } else if (has_prev && old > 0.0f && fit <= old && fit >= p.band_low * old) {
    *kept = true;
    s = old;
  } else {
    s = fit * p.headroom;
  }
  if (!IsFinite(s)) s = fresh;
  return s;
}

TERN_HD uint8_t EncodeFp8(float x, float scale, const MiniFormat& fmt) {
  float v = x / scale;
  if (v < -fmt.max_value) v = -fmt.max_value;
  if (fmt.max_value < v) v = fmt.max_value;
  return EncodeMini(v, fmt, /*saturate=*/true);
}

// ---- NVFP4 (ModelOpt, compressed-tensors) and MXFP4 -----------------------

enum class Fp4Scheme : uint8_t { kNvfp4, kNvfp4Ct, kMxfp4 };
inline constexpr float kNvfp4GlobalRange = 6.0f * 448.0f;

TERN_HD uint64_t Fp4Block(Fp4Scheme s) { return s == Fp4Scheme::kMxfp4 ? 32 : 16; }

// NVFP4's per-tensor scale from the tensor's amax and the previous stored
// value: ModelOpt stores scale_2, compressed-tensors its reciprocal.
struct Fp4Global {
  float scale_2 = 1.0f;    // ModelOpt
  float global_ct = 1.0f;  // compressed-tensors
  bool kept = false;
  TERN_HD float stored(Fp4Scheme s) const { return s == Fp4Scheme::kNvfp4Ct ? global_ct : scale_2; }
};

TERN_HD Fp4Global ChooseFp4Global(float amax, bool has_prev, float stored_prev, Fp4Scheme s,
                                  const QuantPolicy& p) {
  Fp4Global g;
  const bool ct = s == Fp4Scheme::kNvfp4Ct;
  const float fresh = amax / kNvfp4GlobalRange;
  if (has_prev) {
    const float prev_scale_2 = ct ? 1.0f / stored_prev : stored_prev;
    g.kept = amax > 0.0f && IsFinite(prev_scale_2) && KeepPrevious(fresh, prev_scale_2, p);
    if (g.kept) (ct ? g.global_ct : g.scale_2) = stored_prev;
  }
  if (!g.kept && amax > 0.0f) {
    const float a = amax * RescaleFactor(p);
    if (ct) {
      g.global_ct = kNvfp4GlobalRange / a;
    } else {
      g.scale_2 = a / kNvfp4GlobalRange;
    }
  }
  return g;
}

TERN_HD int MxExponent(float m) {
  if (!(m > 0.0f)) return -127;
  const int e = FloorLog2(m) - 2;
  return e < -127 ? -127 : (e > 127 ? 127 : e);
}

// One scale block of Fp4Block(s) master values x: writes the packed codes
// (block/2 bytes, even element in the low nibble) and returns the stored
// scale byte (E4M3 for NVFP4, E8M0 for MXFP4). prev_code: the previous
// state's scale byte (has_prev false: none); for NVFP4 the previous block
// scale is only reused when the global scale was kept.
TERN_HD uint8_t QuantizeFp4Block(const float* x, Fp4Scheme s, const Fp4Global& g, bool has_prev,
                                 uint8_t prev_code, const QuantPolicy& p, uint8_t* packed, bool* kept_out) {
  const uint64_t block = Fp4Block(s);
  float bmax = 0.0f;
  for (uint64_t i = 0; i < block; ++i) bmax = MaxF(bmax, AbsF(x[i]));
  float eff;
  bool kept = false;
  uint8_t scale_byte;
  if (s == Fp4Scheme::kMxfp4) {
    int e = MxExponent(bmax);
    if (has_prev) {
      const int prev_e = static_cast<int>(prev_code) - 127;
      if (prev_code != 0xFF && (bmax == 0.0f || KeepPrevious(Pow2(e), Pow2(prev_e), p)) && p.band) {
        e = prev_e;
        kept = true;
      }
    }
    if (!kept) e = MxExponent(bmax * RescaleFactor(p));
    scale_byte = static_cast<uint8_t>(e + 127);
    eff = Pow2(e);
  } else {
    const bool ct = s == Fp4Scheme::kNvfp4Ct;
    const float want = ct ? g.global_ct * (bmax / 6.0f) : (bmax / 6.0f) / g.scale_2;
    uint8_t code = 0;
    if (g.kept && has_prev) {
      const float prev = DecodeMini(prev_code, E4M3());
      if (IsFinite(prev) && (KeepPrevious(want, prev, p) || (bmax == 0.0f && prev > 0.0f))) {
        code = prev_code;
        kept = true;
      }
    }
    if (!kept) code = EncodeMini(want * RescaleFactor(p), E4M3(), /*saturate=*/true);
    scale_byte = code;
    const float block_scale = DecodeMini(code, E4M3());
    eff = ct ? block_scale / g.global_ct : block_scale * g.scale_2;
  }
  for (uint64_t i = 0; i < block; i += 2) {
    const uint8_t lo = eff > 0.0f ? EncodeMini(x[i] / eff, E2M1(), true) : 0;
    const uint8_t hi = eff > 0.0f ? EncodeMini(x[i + 1] / eff, E2M1(), true) : 0;
    packed[i / 2] = static_cast<uint8_t>(lo | (hi << 4));
  }
  *kept_out = kept;
  return scale_byte;
}

}  // namespace tern::gpu
