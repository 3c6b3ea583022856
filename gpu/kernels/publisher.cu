// GpuPublisher (include/tern/gpu.h): publishing from device tensors with the
// previous view kept by the publisher, on the device or in mapped pinned
// host memory (GpuDiff reads it over PCIe then).
#include <algorithm>
#include <utility>

#include "gpu/kernels/cuda_util.h"
#include "tern/gpu.h"

namespace tern {

Result<std::unique_ptr<GpuPublisher>> GpuPublisher::Create(const ServeView& initial, uint64_t version, Keep keep,
                                                           const GpuOptions& options) {
  using namespace gpu;
  TERN_RETURN_IF_ERROR(RequireDevice());
  TERN_RETURN_IF_ERROR(CheckDeviceView(initial));
  std::unique_ptr<GpuPublisher> p(new GpuPublisher());
  p->keep_ = keep;
  p->options_ = options;
  p->version_ = version;
  cudaStream_t stream = static_cast<cudaStream_t>(options.stream);
  for (const TensorRef& t : initial.tensors) {
    p->descs_.push_back(*t.desc);
    void* buf = nullptr;
    const uint64_t bytes = std::max<uint64_t>(t.desc->bytes(), 1);
    if (keep == Keep::kDevice) {
      TERN_CUDA_RETURN_IF_ERROR(cudaMalloc(&buf, bytes));
    } else {
      TERN_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&buf, bytes, cudaHostAllocMapped));
    }
    p->buffers_.push_back(buf);  // owned from here on, freed by ~GpuPublisher
    if (t.desc->bytes() > 0)
      TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buf, t.data, t.desc->bytes(), cudaMemcpyDefault, stream));
  }
  TERN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  TERN_ASSIGN_OR_RETURN(p->digest_, GpuComputeDigest(p->Kept(), options));
  // Explicit: nvcc does not move a local into the Result implicitly.
  return Result<std::unique_ptr<GpuPublisher>>(std::move(p));
}

GpuPublisher::~GpuPublisher() {
  for (void* b : buffers_) {
    if (keep_ == Keep::kDevice) {
      cudaFree(b);
    } else {
      cudaFreeHost(b);
    }
  }
}

ServeView GpuPublisher::Kept() const {
  ServeView v;
  for (size_t i = 0; i < descs_.size(); ++i) v.tensors.push_back({&descs_[i], static_cast<const uint8_t*>(buffers_[i])});
  return v;
}

Result<std::vector<uint8_t>> GpuPublisher::Publish(const ServeView& current, uint64_t version,
                                                   const DiffOptions& diff) {
  DiffOptions d = diff;
  d.base_version = version_;
  d.target_version = version;
  TERN_ASSIGN_OR_RETURN(std::vector<uint8_t> patch, GpuDiff(Kept(), current, d, options_, &digest_));
  // Our own, just-written patch: its target digest sits at a fixed offset
  // (file header 32 bytes, then the manifest's target_digest at 48).
  constexpr size_t kTargetDigestAt = 32 + 48;
  TERN_ASSERT(patch.size() >= kTargetDigestAt + 32);
  cudaStream_t stream = static_cast<cudaStream_t>(options_.stream);
  for (size_t i = 0; i < descs_.size(); ++i)
    if (descs_[i].bytes() > 0)
      TERN_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(buffers_[i], current.tensors[i].data, descs_[i].bytes(), cudaMemcpyDefault, stream));
  TERN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  digest_ = ViewDigest::FromBytes(patch.data() + kTargetDigestAt);
  version_ = version;
  return patch;
}

}  // namespace tern
