// Per-element and per-segment logic of the GPU codec kernels, as TERN_HD
// functions (format/hd.h): the packed-F4 write rule, shard index maps, and
// the device's decoder of one format-1 segment
// record: one thread per record, canonical codes decoded bit by bit (a
// lookup table per record would not fit a thread). What a record is and how
// each header, table, value and gap is read is format/record.h's, the one
// definition patch/'s codec calls too (its decode loops are table-driven
// and host-only); gpu/ops/codec_ops_test.cc holds this decoder to patch/'s
// on valid and corrupted streams alike.
//
// The decoder accepts exactly what the CPU decoder accepts: a segment either
// decodes to the same (position, delta) list or fails. It reads only inside
// the stream lengths it is given and every loop is bounded by the record's
// counts (element_count <= 2^24), so hostile streams cost bounded work.
#pragma once

#include <cstdint>

#include "format/bit_stream.h"
#include "format/digest_terms.h"
#include "format/element.h"
#include "format/hd.h"
#include "format/record.h"
#include "format/value_code.h"

namespace tern::gpu {

// The record layout, bit streams and codes (format/record.h), by their
// short names.
using format::BitReader;
using format::CanonicalDecoder;
using format::Encoding;
using format::kContext;
using format::kDense;
using format::kLiteralSymbols;
using format::kMaxClasses;
using format::kMaxCodeBits;
using format::kMaxContextTableBytes;
using format::kMaxSegmentElements;
using format::kMaxTableBytes;
using format::kRaw;
using format::kRecordChecksumBytes;
using format::kSparse;
using format::kSymbols;
using format::RecordHeader;

// ---- Values -----------------------------------------------------------------

// WidthMask, ZigZag, UnZigZag, ValueSymbol: format/value_code.h, shared with patch/.

// Element i's raw bits by width (spec §1): format/element.h, shared with patch/.
using format::LoadElement;
using format::StoreElement;

// Applying the change of a packed F4 element (nibble `odd` of its byte) when
// another thread may hold the other nibble's change: the even nibble's
// change writes the whole byte (with its partner's delta when the odd
// nibble changed too); an odd nibble's change writes only when the even
// nibble did not change. So each byte is written once, by one thread, and
// byte stores never race. Returns false when this change must not write.
TERN_HD bool F4ByteToWrite(uint8_t old_byte, bool odd, uint64_t delta, bool prev_partner, bool next_partner,
                           uint64_t next_delta, uint8_t* out) {
  const uint8_t lo = old_byte & 15, hi = old_byte >> 4;
  if (odd) {
    if (prev_partner) return false;
    *out = static_cast<uint8_t>(lo | (((hi + delta) & 15) << 4));
    return true;
  }
  const uint8_t new_hi = next_partner ? static_cast<uint8_t>((hi + next_delta) & 15) : hi;
  *out = static_cast<uint8_t>(((lo + delta) & 15) | (new_hi << 4));
  return true;
}

// ---- Digest (spec §8) --------------------------------------------------------

// The element and tensor terms (Mix64, Lane, AddElementHash,
// AddElementChange, AddTensorTerm): format/digest_terms.h, shared with patch/.

// ---- Tensor-parallel shards (docs/gpu.md, "Islands") -----------------------

// A shard of a tensor viewed as [rows, cols] (leading dimensions folded into
// rows): the block of rows [r0, r1) and columns [c0, c1), stored row-major.
struct ShardBlock {
  uint64_t cols = 0;  // the full tensor's
  uint64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
};

// Whether global element i is in the block, and its index in the shard.
TERN_HD bool ShardLocalIndex(const ShardBlock& b, uint64_t i, uint64_t* local) {
  const uint64_t r = i / b.cols, c = i % b.cols;
  if (r < b.r0 || r >= b.r1 || c < b.c0 || c >= b.c1) return false;
  *local = (r - b.r0) * (b.c1 - b.c0) + (c - b.c0);
  return true;
}

// The global index of shard-local element k.
TERN_HD uint64_t ShardGlobalIndex(const ShardBlock& b, uint64_t k) {
  const uint64_t w = b.c1 - b.c0;
  return (b.r0 + k / w) * b.cols + b.c0 + k % w;
}

// ---- Decoding (spec §5, §6) -------------------------------------------------

enum DecodeError : int {
  kDecodeOk = 0,
  kBadTable,       // code table malformed (size, padding, Kraft, not minimal)
  kBadValue,       // no code word, a symbol too long for w, or stream overrun
  kBadPosition,    // SPARSE: bad unary run or position out of range
  kZeroDelta,      // SPARSE: a zero delta
  kCountMismatch,  // changed_count differs from the stream's non-zero deltas
  kNotClean,       // a stream not consumed exactly (spec §4)
  kBadHeader,      // header fields break a rule of spec §3.3
};

// A stored code table (format::ParseCodeLengths's rules) as a decoder.
TERN_HD int ParseCodeTable(const uint8_t* table, uint32_t bytes, CanonicalDecoder* code) {
  uint8_t lengths[kSymbols];
  if (format::ParseCodeLengths(table, bytes, lengths) != nullptr) return kBadTable;
  format::BuildCanonicalDecoder(lengths, code);
  return kDecodeOk;
}

// A value's zigzag form, or false (bad code, too wide for w).
TERN_HD bool DecodeValue(BitReader& in, const CanonicalDecoder& c, int w, uint64_t* z) {
  const int sym = format::DecodeSymbol(in, c);
  return sym >= 0 && format::ReadSymbolValue(in, sym, w, z);
}

// Streams of one record, already framed and checksummed by the host.
struct SegmentStreams {
  RecordHeader h;
  const uint8_t* table;
  const uint8_t* positions;
  const uint8_t* values;
};

// Decodes one record, calling fn(position_in_segment, delta) for every
// non-zero delta in increasing position order; returns a DecodeError. On an
// error fn may already have been called for earlier changes.
template <class Fn>
TERN_HD int DecodeSegment(const SegmentStreams& s, int w, Fn&& fn) {
  const RecordHeader& h = s.h;
  if (h.encoding == kContext || format::RecordHeaderProblem(h, w, false) != nullptr)
    return kBadHeader;
  if (h.encoding == kRaw) {
    BitReader in(s.values, h.value_bytes);
    uint64_t changed = 0;
    for (uint64_t i = 0; i < h.element_count; ++i) {
      const uint64_t d = in.Read(w);
      if (d != 0) {
        ++changed;
        fn(i, d);
      }
    }
    if (!in.FinishedCleanly()) return kNotClean;
    return changed == h.changed_count ? kDecodeOk : kCountMismatch;
  }
  CanonicalDecoder code;
  const int t = ParseCodeTable(s.table, h.table_bytes, &code);
  if (t != kDecodeOk) return t;
  BitReader vin(s.values, h.value_bytes);
  if (h.encoding == kDense) {
    uint64_t changed = 0;
    for (uint64_t i = 0; i < h.element_count; ++i) {
      uint64_t z;
      if (!DecodeValue(vin, code, w, &z) || vin.Overrun()) return kBadValue;
      if (z != 0) {
        ++changed;
        fn(i, UnZigZag(z, w));
      }
    }
    if (!vin.FinishedCleanly()) return kNotClean;
    return changed == h.changed_count ? kDecodeOk : kCountMismatch;
  }
  BitReader pin(s.positions, h.position_bytes);
  const int k = h.rice_k;
  const uint64_t count = h.element_count;
  uint64_t next = 0;
  for (uint64_t j = 0; j < h.changed_count; ++j) {
    uint64_t gap;
    if (!format::ReadRice(pin, k, count, &gap) || pin.Overrun() || gap >= count - next)
      return kBadPosition;
    const uint64_t pos = next + gap;
    uint64_t z;
    if (!DecodeValue(vin, code, w, &z) || vin.Overrun()) return kBadValue;
    if (z == 0) return kZeroDelta;
    fn(pos, UnZigZag(z, w));
    next = pos + 1;
  }
  if (!pin.FinishedCleanly() || !vin.FinishedCleanly()) return kNotClean;
  return kDecodeOk;
}

}  // namespace tern::gpu
