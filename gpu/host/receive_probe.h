// Which way received bytes can reach GPU memory (tern/gpu.h,
// ProbeGpuReceive): the facts gathered from the machine, and the choice made
// from them as a pure function so that gpu/host/receive_probe_test.cc checks the
// choice for machines this one is not. Internal to gpu/.
#pragma once

#include <string>

#include "tern/gpu.h"

namespace tern::gpu {

struct ReceiveFacts {
  int cuda_devices = 0;
  std::string cuda_reason;         // why none, when cuda_devices == 0
  bool verbs_loaded = false;       // libibverbs.so.1
  bool verbs_dmabuf = false;       // it exports ibv_reg_dmabuf_mr (rdma-core >= 34)
  int rdma_devices = 0;            // ibv_get_device_list
  bool peermem = false;            // the nvidia_peermem kernel module is loaded
  bool ucx_cuda = false;           // UCX's CUDA transport module is installed
};

GpuReceiveProbe ChooseReceivePath(const ReceiveFacts& f);
ReceiveFacts GatherReceiveFacts();

}  // namespace tern::gpu
