// PULSE patches, re-implemented as a size and speed baseline for tern's codec.
//
// Source: Miahi & Belilovsky, "Understanding and Exploiting Weight Update
// Sparsity for Communication-Efficient Distributed RL" (arXiv 2602.03839,
// PULSESync), and its deployment in Covenant's grail. Our reading of the
// format, which this file reproduces byte-for-byte in content (not in framing):
//  1. Bitwise diff of consecutive BF16 views, per tensor: the flat indices of
//     the elements whose bits differ, ascending, and their *new* values' raw
//     bits ("values rather than deltas, to avoid floating-point drift").
//  2. Indices are delta-encoded: first gap = first index, then
//     index_j - index_{j-1} (>= 1).
//  3. "Type downscaling": the gaps of a tensor are stored in the smallest
//     unsigned integer type that holds its largest gap (u8, u16, u32; u64 here
//     for tensors past 2^32 elements).
//  4. The whole patch (a small header, then per tensor its gaps and values) is
//     compressed as one zstd frame at level 1; the paper reports ~108 MB per
//     step for a 7B BF16 model (~12 bits per changed value at ~1% density).
// grail's later "v3.1" writer stores COO indices instead: rows sorted, row
// deltas in u8 when they fit (else wider), column deltas within a row (absolute
// at a row change) in u16 when they fit (else wider). kCooRowCol reproduces
// that variant; the report takes whichever of the two is smaller for PULSE.
// Our framing replaces grail's JSON header with a binary one of the same
// information; at a few dozen bytes per tensor it does not move the sizes.
//
// Thread safety: pure functions (encode and apply are single-threaded, like
// the reference implementation's zstd-1 frame).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "tern/status.h"
#include "tern/view.h"

namespace tern::bench {

enum class PulseIndexLayout : uint8_t { kFlatGaps = 0, kCooRowCol = 1 };

struct PulseOptions {
  PulseIndexLayout layout = PulseIndexLayout::kFlatGaps;
  int zstd_level = 1;
};

// Width in bytes (1, 2, 4 or 8) of the smallest unsigned type holding
// max_value, never narrower than min_bytes.
int PulseIndexWidthBytes(uint64_t max_value, int min_bytes = 1);

// Encodes the change from old_view to new_view (identical layouts; element
// widths of 8, 16, 32 or 64 bits).
Result<std::vector<uint8_t>> PulseEncode(const ServeView& old_view, const ServeView& new_view,
                                         const PulseOptions& options = {});

// Applies a PULSE patch to `view` in place. The patch is untrusted: every
// length, count and index is checked, and the view is written only after the
// whole patch has been validated against it.
Status PulseApply(std::span<const uint8_t> patch, MutableServeView& view);

}  // namespace tern::bench
