// GPU path throughput against a device-to-device copy measured in the same
// run (docs/gpu.md, "Benchmarks"; run by bench/gpu_check.sh). Every result
// is also checked bit for bit against the CPU codec before it is reported:
// the applied view's digest, the encoded patch's bytes.
//
//   gpu_bench [--elements N] [--tensors T] [--densities 0.01,0.001] [--reps R]
//
// The view is T BF16 tensors of N elements in all. Reported per density:
// apply and encode (GpuDiff) time, and their ratio to the time of one
// cudaMemcpy of the whole view (device to device): a ratio of 1 is "as fast
// as copying the view". Goal: apply >= 0.5 at 1% changed, so that applying
// a patch never costs more than twice a copy of the view (docs/gpu.md).
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/host/patch_walk.h"
#include "tern/gpu.h"
#include "tern/patch.h"
#include "tern/quantize.h"
#include "tern/thread_pool.h"
#include "tests/support/owned_view.h"

namespace tern {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

#define CHECK_CUDA(call)                                                                  \
  do {                                                                                    \
    const cudaError_t e_ = (call);                                                        \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));                    \
      std::exit(2);                                                                       \
    }                                                                                     \
  } while (0)

void Die(const Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  std::exit(2);
}

struct DeviceCopy {
  std::vector<void*> buffers;
  MutableServeView view;
  explicit DeviceCopy(const ServeView& host) {
    for (const TensorRef& t : host.tensors) {
      void* p = nullptr;
      CHECK_CUDA(cudaMalloc(&p, t.desc->bytes()));
      CHECK_CUDA(cudaMemcpy(p, t.data, t.desc->bytes(), cudaMemcpyHostToDevice));
      buffers.push_back(p);
      view.tensors.push_back({t.desc, static_cast<uint8_t*>(p)});
    }
  }
  ~DeviceCopy() {
    for (void* p : buffers) cudaFree(p);
  }
  void CopyFrom(const DeviceCopy& o) {
    for (size_t i = 0; i < buffers.size(); ++i)
      CHECK_CUDA(cudaMemcpy(buffers[i], o.buffers[i], view.tensors[i].desc->bytes(), cudaMemcpyDeviceToDevice));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
};

// Random BF16-like bits, then about density * n changes at geometric gaps,
// mostly +-1 ulp (an RL step's typical change), some larger.
void Fill(std::vector<uint8_t>& d, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i + 8 <= d.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(d.data() + i, &v, 8);
  }
}
uint64_t Mutate(std::vector<uint8_t>& d, double density, uint64_t seed) {
  if (density <= 0) return 0;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(1e-12, 1.0);
  const uint64_t n = d.size() / 2;
  uint64_t changes = 0;
  const double lg = std::log1p(-std::min(density, 0.999999));
  for (uint64_t i = static_cast<uint64_t>(std::log(u(rng)) / lg); i < n;
       i += 1 + static_cast<uint64_t>(std::log(u(rng)) / lg)) {
    uint16_t v;
    std::memcpy(&v, d.data() + 2 * i, 2);
    const uint64_t r = rng() % 8;
    v = static_cast<uint16_t>(v + (r < 3 ? 1 : r < 6 ? 0xFFFF : 1 + rng() % 64));
    std::memcpy(d.data() + 2 * i, &v, 2);
    ++changes;
  }
  return changes;
}

}  // namespace
}  // namespace tern

