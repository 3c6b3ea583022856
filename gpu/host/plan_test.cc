// The launch code's host half on the CPU: batch plans of the apply and the
// diff (every record or segment exactly once, scratch offsets disjoint and
// within bounds, segments cut as tern::Diff cuts them) and the packed-F4
// byte rule of the write kernel, run over every change in an arbitrary order
// as the GPU's threads would.
#include "gpu/host/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "gpu/ops/codec_ops.h"
#include "patch/segment_codec.h"
#include "patch/test_util.h"
#include "tern/digest.h"
#include "tern/patch.h"
#include "tern/thread_pool.h"

namespace tern::gpu {
namespace {

testing::OwnedView Layout(std::mt19937_64& rng, uint64_t scale) {
  testing::OwnedView v;
  v.Add("a.f4", DType::kF4, {3 * scale + 1});
  v.Add("b.u8", DType::kU8, {2 * scale});
  v.Add("c.bf16", DType::kBF16, {scale});
  v.Add("d.f32", DType::kF32, {scale / 2 + 1});
  v.Add("e.empty", DType::kF16, {0});
  for (auto& d : v.data) testing::FillRandom(d, rng);
  return v;
}

void Mutate(testing::OwnedView& v, double density, std::mt19937_64& rng) {
  for (size_t t = 0; t < v.descs.size(); ++t)
    testing::Mutate(v.data[t], ElementBits(v.descs[t].dtype), v.descs[t].elements(), density, rng);
}

TEST(GpuPlan, ApplyBatchesCoverEveryRecordOnceWithinScratch) {
  std::mt19937_64 rng(1);
  ThreadPool pool(2);
  for (double density : {0.001, 0.05, 1.0}) {
    testing::OwnedView a = Layout(rng, 20000), b(a.View());
    Mutate(b, density, rng);
    DiffOptions opt;
    opt.segment_elements = 3001;
    opt.nibble_coding = false;  // the GPU walk takes versions 1 and 2 only
    auto patch = Diff(a.View(), b.View(), opt, pool);
    ASSERT_TRUE(patch.ok());
    auto wp = WalkPatch(*patch);
    ASSERT_TRUE(wp.ok());
    for (uint64_t scratch : {uint64_t{1}, uint64_t{20000}, uint64_t{1} << 20, uint64_t{1} << 40}) {
      const ApplyPlan plan = PlanApply(wp->records, scratch);
      ASSERT_FALSE(plan.batches.empty());
      uint64_t next = 0;
      for (const ApplyBatch& bt : plan.batches) {
        ASSERT_EQ(bt.rec_begin, next);
        ASSERT_GT(bt.rec_end, bt.rec_begin);
        next = bt.rec_end;
        EXPECT_EQ(bt.bytes_begin, wp->records[bt.rec_begin].offset);
        EXPECT_EQ(bt.bytes_end, wp->records[bt.rec_end - 1].offset + wp->records[bt.rec_end - 1].total_bytes);
        uint64_t at = 0;
        for (uint64_t r = bt.rec_begin; r < bt.rec_end; ++r) {
          ASSERT_EQ(plan.change_at[r], at);  // disjoint, gap-free slots
          at += wp->records[r].h.changed_count;
        }
        EXPECT_EQ(bt.changes, at);
        EXPECT_LE(bt.changes, plan.max_changes);
        EXPECT_LE(bt.bytes_end - bt.bytes_begin, plan.max_bytes);
        if (bt.rec_end - bt.rec_begin > 1) {  // only a lone record may exceed the scratch
          EXPECT_LE(bt.changes * kApplyChangeBytes + (bt.bytes_end - bt.bytes_begin), scratch);
        }
      }
      EXPECT_EQ(next, wp->records.size());
      if (scratch == 1) {
        EXPECT_EQ(plan.batches.size(), wp->records.size());
      }
      if (scratch == uint64_t{1} << 40) {
        EXPECT_EQ(plan.batches.size(), 1u);
      }
    }
  }
}

TEST(GpuPlan, DiffSegmentsAreDiffsAndBatchesAreBounded) {
  std::mt19937_64 rng(2);
  ThreadPool pool(2);
  for (uint64_t seg : {uint64_t{1}, uint64_t{999}, uint64_t{1000}, uint64_t{4096}}) {
    testing::OwnedView a = Layout(rng, 3000), b(a.View());
    Mutate(b, 1.0, rng);  // every segment changes, so the patch lists them all
    DiffOptions opt;
    opt.segment_elements = seg;
    auto patch = Diff(a.View(), b.View(), opt, pool);
    ASSERT_TRUE(patch.ok());
    auto wp = WalkPatch(*patch);
    ASSERT_TRUE(wp.ok());
    for (uint64_t scratch : {uint64_t{1}, uint64_t{100000}, uint64_t{1} << 40}) {
      const DiffPlan plan = PlanDiff(a.View(), seg, scratch);
      ASSERT_EQ(plan.segments.size(), wp->records.size()) << "segment " << seg;
      for (size_t i = 0; i < plan.segments.size(); ++i) {
        EXPECT_EQ(plan.segments[i].tensor, wp->records[i].h.tensor_index);
        EXPECT_EQ(plan.segments[i].first, wp->records[i].h.first_element);
        EXPECT_EQ(plan.segments[i].count, wp->records[i].h.element_count);
      }
      size_t next = 0;
      for (const auto& [begin, end] : plan.batches) {
        ASSERT_EQ(begin, next);
        ASSERT_GT(end, begin);
        next = end;
        uint64_t elements = 0, out = 0;
        for (size_t i = begin; i < end; ++i) {
          ASSERT_EQ(plan.segments[i].scratch_at, elements);
          ASSERT_EQ(plan.segments[i].out_at, out);
          elements += plan.segments[i].count;
          out += plan.segments[i].out_capacity;
        }
        EXPECT_LE(elements, plan.max_elements);
        EXPECT_LE(out, plan.max_out);
        EXPECT_LE(end - begin, plan.max_segments);
        if (end - begin > 1) {
          EXPECT_LE(elements * 12 + out, scratch);
        }
      }
      EXPECT_EQ(next, plan.segments.size());
    }
  }
}

// The write kernel's packed-F4 rule, every change handled independently and
// in reverse order: the bytes must equal the CPU target.
TEST(GpuPlan, PackedF4WritesNeverLoseANibble) {
  std::mt19937_64 rng(3);
  for (double density : {0.01, 0.3, 0.7, 1.0}) {
    const uint64_t n = 20001;
    std::vector<uint8_t> before((n + 1) / 2), after;
    testing::FillRandom(before, rng);
    after = before;
    testing::Mutate(after, 4, n, density, rng);
    // Changes as the decode kernel leaves them: (record, position, delta),
    // records of 1000 elements, position order within each.
    struct Change {
      uint32_t rec;
      uint32_t pos;
      uint64_t delta;
    };
    std::vector<Change> ch;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t a = LoadElement(before.data(), i, 4), b = LoadElement(after.data(), i, 4);
      if (a != b) ch.push_back({static_cast<uint32_t>(i / 1000), static_cast<uint32_t>(i % 1000), (b - a) & 15});
    }
    // Every thread reads the byte before any writes (the worst case), and
    // the writes land in either order.
    for (bool reverse : {false, true}) {
      std::vector<uint8_t> x = before;
      for (size_t j = 0; j < ch.size(); ++j) {
        const size_t k = reverse ? ch.size() - 1 - j : j;
        const uint64_t idx = uint64_t{ch[k].rec} * 1000 + ch[k].pos;
        const bool prev = k > 0 && ch[k - 1].rec == ch[k].rec && ch[k - 1].pos + 1 == ch[k].pos;
        const bool next = k + 1 < ch.size() && ch[k + 1].rec == ch[k].rec && ch[k + 1].pos == ch[k].pos + 1;
        uint8_t byte;
        if (F4ByteToWrite(before[idx >> 1], idx & 1, ch[k].delta, prev, next, next ? ch[k + 1].delta : 0, &byte))
          x[idx >> 1] = byte;
      }
      EXPECT_EQ(x, after) << "density " << density << (reverse ? " reverse" : " forward");
    }
  }
}

// The shard design's claim (docs/gpu.md, "Islands"): partial digests over
// blocks that partition a tensor (element terms at global indices, the
// tensor term once) sum to the view digest, so an island can verify a
// patch without any rank holding the whole view.
TEST(GpuShards, PartialDigestsOfAPartitionSumToTheViewDigest) {
  std::mt19937_64 rng(4);
  const uint64_t rows = 96, cols = 40;
  testing::OwnedView v;
  v.Add("w", DType::kBF16, {2, rows / 2, cols});
  testing::FillRandom(v.data[0], rng);
  const ServeView view = v.View();
  const TensorRef& t = view.tensors[0];
  const uint64_t seed = TensorSeed(*t.desc);
  // Column-parallel (row blocks), row-parallel (column blocks), and a 2x2 grid.
  const std::vector<std::vector<ShardBlock>> partitions = {
      {{cols, 0, 32, 0, cols}, {cols, 32, 64, 0, cols}, {cols, 64, rows, 0, cols}},
      {{cols, 0, rows, 0, 10}, {cols, 0, rows, 10, 40}},
      {{cols, 0, 50, 0, 24}, {cols, 0, 50, 24, 40}, {cols, 50, rows, 0, 24}, {cols, 50, rows, 24, 40}}};
  ThreadPool pool(1);
  const ViewDigest want = ComputeDigest(view, pool);
  for (const auto& parts : partitions) {
    ViewDigest sum;
    std::vector<int> held(rows * cols, 0);
    for (size_t p = 0; p < parts.size(); ++p) {
      const ShardBlock& b = parts[p];
      uint64_t acc[4] = {};
      if (p == 0) AddTensorTerm(seed, acc);  // one rank adds the tensor term
      for (uint64_t k = 0; k < (b.r1 - b.r0) * (b.c1 - b.c0); ++k) {
        const uint64_t g = ShardGlobalIndex(b, k);
        uint64_t local;
        ASSERT_TRUE(ShardLocalIndex(b, g, &local));
        ASSERT_EQ(local, k);
        held[g]++;
        AddElementHash(seed, g, LoadElement(t.data, g, 16), acc);
      }
      sum += ViewDigest({acc[0], acc[1], acc[2], acc[3]});
    }
    EXPECT_EQ(std::count(held.begin(), held.end(), 1), static_cast<long>(held.size()));  // a partition
    EXPECT_EQ(sum, want);
  }
  uint64_t local;
  EXPECT_FALSE(ShardLocalIndex({cols, 0, 10, 5, 7}, 3, &local));   // column outside
  EXPECT_FALSE(ShardLocalIndex({cols, 1, 10, 0, 40}, 3, &local));  // row outside
}

}  // namespace
}  // namespace tern::gpu
