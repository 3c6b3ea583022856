// One segment record: encode (encoder picks SPARSE, DENSE or RAW, whichever
// is smallest) and the fast, table-driven decode. Spec: docs/format/patch.md,
// "Segment records".
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

#include "format/context.h"
#include "format/record.h"
#include "patch/bitio.h"
#include "patch/format.h"
#include "tern/status.h"

namespace tern::patch {

using format::UnZigZag;
using format::ValueSymbol;
using format::WidthMask;
using format::ZigZag;

// Huffman code construction, code tables and Rice sizes: format/record.h's,
// shared with the GPU encoder.
using format::BuildLengths;
using format::CanonicalCodes;
using format::CodeBits;
using format::RiceBits;
using format::TableBytes;

// The exponent field of a dtype's elements (format/context.h).
using format::ContextField;

// Where a format-2 encoder finds the base (context_codec.h): the base
// tensor's bytes. Null tensor or !field.ok: base-free encodings only.
struct ContextBase {
  const uint8_t* tensor = nullptr;
  ContextField field;
  int max_classes = kMaxClasses;  // 2 .. kMaxClasses
};

// Appends one complete record (header, payload, checksum). positions are
// relative to `first`, strictly increasing, < count; deltas non-zero and
// < 2^w; n >= 1. With a base, CONTEXT competes with the other encodings.
void EncodeRecord(const uint64_t* positions, const uint64_t* deltas, uint64_t n, int w,
                  uint32_t tensor_index, uint64_t first, uint64_t count, std::vector<uint8_t>* out,
                  const ContextBase& base = {});

struct RecordView {
  RecordHeader h;
  const uint8_t* table;
  const uint8_t* positions;
  const uint8_t* values;
  uint64_t total_bytes;  // header + payload + checksum
  uint64_t checksum;
};

// Validates the record framing at data[0..available): reserved fields, bounds
// of every length, encoding-specific rules, the checksum. Not the streams.
// *need_bytes (optional) is set to the record size when only that is missing.
// context_ok: CONTEXT is allowed (format 2, a dtype with an exponent field).
Result<RecordView> ParseRecord(const uint8_t* data, uint64_t available, int w,
                               uint64_t* need_bytes = nullptr, bool context_ok = false);

// Canonical code lengths from the stored table (format::ParseCodeLengths's
// rules: size, padding, minimal, Kraft <= 1).
Status ParseCodeLengths(const uint8_t* table, uint32_t bytes, uint8_t lengths[kSymbols]);

struct HuffmanDecoder {
  // Entry for the next max_bits stream bits: symbol << 4 | code length, or 0.
  std::vector<uint16_t> table;
  int max_bits = 0;
  // The same index, one lookup for a whole value (code and extra bits) on
  // the fast path (FastValue): see BuildFastTable. 0: take the checked path.
  std::vector<uint32_t> fast;
};
void BuildDecoder(const uint8_t lengths[kSymbols], HuffmanDecoder* dec);

// Fast entries: bits 0..7 bits consumed (code + extra, <= 56), 8..11 code
// length, 12..17 extra bits, 24..27 the value of a literal symbol. An entry
// is 0 (so the checked DecodeValue decides, and fails) for no code, for a
// symbol too long for width w, for z == 0 when !zero_ok (SPARSE stores only
// changes), and for a value longer than one 56-bit peek.
void BuildFastTable(int w, bool zero_ok, HuffmanDecoder* dec);

// The zigzag value of fast entry e (non-zero) at stream bits `bits`.
[[gnu::always_inline]] inline uint64_t FastValue(uint32_t e, uint64_t bits) {
  const int code_len = (e >> 8) & 15;
  const int extra = (e >> 12) & 63;
  const uint64_t m = (uint64_t{1} << extra) - 1;  // 0 for literals
  // Literal: e >> 24. Otherwise the implicit leading one, 1 << extra, and
  // the extra bits below it.
  return (e >> 24) | ((bits >> code_len) & m) | ((m + 1) & ~uint64_t{1});
}

// Reads one value (returns zigzag value) or fails. Forced inline: it runs
// once per change in every decode loop.
[[gnu::always_inline]] inline bool DecodeValue(BitReader& in, const HuffmanDecoder& dec, int w, uint64_t* z) {
  const uint16_t e = dec.table[in.Peek(dec.max_bits)];
  if (e == 0) return false;
  in.Skip(e & 15);
  return format::ReadSymbolValue(in, e >> 4, w, z);
}

// Decodes a parsed record, calling fn(position_in_segment, delta) for every
// non-zero delta in increasing position order. Validates every stream.
template <class Fn>
Status DecodeRecord(const RecordView& r, int w, Fn&& fn) {
  const RecordHeader& h = r.h;
  TERN_REQUIRE(h.encoding != kContext, kInvalidArgument, "a CONTEXT segment decodes only against its base");
  if (h.encoding == kRaw) {
    BitReader in(r.values, h.value_bytes);
    uint64_t changed = 0;
    for (uint64_t i = 0; i < h.element_count; ++i) {
      const uint64_t d = in.Read(w);
      if (d != 0) {
        ++changed;
        fn(i, d);
      }
    }
    TERN_REQUIRE(in.FinishedCleanly(), kCorrupt, "RAW segment: stream not cleanly consumed");
    TERN_REQUIRE(changed == h.changed_count, kCorrupt, "RAW segment: changed count mismatch");
    return Status::Ok();
  }
  uint8_t lengths[kSymbols];
  TERN_RETURN_IF_ERROR(ParseCodeLengths(r.table, h.table_bytes, lengths));
  HuffmanDecoder dec;
  BuildDecoder(lengths, &dec);
  BitReader vin(r.values, h.value_bytes);
  BuildFastTable(w, h.encoding == kDense, &dec);
  const uint32_t* fast = dec.fast.data();
  const uint64_t fast_mask = WidthMask(dec.max_bits);
  if (h.encoding == kDense) {
    uint64_t changed = 0;
    for (uint64_t i = 0; i < h.element_count;) {
      // Fast path: unchecked peeks while the stream has room for them.
      for (uint64_t m = std::min(vin.FastReads(), h.element_count - i); m > 0; --m) {
        const uint64_t bits = vin.PeekFast();
        const uint32_t e = fast[bits & fast_mask];
        if (e == 0) break;
        vin.Skip(e & 255);
        const uint64_t z = FastValue(e, bits);
        if (z != 0) {
          ++changed;
          fn(i, UnZigZag(z, w));
        }
        ++i;
      }
      if (i == h.element_count) break;
      // Checked path: one element.
      uint64_t z;
      if (!DecodeValue(vin, dec, w, &z) || vin.Overrun())
        return TERN_ERROR(kCorrupt, "DENSE segment: bad value code at element ", i);
      if (z != 0) {
        ++changed;
        fn(i, UnZigZag(z, w));
      }
      ++i;
    }
    TERN_REQUIRE(vin.FinishedCleanly(), kCorrupt, "DENSE segment: values stream not cleanly consumed");
    TERN_REQUIRE(changed == h.changed_count, kCorrupt, "DENSE segment: changed count mismatch");
    return Status::Ok();
  }
  // SPARSE
  BitReader pin(r.positions, h.position_bytes);
  const int k = h.rice_k;
  const uint64_t count = h.element_count;
  const uint64_t rem_mask = WidthMask(k);
  uint64_t next = 0;  // smallest position allowed for the next change
  for (uint64_t j = 0; j < h.changed_count;) {
    // Fast path: unchecked peeks while both streams have room for them. A
    // change is taken here only when it is certainly valid (its unary run,
    // remainder and value each fit one peek, the gap is in range, the value
    // is a non-zero code of width <= w); anything else goes to the checked
    // path below, which decodes it again and gives the exact error.
    const uint64_t m = std::min({pin.FastReads(), vin.FastReads(), h.changed_count - j});
    if (m > 0) {
      // Stream positions in locals: the readers' own fields live in memory
      // (ReadLong takes `this`), and a store per change would cost.
      uint64_t pat = pin.position_bits(), vat = vin.position_bits();
      // Values are short (~2 bits at 1%): kept in a bit buffer, reloaded
      // from vat when fewer than 56 bits are left, so the value chain is a
      // table lookup and a shift rather than a load, a shift, a lookup.
      uint64_t vbits = vin.PeekFastAt(vat);
      int vavail = 64 - static_cast<int>(vat & 7);
      const uint64_t j_end = j + m;
      for (; j < j_end; ++j) {
        const uint64_t pbits = pin.PeekFastAt(pat);
        if (vavail < 56) [[unlikely]] {
          vbits = vin.PeekFastAt(vat);
          vavail = 64 - static_cast<int>(vat & 7);
        }
        const int q = std::countr_zero(pbits);  // 64 when no one bit
        const uint32_t e = fast[vbits & fast_mask];
        const int pos_len = q + 1 + k;
        if (pos_len > 56 || e == 0) break;
        const uint64_t gap = (uint64_t(q) << k) | ((pbits >> (q + 1)) & rem_mask);
        if (gap >= count - next) break;
        pat += static_cast<uint64_t>(pos_len);
        const int val_len = static_cast<int>(e & 255);
        vat += static_cast<uint64_t>(val_len);
        vavail -= val_len;
        const uint64_t z = FastValue(e, vbits);
        vbits >>= val_len;
        const uint64_t pos = next + gap;
        fn(pos, UnZigZag(z, w));
        next = pos + 1;
      }
      pin.SkipBits(pat - pin.position_bits());
      vin.SkipBits(vat - vin.position_bits());
    }
    if (j == h.changed_count) break;
    // Checked path: one change.
    uint64_t gap;
    if (!format::ReadRice(pin, k, count, &gap))
      return TERN_ERROR(kCorrupt, "SPARSE segment: bad position code at change ", j);
    if (pin.Overrun() || gap >= count - next)
      return TERN_ERROR(kCorrupt, "SPARSE segment: position out of range at change ", j);
    const uint64_t pos = next + gap;
    uint64_t z;
    if (!DecodeValue(vin, dec, w, &z) || vin.Overrun() || z == 0)
      return TERN_ERROR(kCorrupt, "SPARSE segment: bad value code at change ", j);
    fn(pos, UnZigZag(z, w));
    next = pos + 1;
    ++j;
  }
  TERN_REQUIRE(pin.FinishedCleanly(), kCorrupt, "SPARSE segment: positions stream not cleanly consumed");
  TERN_REQUIRE(vin.FinishedCleanly(), kCorrupt, "SPARSE segment: values stream not cleanly consumed");
  return Status::Ok();
}

}  // namespace tern::patch
