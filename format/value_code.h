// A segment record's values (docs/format/patch.md, "Values"): the zigzag of a
// w-bit delta and its value symbol, as TERN_HD functions (format/hd.h) so that
// patch/'s codec and gpu/'s kernels share one source.
#pragma once

#include <cstdint>

#include "format/hd.h"

namespace tern::hd {

// Value symbols 0..15 are zigzag values themselves; the rest name a length.
inline constexpr int kLiteralSymbols = 16;

TERN_HD uint64_t WidthMask(int w) { return w >= 64 ? ~uint64_t{0} : (uint64_t{1} << w) - 1; }

// Zigzag of the w-bit two's-complement value d: 0,-1,1,-2,.. -> 0,1,2,3,..
TERN_HD uint64_t ZigZag(uint64_t d, int w) {
  const uint64_t mask = WidthMask(w);
  const uint64_t sign = (d >> (w - 1)) & 1;
  return ((d << 1) ^ (sign ? mask : 0)) & mask;
}
TERN_HD uint64_t UnZigZag(uint64_t z, int w) {
  return ((z >> 1) ^ (uint64_t{0} - (z & 1))) & WidthMask(w);
}

// Symbol of zigzag value z; *extra_bits raw bits (*extra) follow it.
TERN_HD int ValueSymbol(uint64_t z, int* extra_bits, uint64_t* extra) {
  if (z < kLiteralSymbols) {
    *extra_bits = 0;
    *extra = 0;
    return static_cast<int>(z);
  }
  const int len = 64 - Clz64(z);  // 5..64
  *extra_bits = len - 1;
  *extra = z & WidthMask(len - 1);
  return kLiteralSymbols + len - 5;
}

}  // namespace tern::hd
