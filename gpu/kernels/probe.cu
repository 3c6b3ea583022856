// The run-time probe and the CUDA error mapping. The runtime is linked
// statically and opens libcuda.so itself on first use, so this runs (and
// answers "no driver") on machines without a GPU.
#include "gpu/kernels/cuda_util.h"
#include "tern/gpu.h"

namespace tern {
namespace gpu {

Status CudaStatus(cudaError_t e, const char* what) {
  const std::string msg = std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorNoKernelImageForDevice:
      return Status(Code::kUnavailable, msg);
    case cudaErrorMemoryAllocation:
      return Status(Code::kResourceExhausted, msg);
    default:
      return Status(Code::kInternal, msg);
  }
}

Status RequireDevice() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // the probe's error is not sticky; clear it
    return CudaStatus(e, "no usable GPU: cudaGetDeviceCount");
  }
  TERN_REQUIRE(n > 0, kUnavailable, "no usable GPU: no CUDA device");
  return Status::Ok();
}

Status CheckDevicePointer(const void* ptr, uint64_t align, const std::string& what) {
  TERN_REQUIRE(ptr != nullptr, kInvalidArgument, what, ": null pointer");
  TERN_REQUIRE(reinterpret_cast<uintptr_t>(ptr) % align == 0, kInvalidArgument, what, ": address not aligned to ",
               align, " bytes");
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(e, (what + ": cudaPointerGetAttributes").c_str());
  }
  const bool usable = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged ||
                      (attr.type == cudaMemoryTypeHost && attr.devicePointer == ptr);
  TERN_REQUIRE(usable, kInvalidArgument, what, ": not device memory (nor managed or mapped pinned host memory)");
  return Status::Ok();
}

}  // namespace gpu

GpuProbe ProbeGpu() {
  GpuProbe p;
  p.built_with_cuda = true;
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    p.reason = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    return p;
  }
  p.devices = n;
  if (n == 0) {
    p.reason = "no CUDA device";
    return p;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) p.device_name = prop.name;
  return p;
}

}  // namespace tern
