// All 2^32 FP32 inputs: the vector casts equal the scalar references. Labelled
// slow (tens of seconds); the boundary tests in cast_test.cc cover rounding.
#include <gtest/gtest.h>

#include <vector>

#include "quant/cast_internal.h"
#include "tern/float_cast.h"

namespace tern {
namespace {

TEST(CastExhaustiveTest, EveryF32MatchesScalarReference) {
  constexpr uint64_t kChunk = 1 << 20;
  std::vector<uint32_t> in(kChunk);
  std::vector<uint16_t> bf(kChunk), h(kChunk);
  uint64_t mismatches = 0;
  for (uint64_t base = 0; base < (1ull << 32); base += kChunk) {
    for (uint64_t i = 0; i < kChunk; ++i) in[i] = static_cast<uint32_t>(base + i);
    CastF32ToBF16(reinterpret_cast<const float*>(in.data()), bf.data(), kChunk);
    CastF32ToF16(reinterpret_cast<const float*>(in.data()), h.data(), kChunk);
    for (uint64_t i = 0; i < kChunk; ++i) {
      mismatches += bf[i] != quant::F32BitsToBF16(in[i]);
      mismatches += h[i] != quant::F32BitsToF16(in[i]);
    }
    ASSERT_EQ(mismatches, 0u) << "in chunk starting at " << base;
  }
}

}  // namespace
}  // namespace tern
