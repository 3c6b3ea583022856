// The device apply behind GpuApply and the island's shard apply
// (gpu/kernels/apply.cu). Internal to gpu/.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "gpu/host/shard_plan.h"
#include "tern/gpu.h"

namespace tern::gpu {

// A tensor-parallel rank's part: its shard of every tensor (by tensor
// index), a host-side verdict to share before any work (so that no rank
// waits in a collective for one that gave up), and the island's in-place
// sum of `count` uint64 of device memory on `stream`.
struct ShardedApply {
  std::vector<TpShard> shards;
  Status preflight = Status::Ok();
  std::function<Status(uint64_t* device_sums, uint64_t count, void* stream)> all_reduce;
};

// GpuApply's contract; with `sharded`, the view's tensors point at this
// rank's shards and the verdict is the island's (see NcclIsland::
// ApplyShardsFromRoot).
Status ApplyOnDevice(MutableServeView& view, std::span<const uint8_t> patch, const ViewDigest& current_digest,
                     const GpuOptions& options, ViewDigest* new_digest, const ShardedApply* sharded);

}  // namespace tern::gpu
