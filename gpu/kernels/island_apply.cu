// NcclIsland::ApplyFromRoot and ApplyShardsFromRoot (include/tern/gpu.h): the
// root's patch reaches every rank of the island over NCCL, then each rank
// applies it on its GPU: all of it (replicas), or its shards with the
// island's digest verdict all-reduced (tensor parallelism, gpu/host/shard_plan.h).
// Collective: a CUDA or NCCL error on one rank between the two all-reduces
// of a shard apply leaves the others waiting in NCCL (its usual failure
// mode; the application's NCCL timeout or abort handles it).
#include <vector>

#include "gpu/kernels/apply_internal.h"
#include "gpu/kernels/cuda_util.h"
#include "tern/gpu.h"

namespace tern {

namespace {

// The root's patch on every rank: its size, then its bytes, broadcast
// through device buffers; non-root ranks get the bytes back into
// `received` (the apply verifies checksums on the host; a patch is ~1% of
// the view, and the view itself stays on the GPU).
Status ReceiveFromRoot(NcclIsland& island, std::span<const uint8_t> patch, int root, cudaStream_t stream,
                       std::vector<uint8_t>* received, std::span<const uint8_t>* out) {
  using namespace gpu;
  TERN_REQUIRE(root >= 0 && root < island.nranks(), kInvalidArgument, "root ", root, " of ", island.nranks());
  TERN_RETURN_IF_ERROR(RequireDevice());
  const bool is_root = island.rank() == root;
  DeviceBuffer d_size;
  TERN_RETURN_IF_ERROR(d_size.Allocate(sizeof(uint64_t), stream));
  uint64_t size = is_root ? patch.size() : 0;
  if (is_root)
    TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_size.as<void>(), &size, sizeof(size), cudaMemcpyHostToDevice, stream));
  TERN_RETURN_IF_ERROR(island.Broadcast(d_size.as<void>(), sizeof(size), root, stream));
  TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&size, d_size.as<void>(), sizeof(size), cudaMemcpyDeviceToHost, stream));
  TERN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  // A bound before allocating: the root's patch is validated by every
  // rank's apply, but its announced size is trusted only this far.
  TERN_REQUIRE(size >= 1 && size <= (uint64_t{1} << 40), kCorrupt, "island: root announced a patch of ", size,
               " bytes");
  DeviceBuffer d_patch;
  TERN_RETURN_IF_ERROR(d_patch.Allocate(size, stream));
  if (is_root)
    TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_patch.as<void>(), patch.data(), size, cudaMemcpyHostToDevice, stream));
  TERN_RETURN_IF_ERROR(island.Broadcast(d_patch.as<void>(), size, root, stream));
  if (!is_root) {
    received->resize(size);
    TERN_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(received->data(), d_patch.as<void>(), size, cudaMemcpyDeviceToHost, stream));
  }
  TERN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  *out = is_root ? patch : std::span<const uint8_t>(*received);
  return Status::Ok();
}

}  // namespace

Status NcclIsland::ApplyFromRoot(MutableServeView& device_view, std::span<const uint8_t> patch, int root,
                                 const ViewDigest& current_digest, const GpuOptions& options,
                                 ViewDigest* new_digest) {
  std::vector<uint8_t> received;
  std::span<const uint8_t> bytes;
  TERN_RETURN_IF_ERROR(
      ReceiveFromRoot(*this, patch, root, static_cast<cudaStream_t>(options.stream), &received, &bytes));
  return GpuApply(device_view, bytes, current_digest, options, new_digest);
}

Status NcclIsland::ApplyShardsFromRoot(MutableServeView& device_view, std::span<const uint8_t> patch, int root,
                                       const std::vector<GpuTpSplit>& splits, const ViewDigest& current_digest,
                                       const GpuOptions& options, ViewDigest* new_digest) {
  using namespace gpu;
  std::vector<uint8_t> received;
  std::span<const uint8_t> bytes;
  TERN_RETURN_IF_ERROR(
      ReceiveFromRoot(*this, patch, root, static_cast<cudaStream_t>(options.stream), &received, &bytes));
  // Shard errors (a split that does not divide) go into the island's shared
  // verdict, not straight back: the other ranks are about to wait for ours.
  ShardedApply sharded;
  sharded.preflight = [&]() -> Status {
    TERN_REQUIRE(splits.size() == device_view.tensors.size(), kInvalidArgument, "island: ", splits.size(),
                 " splits for ", device_view.tensors.size(), " tensors");
    for (size_t t = 0; t < splits.size(); ++t) {
      TERN_ASSIGN_OR_RETURN(TpShard s, ShardOf(*device_view.tensors[t].desc, splits[t], nranks_, rank_));
      sharded.shards.push_back(s);
    }
    return Status::Ok();
  }();
  sharded.all_reduce = [this](uint64_t* sums, uint64_t count, void* stream) {
    return AllReduceSum(sums, count, stream);
  };
  return ApplyOnDevice(device_view, bytes, current_digest, options, new_digest, &sharded);
}

}  // namespace tern
