// tern_quant_bench: cast throughput against memcpy, and the scale-policy
// trade-off per format on a synthetic RL trajectory: per-step changed
// fraction and patch bytes (the real codec, tern::Diff) vs the quantization
// error relative to fresh re-quantization. Results: docs/benchmarks.md.
//
//   tern_quant_bench [--casts-only] [--rows N] [--cols N] [--steps S] [--formats a,b]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tern/thread_pool.h"
#include "tern/patch.h"
#include "tern/float_cast.h"
#include "tern/quantize.h"

namespace tern {
namespace {

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void BenchCasts() {
  const uint64_t n = uint64_t{1} << 26;  // 64 Mi floats = 256 MiB in
  std::vector<float> in(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  for (float& x : in) x = dist(rng);
  std::vector<uint16_t> out(n);
  std::vector<uint8_t> copy(n * 4);
  auto best = [&](auto fn) {
    double t = 1e9;
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      fn();
      t = std::min(t, Seconds(t0));
    }
    return t;
  };
  const double t_memcpy = best([&] { std::memcpy(copy.data(), in.data(), n * 4); });
  const double t_bf16 = best([&] { CastF32ToBF16(in.data(), out.data(), n); });
  const double t_f16 = best([&] { CastF32ToF16(in.data(), out.data(), n); });
  const double gb = n * 4 / 1e9;
  printf("casts, %llu FP32 values, one thread (GB/s of FP32 input; ratio to memcpy of the input):\n",
         static_cast<unsigned long long>(n));
  printf("  memcpy       %6.2f GB/s\n", gb / t_memcpy);
  printf("  F32->BF16    %6.2f GB/s  %.2fx memcpy time\n", gb / t_bf16, t_bf16 / t_memcpy);
  printf("  F32->F16     %6.2f GB/s  %.2fx memcpy time\n", gb / t_f16, t_f16 / t_memcpy);
}

struct Stats {
  double changed = 0, patch_bytes = 0, rescaled = 0, err_ratio = 0;
};

ServeView ViewOf(const Quantized& q, std::vector<TensorDesc>& descs) {
  descs.clear();
  for (const QuantTensor& t : q.tensors) descs.push_back({"w" + t.suffix, t.dtype, t.shape});
  ServeView v;
  for (size_t i = 0; i < descs.size(); ++i) v.tensors.push_back({&descs[i], q.tensors[i].data.data()});
  SortAndCheck(v).IgnoreError();
  return v;
}

double Rmse(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(s / a.size());
}

// Mean over steps 1..S of one (format, lr, policy) trajectory.
Stats Trajectory(const QuantSpec& spec, const ScalePolicy& policy, float lr, uint64_t rows,
                 uint64_t cols, int steps, ThreadPool& pool) {
  const std::vector<uint64_t> shape = {rows, cols};
  std::vector<float> w(rows * cols);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  for (float& x : w) x = dist(rng);
  ScalePolicy fresh;
  fresh.kind = ScalePolicy::Kind::kFresh;
  Quantized prev = *Quantize(spec, w.data(), shape, nullptr, policy);
  Stats st;
  std::normal_distribution<float> unit(0.0f, 1.0f);
  for (int s = 1; s <= steps; ++s) {
    for (float& x : w) x += lr * unit(rng);  // Adam-like: |update| ~ lr
    Quantized cur = *Quantize(spec, w.data(), shape, &prev, policy);
    std::vector<TensorDesc> d0, d1;
    ServeView v0 = ViewOf(prev, d0), v1 = ViewOf(cur, d1);
    auto patch = Diff(v0, v1, {}, pool);
    auto info = Inspect(*patch);
    const uint64_t code_elems = d1[0].elements();
    uint64_t changed_codes = 0;
    for (const TensorPatchInfo& t : info->tensors)
      if (t.name == "w" + cur.tensors[0].suffix) changed_codes = t.changed_elements;
    st.changed += double(changed_codes) / code_elems;
    st.patch_bytes += double(info->patch_bytes);
    st.rescaled += cur.scale_groups ? double(cur.rescaled_groups) / cur.scale_groups : 0.0;
    const Quantized ref = *Quantize(spec, w.data(), shape, nullptr, fresh);
    const double e = Rmse(*Dequantize(spec, cur, shape), w);
    const double e_ref = Rmse(*Dequantize(spec, ref, shape), w);
    st.err_ratio += e / e_ref;
    prev = std::move(cur);
  }
  st.changed /= steps, st.patch_bytes /= steps, st.rescaled /= steps, st.err_ratio /= steps;
  return st;
}

void BenchPolicies(uint64_t rows, uint64_t cols, int steps, const std::vector<std::string>& formats) {
  ThreadPool pool(1);
  struct P {
    const char* name;
    ScalePolicy policy;
  };
  const P policies[] = {{"fresh", {ScalePolicy::Kind::kFresh, 0.5f, 1.0f}},
                        {"band 0.5 x1.125", {ScalePolicy::Kind::kBand, 0.5f, 1.125f}},
                        {"band 0.8 x1.03", {ScalePolicy::Kind::kBand, 0.8f, 1.03f}},
                        {"band 0.9 x1.01 (default)", {ScalePolicy::Kind::kBand, 0.9f, 1.01f}}};
  printf("\nscale policies: [%llu x %llu] N(0, 0.02) master, %d steps of w += lr * N(0,1);\n"
         "means per step: changed codes, patch bytes (tern codec), groups re-scaled,\n"
         "RMSE vs master relative to fresh re-quantization's RMSE\n",
         static_cast<unsigned long long>(rows), static_cast<unsigned long long>(cols), steps);
  printf("| format | lr | policy | changed codes | patch bytes | re-scaled groups | error vs fresh |\n");
  printf("|---|---|---|---|---|---|---|\n");
  for (const std::string& name : formats) {
    const char* fmt = name.c_str();
    auto parsed = ParseQuantFormat(name);
    if (!parsed.ok()) {
      fprintf(stderr, "%s\n", parsed.status().ToString().c_str());
      return;
    }
    const QuantSpec spec = *parsed;
    for (float lr : {1e-6f, 1e-5f}) {
      const bool plain = spec.scheme == QuantScheme::kBF16 || spec.scheme == QuantScheme::kF16;
      for (const P& p : policies) {
        if (plain && p.policy.kind != ScalePolicy::Kind::kFresh) continue;
        const Stats st = Trajectory(spec, p.policy, lr, rows, cols, steps, pool);
        printf("| %s | %.0e | %s | %.4f%% | %.0f | %.2f%% | %.4f |\n", fmt, lr, plain ? "-" : p.name,
               100 * st.changed, st.patch_bytes, 100 * st.rescaled, st.err_ratio);
        fflush(stdout);
      }
    }
  }
}

}  // namespace
}  // namespace tern

