// Synthetic BF16 optimizer steps for benchmarks: a random N(0, sigma) BF16
// view and a copy of it in which exactly round(elements * density) elements
// moved by a few units in the last place of their bit pattern.
//
// This stands in for the datagen trace generator (include/tern/datagen.h) where
// an exact density is wanted: the changed positions are uniformly random
// (independent of one another, which is the entropy bound's own assumption)
// and the deltas follow `ulp_weights` (weight of +-1 ulp, +-2 ulp, ...; sign
// equally likely), mostly +-1 as Adam at RL learning rates produces.
//
// Deterministic from the seed for a given element count, whatever the pool
// size. Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "tern/thread_pool.h"

namespace tern::bench {

struct SynthOptions {
  uint64_t elements = 0;
  double density = 0.01;  // fraction of elements that change, in [0, 1]
  double sigma = 0.02;    // weights ~ N(0, sigma), cast to BF16 (round to nearest even)
  uint64_t seed = 1;
  // Relative weights of |delta| = 1, 2, 3, ... ulp.
  std::vector<double> ulp_weights = {0.90, 0.07, 0.02, 0.01};
};

struct SynthStep {
  std::vector<uint16_t> old_bits;
  std::vector<uint16_t> new_bits;
  uint64_t changed = 0;
};

SynthStep SynthesizeBf16Step(const SynthOptions& options, ThreadPool& pool);

// FP32 -> BF16 bits with round-to-nearest-even (finite inputs).
uint16_t Bf16FromFloat(float f);

}  // namespace tern::bench
