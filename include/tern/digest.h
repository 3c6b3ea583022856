// ViewDigest: the 256-bit identity of a serve view that patches name as their
// base and target. Spec: docs/format/patch.md, section "Digest".
//
// D(view) = sum over tensors t of [ T(seed_t) + sum over elements i of
// h(seed_t, i, bits_i) ], added per 64-bit lane mod 2^64. Because it is a sum,
// changing element i from a to b moves D by h(i, b) - h(i, a): a patch's
// target digest is verified in O(changed elements). For a fixed element,
// value -> h is a bijection in every lane, so any single changed element
// changes every lane.
//
// This is a checksum against accidental corruption and bugs, NOT a
// cryptographic hash: an adversary can construct collisions. Authenticity
// must come from elsewhere: a version manifest signed by the publisher binds
// the digests and a hash of every chunk (include/tern/version_manifest.h,
// docs/security.md); no tool or transfer uses it yet (the agent will).
//
// Thread safety: values; ComputeDigest reads the view from pool threads.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "tern/export.h"
#include "tern/status.h"
#include "tern/view.h"

namespace tern {

class ThreadPool;

struct ViewDigest {
  std::array<uint64_t, 4> lanes{};

  bool operator==(const ViewDigest&) const = default;
  ViewDigest& operator+=(const ViewDigest& o) {
    for (int l = 0; l < 4; ++l) lanes[l] += o.lanes[l];
    return *this;
  }
  ViewDigest& operator-=(const ViewDigest& o) {
    for (int l = 0; l < 4; ++l) lanes[l] -= o.lanes[l];
    return *this;
  }
  // The 32 bytes as stored in a patch: lanes little-endian, lane 0 first.
  std::array<uint8_t, 32> Bytes() const;
  static ViewDigest FromBytes(const uint8_t* bytes32);
  // "tern1:" + 64 lower-case hex digits of Bytes(); what `tern digest` prints.
  std::string ToString() const;
  static Result<ViewDigest> Parse(std::string_view text);
};

// Seed of a tensor: XXH3-64 of its name, dtype code and shape (spec).
TERN_EXPORT uint64_t TensorSeed(const TensorDesc& desc);

// The contribution of one element (value = its raw bits, zero-extended), and
// of a tensor's existence (so empty tensors still count). Exposed for the
// GPU path and tests; the per-lane functions are defined in the spec.
TERN_EXPORT ViewDigest ElementHash(uint64_t seed, uint64_t index, uint64_t value);
TERN_EXPORT ViewDigest TensorTerm(uint64_t seed);

// The element terms of elements [begin, end) of one tensor (no
// TensorTerm): what a shard adds to D. tensor.data is indexed by the
// tensor's element numbers; only [begin, end) is read. Single-threaded, the
// CPU's fastest loop (ComputeDigest's).
TERN_EXPORT ViewDigest ComputeElementTerms(const TensorRef& tensor, uint64_t begin, uint64_t end);

// Full digest (the scrub path): multi-threaded over `pool`.
TERN_EXPORT ViewDigest ComputeDigest(const ServeView& view, ThreadPool& pool);
// Digest of one tensor alone (TensorTerm included); D(view) is the lane sum
// over its tensors. Single-threaded.
TERN_EXPORT ViewDigest ComputeTensorDigest(const TensorRef& tensor);

}  // namespace tern
