// The GPU API in a build without nvcc: every call answers kUnavailable, so
// callers take the CPU path by the same run-time check as on a machine
// without a GPU (ProbeGpu().devices == 0).
#include "tern/gpu.h"

namespace tern {
namespace {
constexpr const char* kWhy = "this build of tern has no GPU path (built without nvcc)";
}

GpuProbe ProbeGpu() {
  GpuProbe p;
  p.reason = kWhy;
  return p;
}

Status GpuApply(MutableServeView&, std::span<const uint8_t>, const ViewDigest&, const GpuOptions&, ViewDigest*) {
  return TERN_ERROR(kUnavailable, kWhy);
}
Result<ViewDigest> GpuComputeDigest(const ServeView&, const GpuOptions&) { return TERN_ERROR(kUnavailable, kWhy); }
Result<std::vector<uint8_t>> GpuDiff(const ServeView&, const ServeView&, const DiffOptions&, const GpuOptions&,
                                     const ViewDigest*) {
  return TERN_ERROR(kUnavailable, kWhy);
}
Result<GpuQuantStats> GpuQuantize(const QuantSpec&, DType, const void*, const std::vector<uint64_t>&,
                                  std::span<void* const>, bool, const ScalePolicy&, const GpuOptions&) {
  return TERN_ERROR(kUnavailable, kWhy);
}

Result<std::unique_ptr<GpuPublisher>> GpuPublisher::Create(const ServeView&, uint64_t, Keep, const GpuOptions&) {
  return TERN_ERROR(kUnavailable, kWhy);
}
GpuPublisher::~GpuPublisher() = default;
Result<std::vector<uint8_t>> GpuPublisher::Publish(const ServeView&, uint64_t, const DiffOptions&) {
  return TERN_ERROR(kUnavailable, kWhy);
}
ServeView GpuPublisher::Kept() const { return {}; }
struct GpuStagingUpload::Impl {};
GpuStagingUpload::GpuStagingUpload(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuStagingUpload::~GpuStagingUpload() = default;
Result<std::unique_ptr<GpuStagingUpload>> GpuStagingUpload::Create(void*, uint64_t, int, uint64_t, const GpuOptions&) {
  return TERN_ERROR(kUnavailable, kWhy);
}
Result<std::span<uint8_t>> GpuStagingUpload::Acquire() { return TERN_ERROR(kUnavailable, kWhy); }
Status GpuStagingUpload::Submit(uint64_t) { return TERN_ERROR(kUnavailable, kWhy); }
Status GpuStagingUpload::Push(std::span<const uint8_t>) { return TERN_ERROR(kUnavailable, kWhy); }
Status GpuStagingUpload::Drain() { return TERN_ERROR(kUnavailable, kWhy); }
uint64_t GpuStagingUpload::bytes_done() const { return 0; }

Status NcclIsland::ApplyShardsFromRoot(MutableServeView&, std::span<const uint8_t>, int, const std::vector<GpuTpSplit>&,
                                       const ViewDigest&, const GpuOptions&, ViewDigest*) {
  return TERN_ERROR(kUnavailable, kWhy);
}
Status NcclIsland::ApplyFromRoot(MutableServeView&, std::span<const uint8_t>, int, const ViewDigest&,
                                 const GpuOptions&, ViewDigest*) {
  return TERN_ERROR(kUnavailable, kWhy);
}

}  // namespace tern
