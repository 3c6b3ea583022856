// The receive-path choice (gpu/host/receive_probe.h) for machines this one is
// not, and the probe on this one.
#include "gpu/host/receive_probe.h"

#include <gtest/gtest.h>

#include <iostream>

namespace tern::gpu {
namespace {

ReceiveFacts GpuWithNic() {
  ReceiveFacts f;
  f.cuda_devices = 8;
  f.verbs_loaded = true;
  f.rdma_devices = 4;
  return f;
}

TEST(GpuReceiveProbe, PicksTheBestPathTheFactsAllow) {
  ReceiveFacts f = GpuWithNic();
  f.verbs_dmabuf = true;
  f.peermem = true;
  f.ucx_cuda = true;
  EXPECT_EQ(ChooseReceivePath(f).best, GpuReceivePath::kVerbsDmaBuf);
  f.verbs_dmabuf = false;
  EXPECT_EQ(ChooseReceivePath(f).best, GpuReceivePath::kVerbsPeermem);
  f.peermem = false;
  EXPECT_EQ(ChooseReceivePath(f).best, GpuReceivePath::kUcxCuda);
  f.rdma_devices = 0;  // UCX with CUDA still registers device memory (e.g. over shared memory or TCP)
  EXPECT_EQ(ChooseReceivePath(f).best, GpuReceivePath::kUcxCuda);
  f.ucx_cuda = false;
  const GpuReceiveProbe p = ChooseReceivePath(f);
  EXPECT_EQ(p.best, GpuReceivePath::kStagingRing);
  EXPECT_TRUE(p.device);
  EXPECT_NE(p.reason.find("0 RDMA devices"), std::string::npos) << p.reason;
  EXPECT_NE(p.reason.find("libuct_cuda"), std::string::npos) << p.reason;
}

TEST(GpuReceiveProbe, EveryDirectPathNeedsADevice) {
  ReceiveFacts f = GpuWithNic();
  f.verbs_dmabuf = f.peermem = f.ucx_cuda = true;
  f.cuda_devices = 0;
  f.cuda_reason = "cudaErrorNoDevice";
  const GpuReceiveProbe p = ChooseReceivePath(f);
  EXPECT_EQ(p.best, GpuReceivePath::kStagingRing);
  EXPECT_FALSE(p.device);
  EXPECT_NE(p.reason.find("no CUDA device (cudaErrorNoDevice)"), std::string::npos) << p.reason;
  EXPECT_NE(p.reason.find("needs a CUDA device too"), std::string::npos) << p.reason;
}

TEST(GpuReceiveProbe, TernUsesTheStagingRingAndSaysWhy) {
  ReceiveFacts f = GpuWithNic();
  f.verbs_dmabuf = true;
  const GpuReceiveProbe p = ChooseReceivePath(f);
  EXPECT_EQ(p.best, GpuReceivePath::kVerbsDmaBuf);
  EXPECT_EQ(p.used, GpuReceivePath::kStagingRing);
  EXPECT_NE(p.reason.find("do not register device memory yet"), std::string::npos) << p.reason;
  EXPECT_STREQ(GpuReceivePathName(p.best), "verbs+dma-buf");
}

// This machine: whatever it has, without a GPU the answer is the staging
// ring with the reason (the requirement); with one, the probe still
// answers with a reason for every better path it could not take.
TEST(GpuReceiveProbe, ThisMachine) {
  const GpuReceiveProbe p = ProbeGpuReceive();
  std::cout << "receive path: best " << GpuReceivePathName(p.best) << ", used " << GpuReceivePathName(p.used)
            << "; " << p.reason << "\n";
  EXPECT_EQ(p.used, GpuReceivePath::kStagingRing);
  EXPECT_FALSE(p.reason.empty());
  if (!p.device) {
    EXPECT_EQ(p.best, GpuReceivePath::kStagingRing);
    EXPECT_NE(p.reason.find("no CUDA device"), std::string::npos) << p.reason;
  }
}

}  // namespace
}  // namespace tern::gpu
