// FP32 <-> BF16 / FP16 casts. See include/tern/float_cast.h for the contract; the
// scalar functions here are the reference the vector paths are tested against.
#include <cstring>

#include "quant/cast_internal.h"
#include "tern/float_cast.h"

#if defined(__F16C__) && defined(__AVX2__)
#include <immintrin.h>
#define TERN_HAVE_F16C 1
#endif

namespace tern {
namespace quant {

uint16_t F32BitsToBF16(uint32_t u) {
  // PyTorch's AVX2/AVX-512 kernels write 0xFFFF for any NaN.
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0xFFFF;
  // Adding 0x7FFF plus the kept LSB rounds to nearest even; a carry out of
  // the mantissa correctly bumps the exponent (and max finite -> Inf).
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

uint16_t F32BitsToF16(uint32_t u) {
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7E00u;  // canonical quiet NaN
  // 65520 = 0x477FF000 is the midpoint between FP16 max (65504) and 2^16;
  // ties go to the even neighbour, which is Inf.
  if (a >= 0x477FF000u) return sign | 0x7C00u;
  if (a >= 0x38800000u) {  // normal in FP16 (>= 2^-14)
    const uint32_t rounded = a + 0xFFFu + ((a >> 13) & 1u);
    return sign | static_cast<uint16_t>((rounded - (112u << 23)) >> 13);
  }
  const uint32_t exp = a >> 23;
  // Below 2^-25 (half the smallest subnormal) everything rounds to zero, and
  // exactly 2^-25 ties to even (zero).
  if (exp < 102) return sign;
  // |x| * 2^24 = m * 2^(exp - 126): the subnormal code, before rounding.
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126 - exp;  // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // may carry into 0x400: fine
  return sign | static_cast<uint16_t>(q);
}

uint32_t F16ToF32Bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) {
    // Inf, or NaN with its payload kept and quieted, as vcvtph2ps does.
    return sign | 0x7F800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u);
  }
  if (exp != 0) return sign | ((exp + 112u) << 23) | (mant << 13);
  if (mant == 0) return sign;
  // Subnormal: normalise. Value = mant * 2^-24.
  uint32_t e = 113;  // exponent if the leading 1 were at bit 10
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return sign | (e << 23) | ((mant & 0x3FFu) << 13);
}

}  // namespace quant

namespace {
using quant::F16ToF32Bits;
using quant::F32BitsToBF16;
using quant::F32BitsToF16;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace

void CastF32ToBF16(const float* in, uint16_t* out, uint64_t n) {
  // Branch-free so GCC/Clang vectorise it (8 lanes on AVX2).
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, in + i, sizeof u);
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
    out[i] = static_cast<uint16_t>(nan ? 0xFFFFu : rounded);
  }
}

void CastF32ToF16(const float* in, uint16_t* out, uint64_t n) {
  uint64_t i = 0;
#ifdef TERN_HAVE_F16C
  // vcvtps2ph with an explicit RNE immediate ignores MXCSR rounding and does
  // not flush subnormals; only its NaN (payload-keeping) differs from PyTorch,
  // so NaN lanes are replaced by the canonical quiet NaN with the sign kept.
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf_bits = _mm256_set1_epi32(0x7F800000);
  const __m128i qnan = _mm_set1_epi16(0x7E00);
  const __m128i sign_bit = _mm_set1_epi16(static_cast<short>(0x8000));
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(in + i);
    __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i abs = _mm256_and_si256(_mm256_castps_si256(v), abs_mask);
    const __m256i nan32 = _mm256_cmpgt_epi32(abs, inf_bits);
    // Narrow the 32-bit lane mask to 16 bits (all-ones/zero survive packs).
    const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan32),
                                          _mm256_extracti128_si256(nan32, 1));
    const __m128i fixed = _mm_or_si128(qnan, _mm_and_si128(h, sign_bit));
    h = _mm_blendv_epi8(h, fixed, nan16);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
#endif
  for (; i < n; ++i) out[i] = F32BitsToF16(Bits(in[i]));
}

float BF16ToF32(uint16_t bits) { return FromBits(static_cast<uint32_t>(bits) << 16); }

float F16ToF32(uint16_t bits) { return FromBits(F16ToF32Bits(bits)); }

void CastBF16ToF32(const uint16_t* in, float* out, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(out + i, &u, sizeof u);
  }
}

void CastF16ToF32(const uint16_t* in, float* out, uint64_t n) {
  uint64_t i = 0;
#ifdef TERN_HAVE_F16C
  // vcvtph2ps is exact, handles subnormals, keeps NaN payloads and quiets
  // signalling NaNs, exactly like the scalar path.
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) out[i] = F16ToF32(in[i]);
}

}  // namespace tern
