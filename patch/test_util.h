// Owned serve views (tests/support/owned_view.h) and change generators for
// the codec tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "patch/context_codec.h"
#include "patch/element_access.h"
#include "tern/view.h"
#include "tests/support/owned_view.h"

namespace tern::testing {

inline uint64_t Get(const std::vector<uint8_t>& d, int w, uint64_t i) {
  return patch::DispatchWidth(w, [&]<int W>() { return patch::LoadElement<W>(d.data(), i); });
}
inline void Set(std::vector<uint8_t>& d, int w, uint64_t i, uint64_t v) {
  patch::DispatchWidth(w, [&]<int W>() { patch::StoreElement<W>(d.data(), i, v); });
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

// A step of packed 4-bit codes (two a byte, eight an I32; w >= 8): each of
// the n w-bit elements changes with probability `density`, one of its
// nibbles by +-1 mod 16 (so 15 -> 0 wraps with no carry into the next
// nibble), and a second one time in four: how quantized codes move when the
// master weights cross a rounding step.
inline void MutateNibbles(std::vector<uint8_t>& d, int w, uint64_t n, double density, std::mt19937_64& rng) {
  std::bernoulli_distribution pick(density), second(0.25);
  const uint64_t per = static_cast<uint64_t>(w / 4);
  for (uint64_t i = 0; i < n; ++i) {
    if (!pick(rng)) continue;
    const int changes = second(rng) ? 2 : 1;
    for (int c = 0; c < changes; ++c) {
      const uint64_t nib = i * per + rng() % per;
      Set(d, 4, nib, (Get(d, 4, nib) + (rng() % 2 ? 1 : 15)) & 15);
    }
  }
}

// A step with the physics of a served float view: exponent fields fall off
// geometrically from the top one (most elements are large), and an element
// changes with probability ~ push / ulp, doubling per binade down. Mostly
// +-1 in bit-pattern space, like a rounding flip.
inline void PhysicalFill(std::vector<uint8_t>& d, DType dt, uint64_t n, std::mt19937_64& rng) {
  const patch::ContextField f = patch::ContextFieldOf(dt);
  const int w = ElementBits(dt);
  const uint64_t top = f.mask > 2 ? f.mask - 1 : f.mask;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t g = 0;
    while (g < top && (rng() & 1)) ++g;
    const uint64_t mant = rng() & ((uint64_t{1} << f.shift) - 1);
    const uint64_t sign = rng() & 1;
    Set(d, w, i, ((sign << (w - 1)) | ((top - g) << f.shift) | mant) & patch::WidthMask(w));
  }
}

inline void PhysicalMutate(std::vector<uint8_t>& d, DType dt, uint64_t n, double push, std::mt19937_64& rng) {
  const patch::ContextField f = patch::ContextFieldOf(dt);
  const int w = ElementBits(dt);
  const uint64_t mask = patch::WidthMask(w);
  std::uniform_real_distribution<double> u(0, 1);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t v = Get(d, w, i);
    const uint64_t g = f.mask - ((v >> f.shift) & f.mask);
    if (u(rng) >= std::min(0.9, push * std::ldexp(1.0, static_cast<int>(std::min<uint64_t>(g, 30))))) continue;
    const uint64_t r = rng() % 8;
    const uint64_t delta = r < 3 ? 1 : r < 6 ? mask : r < 7 ? 2 : mask - 1;
    Set(d, w, i, (v + delta) & mask);
  }
}

// One tensor "w" of n elements.
inline OwnedView PhysicalBase(DType dt, uint64_t n, std::mt19937_64& rng) {
  OwnedView a;
  a.Add("w", dt, {n});
  PhysicalFill(a.data[0], dt, n, rng);
  return a;
}

inline OwnedView PhysicalStep(const OwnedView& a, double push, std::mt19937_64& rng) {
  OwnedView b = a;
  for (size_t t = 0; t < b.descs.size(); ++t)
    PhysicalMutate(b.data[t], b.descs[t].dtype, b.descs[t].elements(), push, rng);
  return b;
}

}  // namespace tern::testing
