// GpuStagingUpload (include/tern/gpu.h): the staging ring (gpu/host/staging_ring.h)
// on CUDA: pinned slots from cudaHostAlloc, each slot's copy a
// cudaMemcpyAsync on the caller's stream followed by an event, so "done" is
// cudaEventQuery and "wait" cudaEventSynchronize. Copies on one stream run in
// submission order, as the ring's done prefix assumes.
#include <memory>
#include <vector>

#include "gpu/host/staging_ring.h"
#include "gpu/kernels/cuda_util.h"
#include "tern/gpu.h"

namespace tern {
namespace gpu {
namespace {

class CudaCopyEngine : public CopyEngine {
 public:
  CudaCopyEngine(uint8_t* dst, cudaStream_t stream, std::vector<cudaEvent_t> events)
      : dst_(dst), stream_(stream), events_(std::move(events)) {}
  Status Start(int slot, const uint8_t* src, uint64_t n, uint64_t off) override {
    TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst_ + off, src, n, cudaMemcpyHostToDevice, stream_));
    TERN_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[slot], stream_));
    return Status::Ok();
  }
  Result<bool> Done(int slot) override {
    const cudaError_t e = cudaEventQuery(events_[slot]);
    if (e == cudaErrorNotReady) {
      cudaGetLastError();  // not an error; do not leave it for the next check
      return false;
    }
    if (e != cudaSuccess) return CudaStatus(e, "cudaEventQuery");
    return true;
  }
  Status Wait(int slot) override {
    TERN_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(events_[slot]));
    return Status::Ok();
  }

 private:
  uint8_t* dst_;
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
};

}  // namespace
}  // namespace gpu

struct GpuStagingUpload::Impl {
  std::vector<uint8_t*> slots;
  std::vector<cudaEvent_t> events;
  std::unique_ptr<gpu::CudaCopyEngine> engine;
  std::unique_ptr<gpu::StagingRing> ring;
  cudaStream_t stream = nullptr;
  ~Impl() {
    if (ring) (void)ring->Drain();  // no copy may read a freed slot
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    for (uint8_t* s : slots) cudaFreeHost(s);
  }
};

GpuStagingUpload::GpuStagingUpload(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuStagingUpload::~GpuStagingUpload() = default;

Result<std::unique_ptr<GpuStagingUpload>> GpuStagingUpload::Create(void* device_dst, uint64_t dst_bytes, int slots,
                                                                   uint64_t slot_bytes, const GpuOptions& options) {
  using namespace gpu;
  TERN_REQUIRE(slots >= 1 && slots <= 64, kInvalidArgument, "staging upload: slots must be in [1, 64], got ", slots);
  TERN_REQUIRE(slot_bytes >= 1 && slot_bytes <= (uint64_t{1} << 30), kInvalidArgument,
               "staging upload: slot_bytes must be in [1, 1 GiB], got ", slot_bytes);
  TERN_RETURN_IF_ERROR(RequireDevice());
  TERN_RETURN_IF_ERROR(CheckDevicePointer(device_dst, 1, "staging upload destination"));
  auto impl = std::make_unique<Impl>();
  impl->stream = static_cast<cudaStream_t>(options.stream);
  for (int i = 0; i < slots; ++i) {
    void* p = nullptr;
    TERN_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&p, slot_bytes, cudaHostAllocDefault));
    impl->slots.push_back(static_cast<uint8_t*>(p));
    cudaEvent_t e;
    TERN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    impl->events.push_back(e);
  }
  impl->engine = std::make_unique<CudaCopyEngine>(static_cast<uint8_t*>(device_dst), impl->stream, impl->events);
  impl->ring = std::make_unique<StagingRing>(impl->slots, slot_bytes, dst_bytes, impl->engine.get());
  return std::unique_ptr<GpuStagingUpload>(new GpuStagingUpload(std::move(impl)));
}

Result<std::span<uint8_t>> GpuStagingUpload::Acquire() { return impl_->ring->Acquire(); }
Status GpuStagingUpload::Submit(uint64_t bytes) { return impl_->ring->Submit(bytes); }
Status GpuStagingUpload::Push(std::span<const uint8_t> data) { return impl_->ring->Push(data); }
Status GpuStagingUpload::Drain() { return impl_->ring->Drain(); }
uint64_t GpuStagingUpload::bytes_done() const { return impl_->ring->bytes_done(); }

}  // namespace tern
