// CUDA runtime plumbing shared by gpu/*.cu: errors as Status, stream-ordered
// scratch, launch geometry. Internal; included only by CUDA sources.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "tern/dtype.h"
#include "tern/status.h"

namespace tern::gpu {

// The CUDA call's error as a Status (kUnavailable when there is no usable
// device or driver, kResourceExhausted when memory runs out, else kInternal).
Status CudaStatus(cudaError_t e, const char* what);

#define TERN_CUDA_RETURN_IF_ERROR(call)                                   \
  do {                                                                    \
    const cudaError_t tern_cuda_e = (call);                               \
    if (tern_cuda_e != cudaSuccess) return ::tern::gpu::CudaStatus(tern_cuda_e, #call); \
  } while (0)

// Fails with kUnavailable (and the probe's reason) when no device is usable.
Status RequireDevice();

// kInvalidArgument unless `ptr` is memory the current device can address
// (device, managed, or mapped pinned host memory) aligned to `align` bytes.
// A kernel that touched anything else would fail with a sticky error that
// ends the process's CUDA context, so every view is checked before launch.
Status CheckDevicePointer(const void* ptr, uint64_t align, const std::string& what);

// CheckDevicePointer for every non-empty tensor of a view.
template <class View>
Status CheckDeviceView(const View& view) {
  for (const auto& t : view.tensors) {
    if (t.desc->bytes() == 0) continue;
    const int w = ElementBits(t.desc->dtype);
    TERN_RETURN_IF_ERROR(CheckDevicePointer(t.data, w >= 8 ? w / 8 : 1, "tensor '" + t.desc->name + "'"));
  }
  return Status::Ok();
}

// Device scratch, allocated and freed in stream order (cudaMallocAsync), so a
// call's temporaries never force a device-wide synchronisation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Release(); }

  Status Allocate(uint64_t bytes, cudaStream_t stream) {
    Release();
    stream_ = stream;
    if (bytes == 0) return Status::Ok();
    TERN_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&ptr_, bytes, stream));
    bytes_ = bytes;
    return Status::Ok();
  }
  void Release() {
    if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  uint64_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  uint64_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;
};

// Grid for n work items of `block` threads, capped so that grid-stride
// loops cover the rest (64-bit counts never overflow the grid dimension).
inline unsigned GridFor(uint64_t n, unsigned block) {
  const uint64_t want = (n + block - 1) / block;
  return static_cast<unsigned>(want < 65535u * 16 ? (want == 0 ? 1 : want) : 65535u * 16);
}

}  // namespace tern::gpu
