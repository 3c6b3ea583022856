// General-purpose baselines for patch sizes: what a team without a weight
// codec would ship.
//  * zstd of (old XOR new): the bytes that differ survive, the rest are zero
//    runs; level 3 is zstd's default (`zstd -3`).
//  * xdelta3 (VCDIFF, the Debian binary) with the old view as its source.
//  * naive sparse: a u32 index and the raw new value per change (48 bits for
//    BF16), the usual {indices, values} pair of int32 + dtype tensors.
//
// Thread safety: pure functions; Xdelta3Bytes uses its own temporary files.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tern/status.h"

namespace tern::bench {

// zstd of old XOR new at `level`, streamed in slices so no XOR copy of a large
// view is held. Returns the compressed bytes when `out` is non-null, else
// only counts them.
Result<uint64_t> ZstdXorBytes(std::span<const uint8_t> old_bytes,
                              std::span<const uint8_t> new_bytes, int level = 3,
                              std::vector<uint8_t>* out = nullptr);

// Size of `xdelta3 -e -s OLD NEW` (extra_args added before -s), run on files
// in tmp_dir. kUnavailable when the binary cannot be run. When
// check_roundtrip is set, also decodes the delta and compares with new_bytes
// (kInternal on a difference).
Result<uint64_t> Xdelta3Bytes(std::span<const uint8_t> old_bytes, std::span<const uint8_t> new_bytes,
                              const std::string& tmp_dir,
                              const std::vector<std::string>& extra_args = {},
                              bool check_roundtrip = false);

inline uint64_t NaiveSparseBytes(uint64_t changed, int element_bits) {
  return changed * (4 + uint64_t(element_bits) / 8);
}

}  // namespace tern::bench