int main(int argc, char** argv) {
  uint64_t rows = 1024, cols = 1024;
  int steps = 4;
  bool casts_only = false;
  std::vector<std::string> formats = {"bf16", "fp16", "fp8-e4m3-tensor", "fp8-e4m3-channel",
                                      "fp8-e4m3-block128", "fp8-e5m2-tensor", "nvfp4", "nvfp4-ct",
                                      "mxfp4", "int4-g128", "int4-g128-asym", "gptq-int4-g128"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--casts-only") casts_only = true;
    else if (a == "--rows" && i + 1 < argc) rows = std::stoull(argv[++i]);
    else if (a == "--cols" && i + 1 < argc) cols = std::stoull(argv[++i]);
    else if (a == "--steps" && i + 1 < argc) steps = std::stoi(argv[++i]);
    else if (a == "--formats" && i + 1 < argc) {
      formats.clear();
      std::string list = argv[++i];
      for (size_t p = 0; p <= list.size();) {
        const size_t c = std::min(list.find(',', p), list.size());
        if (c > p) formats.push_back(list.substr(p, c - p));
        p = c + 1;
      }
    }
    else {
      fprintf(stderr, "usage: tern_quant_bench [--casts-only] [--rows N] [--cols N] [--steps S] [--formats a,b]\n");
      return 2;
    }
  }
  tern::BenchCasts();
  if (!casts_only) tern::BenchPolicies(rows, cols, steps, formats);
  return 0;
}
