// The shard plan (gpu/host/shard_plan.h) by brute force: shards partition each
// tensor, local indices are a bijection onto the shard, a segment's runs are
// exactly its elements inside the shard (with ShardLocalIndex's local
// indices), and per-rank partial digests add up to the view digest.
#include "gpu/host/shard_plan.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "patch/test_util.h"
#include "tern/digest.h"
#include "tern/thread_pool.h"

namespace tern::gpu {
namespace {

TensorDesc Desc(DType dt, std::vector<uint64_t> shape) {
  TensorDesc d;
  d.name = "t";
  d.dtype = dt;
  d.shape = std::move(shape);
  return d;
}

struct Case {
  DType dtype;
  std::vector<uint64_t> shape;
  TpSplit split;
  int nranks;
};
const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {DType::kBF16, {12, 10}, TpSplit::kRows, 4},    {DType::kBF16, {12, 10}, TpSplit::kCols, 2},
      {DType::kBF16, {3, 4, 10}, TpSplit::kCols, 5},  {DType::kBF16, {2, 6, 8}, TpSplit::kRows, 3},
      {DType::kF32, {24}, TpSplit::kRows, 8},         {DType::kF32, {7, 9}, TpSplit::kReplicated, 3},
      {DType::kF4, {6, 16}, TpSplit::kCols, 4},       {DType::kF4, {6, 16}, TpSplit::kRows, 2},
      {DType::kU8, {1, 64}, TpSplit::kCols, 8},       {DType::kF16, {}, TpSplit::kReplicated, 2},
  };
  return cases;
}

TEST(GpuShardPlan, ShardsPartitionTheTensorAndMapOntoTheShard) {
  for (const Case& c : Cases()) {
    const TensorDesc d = Desc(c.dtype, c.shape);
    const uint64_t n = d.elements();
    std::vector<int> owners(n, 0);
    int counting = 0;
    for (int r = 0; r < c.nranks; ++r) {
      auto s = ShardOf(d, c.split, c.nranks, r);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      counting += s->counts_elements;
      std::vector<int> hit(s->elements, 0);
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t local;
        if (!ShardLocalIndex(s->block, i, &local)) continue;
        ++owners[i];
        ASSERT_LT(local, s->elements);
        ++hit[local];
        ASSERT_EQ(ShardGlobalIndex(s->block, local), i);
      }
      for (int h : hit) ASSERT_EQ(h, 1);
    }
    EXPECT_EQ(counting, c.split == TpSplit::kReplicated ? 1 : c.nranks);
    for (int o : owners) ASSERT_EQ(o, c.split == TpSplit::kReplicated ? c.nranks : 1);
  }
}

TEST(GpuShardPlan, SegmentRunsAreTheSegmentsElementsInTheShard) {
  std::mt19937_64 rng(41);
  for (const Case& c : Cases()) {
    const TensorDesc d = Desc(c.dtype, c.shape);
    const uint64_t n = d.elements();
    for (int trial = 0; trial < 200; ++trial) {
      const uint64_t first = rng() % n, count = 1 + rng() % (n - first);
      std::vector<int> covered(count, 0);
      for (int r = 0; r < c.nranks; ++r) {
        const TpShard s = *ShardOf(d, c.split, c.nranks, r);
        const std::vector<ShardRun> runs = SegmentRuns(s.block, first, count);
        uint64_t in_runs = 0, prev_end = 0;
        for (const ShardRun& run : runs) {
          ASSERT_LT(run.begin, run.end);
          ASSERT_GE(run.begin, prev_end);  // in order, disjoint
          prev_end = run.end;
          for (uint64_t p = run.begin; p < run.end; ++p) {
            uint64_t local;
            ASSERT_TRUE(ShardLocalIndex(s.block, first + p, &local));
            ASSERT_EQ(local, run.local + (p - run.begin));
            ++covered[p];
          }
          in_runs += run.end - run.begin;
        }
        uint64_t inside = 0;
        for (uint64_t p = 0; p < count; ++p) {
          uint64_t local;
          inside += ShardLocalIndex(s.block, first + p, &local);
        }
        ASSERT_EQ(in_runs, inside);
        ASSERT_EQ(SegmentInside(s.block, first, count), inside == count);
      }
      for (int k : covered) ASSERT_EQ(k, c.split == TpSplit::kReplicated ? c.nranks : 1);
    }
  }
}

