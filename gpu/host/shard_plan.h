// Tensor-parallel shards of an island (docs/gpu.md, "Islands"): which
// elements of each tensor rank r of n holds, and which parts of a patch
// segment fall in them. Pure functions, tested on the CPU
// (gpu/host/shard_plan_test.cc); the index map itself is codec_ops.h's
// ShardBlock/ShardLocalIndex, which the device code shares.
//
// A tensor is folded to [rows, cols]: cols is its last dimension (1 for a
// rank-0 or rank-1 tensor), rows the product of the others. A
// column-parallel linear (and its bias) holds a block of output rows
// (kRows), a row-parallel one a block of input columns (kCols); layer norms
// and the like are replicated on every rank. Shards are equal, as tensor
// parallelism in vLLM/Megatron requires (rows or cols divisible by n).
#pragma once

#include <cstdint>
#include <vector>

#include "gpu/host/patch_walk.h"
#include "gpu/ops/codec_ops.h"
#include "tern/gpu.h"
#include "tern/status.h"
#include "tern/view.h"

namespace tern::gpu {

using TpSplit = GpuTpSplit;  // tern/gpu.h

struct TpShard {
  ShardBlock block;
  uint64_t elements = 0;  // in the shard
  // What this rank adds to the island's digest sum, so that the ranks'
  // partial digests add up to the view digest: the element terms of its
  // shard (a replicated tensor's on rank 0 only), and the tensor term (rank
  // 0 only).
  bool counts_elements = true;
  bool counts_tensor = true;
};

// Rank `rank`'s shard of `desc` split `split` over `nranks`. kInvalidArgument
// for a split that does not divide, a kCols split of a tensor of rank < 2,
// and a packed F4 block that would split a byte (odd columns per row piece).
Result<TpShard> ShardOf(const TensorDesc& desc, TpSplit split, int nranks, int rank);

// The part of segment [first, first + count) of the tensor inside a shard:
// runs of consecutive segment positions whose shard-local indices are also
// consecutive, in segment order (one run for kRows, one per row for kCols).
struct ShardRun {
  uint64_t begin = 0, end = 0;  // positions in the segment, [begin, end)
  uint64_t local = 0;           // shard-local index of position `begin`
};
std::vector<ShardRun> SegmentRuns(const ShardBlock& b, uint64_t first, uint64_t count);

// Whether the whole segment lies inside the shard. A CONTEXT record decodes
// only against the base of its whole segment, so a rank can decode it alone
// only then (otherwise the island would have to gather the segment's
// classes; not built).
bool SegmentInside(const ShardBlock& b, uint64_t first, uint64_t count);

// The records of a patch a rank decodes for its shards (shards[t]: tensor
// t's), in patch order: those whose segment has an element in the shard.
// A CONTEXT record that touches the shard must lie inside it
// (SegmentInside), else kUnsupported naming it: the encoder has to cut
// segments at shard boundaries (row splits: segment_elements dividing a
// shard's elements) or write format 1 for split tensors.
Result<std::vector<uint64_t>> RecordsForShards(const std::vector<WalkedRecord>& records,
                                               const std::vector<TpShard>& shards);

}  // namespace tern::gpu
