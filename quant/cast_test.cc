#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "quant/cast_internal.h"
#include "tern/float_cast.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace tern {
namespace {

using quant::F16ToF32Bits;
using quant::F32BitsToBF16;
using quant::F32BitsToF16;

uint32_t U(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::vector<uint16_t> ToBF16(const std::vector<uint32_t>& bits) {
  std::vector<uint16_t> out(bits.size());
  CastF32ToBF16(reinterpret_cast<const float*>(bits.data()), out.data(), bits.size());
  return out;
}
std::vector<uint16_t> ToF16(const std::vector<uint32_t>& bits) {
  std::vector<uint16_t> out(bits.size());
  CastF32ToF16(reinterpret_cast<const float*>(bits.data()), out.data(), bits.size());
  return out;
}

bool IsNaN16(uint16_t h, bool bf16) {
  return bf16 ? (h & 0x7FFF) > 0x7F80 : (h & 0x7FFF) > 0x7C00;
}

// For every finite non-negative code c (and its negation) with a finite
// successor: c itself, the exact midpoint to c+1, and the FP32 values one ulp
// either side of that midpoint. Round to nearest even fixes every answer, so
// this checks the rounding at every boundary the format has.
void CheckBoundaries(bool bf16) {
  std::vector<uint32_t> in;
  std::vector<uint16_t> want;
  const uint16_t inf = bf16 ? 0x7F80 : 0x7C00;
  for (uint32_t c = 0; c < inf; ++c) {
    const uint16_t code = static_cast<uint16_t>(c);
    const float lo = bf16 ? BF16ToF32(code) : F16ToF32(code);
    // The successor of the largest finite value is Inf; its "midpoint" is the
    // overflow threshold (max + half an ulp), which ties to even = Inf.
    // In double: for BF16 the "successor" of the max is 2^128, beyond FP32.
    const double hi = c + 1 < inf ? (bf16 ? BF16ToF32(code + 1) : F16ToF32(code + 1))
                                  : 2.0 * lo - (bf16 ? BF16ToF32(code - 1) : F16ToF32(code - 1));
    const double mid_d = (static_cast<double>(lo) + hi) / 2;
    const float mid = static_cast<float>(mid_d);
    ASSERT_EQ(static_cast<double>(mid), mid_d) << "midpoint not representable, code " << c;
    const uint16_t even = (code & 1) ? static_cast<uint16_t>(code + 1) : code;
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint16_t s16 = sign ? 0x8000 : 0;
      in.push_back(U(lo) | sign), want.push_back(code | s16);
      in.push_back(U(mid) | sign), want.push_back(even | s16);
      in.push_back((U(mid) - 1) | sign), want.push_back(code | s16);
      in.push_back((U(mid) + 1) | sign), want.push_back(static_cast<uint16_t>(code + 1) | s16);
    }
  }
  const std::vector<uint16_t> got = bf16 ? ToBF16(in) : ToF16(in);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << std::hex << "input 0x" << in[i];
    const uint16_t ref = bf16 ? F32BitsToBF16(in[i]) : F32BitsToF16(in[i]);
    ASSERT_EQ(ref, want[i]) << std::hex << "scalar reference, input 0x" << in[i];
  }
}

TEST(CastTest, BF16RoundsToNearestEvenAtEveryBoundary) { CheckBoundaries(true); }
TEST(CastTest, F16RoundsToNearestEvenAtEveryBoundary) { CheckBoundaries(false); }

TEST(CastTest, SpecialValues) {
  const std::vector<uint32_t> in = {0x00000000, 0x80000000, 0x7F800000, 0xFF800000,
                                    0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x80000001};
  const std::vector<uint16_t> bf = ToBF16(in);
  const std::vector<uint16_t> want_bf = {0x0000, 0x8000, 0x7F80, 0xFF80,
                                         0x7F80, 0xFF80, 0x0000, 0x8000};
  EXPECT_EQ(bf, want_bf);
  const std::vector<uint16_t> h = ToF16(in);
  const std::vector<uint16_t> want_h = {0x0000, 0x8000, 0x7C00, 0xFC00,
                                        0x7C00, 0xFC00, 0x0000, 0x8000};
  EXPECT_EQ(h, want_h);
  // 2^-24 is the smallest FP16 subnormal; 1.5 * 2^-24 ties to even (2).
  EXPECT_EQ(ToF16({U(std::ldexp(1.0f, -24)), U(std::ldexp(1.5f, -24)),
                   U(std::ldexp(1.0f, -25)), U(std::nextafter(std::ldexp(1.0f, -25), 1.0f))}),
            (std::vector<uint16_t>{0x0001, 0x0002, 0x0000, 0x0001}));
}

TEST(CastTest, NaNsBecomeTorchsCanonicalNaN) {
  std::vector<uint32_t> in;
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t payload : {1u, 2u, 0x1FFFu, 0x2000u, 0x3FFFFFu, 0x400000u, 0x400001u, 0x7FFFFFu})
      in.push_back(sign | 0x7F800000u | payload);
  // Several lengths so both the vector body and the scalar tail see NaNs.
  for (size_t len : {in.size(), size_t{7}, size_t{1}}) {
    std::vector<uint32_t> part(in.begin(), in.begin() + len);
    const auto bf = ToBF16(part);
    const auto h = ToF16(part);
    for (size_t i = 0; i < len; ++i) {
      EXPECT_EQ(bf[i], 0xFFFF) << std::hex << part[i];
      EXPECT_EQ(h[i], (part[i] >> 31) ? 0xFE00 : 0x7E00) << std::hex << part[i];
    }
  }
}

