// The per-element mixing functions of the view digest, inline so the apply
// and diff hot loops update digests without calls. Spec: docs/format/patch.md,
// "Digest". Changing any constant changes every digest: that is a new format.
#pragma once

#include <cstdint>

#include "tern/digest.h"

namespace tern::patchfmt {

inline constexpr uint64_t kMixMul = 0xd6e8feb86659fd93ull;
inline constexpr uint64_t kLaneAdd[4] = {0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full, 0x165667b19e3779f9ull,
                                  0x27d4eb2f165667c5ull};
inline constexpr uint64_t kLaneMul[4] = {0xff51afd7ed558ccdull, 0xc4ceb9fe1a85ec53ull, 0x94d049bb133111ebull,
                                  0xbf58476d1ce4e5b9ull};

inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 32;
  x *= kMixMul;
  x ^= x >> 32;
  x *= kMixMul;
  x ^= x >> 32;
  return x;
}

// Each step is a bijection of v for fixed u: xor with a constant, multiply by
// an odd constant, xor-shift. So v -> lane value is a bijection.
inline uint64_t Lane(int l, uint64_t u, uint64_t v) {
  uint64_t t = (v ^ (u + kLaneAdd[l])) * kLaneMul[l];
  return t ^ (t >> 29);
}

// D(after) - D(before) for element `index` changing from old_value to new_value.
inline void AddElementChange(uint64_t seed, uint64_t index, uint64_t old_value, uint64_t new_value,
                             uint64_t acc[4]) {
  const uint64_t u = Mix64(index ^ seed);
  for (int l = 0; l < 4; ++l) acc[l] += Lane(l, u, new_value) - Lane(l, u, old_value);
}

}  // namespace tern::patchfmt
