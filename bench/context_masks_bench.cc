// context_masks_bench: the class-mask step of a CONTEXT decode (every base
// element's class, then one bit mask per class; patch/context_codec.h), two
// ways in one run: ComputeClasses + ClassMasks (two passes through the class
// bytes) and BaseClassMasks (fused for 16-bit blocks with AVX2), against a
// memcpy of the same view. One thread, CPU time, min of the repetitions,
// alternating the three so load hits each alike (docs/benchmarks-journal.md).
//
// Usage: context_masks_bench [elements (default 2^25)] [repetitions (9)]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "patch/context_codec.h"

namespace {

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tern;
  using namespace tern::patch;
  const uint64_t blocks = std::max<uint64_t>(
      1, (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : uint64_t{1} << 25) / kContextBlock);
  const int reps = std::clamp(argc > 2 ? std::atoi(argv[2]) : 9, 1, 100);
  const uint64_t n = blocks * kContextBlock;
  // BF16 weights ~ N(0, 0.02): the exponents of a real layer.
  std::vector<uint16_t> view(n), copy(n);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (uint16_t& x : view) {
    const float w = normal(rng);
    uint32_t bits;
    std::memcpy(&bits, &w, 4);
    x = static_cast<uint16_t>(bits >> 16);
  }
  const ContextField f = ContextFieldOf(DType::kBF16);
  const uint32_t e0 = 122;  // about where ChooseE0 puts 16 classes for this spread
  const int classes = 16;
  alignas(64) static uint8_t cls[kContextBlock];
  alignas(64) static uint64_t masks[kMaxClasses][kContextBlockWords];
  const uint8_t* base = reinterpret_cast<const uint8_t*>(view.data());
  double two_pass = 1e30, fused = 1e30, memcpy_s = 1e30;
  uint64_t sink = 0;
  for (int r = 0; r < reps; ++r) {
    const double t0 = CpuSeconds();
    for (uint64_t b = 0; b < n; b += kContextBlock) {
      ComputeClasses<16>(base, b, kContextBlock, f, e0, classes, cls);
      ClassMasks(cls, kContextBlock, classes, masks);
      sink += masks[r % classes][b / kContextBlock % kContextBlockWords];
    }
    const double t1 = CpuSeconds();
    for (uint64_t b = 0; b < n; b += kContextBlock) {
      BaseClassMasks<16>(base, b, kContextBlock, f, e0, classes, cls, masks);
      sink += masks[r % classes][b / kContextBlock % kContextBlockWords];
    }
    const double t2 = CpuSeconds();
    std::memcpy(copy.data(), view.data(), n * 2);
    sink += copy[static_cast<uint64_t>(r) * 7919 % n];
    const double t3 = CpuSeconds();
    two_pass = std::min(two_pass, t1 - t0);
    fused = std::min(fused, t2 - t1);
    memcpy_s = std::min(memcpy_s, t3 - t2);
  }
  std::printf(
      "%llu BF16 elements, %d classes, min of %d: memcpy %.2f ms | two-pass %.2f ms (%.2fx memcpy) | "
      "fused %.2f ms (%.2fx memcpy) | fused/two-pass %.3f  [%llu]\n",
      static_cast<unsigned long long>(n), classes, reps, memcpy_s * 1e3, two_pass * 1e3,
      two_pass / memcpy_s, fused * 1e3, fused / memcpy_s, fused / two_pass,
      static_cast<unsigned long long>(sink % 10));
  return 0;
}
