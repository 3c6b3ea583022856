#include "gpu/host/receive_probe.h"

#include <dlfcn.h>
#include <unistd.h>

#include <array>

namespace tern {

const char* GpuReceivePathName(GpuReceivePath path) {
  switch (path) {
    case GpuReceivePath::kVerbsDmaBuf: return "verbs+dma-buf";
    case GpuReceivePath::kVerbsPeermem: return "verbs+nvidia-peermem";
    case GpuReceivePath::kUcxCuda: return "ucx+cuda";
    case GpuReceivePath::kStagingRing: return "staging ring";
  }
  return "?";
}

namespace gpu {

GpuReceiveProbe ChooseReceivePath(const ReceiveFacts& f) {
  GpuReceiveProbe p;
  p.device = f.cuda_devices > 0;
  std::string why;
  auto add = [&](const std::string& s) { why += (why.empty() ? "" : "; ") + s; };
  // Every direct path needs a device to register; the verbs ones an RDMA NIC.
  const std::string no_device = "no CUDA device (" + f.cuda_reason + ")";
  std::string verbs_out;
  if (!f.verbs_loaded) {
    verbs_out = "libibverbs.so.1 not loadable";
  } else if (f.rdma_devices == 0) {
    verbs_out = "libibverbs loaded, 0 RDMA devices";
  }
  if (!p.device) {
    add(no_device);
  }
  const bool verbs_ok = p.device && verbs_out.empty();
  if (verbs_ok && f.verbs_dmabuf) {
    p.best = GpuReceivePath::kVerbsDmaBuf;
  } else if (verbs_ok && f.peermem) {
    p.best = GpuReceivePath::kVerbsPeermem;
  } else if (p.device && f.ucx_cuda) {
    p.best = GpuReceivePath::kUcxCuda;
  } else {
    p.best = GpuReceivePath::kStagingRing;
  }
  if (p.best != GpuReceivePath::kVerbsDmaBuf)
    add("verbs+dma-buf: " + (!verbs_out.empty() ? verbs_out
                             : !f.verbs_dmabuf  ? std::string("libibverbs has no ibv_reg_dmabuf_mr")
                                                : no_device));
  if (p.best != GpuReceivePath::kVerbsDmaBuf && p.best != GpuReceivePath::kVerbsPeermem)
    add("verbs+nvidia-peermem: " + (!verbs_out.empty() ? verbs_out
                                    : !f.peermem       ? std::string("nvidia_peermem module not loaded")
                                                       : no_device));
  if (p.best == GpuReceivePath::kStagingRing)
    add(std::string("ucx+cuda: ") + (!f.ucx_cuda ? "UCX's CUDA transport (libuct_cuda) not installed" : "no CUDA device"));
  if (p.best != GpuReceivePath::kStagingRing)
    add(std::string("best is ") + GpuReceivePathName(p.best) +
        ", but the transports do not register device memory yet: received bytes take the staging ring");
  if (!p.device) add("the staging ring needs a CUDA device too");
  p.used = GpuReceivePath::kStagingRing;
  p.reason = why;
  return p;
}

ReceiveFacts GatherReceiveFacts() {
  ReceiveFacts f;
  const GpuProbe g = ProbeGpu();
  f.cuda_devices = g.devices;
  f.cuda_reason = g.reason;
  // libibverbs's C ABI, declared here as nccl_island.cc does NCCL's: no
  // header needed, and nothing linked.
  if (void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL)) {
    f.verbs_loaded = true;
    f.verbs_dmabuf = dlsym(lib, "ibv_reg_dmabuf_mr") != nullptr;
    using GetList = void** (*)(int*);
    using FreeList = void (*)(void**);
    auto get = reinterpret_cast<GetList>(dlsym(lib, "ibv_get_device_list"));
    auto free_list = reinterpret_cast<FreeList>(dlsym(lib, "ibv_free_device_list"));
    if (get != nullptr && free_list != nullptr) {
      int n = 0;
      if (void** list = get(&n)) {
        f.rdma_devices = n;
        free_list(list);
      }
    }
    dlclose(lib);
  }
  f.peermem = access("/sys/module/nvidia_peermem", F_OK) == 0;
  // UCX loads its transports as modules from <libdir>/ucx; the CUDA one
  // exists only in a UCX built with CUDA.
  static constexpr std::array<const char*, 4> kUctCuda = {
      "/usr/lib/x86_64-linux-gnu/ucx/libuct_cuda.so.0", "/usr/lib/aarch64-linux-gnu/ucx/libuct_cuda.so.0",
      "/usr/lib64/ucx/libuct_cuda.so.0", "/usr/local/lib/ucx/libuct_cuda.so.0"};
  for (const char* path : kUctCuda) f.ucx_cuda = f.ucx_cuda || access(path, F_OK) == 0;
  return f;
}

}  // namespace gpu

GpuReceiveProbe ProbeGpuReceive() { return gpu::ChooseReceivePath(gpu::GatherReceiveFacts()); }

}  // namespace tern
