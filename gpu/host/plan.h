// Host-side planning of the GPU apply and diff: which records or segments go
// into which batch, and where each one's scratch lies. Kept apart from the
// .cu files so that the CPU tests check it (gpu/host/plan_test.cc): it is the
// part of the launch code whose mistakes (a record counted twice, scratch
// offsets that overlap) no CPU-side kernel test would see.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "gpu/host/patch_walk.h"
#include "tern/view.h"

namespace tern::gpu {

// Apply: each change takes (record u32, position u32, delta u64) of scratch.
inline constexpr uint64_t kApplyChangeBytes = 16;

struct ApplyBatch {
  uint64_t rec_begin = 0, rec_end = 0;      // records [begin, end)
  uint64_t bytes_begin = 0, bytes_end = 0;  // their bytes in the patch
  uint64_t changes = 0;
};
struct ApplyPlan {
  std::vector<ApplyBatch> batches;
  std::vector<uint64_t> change_at;  // per record: first scratch slot in its batch
  uint64_t max_changes = 0, max_bytes = 0;
};

// Whole records per batch, consecutive in the patch, each batch's changes
// and bytes within scratch_bytes unless one record alone needs more (it
// then gets a batch of its own: a record has at most 2^24 changes).
ApplyPlan PlanApply(const std::vector<WalkedRecord>& records, uint64_t scratch_bytes);

// Diff: 12 bytes of scratch per element (position u32, delta u64) plus the
// record's worst-case output slot.
struct DiffSegment {
  uint32_t tensor = 0;
  int w = 0;
  uint64_t first = 0, count = 0;
  uint64_t scratch_at = 0;  // first slot in its batch
  uint64_t out_at = 0, out_capacity = 0;
};
struct DiffPlan {
  std::vector<DiffSegment> segments;                // tensor order, then element order
  std::vector<std::pair<size_t, size_t>> batches;  // segment ranges [first, second)
  uint64_t max_elements = 0, max_out = 0, max_segments = 0;
};

// Segments as tern::Diff cuts them (packed 4-bit ones start on a byte).
DiffPlan PlanDiff(const ServeView& layout, uint64_t segment_elements, uint64_t scratch_bytes);

}  // namespace tern::gpu
