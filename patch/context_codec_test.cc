// The CONTEXT encoding's building blocks (patch/context_codec.h); whole
// patches are tested in patch_test.cc (PatchFormat2Test).
#include "patch/context_codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <random>
#include <vector>

namespace tern::patch {
namespace {

TEST(ContextCodecTest, ClassMasksMatchTheBitByBitVersion) {
  std::mt19937_64 rng(31);
  alignas(64) uint8_t cls[kContextBlock];
  alignas(64) uint64_t fast[kMaxClasses][kContextBlockWords], slow[kMaxClasses][kContextBlockWords];
  for (int classes = 2; classes <= kMaxClasses; ++classes) {
    for (uint64_t n : {uint64_t{1}, uint64_t{63}, uint64_t{64}, uint64_t{65}, uint64_t{1000}, kContextBlock}) {
      for (uint64_t i = 0; i < kContextBlock; ++i) cls[i] = i < n ? static_cast<uint8_t>(rng() % classes) : 0;
      for (auto& row : fast) std::fill(std::begin(row), std::end(row), ~uint64_t{0});
      ClassMasks(cls, n, classes, fast);
      ClassMasksScalar(cls, n, classes, slow);
      for (int c = 0; c < classes; ++c)
        for (uint64_t j = 0; j < (n + 63) / 64; ++j)
          ASSERT_EQ(fast[c][j], slow[c][j]) << "K " << classes << " n " << n << " class " << c << " word " << j;
      // Rows past the classes, up to the next power of two, are written as zero.
      for (int c = classes; c < static_cast<int>(std::bit_ceil(static_cast<unsigned>(classes)));
           ++c)
        for (uint64_t j = 0; j < (n + 63) / 64; ++j)
          ASSERT_EQ(fast[c][j], 0u) << "K " << classes << " row " << c;
    }
  }
}

// The fused block path (AVX2, 16-bit elements) against classes computed one
// element at a time from the definition and masks built bit by bit.
TEST(ContextCodecTest, BaseClassMasksMatchTheDefinition) {
  std::mt19937_64 rng(33);
  std::vector<uint16_t> v(2 * kContextBlock + 100);
  alignas(64) uint8_t cls[kContextBlock], want_cls[kContextBlock];
  alignas(64) uint64_t got[kMaxClasses][kContextBlockWords], want[kMaxClasses][kContextBlockWords];
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    const ContextField f = ContextFieldOf(dtype);
    for (uint16_t& x : v) x = static_cast<uint16_t>(rng());
    for (int classes = 2; classes <= kMaxClasses; ++classes) {
      for (uint32_t e0 : {0u, 3u, 17u, 0x7fu, 0x80u, 0xffu, 0x100u, 4095u}) {
        for (uint64_t first : {uint64_t{0}, uint64_t{1}, uint64_t{77}}) {
          for (uint64_t n : {kContextBlock, uint64_t{1000}, uint64_t{64}}) {
            for (uint64_t i = 0; i < n; ++i) {
              const int32_t c = static_cast<int32_t>(e0) -
                                static_cast<int32_t>((v[first + i] >> f.shift) & f.mask);
              want_cls[i] = static_cast<uint8_t>(std::clamp(c, 0, classes - 1));
            }
            ClassMasksScalar(want_cls, n, classes, want);
            for (auto& row : got) std::fill(std::begin(row), std::end(row), ~uint64_t{0});
            BaseClassMasks<16>(reinterpret_cast<const uint8_t*>(v.data()), first, n, f, e0, classes,
                               cls, got);
            // Rows past the classes, up to the next power of two: zero.
            for (int c = classes;
                 c < static_cast<int>(std::bit_ceil(static_cast<unsigned>(classes))); ++c)
              for (uint64_t j = 0; j < (n + 63) / 64; ++j)
                ASSERT_EQ(got[c][j], 0u) << "K " << classes << " n " << n << " row " << c;
            for (int c = 0; c < classes; ++c)
              for (uint64_t j = 0; j < (n + 63) / 64; ++j)
                ASSERT_EQ(got[c][j], want[c][j])
                    << DTypeName(dtype) << " K " << classes << " e0 " << e0 << " first " << first
                    << " n " << n << " class " << c << " word " << j;
          }
        }
      }
    }
  }
}

TEST(ContextCodecTest, CountMembersAndRankDirectoryCountEveryWord) {
  std::mt19937_64 rng(34);
  alignas(64) uint64_t m[kContextBlockWords];
  alignas(64) uint16_t before[kContextBlockWords];
  // Random words, then a block all of one class (the largest counts).
  for (int fill = 0; fill < 2; ++fill) {
    for (uint64_t& x : m) x = fill == 0 ? rng() & rng() : ~uint64_t{0};
    for (uint64_t words = 0; words <= kContextBlockWords; ++words) {
      const uint64_t members = RankDirectory(m, words, before);
      uint64_t want = 0;
      for (uint64_t j = 0; j < words; ++j) {
        ASSERT_EQ(before[j], want) << words << " " << j;
        want += static_cast<uint64_t>(std::popcount(m[j]));
      }
      EXPECT_EQ(members, want) << words;
      EXPECT_EQ(CountMembers(m, words), want) << words;
#if TERN_CONTEXT_VPOPCNT
      if (!HaveVectorPopcount()) {  // the scalar loops only, on this CPU
        RecordProperty("vector_popcount", "not on this CPU: only the scalar loops checked");
        continue;
      }
      alignas(64) uint16_t vector_before[kContextBlockWords];
      EXPECT_EQ(RankDirectoryAvx512(m, words, vector_before), want) << words;
      for (uint64_t j = 0; j < words; ++j)
        ASSERT_EQ(vector_before[j], before[j]) << words << " " << j;
      EXPECT_EQ(CountMembersAvx512(m, words), want) << words;
#endif
    }
  }
}

TEST(ContextCodecTest, SelectBitFindsTheNthOne) {
  std::mt19937_64 rng(32);
  for (int t = 0; t < 1000; ++t) {
    const uint64_t x = rng() & rng();
    uint64_t r = 0;
    for (int b = 0; b < 64; ++b) {
      if ((x >> b) & 1) {
        EXPECT_EQ(SelectBit(x, r++), b);
      }
    }
  }
}

// The decoder's rank -> element step (RankDirectory, WordOfRank, SelectBit)
// against counting set bits one at a time, on full and partial blocks.
TEST(ContextCodecTest, RankDirectoryFindsEveryMember) {
  std::mt19937_64 rng(34);
  alignas(64) uint64_t m[kContextBlockWords];
  alignas(64) uint16_t before[kContextBlockWords];
  for (uint64_t words : {uint64_t{1}, uint64_t{2}, uint64_t{33}, uint64_t{63}, kContextBlockWords}) {
    for (int density = 0; density < 6; ++density) {
      for (uint64_t& x : m) {
        x = rng();
        for (int d = 0; d < density; ++d) x &= rng();  // 1/2 .. 1/64 of the bits, and none
        if (density == 5 && rng() % 4 != 0) x = 0;
      }
      std::fill(before, before + kContextBlockWords, uint16_t{0xffff});
      const uint64_t members = RankDirectory(m, words, before);
      uint64_t r = 0;
      for (uint64_t j = 0; j < words; ++j)
        for (int b = 0; b < 64; ++b) {
          if (!((m[j] >> b) & 1)) continue;
          const uint64_t got = WordOfRank(before, r);
          ASSERT_EQ(got, j) << "words " << words << " rank " << r;
          ASSERT_EQ(SelectBit(m[got], r - before[got]), b) << "words " << words << " rank " << r;
          ++r;
        }
      EXPECT_EQ(members, r) << "words " << words;
    }
  }
}

TEST(ContextCodecTest, ClassesClampToTheRange) {
  // BF16 exponent field 0x7f (1.0) with e0 = 0x80: class 1; 0xff: class 0;
  // 0x00: the last class.
  const ContextField f = ContextFieldOf(DType::kBF16);
  ASSERT_TRUE(f.ok);
  const uint16_t v[3] = {0x3f80, 0x7f80, 0x0001};
  alignas(64) uint8_t cls[64];
  ComputeClasses<16>(reinterpret_cast<const uint8_t*>(v), 0, 3, f, 0x80, 16, cls);
  EXPECT_EQ(cls[0], 1);
  EXPECT_EQ(cls[1], 0);
  EXPECT_EQ(cls[2], 15);
  EXPECT_EQ(cls[3], 0);  // padding
  EXPECT_FALSE(ContextFieldOf(DType::kU8).ok);
  EXPECT_FALSE(ContextFieldOf(DType::kI32).ok);
}

}  // namespace
}  // namespace tern::patch
