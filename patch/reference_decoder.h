// A plain, slow decoder of segment streams: one bit at a time, no tables.
// It is the test oracle for the fast path (segment_codec.h) and a readable
// companion to docs/format/patch.md. Framing (header, manifest, checksums)
// is shared with the fast path via ParsePatch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tern/status.h"
#include "tern/view.h"

namespace tern::patch {

struct RefChange {
  uint32_t tensor;
  uint64_t element;  // absolute element index in the tensor, in elements of `width` bits
  uint64_t delta;    // (new - old) mod 2^width, non-zero
  // The element width the records code: the dtype's, or 4 for a tensor
  // coded as nibbles (format 3), whose elements are then its nibbles.
  int width = 0;
  bool operator==(const RefChange&) const = default;
};

// Changes in record order; within a CONTEXT record (format 2) class by
// class. CONTEXT records need `base` (the view the patch applies to) to turn
// class ranks into elements; without it they are only checked, and their
// changes are left out.
Result<std::vector<RefChange>> ReferenceDecode(std::span<const uint8_t> patch, const ServeView* base = nullptr);

}  // namespace tern::patch
