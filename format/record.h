// Segment records (docs/format/patch.md §3.3, §5, §6), as TERN_HD functions
// (format/hd.h): the record header and its rules, code tables, and the
// value and position codes one change at a time. The one definition of the
// record format: patch/'s codec (patch/segment_codec.h, context_codec.h) and
// gpu/'s kernels (gpu/ops/) both call these; their decode loops differ in
// shape (the CPU's table-driven fast paths, the GPU's one thread per record),
// not in what they accept or write.
//
// Functions that validate return the broken rule as a static string, or
// nullptr when the input is valid: the CPU turns it into a Status, the
// device into its error code.
#pragma once

#include <cstddef>
#include <cstdint>

#include "format/bit_stream.h"
#include "format/hd.h"
#include "format/huffman_build.h"
#include "format/value_code.h"

namespace tern::format {

using hd::UnZigZag;
using hd::ValueSymbol;
using hd::WidthMask;
using hd::ZigZag;

// ---- Layout (§3.3) ----------------------------------------------------------

enum Encoding : uint8_t { kSparse = 0, kDense = 1, kRaw = 2, kContext = 3 };

// Value alphabet (§5): zigzag values 0..15 are their own symbol; larger
// values of bit length L (5..64) are symbol 16 + (L - 5) followed by the L-1
// bits below the leading one.
inline constexpr int kLiteralSymbols = hd::kLiteralSymbols;
inline constexpr int kSymbols = kLiteralSymbols + 60;  // 76
inline constexpr int kMaxCodeBits = 15;
inline constexpr uint32_t kMaxTableBytes = 1 + (kSymbols + 1) / 2;
inline constexpr uint64_t kMaxSegmentElements = uint64_t{1} << 24;
// CONTEXT (format 2, §6.4): elements fall into classes by their base value's
// exponent field; at most kMaxClasses. The context table holds K, e0 and one
// entry per class, so it is bounded by the entry's largest form.
inline constexpr int kMaxClasses = 16;
inline constexpr uint32_t kMaxContextTableBytes = 3 + kMaxClasses * (4 + 1 + 5 + 5 + 39);
inline constexpr uint64_t kRecordChecksumBytes = 8;

struct RecordHeader {
  uint32_t tensor_index;
  uint8_t encoding;
  uint8_t rice_k;      // SPARSE: 0..63; otherwise MUST be 0
  uint16_t reserved0;  // MUST be 0
  uint64_t first_element;
  uint64_t element_count;  // 1 .. kMaxSegmentElements
  uint64_t changed_count;  // elements with a non-zero delta
  uint32_t table_bytes;
  uint32_t position_bytes;
  uint32_t value_bytes;
  uint32_t reserved1;  // MUST be 0
};
static_assert(sizeof(RecordHeader) == 48, "spec §3.3");
static_assert(offsetof(RecordHeader, first_element) == 8 &&
              offsetof(RecordHeader, changed_count) == 24 &&
              offsetof(RecordHeader, table_bytes) == 32 && offsetof(RecordHeader, reserved1) == 44);

// The header rules of §3.3 that need nothing but the header and the width
// (not the checksum, not the container's order). context_ok: CONTEXT is
// allowed (format 2, a dtype with an exponent field).
TERN_HD const char* RecordHeaderProblem(const RecordHeader& h, int w, bool context_ok) {
  if (h.reserved0 != 0 || h.reserved1 != 0) return "segment record: reserved field not zero";
  if (!(h.encoding <= kRaw || (h.encoding == kContext && context_ok)))
    return "segment record: unknown encoding";
  if (h.element_count < 1 || h.element_count > kMaxSegmentElements)
    return "segment record: element count out of range";
  if (h.changed_count > h.element_count) return "segment record: changed count exceeds elements";
  switch (h.encoding) {
    case kSparse:
      if (h.changed_count < 1 || h.rice_k > 63) return "SPARSE record: bad count or Rice k";
      if (h.table_bytes < 2 || h.table_bytes > kMaxTableBytes) return "record: bad table size";
      break;
    case kDense:
      if (h.rice_k != 0 || h.position_bytes != 0) return "DENSE record: stray position fields";
      if (h.table_bytes < 2 || h.table_bytes > kMaxTableBytes) return "record: bad table size";
      break;
    case kRaw:
      if (h.rice_k != 0 || h.position_bytes != 0 || h.table_bytes != 0)
        return "RAW record: stray table or position fields";
      if (h.value_bytes != (h.element_count * static_cast<uint64_t>(w) + 7) / 8)
        return "RAW record: value bytes do not match element count";
      break;
    default:  // kContext
      if (h.changed_count < 1 || h.rice_k != 0) return "CONTEXT record: bad count or Rice k";
      if (h.table_bytes < 4 || h.table_bytes > kMaxContextTableBytes)
        return "CONTEXT record: bad table size";
      break;
  }
  return nullptr;
}

// ---- Code tables (§5) -------------------------------------------------------

// Huffman code lengths limited to kMaxCodeBits, and canonical codes
// bit-reversed for LSB-first writing (format/huffman_build.h). Count: the
// CPU's u64 or the GPU's u32 (a segment has at most 2^24 elements).
template <class Count>
TERN_HD void BuildLengths(const Count freq[kSymbols], uint8_t lengths[kSymbols]) {
  hd::BuildLengths<kSymbols, kMaxCodeBits>(freq, lengths);
}
TERN_HD void CanonicalCodes(const uint8_t lengths[kSymbols], uint16_t codes[kSymbols]) {
  hd::CanonicalCodes<kSymbols, kMaxCodeBits>(lengths, codes);
}
template <class Count>
TERN_HD uint64_t CodeBits(const Count freq[kSymbols], const uint8_t lengths[kSymbols]) {
  uint64_t bits = 0;
  for (int s = 0; s < kSymbols; ++s) bits += uint64_t{freq[s]} * lengths[s];
  return bits;
}

// nsym: symbols up to the last one with a code.
TERN_HD int UsedSymbols(const uint8_t lengths[kSymbols]) {
  int nsym = kSymbols;
  while (nsym > 0 && lengths[nsym - 1] == 0) --nsym;
  return nsym;
}
TERN_HD uint32_t TableBytes(const uint8_t lengths[kSymbols]) {
  return 1 + static_cast<uint32_t>((UsedSymbols(lengths) + 1) / 2);
}
template <class Sink>
TERN_HD void WriteTable(const uint8_t lengths[kSymbols], Sink* out) {
  const int nsym = UsedSymbols(lengths);
  out->Push(static_cast<uint8_t>(nsym));
  for (int s = 0; s < nsym; s += 2) {
    const uint8_t hi = s + 1 < nsym ? lengths[s + 1] : 0;
    out->Push(static_cast<uint8_t>(lengths[s] | (hi << 4)));
  }
}

// Code lengths from a stored table of `bytes` bytes, with every rule of §5
// (size, padding, minimal, Kraft <= 1).
TERN_HD const char* ParseCodeLengths(const uint8_t* table, uint32_t bytes,
                                     uint8_t lengths[kSymbols]) {
  if (bytes < 1) return "empty code table";
  const int nsym = table[0];
  if (nsym < 1 || nsym > kSymbols) return "code table: bad symbol count";
  if (bytes != 1 + static_cast<uint32_t>((nsym + 1) / 2)) return "code table: size mismatch";
  for (int s = 0; s < kSymbols; ++s)
    lengths[s] = s < nsym ? (table[1 + s / 2] >> (4 * (s & 1))) & 15 : 0;
  if ((nsym & 1) && (table[bytes - 1] >> 4) != 0) return "code table: padding not zero";
  if (lengths[nsym - 1] == 0) return "code table: not minimal";
  uint64_t kraft = 0;
  for (int s = 0; s < nsym; ++s)
    if (lengths[s]) kraft += uint64_t{1} << (kMaxCodeBits - lengths[s]);
  if (kraft > (uint64_t{1} << kMaxCodeBits)) return "code table: lengths oversubscribe the code";
  return nullptr;
}

// A canonical code decoded bit by bit with per-length counts (as zlib's
// puff): 16 + 76 bytes, small enough for a GPU thread to hold one, where a
// lookup table needs up to 64 KiB. The CPU's table-driven decoders use it
// for the codes longer than their tables.
struct CanonicalDecoder {
  uint16_t count[kMaxCodeBits + 1];  // codes of each length
  uint8_t symbol[kSymbols];          // symbols in canonical order
  int max_bits;
};
TERN_HD void BuildCanonicalDecoder(const uint8_t lengths[kSymbols], CanonicalDecoder* d) {
  for (int len = 0; len <= kMaxCodeBits; ++len) d->count[len] = 0;
  d->max_bits = 0;
  for (int s = 0; s < kSymbols; ++s) {
    if (!lengths[s]) continue;
    d->count[lengths[s]]++;
    if (lengths[s] > d->max_bits) d->max_bits = lengths[s];
  }
  uint16_t offs[kMaxCodeBits + 2];
  offs[1] = 0;
  for (int len = 1; len <= kMaxCodeBits; ++len) offs[len + 1] = offs[len] + d->count[len];
  for (int s = 0; s < kSymbols; ++s)
    if (lengths[s]) d->symbol[offs[lengths[s]]++] = static_cast<uint8_t>(s);
}
// The next symbol, or -1 when the bits form no code word within max_bits.
TERN_HD int DecodeSymbol(BitReader& in, const CanonicalDecoder& d) {
  const uint64_t bits = in.Peek(d.max_bits);
  int code = 0, first = 0, index = 0;
  for (int len = 1; len <= d.max_bits; ++len) {
    code |= static_cast<int>((bits >> (len - 1)) & 1);
    const int count = d.count[len];
    if (code - first < count) {
      in.Skip(len);
      return d.symbol[index + (code - first)];
    }
    index += count;
    first += count;
    first <<= 1;
    code <<= 1;
  }
  return -1;
}

// ---- Values (§5) ------------------------------------------------------------

// The value bit length L of a length symbol (sym >= kLiteralSymbols).
TERN_HD int SymbolValueBits(int sym) { return sym - kLiteralSymbols + 5; }

// The zigzag value of symbol `sym`, its extra bits read from `in`; false
// for a symbol too long for width w. (Zero is a valid value here: DENSE
// codes unchanged elements; SPARSE and CONTEXT callers reject it.)
TERN_HD_ALWAYS_INLINE bool ReadSymbolValue(BitReader& in, int sym, int w, uint64_t* z) {
  if (sym < kLiteralSymbols) {
    *z = static_cast<uint64_t>(sym);
    return static_cast<uint64_t>(sym) <= WidthMask(w);
  }
  const int len = SymbolValueBits(sym);
  if (len > w) return false;
  *z = (uint64_t{1} << (len - 1)) | in.Read(len - 1);
  return true;
}

// One w-bit delta in a code (codes, lengths), with its extra bits.
template <class Sink>
TERN_HD_ALWAYS_INLINE void PutValue(BitWriter<Sink>& out, const uint16_t codes[kSymbols],
                                    const uint8_t lengths[kSymbols], uint64_t delta, int w) {
  int eb;
  uint64_t ex;
  const int sym = ValueSymbol(ZigZag(delta, w), &eb, &ex);
  out.Put(codes[sym], lengths[sym]);
  out.Put(ex, eb);
}

// ---- Positions (§6): Golomb-Rice codes of gaps -----------------------------

// A gap with parameter k, of a segment of `count` elements: the unary run
// is bounded by (count - 1) >> k. False when the run is not (stream end,
// too long); the caller checks Overrun() and the gap's range.
TERN_HD_ALWAYS_INLINE bool ReadRice(BitReader& in, int k, uint64_t count, uint64_t* gap) {
  uint64_t q;
  if (!in.ReadUnary((count - 1) >> k, &q)) return false;
  *gap = (q << k) | in.Read(k);
  return true;
}
template <class Sink>
TERN_HD void PutRice(BitWriter<Sink>& out, uint64_t gap, int k) {
  out.PutUnary(gap >> k);
  out.Put(gap, k);
}

// Bits of the Rice codes of the gaps between sorted positions (u64 on the
// CPU, u32 on the GPU: the same stream).
template <class Position>
TERN_HD uint64_t RiceBits(const Position* positions, uint64_t n, int k) {
  uint64_t bits = n * static_cast<uint64_t>(k + 1);
  uint64_t next = 0;
  for (uint64_t j = 0; j < n; ++j) {
    bits += (positions[j] - next) >> k;
    next = uint64_t{positions[j]} + 1;
  }
  return bits;
}

// The k in [k0 - 2, k0 + 2] ∩ [0, k_max] (k0 = floor(log2(mean gap))) with
// the fewest bits for n positions in `span` elements; the cost is convex in
// k. *bits: that size.
template <class Position>
TERN_HD int BestRiceK(const Position* positions, uint64_t n, uint64_t span, int k_max,
                      uint64_t* bits) {
  const uint64_t mean_gap = (span - n) / n;
  const int k0 = mean_gap ? 63 - hd::Clz64(mean_gap) : 0;
  int best_k = 0;
  *bits = ~uint64_t{0};
  const int k_lo = k0 - 2 > 0 ? k0 - 2 : 0, k_hi = k0 + 2 < k_max ? k0 + 2 : k_max;
  for (int k = k_lo; k <= k_hi; ++k) {
    const uint64_t b = RiceBits(positions, n, k);
    if (b < *bits) *bits = b, best_k = k;
  }
  return best_k;
}

// ---- Varints (§6.4) ---------------------------------------------------------

// Unsigned LEB128, at most 5 bytes, minimal, <= max; *at advances.
TERN_HD bool ReadVarint(const uint8_t* p, uint64_t n, uint64_t* at, uint64_t max, uint64_t* v) {
  uint64_t x = 0;
  for (int shift = 0; shift < 35; shift += 7) {
    if (*at >= n) return false;
    const uint8_t b = p[(*at)++];
    x |= static_cast<uint64_t>(b & 0x7fu) << shift;
    if (!(b & 0x80)) {
      if (b == 0 && shift > 0) return false;  // not minimal
      if (x > max) return false;
      *v = x;
      return true;
    }
  }
  return false;
}
// Minimal form only (a reader rejects padded varints, so every table has
// one spelling).
template <class Sink>
TERN_HD void PutVarint(uint64_t v, Sink* out) {
  while (v >= 0x80) {
    out->Push(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out->Push(static_cast<uint8_t>(v));
}
TERN_HD uint64_t VarintBytes(uint64_t v) {
  uint64_t b = 1;
  for (; v >= 0x80; v >>= 7) ++b;
  return b;
}

}  // namespace tern::format
