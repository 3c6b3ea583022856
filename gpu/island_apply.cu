// NcclIsland::ApplyFromRoot (include/tern/gpu.h): the root's patch reaches
// every rank of the island over NCCL, then each rank applies it on its GPU.
#include <vector>

#include "gpu/cuda_util.h"
#include "tern/gpu.h"

namespace tern {

Status NcclIsland::ApplyFromRoot(MutableServeView& device_view, std::span<const uint8_t> patch, int root,
                                 const ViewDigest& current_digest, const GpuOptions& options,
                                 ViewDigest* new_digest) {
  using namespace gpu;
  TERN_REQUIRE(root >= 0 && root < nranks_, kInvalidArgument, "root ", root, " of ", nranks_);
  TERN_RETURN_IF_ERROR(RequireDevice());
  cudaStream_t stream = static_cast<cudaStream_t>(options.stream);
  const bool is_root = rank_ == root;
  // The size first, so that every rank can allocate the bytes' buffer.
  DeviceBuffer d_size;
  TERN_RETURN_IF_ERROR(d_size.Allocate(sizeof(uint64_t), stream));
  uint64_t size = is_root ? patch.size() : 0;
  if (is_root)
    TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_size.as<void>(), &size, sizeof(size), cudaMemcpyHostToDevice, stream));
  TERN_RETURN_IF_ERROR(Broadcast(d_size.as<void>(), sizeof(size), root, stream));
  TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&size, d_size.as<void>(), sizeof(size), cudaMemcpyDeviceToHost, stream));
  TERN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  // A bound before allocating: the root's patch is validated by GpuApply on
  // every rank, but its announced size is trusted only this far.
  TERN_REQUIRE(size >= 1 && size <= (uint64_t{1} << 40), kCorrupt, "island: root announced a patch of ", size,
               " bytes");
  DeviceBuffer d_patch;
  TERN_RETURN_IF_ERROR(d_patch.Allocate(size, stream));
  if (is_root)
    TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_patch.as<void>(), patch.data(), size, cudaMemcpyHostToDevice, stream));
  TERN_RETURN_IF_ERROR(Broadcast(d_patch.as<void>(), size, root, stream));
  std::vector<uint8_t> received;
  if (!is_root) {
    // GpuApply verifies the patch's checksums on the host, so the bytes come
    // back (a patch is ~1% of the view; the view itself stays on the GPU).
    received.resize(size);
    TERN_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(received.data(), d_patch.as<void>(), size, cudaMemcpyDeviceToHost, stream));
  }
  TERN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return GpuApply(device_view, is_root ? patch : std::span<const uint8_t>(received), current_digest, options,
                  new_digest);
}

}  // namespace tern
