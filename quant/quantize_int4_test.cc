#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "tern/quantize.h"

namespace tern {
namespace {

const ScalePolicy kFreshPolicy{ScalePolicy::Kind::kFresh};

std::vector<float> Random(uint64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

QuantSpec Spec(const char* name) { return *ParseQuantFormat(name); }

uint32_t Word(const QuantTensor& t, uint64_t i) {
  uint32_t w;
  std::memcpy(&w, t.data.data() + 4 * i, 4);
  return w;
}

// One row, one group of 32: amax 7.5 -> scale 1 (exact in BF16), so the
// codes are rne(x) and the packed nibbles are q + 8, element 0 lowest.
TEST(QuantizeInt4Test, HandWorkedSymmetricGroup) {
  std::vector<float> w(32, 0.0f);
  const float head[8] = {7.5f, -7.5f, 2.5f, 3.5f, -0.5f, 1.2f, -3.0f, 0.0f};
  // rne:               8->7  -8     2     4     -0     1     -3     0
  std::memcpy(w.data(), head, sizeof head);
  auto q = Quantize(Spec("int4-g32"), w.data(), {1, 32}, nullptr, kFreshPolicy);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  const QuantTensor* packed = q->Find(".weight_packed");
  ASSERT_NE(packed, nullptr);
  EXPECT_EQ(packed->shape, (std::vector<uint64_t>{1, 4}));
  // nibbles q+8: 15, 0, 10, 12, 8, 9, 5, 8
  EXPECT_EQ(Word(*packed, 0), 0x8598CA0Fu);
  for (uint64_t i = 1; i < 4; ++i) EXPECT_EQ(Word(*packed, i), 0x88888888u);
  const QuantTensor* scale = q->Find(".weight_scale");
  ASSERT_NE(scale, nullptr);
  EXPECT_EQ(scale->dtype, DType::kBF16);
  EXPECT_EQ(scale->data[0] | (scale->data[1] << 8), 0x3F80);  // 1.0
  EXPECT_EQ(q->Find(".weight_zero_point"), nullptr);
  const QuantTensor* ws = q->Find(".weight_shape");
  ASSERT_NE(ws, nullptr);
  EXPECT_EQ(ws->dtype, DType::kI64);
}

TEST(QuantizeInt4Test, RejectsShapesTheLayoutCannotTake) {
  std::vector<float> w = Random(16 * 96, 1);
  auto a = Quantize(Spec("int4-g64"), w.data(), {16, 96}, nullptr, {});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), Code::kInvalidArgument);
  EXPECT_NE(a.status().message().find("divisible by the group 64"), std::string::npos);
  EXPECT_TRUE(Quantize(Spec("int4-g32"), w.data(), {16, 96}, nullptr, {}).ok());
  EXPECT_FALSE(Quantize(Spec("int4-g32"), w.data(), {2, 8, 96}, nullptr, {}).ok());
  EXPECT_FALSE(Quantize(Spec("gptq-int4-g32"), w.data(), {12, 128}, nullptr, {}).ok());
  EXPECT_TRUE(Quantize(Spec("gptq-int4-g32"), w.data(), {8, 192}, nullptr, {}).ok());
}

// Dequantization error is at most half a step, except where an asymmetric
// zero point clips (never, since the grid covers [min, max]).
TEST(QuantizeInt4Test, RoundTripErrorIsHalfAStep) {
  const uint64_t out = 16, in = 256;
  std::vector<float> w = Random(out * in, 2);
  for (uint64_t i = 0; i < 64; ++i) w[3 * in + i] = std::fabs(w[3 * in + i]) + 0.01f;
  for (const char* fmt : {"int4-g64", "int4-g64-asym", "gptq-int4-g64", "int4-g128-asym"}) {
    auto q = Quantize(Spec(fmt), w.data(), {out, in}, nullptr, kFreshPolicy);
    ASSERT_TRUE(q.ok()) << fmt << q.status().ToString();
    auto back = Dequantize(Spec(fmt), *q, {out, in});
    ASSERT_TRUE(back.ok()) << fmt << back.status().ToString();
    const uint64_t g = Spec(fmt).group;
    for (uint64_t o = 0; o < out; ++o)
      for (uint64_t k = 0; k < in / g; ++k) {
        float lo = 0, hi = 0;
        for (uint64_t i = 0; i < g; ++i)
          lo = std::fmin(lo, w[o * in + k * g + i]), hi = std::fmax(hi, w[o * in + k * g + i]);
        const bool asym = !Spec(fmt).symmetric;
        const float step = asym ? (hi - lo) / 15 : std::fmax(-lo, hi) / 7.5f;
        for (uint64_t i = 0; i < g; ++i) {
          const uint64_t e = o * in + k * g + i;
          // Half a step, plus the BF16/F16 rounding of the scale over 8 steps.
          ASSERT_LE(std::fabs((*back)[e] - w[e]), step * (0.5f + 8.0f / 256)) << fmt << " " << e;
        }
      }
  }
}

TEST(QuantizeInt4Test, BandPolicyKeepsScalesAndZeroPoints) {
  const uint64_t out = 16, in = 256;
  std::vector<float> w = Random(out * in, 3);
  std::vector<float> w1 = w;
  std::mt19937 rng(4);
  std::normal_distribution<float> step(0.0f, 2e-5f);
  for (float& x : w1) x += step(rng);
  for (const char* fmt : {"int4-g128", "int4-g32-asym", "gptq-int4-g128"}) {
    auto q0 = Quantize(Spec(fmt), w.data(), {out, in}, nullptr, {});
    ASSERT_TRUE(q0.ok()) << fmt;
    auto band = Quantize(Spec(fmt), w1.data(), {out, in}, &*q0, {});
    auto fresh = Quantize(Spec(fmt), w1.data(), {out, in}, &*q0, kFreshPolicy);
    ASSERT_TRUE(band.ok() && fresh.ok()) << fmt;
    EXPECT_EQ(fresh->rescaled_groups, fresh->scale_groups) << fmt;
    EXPECT_LT(band->rescaled_groups * 10, band->scale_groups) << fmt;
    EXPECT_EQ(band->tensors[1].data, q0->tensors[1].data) << fmt;
    // Mismatched previous state.
    auto other = Quantize(Spec(fmt), w1.data(), {8, 512}, &*q0, {});
    EXPECT_EQ(other.status().code(), Code::kMismatch) << fmt;
  }
}

}  // namespace
}  // namespace tern
