#include "gpu/host/shard_plan.h"

#include <algorithm>

namespace tern::gpu {

Result<TpShard> ShardOf(const TensorDesc& desc, TpSplit split, int nranks, int rank) {
  TERN_REQUIRE(nranks >= 1 && rank >= 0 && rank < nranks, kInvalidArgument, "shard: rank ", rank, " of ", nranks);
  const uint64_t n = desc.elements();
  const uint64_t cols = desc.shape.size() >= 2 ? desc.shape.back() : 1;
  const uint64_t rows = cols == 0 ? 0 : n / cols;
  TpShard s;
  s.counts_tensor = rank == 0;
  s.block.cols = std::max<uint64_t>(cols, 1);
  s.block.r0 = 0, s.block.r1 = rows, s.block.c0 = 0, s.block.c1 = cols;
  const uint64_t k = static_cast<uint64_t>(nranks), r = static_cast<uint64_t>(rank);
  switch (split) {
    case TpSplit::kReplicated:
      s.counts_elements = rank == 0;
      break;
    case TpSplit::kRows:
      TERN_REQUIRE(rows % k == 0, kInvalidArgument, "shard: tensor '", desc.name, "': ", rows,
                   " rows do not split over ", nranks, " ranks");
      s.block.r0 = rows / k * r, s.block.r1 = rows / k * (r + 1);
      break;
    case TpSplit::kCols:
      TERN_REQUIRE(desc.shape.size() >= 2, kInvalidArgument, "shard: tensor '", desc.name,
                   "' has no columns to split (rank ", desc.shape.size(), ")");
      TERN_REQUIRE(cols % k == 0, kInvalidArgument, "shard: tensor '", desc.name, "': ", cols,
                   " columns do not split over ", nranks, " ranks");
      s.block.c0 = cols / k * r, s.block.c1 = cols / k * (r + 1);
      break;
  }
  // Packed F4: a shard must not share a byte with another, so every row
  // piece starts at an even element and has an even width (spec §3.3's rule
  // for segments, for the same reason: parallel byte writes).
  if (desc.dtype == DType::kF4 && split != TpSplit::kReplicated)
    TERN_REQUIRE(cols % 2 == 0 && (s.block.c1 - s.block.c0) % 2 == 0 && s.block.c0 % 2 == 0, kInvalidArgument,
                 "shard: F4 tensor '", desc.name, "': shards of ", s.block.c1 - s.block.c0, " of ", cols,
                 " columns would split a byte");
  s.elements = (s.block.r1 - s.block.r0) * (s.block.c1 - s.block.c0);
  return s;
}

std::vector<ShardRun> SegmentRuns(const ShardBlock& b, uint64_t first, uint64_t count) {
  std::vector<ShardRun> runs;
  if (count == 0 || b.c1 <= b.c0 || b.r1 <= b.r0) return runs;
  const uint64_t end = first + count;
  // Rows the segment touches, clipped to the shard's.
  const uint64_t row_lo = std::max(first / b.cols, b.r0), row_hi = std::min((end - 1) / b.cols + 1, b.r1);
  for (uint64_t row = row_lo; row < row_hi; ++row) {
    const uint64_t lo = std::max(first, row * b.cols + b.c0), hi = std::min(end, row * b.cols + b.c1);
    if (lo >= hi) continue;
    const uint64_t local = (row - b.r0) * (b.c1 - b.c0) + (lo - row * b.cols - b.c0);
    // Whole rows of a full-width block are consecutive locally too: merge.
    if (!runs.empty() && runs.back().end == lo - first && runs.back().local + (runs.back().end - runs.back().begin) == local) {
      runs.back().end = hi - first;
    } else {
      runs.push_back({lo - first, hi - first, local});
    }
  }
  return runs;
}

bool SegmentInside(const ShardBlock& b, uint64_t first, uint64_t count) {
  const std::vector<ShardRun> runs = SegmentRuns(b, first, count);
  uint64_t covered = 0;
  for (const ShardRun& r : runs) covered += r.end - r.begin;
  return covered == count;
}

Result<std::vector<uint64_t>> RecordsForShards(const std::vector<WalkedRecord>& records,
                                               const std::vector<TpShard>& shards) {
  std::vector<uint64_t> out;
  for (uint64_t r = 0; r < records.size(); ++r) {
    const RecordHeader& h = records[r].h;
    TERN_REQUIRE(h.tensor_index < shards.size(), kInvalidArgument, "shards: record ", r, " names tensor ",
                 h.tensor_index, " of ", shards.size());
    const ShardBlock& b = shards[h.tensor_index].block;
    const std::vector<ShardRun> runs = SegmentRuns(b, h.first_element, h.element_count);
    if (runs.empty()) continue;
    if (h.encoding == 3) {  // CONTEXT
      TERN_REQUIRE(runs.size() == 1 && runs[0].end - runs[0].begin == h.element_count, kUnsupported,
                   "shards: CONTEXT record ", r, " (tensor ", h.tensor_index, ", elements ", h.first_element, "+",
                   h.element_count, ") straddles this rank's shard; it decodes only against its whole segment");
    }
    out.push_back(r);
  }
  return out;
}

}  // namespace tern::gpu
