// The per-element mixing functions of the view digest, inline so the apply
// and diff hot loops update digests without calls. Spec: docs/format/patch.md,
// "Digest". One source with the GPU kernels: base/digest_terms.h.
#pragma once

#include <cstdint>

#include "format/digest_terms.h"
#include "tern/digest.h"

namespace tern::patch {

using hd::AddElementChange;
using hd::Lane;
using hd::LaneAdd;
using hd::LaneMul;
using hd::Mix64;

// Adds the element terms of elements [begin, end) of `tensor` (seed: its
// TensorSeed; no TensorTerm) into acc: ComputeDigest's loop, exposed so the
// diff hashes the old view in its own pass over the old bytes (Diff's
// old_digest). Single-threaded.
// The CPU's fastest loop is chosen at run time (AVX-512DQ where present).
void AccumulateElements(const TensorRef& tensor, uint64_t seed, uint64_t begin, uint64_t end,
                        uint64_t acc[4]);
// The same with the build floor's loop (x86-64-v3), for tests that compare
// the two; returns whether AccumulateElements uses another loop here.
bool AccumulateElementsPortable(const TensorRef& tensor, uint64_t seed, uint64_t begin,
                                uint64_t end, uint64_t acc[4]);

}  // namespace tern::patch