int main(int argc, char** argv) {
  using namespace tern;
  uint64_t elements = uint64_t{1} << 30;
  uint32_t tensors = 32;
  std::vector<double> densities = {0.01, 0.001, 0.1};
  int reps = 5;
  uint64_t quant_elements = uint64_t{1} << 28;
  CLI::App app("GPU path throughput against a device-to-device copy (docs/gpu.md)", "gpu_bench");
  app.add_option("--elements", elements, "BF16 elements in the view")->check(CLI::Range(uint64_t{1} << 16, uint64_t{1} << 36));
  app.add_option("--tensors", tensors, "tensors the view is split into")->check(CLI::Range(1, 4096));
  app.add_option("--densities", densities, "fractions of elements changed")->delimiter(',');
  app.add_option("--reps", reps, "repetitions (best is reported)")->check(CLI::Range(1, 100));
  app.add_option("--quant-elements", quant_elements, "F32 master elements for the quantize timings (0: skip)");
  CLI11_PARSE(app, argc, argv);

  const GpuProbe probe = ProbeGpu();
  if (probe.devices == 0) {
    std::fprintf(stderr, "gpu_bench: no GPU: %s\n", probe.reason.c_str());
    return 2;
  }
  std::printf("device: %s\n", probe.device_name.c_str());
  // Keep the calls' scratch mapped between calls (tern/gpu.h, "Memory"), as
  // an engine that applies every step would.
  {
    cudaMemPool_t mem_pool;
    CHECK_CUDA(cudaDeviceGetDefaultMemPool(&mem_pool, 0));
    uint64_t keep = ~uint64_t{0};
    CHECK_CUDA(cudaMemPoolSetAttribute(mem_pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }
  ThreadPool pool(0);
  const uint64_t per = std::max<uint64_t>(elements / tensors, 1);
  testing::OwnedView base;
  for (uint32_t t = 0; t < tensors; ++t) {
    char name[32];
    std::snprintf(name, sizeof(name), "layer.%04u.weight", t);
    base.Add(name, DType::kBF16, {per});
    Fill(base.data.back(), t + 1);
  }
  const ServeView base_view = base.View();
  const uint64_t view_bytes = base_view.total_bytes();
  const ViewDigest base_digest = ComputeDigest(base_view, pool);
  DeviceCopy pristine(base_view), work(base_view), target_dev(base_view);

  // The yardstick: one D2D copy of the whole view (best of reps).
  double copy_s = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    work.CopyFrom(pristine);
    copy_s = std::min(copy_s, Seconds(t0, Clock::now()));
  }
  std::printf("view: %u BF16 tensors, %.3f GB; D2D copy %.3f ms (%.0f GB/s read+write %.0f GB/s)\n", tensors,
              view_bytes / 1e9, copy_s * 1e3, view_bytes / copy_s / 1e9, 2 * view_bytes / copy_s / 1e9);
  {
    double s = 1e30;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      auto d = GpuComputeDigest(AsConst(pristine.view), {});
      s = std::min(s, Seconds(t0, Clock::now()));
      Die(d.status(), "GpuComputeDigest");
      if (*d != base_digest) Die(Status(Code::kInternal, "GPU digest differs from the CPU digest"), "digest");
    }
    std::printf("digest (full view): %.3f ms, %.2fx the D2D copy time\n", s * 1e3, s / copy_s);
  }
  std::printf("\n| changed | patch MB | apply ms | apply vs copy | of which host verify ms | upload ms |"
              " encode ms | encode vs copy | CPU apply ms | f2 patch MB (CONTEXT segs) | f2 apply ms |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|\n");
  bool goal_met = true;
  for (double density : densities) {
    testing::OwnedView next(base_view);
    uint64_t changes = 0;
    for (uint32_t t = 0; t < tensors; ++t) changes += Mutate(next.data[t], density, 1000 + t);
    const ServeView next_view = next.View();
    const ViewDigest next_digest = ComputeDigest(next_view, pool);
    DiffOptions v1;
    v1.format_version = 1;  // GpuDiff writes format 1; its bytes are compared below
    auto patch = Diff(base_view, next_view, v1, pool, &base_digest);
    Die(patch.status(), "Diff");
    // CPU apply, for reference (a private copy, exclusive view).
    double cpu_s = 1e30;
    {
      testing::OwnedView scratch(base_view);
      MutableServeView mv = scratch.Mutable();
      ApplyOptions ao;
      ao.exclusive_view = true;
      const auto t0 = Clock::now();
      Die(Apply(mv, *patch, base_digest, pool, ao), "CPU Apply");
      cpu_s = Seconds(t0, Clock::now());
    }
    double apply_s = 1e30;
    for (int r = 0; r < reps; ++r) {
      work.CopyFrom(pristine);
      ViewDigest out;
      const auto t0 = Clock::now();
      Die(GpuApply(work.view, *patch, base_digest, {}, &out), "GpuApply");
      apply_s = std::min(apply_s, Seconds(t0, Clock::now()));
    }
    // Format 2 (CONTEXT records decode against the view on the device).
    DiffOptions v2;
    v2.format_version = 2;
    v2.nibble_coding = false;  // the GPU apply takes versions 1 and 2 (patch_walk.cc)
    auto patch2 = Diff(base_view, next_view, v2, pool, &base_digest);
    Die(patch2.status(), "Diff format 2");
    auto info2 = Inspect(*patch2);
    Die(info2.status(), "Inspect");
    uint64_t context_segments = 0;
    for (const auto& t : info2->tensors) context_segments += t.context_segments;
    double apply2_s = 1e30;
    for (int r = 0; r < reps; ++r) {
      work.CopyFrom(pristine);
      ViewDigest out;
      const auto t0 = Clock::now();
      Die(GpuApply(work.view, *patch2, base_digest, {}, &out), "GpuApply format 2");
      apply2_s = std::min(apply2_s, Seconds(t0, Clock::now()));
    }
    {
      auto applied2 = GpuComputeDigest(AsConst(work.view), {});
      Die(applied2.status(), "GpuComputeDigest");
      if (*applied2 != next_digest)
        Die(Status(Code::kInternal, "GPU apply of format 2 differs from the target"), "apply f2");
    }
    work.CopyFrom(pristine);
    Die(GpuApply(work.view, *patch, base_digest, {}, nullptr), "GpuApply");
    // Where apply's time goes: the host's verification of the patch (every
    // checksum, gpu::WalkPatch) and its upload (pageable memory), the rest
    // being the kernels and the one synchronisation.
    double verify_s = 1e30, upload_s = 1e30;
    {
      void* d_patch = nullptr;
      CHECK_CUDA(cudaMalloc(&d_patch, std::max<size_t>(patch->size(), 1)));
      for (int r = 0; r < reps; ++r) {
        const auto t0 = Clock::now();
        auto wp = gpu::WalkPatch(*patch);
        verify_s = std::min(verify_s, Seconds(t0, Clock::now()));
        Die(wp.status(), "WalkPatch");
        const auto t1 = Clock::now();
        CHECK_CUDA(cudaMemcpy(d_patch, patch->data(), patch->size(), cudaMemcpyHostToDevice));
        upload_s = std::min(upload_s, Seconds(t1, Clock::now()));
      }
      cudaFree(d_patch);
    }
    auto applied = GpuComputeDigest(AsConst(work.view), {});
    Die(applied.status(), "GpuComputeDigest");
    if (*applied != next_digest) Die(Status(Code::kInternal, "GPU apply result differs from the target"), "apply");
    for (size_t i = 0; i < target_dev.buffers.size(); ++i)
      CHECK_CUDA(cudaMemcpy(target_dev.buffers[i], next.data[i].data(), next.data[i].size(), cudaMemcpyHostToDevice));
    double encode_s = 1e30;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      auto got = GpuDiff(AsConst(pristine.view), AsConst(target_dev.view), DiffOptions{}, {}, &base_digest);
      encode_s = std::min(encode_s, Seconds(t0, Clock::now()));
      Die(got.status(), "GpuDiff");
      if (*got != *patch) Die(Status(Code::kInternal, "GPU patch differs from the CPU patch"), "encode");
    }
    std::printf("| %.4g%% (%llu) | %.2f | %.3f | %.2f | %.3f | %.3f | %.3f | %.2f | %.1f | %.2f (%llu) | %.3f |\n",
                density * 100, static_cast<unsigned long long>(changes), patch->size() / 1e6, apply_s * 1e3,
                copy_s / apply_s, verify_s * 1e3, upload_s * 1e3, encode_s * 1e3, copy_s / encode_s, cpu_s * 1e3,
                patch2->size() / 1e6, static_cast<unsigned long long>(context_segments), apply2_s * 1e3);
    if (density == 0.01 && copy_s / apply_s < 0.5) goal_met = false;
  }
  std::printf("\n(\"vs copy\" = D2D copy time / operation time: 1.0 is as fast as copying the view.)\n");

  if (quant_elements > 0) {
    const uint64_t in = 4096, rows = std::max<uint64_t>(quant_elements / in, 128);
    const std::vector<uint64_t> shape = {rows, in};
    const uint64_t n = rows * in;
    std::vector<float> master(n);
    std::mt19937_64 rng(7);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (auto& v : master) v = normal(rng);
    void* d_master = nullptr;
    CHECK_CUDA(cudaMalloc(&d_master, n * 4));
    CHECK_CUDA(cudaMemcpy(d_master, master.data(), n * 4, cudaMemcpyHostToDevice));
    void* d_copy = nullptr;
    CHECK_CUDA(cudaMalloc(&d_copy, n * 4));
    double mcopy = 1e30;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      CHECK_CUDA(cudaMemcpy(d_copy, d_master, n * 4, cudaMemcpyDeviceToDevice));
      CHECK_CUDA(cudaDeviceSynchronize());
      mcopy = std::min(mcopy, Seconds(t0, Clock::now()));
    }
    std::printf("\nquantize %llu x %llu F32 master (%.2f GB; its D2D copy %.3f ms):\n\n| format | ms | vs copy |\n|---|---|---|\n",
                static_cast<unsigned long long>(rows), static_cast<unsigned long long>(in), n * 4 / 1e9, mcopy * 1e3);
    for (const char* f : {"bf16", "fp8-e4m3-block128", "fp8-e4m3-channel", "nvfp4", "mxfp4", "int4-g128",
                          "gptq-int4-g128"}) {
      auto spec = ParseQuantFormat(f);
      Die(spec.status(), f);
      auto cpu = Quantize(*spec, master.data(), shape, nullptr, ScalePolicy{});
      Die(cpu.status(), "Quantize");
      std::vector<void*> outs;
      for (const QuantTensor& t : cpu->tensors) {
        void* p = nullptr;
        CHECK_CUDA(cudaMalloc(&p, t.data.size()));
        outs.push_back(p);
      }
      double s = 1e30;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = Clock::now();
        auto st = GpuQuantize(*spec, DType::kF32, d_master, shape, outs, false, ScalePolicy{}, {});
        s = std::min(s, Seconds(t0, Clock::now()));
        Die(st.status(), "GpuQuantize");
      }
      for (size_t k = 0; k < outs.size(); ++k) {
        std::vector<uint8_t> got(cpu->tensors[k].data.size());
        CHECK_CUDA(cudaMemcpy(got.data(), outs[k], got.size(), cudaMemcpyDeviceToHost));
        if (got != cpu->tensors[k].data) Die(Status(Code::kInternal, std::string(f) + " differs from the CPU"), "quantize");
        cudaFree(outs[k]);
      }
      std::printf("| %s | %.3f | %.2f |\n", f, s * 1e3, mcopy / s);
    }
    cudaFree(d_master);
    cudaFree(d_copy);
  }
  std::printf("\ngoal (apply at 1%% changed >= 0.5 of the D2D copy): %s\n", goal_met ? "met" : "NOT met");
  return 0;
}
