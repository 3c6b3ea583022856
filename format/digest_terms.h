// The view digest's per-element terms (docs/format/patch.md, "Digest"), as
// TERN_HD functions (format/hd.h): patch/'s apply, diff and digest code and
// gpu/'s kernels compute them from this one source. Changing any constant
// changes every digest: that is a new format (the golden files pin them).
#pragma once

#include <cstdint>

#include "format/hd.h"

namespace tern::hd {

inline constexpr uint64_t kMixMul = 0xd6e8feb86659fd93ull;
// Per lane l: the constant added to the index mix, and the odd multiplier.
inline constexpr uint64_t kLaneAdd0 = 0x9e3779b97f4a7c15ull, kLaneAdd1 = 0xc2b2ae3d27d4eb4full,
                          kLaneAdd2 = 0x165667b19e3779f9ull, kLaneAdd3 = 0x27d4eb2f165667c5ull;
inline constexpr uint64_t kLaneMul0 = 0xff51afd7ed558ccdull, kLaneMul1 = 0xc4ceb9fe1a85ec53ull,
                          kLaneMul2 = 0x94d049bb133111ebull, kLaneMul3 = 0xbf58476d1ce4e5b9ull;
// The host indexes arrays (GCC then vectorizes the four lanes of
// AddElementChange); device code cannot index a host array, so it selects.
inline constexpr uint64_t kLaneAdd[4] = {kLaneAdd0, kLaneAdd1, kLaneAdd2, kLaneAdd3};
inline constexpr uint64_t kLaneMul[4] = {kLaneMul0, kLaneMul1, kLaneMul2, kLaneMul3};
TERN_HD uint64_t LaneAdd(int l) {
#if defined(__CUDA_ARCH__)
  return l == 0 ? kLaneAdd0 : l == 1 ? kLaneAdd1 : l == 2 ? kLaneAdd2 : kLaneAdd3;
#else
  return kLaneAdd[l];
#endif
}
TERN_HD uint64_t LaneMul(int l) {
#if defined(__CUDA_ARCH__)
  return l == 0 ? kLaneMul0 : l == 1 ? kLaneMul1 : l == 2 ? kLaneMul2 : kLaneMul3;
#else
  return kLaneMul[l];
#endif
}

TERN_HD uint64_t Mix64(uint64_t x) {
  x ^= x >> 32;
  x *= kMixMul;
  x ^= x >> 32;
  x *= kMixMul;
  x ^= x >> 32;
  return x;
}

// Each step is a bijection of v for fixed u: xor with a constant, multiply by
// an odd constant, xor-shift. So v -> lane value is a bijection.
TERN_HD uint64_t Lane(int l, uint64_t u, uint64_t v) {
  const uint64_t t = (v ^ (u + LaneAdd(l))) * LaneMul(l);
  return t ^ (t >> 29);
}

// h(seed, index, value) added into acc (the element's digest term).
TERN_HD void AddElementHash(uint64_t seed, uint64_t index, uint64_t value, uint64_t acc[4]) {
  const uint64_t u = Mix64(index ^ seed);
  for (int l = 0; l < 4; ++l) acc[l] += Lane(l, u, value);
}

// D(after) - D(before) for element `index` changing from old_value to new_value.
TERN_HD void AddElementChange(uint64_t seed, uint64_t index, uint64_t old_value, uint64_t new_value,
                              uint64_t acc[4]) {
  const uint64_t u = Mix64(index ^ seed);
  for (int l = 0; l < 4; ++l) acc[l] += Lane(l, u, new_value) - Lane(l, u, old_value);
}

// A tensor's own term (its seed), added once per tensor.
TERN_HD void AddTensorTerm(uint64_t seed, uint64_t acc[4]) {
  for (int l = 0; l < 4; ++l) acc[l] += Mix64(seed + LaneAdd(l));
}

}  // namespace tern::hd
