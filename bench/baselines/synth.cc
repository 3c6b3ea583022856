#include "bench/baselines/synth.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "tern/status.h"

namespace tern::bench {

namespace {
uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
double Uniform01(uint64_t& state) { return double(SplitMix64(state) >> 11) * 0x1.0p-53; }

// Blocks are the unit of parallel work; results do not depend on the pool.
constexpr uint64_t kBlockElements = uint64_t{1} << 20;
}  // namespace

uint16_t Bf16FromFloat(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t((u + rounding) >> 16);
}

SynthStep SynthesizeBf16Step(const SynthOptions& options, ThreadPool& pool) {
  TERN_ASSERT(options.density >= 0.0 && options.density <= 1.0, "density ", options.density);
  TERN_ASSERT(!options.ulp_weights.empty());
  const uint64_t n = options.elements;
  SynthStep step;
  step.old_bits.resize(n);

  const uint64_t blocks = (n + kBlockElements - 1) / kBlockElements;
  pool.ParallelFor(blocks, [&](uint64_t b) {
    uint64_t state = options.seed * 0x100000001B3ull + b;
    const uint64_t end = std::min(n, (b + 1) * kBlockElements);
    for (uint64_t i = b * kBlockElements; i < end; i += 2) {
      // Box-Muller: two normals per pair of uniforms.
      const double u1 = 1.0 - Uniform01(state);  // (0, 1]
      const double u2 = Uniform01(state);
      const double r = options.sigma * std::sqrt(-2.0 * std::log(u1));
      step.old_bits[i] = Bf16FromFloat(float(r * std::cos(2 * M_PI * u2)));
      if (i + 1 < end) step.old_bits[i + 1] = Bf16FromFloat(float(r * std::sin(2 * M_PI * u2)));
    }
  });
  step.new_bits = step.old_bits;

  // Exactly `target` distinct positions: draw uniformly, mark in a bitmap,
  // redraw collisions. Sequential so the result does not depend on threads.
  const uint64_t target = uint64_t(std::llround(double(n) * options.density));
  std::vector<uint64_t> marks((n + 63) / 64, 0);
  uint64_t state = options.seed ^ 0xD1B54A32D192ED03ull;
  if (target * 2 <= n) {
    for (uint64_t placed = 0; placed < target;) {
      const uint64_t i = SplitMix64(state) % n;
      uint64_t& w = marks[i / 64];
      const uint64_t bit = uint64_t{1} << (i % 64);
      if (!(w & bit)) {
        w |= bit;
        ++placed;
      }
    }
  } else {
    // Dense: mark everything, then clear n - target positions the same way.
    std::fill(marks.begin(), marks.end(), ~uint64_t{0});
    if (n % 64) marks.back() = (uint64_t{1} << (n % 64)) - 1;
    for (uint64_t cleared = 0; cleared < n - target;) {
      const uint64_t i = SplitMix64(state) % n;
      uint64_t& w = marks[i / 64];
      const uint64_t bit = uint64_t{1} << (i % 64);
      if (w & bit) {
        w &= ~bit;
        ++cleared;
      }
    }
  }

  std::vector<double> cdf(options.ulp_weights.size());
  double sum = 0;
  for (size_t k = 0; k < cdf.size(); ++k) cdf[k] = (sum += options.ulp_weights[k]);
  for (double& c : cdf) c /= sum;

  for (uint64_t wi = 0; wi < marks.size(); ++wi) {
    for (uint64_t w = marks[wi]; w; w &= w - 1) {
      const uint64_t i = wi * 64 + uint64_t(std::countr_zero(w));
      const double u = Uniform01(state);
      const size_t k = size_t(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
      const int magnitude = int(std::min(k, cdf.size() - 1)) + 1;
      const bool negative = SplitMix64(state) & 1;
      step.new_bits[i] = uint16_t(step.old_bits[i] + (negative ? -magnitude : magnitude));
      ++step.changed;
    }
  }
  return step;
}

}  // namespace tern::bench
