#include "quant/minifloat.h"

#include <gtest/gtest.h>

#include <cmath>

namespace tern::quant {
namespace {

TEST(MiniFloatTest, E2M1MatchesHandTable) {
  // OCP MX spec, table 5: codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6.
  const float table[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 16; ++c) {
    const float want = (c & 8) ? -table[c & 7] : table[c & 7];
    EXPECT_EQ(DecodeMini(static_cast<uint8_t>(c), kE2M1), want) << c;
    EXPECT_EQ(std::signbit(DecodeMini(static_cast<uint8_t>(c), kE2M1)), (c & 8) != 0);
    EXPECT_EQ(EncodeMini(want, kE2M1, true), c);
  }
  // Ties go to the even code; beyond 6 saturates.
  const struct {
    float x;
    int code;
  } cases[] = {{0.25f, 0}, {0.2500001f, 1}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4},
               {2.5000002f, 5}, {3.5f, 6}, {5.0f, 6}, {5.0000005f, 7}, {100.0f, 7},
               {-0.2f, 8}, {-5.5f, 15}, {1e-30f, 0}};
  for (const auto& c : cases) EXPECT_EQ(EncodeMini(c.x, kE2M1, true), c.code) << c.x;
}

TEST(MiniFloatTest, E8M0IsABiasedPowerOfTwo) {
  EXPECT_EQ(DecodeE8M0(127), 1.0f);
  EXPECT_EQ(DecodeE8M0(128), 2.0f);
  EXPECT_EQ(DecodeE8M0(120), 1.0f / 128);
  EXPECT_EQ(DecodeE8M0(254), std::ldexp(1.0f, 127));
  EXPECT_EQ(DecodeE8M0(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(DecodeE8M0(255)));
}

TEST(MiniFloatTest, E4M3HandValues) {
  EXPECT_EQ(DecodeMini(0x7E, kE4M3), 448.0f);
  EXPECT_EQ(DecodeMini(0x38, kE4M3), 1.0f);
  EXPECT_EQ(DecodeMini(0x01, kE4M3), std::ldexp(1.0f, -9));
  EXPECT_EQ(DecodeMini(0x08, kE4M3), std::ldexp(1.0f, -6));
  EXPECT_EQ(DecodeMini(0xC0, kE4M3), -2.0f);
  EXPECT_TRUE(std::isnan(DecodeMini(0x7F, kE4M3)));
  EXPECT_TRUE(std::isnan(DecodeMini(0xFF, kE4M3)));
  // 464 is the midpoint of 448 and the (absent) 480: ties to even = 448.
  EXPECT_EQ(EncodeMini(464.0f, kE4M3, false), 0x7E);
  EXPECT_EQ(EncodeMini(464.1f, kE4M3, false), 0x7F);  // NaN, as torch/ml_dtypes
  EXPECT_EQ(EncodeMini(1e9f, kE4M3, true), 0x7E);
  EXPECT_EQ(EncodeMini(-INFINITY, kE4M3, false), 0xFF);
  EXPECT_EQ(EncodeMini(std::ldexp(1.0f, -10), kE4M3, false), 0x00);  // tie to even
  EXPECT_EQ(EncodeMini(std::ldexp(1.5f, -10), kE4M3, false), 0x01);
}

TEST(MiniFloatTest, E5M2HandValues) {
  EXPECT_EQ(DecodeMini(0x7B, kE5M2), 57344.0f);
  EXPECT_EQ(DecodeMini(0x3C, kE5M2), 1.0f);
  EXPECT_EQ(DecodeMini(0x01, kE5M2), std::ldexp(1.0f, -16));
  EXPECT_EQ(DecodeMini(0x7C, kE5M2), INFINITY);
  EXPECT_EQ(DecodeMini(0xFC, kE5M2), -INFINITY);
  EXPECT_TRUE(std::isnan(DecodeMini(0x7D, kE5M2)));
  EXPECT_EQ(EncodeMini(61440.0f, kE5M2, false), 0x7C);  // midpoint to 2^16: even = Inf
  EXPECT_EQ(EncodeMini(61439.0f, kE5M2, false), 0x7B);
  EXPECT_EQ(EncodeMini(1e9f, kE5M2, true), 0x7B);
}

// Every code decodes and re-encodes to itself, and the exact midpoint of two
// neighbours rounds to the even one, with one FP32 ulp deciding either side.
void CheckAllCodes(const MiniFloat& f) {
  const int width = f.ebits + f.mbits;
  for (uint32_t c = 0; c <= f.max_code; ++c) {
    for (uint32_t sign : {0u, 1u << width}) {
      const uint8_t code = static_cast<uint8_t>(c | sign);
      const float v = DecodeMini(code, f);
      ASSERT_EQ(EncodeMini(v, f, false), code) << "format width " << width << " code " << c;
      if (c == f.max_code) continue;
      const float next = DecodeMini(static_cast<uint8_t>((c + 1) | sign), f);
      const float mid = (v + next) / 2;  // exact: few mantissa bits
      const uint8_t even = static_cast<uint8_t>(((c & 1) ? c + 1 : c) | sign);
      ASSERT_EQ(EncodeMini(mid, f, false), even) << "midpoint above code " << c;
      ASSERT_EQ(EncodeMini(std::nextafter(mid, 0.0f), f, false), code);
      ASSERT_EQ(EncodeMini(std::nextafter(mid, sign ? -INFINITY : INFINITY), f, false),
                static_cast<uint8_t>((c + 1) | sign));
    }
  }
}

TEST(MiniFloatTest, EveryCodeRoundTripsAndMidpointsTieToEven) {
  CheckAllCodes(kE4M3);
  CheckAllCodes(kE5M2);
  CheckAllCodes(kE2M1);
}

}  // namespace
}  // namespace tern::quant