// Every offset and length up to 40 against the scalar reference, so the
// vector body / tail split can never change a result.
TEST(CastTest, VectorAndScalarPathsAgreeForAnyLengthAndOffset) {
  std::vector<uint32_t> pool;
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < 48; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    pool.push_back(static_cast<uint32_t>(x));
  }
  pool[5] = 0x7FC00001, pool[17] = 0x00000003, pool[30] = 0x477FF000;
  for (size_t off = 0; off < 8; ++off) {
    for (size_t len = 0; off + len <= pool.size() && len <= 40; ++len) {
      std::vector<uint32_t> part(pool.begin() + off, pool.begin() + off + len);
      const auto bf = ToBF16(part);
      const auto h = ToF16(part);
      for (size_t i = 0; i < len; ++i) {
        ASSERT_EQ(bf[i], F32BitsToBF16(part[i]));
        ASSERT_EQ(h[i], F32BitsToF16(part[i]));
      }
    }
  }
}

// A sparse sweep of all 2^32 inputs (every 65521st pattern, ~65k values,
// covering every exponent): vector == scalar. The full sweep is
// quant_exhaustive_test (label slow).
TEST(CastTest, StridedSweepMatchesScalarReference) {
  std::vector<uint32_t> in;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 65521) in.push_back(static_cast<uint32_t>(u));
  const auto bf = ToBF16(in);
  const auto h = ToF16(in);
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(bf[i], F32BitsToBF16(in[i])) << std::hex << in[i];
    ASSERT_EQ(h[i], F32BitsToF16(in[i])) << std::hex << in[i];
  }
}

TEST(CastTest, WideningIsExactAndRoundTrips) {
  std::vector<uint16_t> codes(65536);
  for (uint32_t c = 0; c < 65536; ++c) codes[c] = static_cast<uint16_t>(c);
  std::vector<float> bf(65536), h(65536);
  CastBF16ToF32(codes.data(), bf.data(), codes.size());
  CastF16ToF32(codes.data(), h.data(), codes.size());
  std::vector<uint16_t> bf_back(65536), h_back(65536);
  CastF32ToBF16(bf.data(), bf_back.data(), bf.size());
  CastF32ToF16(h.data(), h_back.data(), h.size());
  for (uint32_t c = 0; c < 65536; ++c) {
    const uint16_t code = static_cast<uint16_t>(c);
    ASSERT_EQ(U(bf[c]), U(BF16ToF32(code)));
    ASSERT_EQ(U(h[c]), U(F16ToF32(code))) << std::hex << c;  // vector == scalar
    ASSERT_EQ(U(h[c]), F16ToF32Bits(code));
    if (!IsNaN16(code, true)) {
      ASSERT_EQ(bf_back[c], code);
    }
    if (!IsNaN16(code, false)) {
      ASSERT_EQ(h_back[c], code);
    } else {
      ASSERT_TRUE(std::isnan(h[c]));
      ASSERT_EQ(U(h[c]) & 0x400000u, 0x400000u) << "NaN must come back quiet";
    }
    // Independent value check: every finite FP16 is (-1)^s * m * 2^(e-25).
    const uint32_t e = (c >> 10) & 0x1F, m = c & 0x3FF;
    if (e != 0x1F) {
      const double mag = e == 0 ? std::ldexp(static_cast<double>(m), -24)
                                : std::ldexp(static_cast<double>(m | 0x400), static_cast<int>(e) - 25);
      ASSERT_EQ(static_cast<double>(h[c]), (c & 0x8000) ? -mag : mag) << std::hex << c;
    }
  }
}

#if defined(__SSE__)
// Results must not depend on the thread's FTZ/DAZ state (a caller's BLAS or
// the trainer may have set it).
TEST(CastTest, IgnoresFlushToZeroMode) {
  // Inputs first: ldexp itself would flush under FTZ.
  std::vector<float> in(16, std::ldexp(3.0f, -24));
  in[3] = std::ldexp(1.0f, -130);  // FP32 subnormal
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040);  // FTZ | DAZ
  std::vector<uint16_t> h(16), bf(16);
  CastF32ToF16(in.data(), h.data(), in.size());
  CastF32ToBF16(in.data(), bf.data(), in.size());
  std::vector<float> back(16);
  CastF16ToF32(h.data(), back.data(), h.size());
  _mm_setcsr(saved);
  EXPECT_EQ(h[0], 0x0003);
  EXPECT_EQ(h[15], 0x0003);
  EXPECT_EQ(bf[3], F32BitsToBF16(U(std::ldexp(1.0f, -130))));
  EXPECT_NE(bf[3], 0);
  EXPECT_EQ(U(back[0]), U(std::ldexp(3.0f, -24)));
}
#endif

}  // namespace
}  // namespace tern
