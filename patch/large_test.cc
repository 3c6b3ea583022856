// A tensor of more than 2^31 elements: no 32-bit index arithmetic anywhere
// on the diff/apply/digest path. Needs ~2.2 GiB of RAM; labelled slow.
#include <gtest/gtest.h>

#include <random>

#include "tern/thread_pool.h"
#include "patch/test_util.h"
#include "tern/patch.h"

namespace tern {
namespace {

TEST(PatchLargeTest, MoreThan2To31ElementsF4) {
  const uint64_t n = (uint64_t{1} << 31) + 1000;
  testing::OwnedView a;
  a.Add("huge", DType::kF4, {n});
  std::mt19937_64 rng(21);
  for (size_t i = 0; i < a.data[0].size(); i += 4096) a.data[0][i] = static_cast<uint8_t>(rng());
  testing::OwnedView b = a;
  // Changes on both sides of 2^31 and 2^32 nibbles, at the last element, and sparse noise.
  std::vector<uint64_t> at = {0, (uint64_t{1} << 31) - 1, uint64_t{1} << 31, (uint64_t{1} << 31) + 1, n - 1};
  for (int k = 0; k < 20000; ++k) at.push_back(rng() % n);
  for (uint64_t i : at) testing::Set(b.data[0], 4, i, (testing::Get(b.data[0], 4, i) + 1 + rng() % 15) & 15);
  ThreadPool pool(2);
  auto patch = Diff(a.View(), b.View(), DiffOptions{}, pool);
  ASSERT_TRUE(patch.ok()) << patch.status().ToString();
  const ViewDigest target = ComputeDigest(b.View(), pool);
  MutableServeView mv = a.Mutable();
  ViewDigest got;
  const ViewDigest base = ComputeDigest(a.View(), pool);
  Status s = Apply(mv, *patch, base, pool, &got);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(got, target);
  EXPECT_TRUE(a.data[0] == b.data[0]);  // bitwise
}

}  // namespace
}  // namespace tern
