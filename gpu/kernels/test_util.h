// Helpers of the GPU device tests (gpu_test.cc, gpu_format2_test.cc): the
// skip rule, device copies of host views, golden files, physical views.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "patch/test_util.h"
#include "tern/gpu.h"
#include "tern/patch.h"
#include "tern/thread_pool.h"

namespace tern::gpu_test {

// Skips without a device, or fails where one is required (TERN_REQUIRE_GPU
// set, as bench/gpu_check.sh does: a silent skip there would hide a broken
// driver setup behind a green run).
#define SKIP_WITHOUT_GPU()                                                           \
  do {                                                                               \
    const GpuProbe probe = ProbeGpu();                                               \
    if (probe.devices == 0) {                                                        \
      if (std::getenv("TERN_REQUIRE_GPU") != nullptr) FAIL() << "no GPU: " << probe.reason; \
      GTEST_SKIP() << "no GPU here: " << probe.reason;                               \
    }                                                                                \
  } while (0)

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

// Device copies of a host view's tensors, freed at the end of the test.
struct DeviceView {
  std::vector<void*> buffers;
  MutableServeView view;
  explicit DeviceView(const ServeView& host) {
    for (const TensorRef& t : host.tensors) {
      void* p = nullptr;
      EXPECT_EQ(cudaMalloc(&p, std::max<uint64_t>(t.desc->bytes(), 1)), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(p, t.data, t.desc->bytes(), cudaMemcpyHostToDevice), cudaSuccess);
      buffers.push_back(p);
      view.tensors.push_back({t.desc, static_cast<uint8_t*>(p)});
    }
  }
  ~DeviceView() {
    for (void* p : buffers) cudaFree(p);
  }
  std::vector<uint8_t> Download(size_t t) const {
    std::vector<uint8_t> out(view.tensors[t].desc->bytes());
    EXPECT_EQ(cudaMemcpy(out.data(), view.tensors[t].data, out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
};

inline std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing golden file " << path;
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), {});
}

// A served float view with the physics CONTEXT exploits (patch/test_util.h):
// one tensor of each dtype with an exponent field (F4 of odd length) and one
// without, so a format-2 Diff writes CONTEXT records beside the others.
inline testing::OwnedView PhysicalView(std::mt19937_64& rng, uint64_t scale) {
  testing::OwnedView v;
  v.Add("a.bf16", DType::kBF16, {8, scale / 8});
  v.Add("b.f4", DType::kF4, {scale + 1});
  v.Add("c.f8", DType::kF8E4M3, {scale});
  v.Add("d.f32", DType::kF32, {scale / 2});
  v.Add("e.u8", DType::kU8, {scale / 4});
  v.Add("f.f16", DType::kF16, {scale / 2});
  for (size_t t = 0; t < v.descs.size(); ++t) {
    if (v.descs[t].dtype == DType::kU8) {
      testing::FillRandom(v.data[t], rng);
    } else {
      testing::PhysicalFill(v.data[t], v.descs[t].dtype, v.descs[t].elements(), rng);
    }
  }
  return v;
}

inline Result<std::vector<uint8_t>> DiffFormat2(const testing::OwnedView& a, const testing::OwnedView& b,
                                         uint64_t segment_elements, ThreadPool& pool, uint64_t* context_records) {
  DiffOptions opt;
  opt.segment_elements = segment_elements;
  opt.format_version = 2;
  opt.nibble_coding = false;  // the GPU apply takes versions 1 and 2 (patch_walk.cc)
  auto patch = Diff(a.View(), b.View(), opt, pool);
  if (!patch.ok()) return patch;
  auto info = Inspect(*patch);
  if (!info.ok()) return info.status();
  *context_records = 0;
  for (const auto& t : info->tensors) *context_records += t.context_segments;
  return patch;
}

}  // namespace tern::gpu_test
