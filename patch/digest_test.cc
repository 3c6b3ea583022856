#include <gtest/gtest.h>

#include <random>

#include "tern/thread_pool.h"
#include "patch/digest_mix.h"
#include "patch/test_util.h"
#include "tern/digest.h"

namespace tern {
namespace {

using testing::OwnedView;

TEST(DigestTest, SingleChangeChangesEveryLane) {
  std::mt19937_64 rng(1);
  for (int trial = 0; trial < 1000; ++trial) {
    const uint64_t seed = rng(), index = rng(), a = rng(), b = rng();
    if (a == b) continue;
    const ViewDigest ha = ElementHash(seed, index, a), hb = ElementHash(seed, index, b);
    for (int l = 0; l < 4; ++l) EXPECT_NE(ha.lanes[l], hb.lanes[l]);
  }
}

TEST(DigestTest, IncrementalUpdateMatchesFullRecompute) {
  OwnedView v;
  v.Add("a", DType::kBF16, {1000});
  v.Add("b", DType::kF4, {77});
  v.Add("c", DType::kU64, {3, 5});
  std::mt19937_64 rng(2);
  for (auto& d : v.data) testing::FillRandom(d, rng);
  ThreadPool pool(2);
  const ViewDigest before = ComputeDigest(v.View(), pool);
  const ServeView view = v.View();
  // Change element 999 of "a" (BF16) and element 7 of "b" (F4); names were
  // added in sorted order, so view index == data index.
  ViewDigest expect = before;
  for (auto [t, index, w] : {std::tuple{0, uint64_t{999}, 16}, std::tuple{1, uint64_t{7}, 4}}) {
    auto& bytes = v.data[t];
    const uint64_t old_value = testing::Get(bytes, w, index);
    const uint64_t new_value = (old_value + 1) & ((1u << w) - 1);
    const uint64_t seed = TensorSeed(*view.tensors[t].desc);
    expect += ElementHash(seed, index, new_value);
    expect -= ElementHash(seed, index, old_value);
    testing::Set(bytes, w, index, new_value);
  }
  EXPECT_NE(expect, before);
  EXPECT_EQ(ComputeDigest(v.View(), pool), expect);
}

TEST(DigestTest, ThreadCountAndLayoutMatter) {
  OwnedView v;
  v.Add("x", DType::kF32, {3 << 20});  // several parallel chunks
  std::mt19937_64 rng(3);
  testing::FillRandom(v.data[0], rng);
  ThreadPool one(1), two(2);
  const ViewDigest d1 = ComputeDigest(v.View(), one);
  EXPECT_EQ(d1, ComputeDigest(v.View(), two));
  EXPECT_EQ(d1, ComputeTensorDigest(v.View().tensors[0]));
  // Same bytes, other shape: another digest. Empty tensors still count.
  OwnedView w = v;
  w.descs[0].shape = {3, 1 << 20};
  EXPECT_NE(d1, ComputeDigest(w.View(), one));
  OwnedView e1, e2;
  e1.Add("empty", DType::kBF16, {0});
  e2.Add("empty", DType::kBF16, {0, 4});
  EXPECT_NE(ComputeDigest(e1.View(), one), ComputeDigest(e2.View(), one));
  EXPECT_NE(ComputeDigest(e1.View(), one), ViewDigest{});
}

// The loop chosen at run time (AVX-512DQ where the CPU has it) and the
// build floor's loop add the same terms as ElementHash one element at a
// time, in every width, over ranges that start and end off the loops'
// 256-element blocks. On a CPU without AVX-512 both are the floor's loop
// and only the per-element check says anything (the test says which ran).
TEST(DigestTest, EveryLoopAddsTheSpecsTerms) {
  std::mt19937_64 rng(4);
  bool other_loop = false;
  for (DType dt : {DType::kF4, DType::kU8, DType::kBF16, DType::kF32, DType::kF64}) {
    OwnedView v;
    v.Add("t", dt, {1000});
    testing::FillRandom(v.data[0], rng);
    const TensorRef t = v.View().tensors[0];
    const uint64_t seed = TensorSeed(*t.desc);
    const int w = ElementBits(dt);
    for (auto [begin, end] : {std::pair<uint64_t, uint64_t>{0, 1000}, {2, 3}, {6, 777}, {256, 512}}) {
      ViewDigest expect;
      for (uint64_t i = begin; i < end; ++i) expect += ElementHash(seed, i, testing::Get(v.data[0], w, i));
      ViewDigest fast, floor;
      patch::AccumulateElements(t, seed, begin, end, fast.lanes.data());
      other_loop = patch::AccumulateElementsPortable(t, seed, begin, end, floor.lanes.data());
      EXPECT_EQ(fast, expect) << "width " << w << " [" << begin << ", " << end << ")";
      EXPECT_EQ(floor, expect) << "width " << w << " [" << begin << ", " << end << ")";
      EXPECT_EQ(ComputeElementTerms(t, begin, end), expect) << "width " << w;
    }
  }
  // A tensor's digest is its term plus the terms of its ranges.
  OwnedView v;
  v.Add("t", DType::kBF16, {1000});
  testing::FillRandom(v.data[0], rng);
  const TensorRef t = v.View().tensors[0];
  ViewDigest parts = TensorTerm(TensorSeed(*t.desc));
  parts += ComputeElementTerms(t, 0, 333);
  parts += ComputeElementTerms(t, 333, 1000);
  EXPECT_EQ(parts, ComputeTensorDigest(t));
  if (!other_loop) GTEST_LOG_(INFO) << "this CPU runs the build floor's loop only";
}

TEST(DigestTest, TextRoundTrip) {
  ViewDigest d;
  d.lanes = {1, 2, 0xffffffffffffffffull, 0x0123456789abcdefull};
  const std::string s = d.ToString();
  EXPECT_EQ(s.substr(0, 6 + 16), "tern1:0100000000000000");
  auto back = ViewDigest::Parse(s);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, d);
  EXPECT_FALSE(ViewDigest::Parse("tern1:00").ok());
  EXPECT_FALSE(ViewDigest::Parse(std::string("tern2:") + std::string(64, '0')).ok());
  EXPECT_FALSE(ViewDigest::Parse(std::string("tern1:") + std::string(63, '0') + "g").ok());
}

}  // namespace
}  // namespace tern