// The island's digest check: each rank sums the element terms of its shard
// (global indices, the full tensor's seed) and, where it counts the tensor,
// its tensor term; the sum over ranks is the view digest.
TEST(GpuShardPlan, PartialDigestsAddUpToTheViewDigest) {
  std::mt19937_64 rng(42);
  ThreadPool pool(1);
  for (const Case& c : Cases()) {
    testing::OwnedView v;
    v.Add("t", c.dtype, c.shape);
    testing::FillRandom(v.data[0], rng);
    const TensorDesc& d = v.descs[0];
    const int w = ElementBits(c.dtype);
    const uint64_t seed = TensorSeed(d);
    ViewDigest sum;
    for (int r = 0; r < c.nranks; ++r) {
      const TpShard s = *ShardOf(d, c.split, c.nranks, r);
      uint64_t acc[4] = {};
      if (s.counts_tensor) AddTensorTerm(seed, acc);
      if (s.counts_elements)
        for (const ShardRun& run : SegmentRuns(s.block, 0, d.elements()))
          for (uint64_t p = run.begin; p < run.end; ++p) AddElementHash(seed, p, LoadElement(v.data[0].data(), p, w), acc);
      sum += ViewDigest({acc[0], acc[1], acc[2], acc[3]});
    }
    EXPECT_EQ(sum, ComputeDigest(v.View(), pool)) << "shape rank " << c.shape.size();
  }
}

WalkedRecord Record(uint32_t tensor, uint8_t encoding, uint64_t first, uint64_t count) {
  WalkedRecord r{};
  r.h.tensor_index = tensor;
  r.h.encoding = encoding;
  r.h.first_element = first;
  r.h.element_count = count;
  return r;
}

TEST(GpuShardPlan, RecordsForShardsKeepsTouchingRecordsAndRefusesStraddlingContext) {
  // Tensor 0: [8, 4] split by rows over 2 (rank 1 holds elements 16..31);
  // tensor 1: [4, 8] split by columns (rank 1 holds columns 4..7).
  const TensorDesc a = Desc(DType::kBF16, {8, 4}), b = Desc(DType::kBF16, {4, 8});
  const std::vector<TpShard> shards = {*ShardOf(a, TpSplit::kRows, 2, 1), *ShardOf(b, TpSplit::kCols, 2, 1)};
  const std::vector<WalkedRecord> ok = {Record(0, 0, 0, 16), Record(0, 3, 16, 8), Record(0, 1, 24, 8),
                                        Record(1, 0, 0, 4),  Record(1, 3, 12, 4), Record(1, 2, 16, 16)};
  auto got = RecordsForShards(ok, shards);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, (std::vector<uint64_t>{1, 2, 4, 5}));  // 0: rows 0-3; 3: columns 0-3 of row 0
  // CONTEXT records that straddle: rows 3-4 of tensor 0; two rows of tensor 1.
  for (const WalkedRecord& bad : {Record(0, 3, 12, 8), Record(1, 3, 4, 8)}) {
    auto r = RecordsForShards({bad}, shards);
    EXPECT_EQ(r.status().code(), Code::kUnsupported);
  }
  // The same segments in format-1 encodings are fine (every change maps on its own).
  auto f1 = RecordsForShards({Record(0, 0, 12, 8), Record(1, 0, 4, 8)}, shards);
  ASSERT_TRUE(f1.ok());
  EXPECT_EQ(f1->size(), 2u);
  EXPECT_EQ(RecordsForShards({Record(2, 0, 0, 1)}, shards).status().code(), Code::kInvalidArgument);
}

TEST(GpuShardPlan, RefusesSplitsThatDoNotFit) {
  EXPECT_FALSE(ShardOf(Desc(DType::kBF16, {10, 8}), TpSplit::kRows, 4, 0).ok());   // 10 rows over 4
  EXPECT_FALSE(ShardOf(Desc(DType::kBF16, {8, 10}), TpSplit::kCols, 4, 0).ok());   // 10 columns over 4
  EXPECT_FALSE(ShardOf(Desc(DType::kBF16, {16}), TpSplit::kCols, 2, 0).ok());      // no columns
  EXPECT_FALSE(ShardOf(Desc(DType::kF4, {4, 12}), TpSplit::kCols, 4, 1).ok());     // 3 columns: splits a byte
  EXPECT_FALSE(ShardOf(Desc(DType::kF4, {4, 7}), TpSplit::kRows, 2, 0).ok());      // odd rows: splits a byte
  EXPECT_FALSE(ShardOf(Desc(DType::kBF16, {8, 8}), TpSplit::kRows, 2, 2).ok());    // rank out of range
  EXPECT_TRUE(ShardOf(Desc(DType::kF4, {4, 7}), TpSplit::kReplicated, 2, 1).ok());
}

}  // namespace
}  // namespace tern::gpu
