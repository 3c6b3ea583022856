// PatchStreamApply: fed a patch in pieces, it ends bit for bit where Apply
// ends, having written records before the last piece; damaged or foreign
// bytes fail (sticky) and are reported, never a wrong target digest.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "patch/container.h"
#include "patch/test_util.h"
#include "tern/patch.h"
#include "tern/thread_pool.h"

namespace tern {
namespace {

using testing::OwnedView;

// Two tensors, one float (CONTEXT records in format 2) and one byte-wide,
// `steps` versions apart.
struct Pair {
  OwnedView a, b;
};

Pair MakePair(uint64_t seed) {
  std::mt19937_64 rng(seed);
  Pair p;
  p.a.Add("a.w", DType::kBF16, {40000});
  p.a.Add("b.bytes", DType::kU8, {9000});
  testing::PhysicalFill(p.a.data[0], DType::kBF16, 40000, rng);
  testing::FillRandom(p.a.data[1], rng);
  p.b = p.a;
  testing::PhysicalMutate(p.b.data[0], DType::kBF16, 40000, 0.004, rng);
  testing::Mutate(p.b.data[1], 8, 9000, 0.02, rng);
  return p;
}

std::vector<uint8_t> MakePatch(const OwnedView& a, const OwnedView& b, ThreadPool& pool,
                               uint16_t format = kDefaultPatchFormat) {
  DiffOptions o;
  o.segment_elements = 2048;  // many records, so pieces end inside them
  o.base_version = 1;
  o.target_version = 2;
  o.format_version = format;
  auto p = Diff(a.View(), b.View(), o, pool);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? *p : std::vector<uint8_t>{};
}

bool SameBytes(const OwnedView& x, const OwnedView& y) {
  for (size_t t = 0; t < x.data.size(); ++t)
    if (x.data[t] != y.data[t]) return false;
  return true;
}

TEST(PatchStreamApplyTest, PiecesEndWhereApplyEnds) {
  ThreadPool pool(2);
  const Pair pair = MakePair(3);
  for (uint16_t format : {uint16_t{1}, uint16_t{2}}) {
    const std::vector<uint8_t> patch = MakePatch(pair.a, pair.b, pool, format);
    ASSERT_FALSE(patch.empty());
    auto info = Inspect(patch);
    ASSERT_TRUE(info.ok());
    ASSERT_GT(info->segments, 10u);
    if (format == 2) {
      ASSERT_GT(info->tensors[0].context_segments, 0u);
    }
    const ViewDigest base = ComputeDigest(pair.a.View(), pool);
    for (uint64_t piece : {uint64_t{1}, uint64_t{97}, uint64_t{4096}, uint64_t{patch.size()}}) {
      SCOPED_TRACE(::testing::Message() << "format " << format << " piece " << piece);
      OwnedView v = pair.a;
      MutableServeView mv = v.Mutable();
      PatchStreamApply stream(mv, base, pool);
      uint64_t written_before_last = 0;
      for (uint64_t end = piece; end < patch.size(); end += piece) {
        // A fresh copy each time: the buffer may move between calls.
        const std::vector<uint8_t> prefix(patch.begin(), patch.begin() + end);
        ASSERT_TRUE(stream.Feed(prefix).ok());
        written_before_last = stream.records_written();
      }
      if (piece < patch.size() / 2) {
        EXPECT_TRUE(stream.started());
        EXPECT_EQ(stream.target_version(), 2u);
        EXPECT_GT(written_before_last, info->segments / 2) << "records waited for the end";
      }
      ViewDigest target;
      ASSERT_TRUE(stream.Finish(patch, &target).ok());
      EXPECT_EQ(stream.records_written(), info->segments);
      EXPECT_EQ(target, info->target_digest);
      EXPECT_TRUE(SameBytes(v, pair.b));
    }
  }
}

TEST(PatchStreamApplyTest, InspectHeadWaitsForTheManifest) {
  ThreadPool pool(1);
  const Pair pair = MakePair(4);
  const std::vector<uint8_t> patch = MakePatch(pair.a, pair.b, pool);
  auto none = InspectHead(std::span<const uint8_t>(patch).first(40));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  auto head = InspectHead(std::span<const uint8_t>(patch).first(patch.size() / 2));
  ASSERT_TRUE(head.ok() && head->has_value());
  EXPECT_EQ((*head)->target_version, 2u);
  EXPECT_EQ((*head)->tensors.size(), 2u);
  // Each tensor's record count, from the manifest alone: what Inspect counts.
  auto whole = Inspect(patch);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ((*head)->segments, whole->segments);
  for (size_t i = 0; i < whole->tensors.size(); ++i)
    EXPECT_EQ((*head)->tensors[i].segments, whole->tensors[i].segments) << i;
  auto bad = patch;
  bad[3] ^= 1;
  EXPECT_EQ(InspectHead(bad).status().code(), Code::kCorrupt);
}

// A flipped byte in any record: Feed or Finish fails, and keeps failing.
TEST(PatchStreamApplyTest, DamagedRecordFailsAndStaysFailed) {
  ThreadPool pool(2);
  const Pair pair = MakePair(5);
  const std::vector<uint8_t> patch = MakePatch(pair.a, pair.b, pool);
  const ViewDigest base = ComputeDigest(pair.a.View(), pool);
  std::mt19937_64 rng(9);
  for (int trial = 0; trial < 40; ++trial) {
    auto bad = patch;
    const uint64_t at = 200 + rng() % (bad.size() - 200);
    bad[at] ^= static_cast<uint8_t>(1 + rng() % 255);
    SCOPED_TRACE(at);
    OwnedView v = pair.a;
    MutableServeView mv = v.Mutable();
    PatchStreamApply stream(mv, base, pool);
    Status first = Status::Ok();
    for (uint64_t end = 1000; end < bad.size() && first.ok(); end += 1000)
      first = stream.Feed(std::span<const uint8_t>(bad).first(end));
    Status last = stream.Finish(bad);
    EXPECT_FALSE(last.ok());
    if (!first.ok()) {
      EXPECT_EQ(last.ToString(), first.ToString());
    }
    // Sticky, even given the good patch afterwards.
    EXPECT_FALSE(stream.Finish(patch).ok());
  }
}

TEST(PatchStreamApplyTest, WrongBaseAndForeignPatchAreRefused) {
  ThreadPool pool(2);
  const Pair pair = MakePair(6);
  const std::vector<uint8_t> patch = MakePatch(pair.a, pair.b, pool);
  {
    OwnedView v = pair.a;
    MutableServeView mv = v.Mutable();
    PatchStreamApply stream(mv, ViewDigest{}, pool);
    EXPECT_EQ(stream.Feed(patch).code(), Code::kMismatch);
    EXPECT_TRUE(SameBytes(v, pair.a));  // checked before any write
  }
  {
    // Fed one patch, finished with another of the same base: refused.
    Pair other = pair;
    std::mt19937_64 rng(1);
    testing::Mutate(other.b.data[1], 8, 9000, 0.05, rng);
    const std::vector<uint8_t> foreign = MakePatch(pair.a, other.b, pool);
    OwnedView v = pair.a;
    MutableServeView mv = v.Mutable();
    PatchStreamApply stream(mv, ComputeDigest(pair.a.View(), pool), pool);
    ASSERT_TRUE(stream.Feed(std::span<const uint8_t>(patch).first(patch.size() / 2)).ok());
    ASSERT_GT(stream.records_written(), 0u);
    EXPECT_EQ(stream.Finish(foreign).code(), Code::kMismatch);
  }
}

}  // namespace
}  // namespace tern
