// Huffman code construction for a segment record's code tables
// (docs/format/patch.md, "Code tables"), as TERN_HD functions (format/hd.h):
// patch/'s encoders and gpu/'s encoder build their codes from this one
// source, so a patch's bytes do not depend on where it was encoded.
#pragma once

#include <cstdint>

#include "format/hd.h"

namespace tern::hd {

// Code lengths for freq over kSymbols symbols (0: unused), limited to
// kMaxBits by flattening the frequencies until the tree is shallow enough.
// Optimal codes almost never need the limit for this alphabet; the fallback
// only has to be valid, not optimal (but the same on CPU and GPU). Count is
// the CPU's u64 or the GPU's u32: a segment has at most 2^24 elements, so
// every sum fits either.
template <int kSymbols, int kMaxBits, class Count>
TERN_HD void BuildLengths(const Count* freq_in, uint8_t* lengths) {
  Count freq[kSymbols];
  int used = 0, only = -1;
  for (int s = 0; s < kSymbols; ++s) {
    freq[s] = freq_in[s];
    lengths[s] = 0;
    if (freq[s]) ++used, only = s;
  }
  if (used == 0) return;
  if (used == 1) {
    lengths[only] = 1;
    return;
  }
  constexpr int kNodes = 2 * kSymbols;
  for (;;) {  // each round halves the frequencies: at most 64 rounds
    Count weight[kNodes];
    int16_t parent[kNodes];
    bool alive[kNodes];
    int nodes = kSymbols;
    for (int s = 0; s < kSymbols; ++s) {
      weight[s] = freq[s];
      parent[s] = -1;
      alive[s] = freq[s] != 0;
    }
    for (int merges = 0; merges < used - 1; ++merges) {
      int a = -1, b = -1;
      for (int i = 0; i < nodes; ++i) {
        if (!alive[i]) continue;
        if (a < 0 || weight[i] < weight[a]) {
          b = a;
          a = i;
        } else if (b < 0 || weight[i] < weight[b]) {
          b = i;
        }
      }
      weight[nodes] = weight[a] + weight[b];
      parent[nodes] = -1;
      alive[nodes] = true;
      alive[a] = alive[b] = false;
      parent[a] = parent[b] = static_cast<int16_t>(nodes);
      ++nodes;
    }
    int max_len = 0;
    for (int s = 0; s < kSymbols; ++s) {
      if (!freq[s]) continue;
      int len = 0;
      for (int p = s; parent[p] >= 0; p = parent[p]) ++len;
      lengths[s] = static_cast<uint8_t>(len);
      if (len > max_len) max_len = len;
    }
    if (max_len <= kMaxBits) return;
    for (int s = 0; s < kSymbols; ++s)
      if (freq[s]) freq[s] = (freq[s] >> 1) | 1;
  }
}

// Canonical codes (deflate order: by length, then symbol), bit-reversed so
// that writing them LSB-first puts the code's first bit first; 0 for unused
// symbols.
template <int kSymbols, int kMaxBits>
TERN_HD void CanonicalCodes(const uint8_t* lengths, uint16_t* codes) {
  int count[kMaxBits + 1] = {};
  for (int s = 0; s < kSymbols; ++s) count[lengths[s]]++;
  count[0] = 0;
  uint32_t next[kMaxBits + 2] = {};
  uint32_t code = 0;
  for (int len = 1; len <= kMaxBits; ++len) {
    code = (code + count[len - 1]) << 1;
    next[len] = code;
  }
  for (int s = 0; s < kSymbols; ++s) {
    const int len = lengths[s];
    codes[s] = 0;
    if (!len) continue;
    const uint32_t c = next[len]++;
    uint32_t r = 0;
    for (int i = 0; i < len; ++i) r |= ((c >> i) & 1) << (len - 1 - i);
    codes[s] = static_cast<uint16_t>(r);
  }
}

}  // namespace tern::hd
