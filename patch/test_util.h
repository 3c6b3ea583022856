// Owned serve views (tests/support/owned_view.h) and change generators for
// the codec tests.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "patch/element_access.h"
#include "tern/view.h"
#include "tests/support/owned_view.h"

namespace tern::testing {

inline uint64_t Get(const std::vector<uint8_t>& d, int w, uint64_t i) {
  return patchfmt::DispatchWidth(w, [&]<int W>() { return patchfmt::LoadElement<W>(d.data(), i); });
}
inline void Set(std::vector<uint8_t>& d, int w, uint64_t i, uint64_t v) {
  patchfmt::DispatchWidth(w, [&]<int W>() { patchfmt::StoreElement<W>(d.data(), i, v); });
}

inline void FillRandom(std::vector<uint8_t>& d, std::mt19937_64& rng) {
  for (auto& b : d) b = static_cast<uint8_t>(rng());
}

// Changes about density * n elements: mostly +-1 in bit-pattern space (an
// ulp flip), some larger, some arbitrary.
inline void Mutate(std::vector<uint8_t>& d, int w, uint64_t n, double density, std::mt19937_64& rng) {
  std::bernoulli_distribution pick(density);
  const uint64_t mask = w == 64 ? ~uint64_t{0} : (uint64_t{1} << w) - 1;
  for (uint64_t i = 0; i < n; ++i) {
    if (density < 1.0 && !pick(rng)) continue;
    const uint64_t r = rng() % 16;
    uint64_t delta = r < 10 ? (r & 1 ? 1 : mask) : r < 14 ? (rng() % 64) + 1 : rng();
    if ((delta & mask) == 0) delta = 1;
    Set(d, w, i, (Get(d, w, i) + delta) & mask);
  }
}

}  // namespace tern::testing
