// One segment record: encode (encoder picks SPARSE, DENSE or RAW, whichever
// is smallest) and the fast, table-driven decode. Spec: docs/format/patch.md,
// "Segment records".
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

#include "patch/bitio.h"
#include "patch/format.h"
#include "tern/status.h"

namespace tern::patchfmt {

inline uint64_t WidthMask(int w) { return w >= 64 ? ~uint64_t{0} : (uint64_t{1} << w) - 1; }

// Zigzag of the w-bit two's-complement value d: 0,-1,1,-2,.. -> 0,1,2,3,..
inline uint64_t ZigZag(uint64_t d, int w) {
  const uint64_t mask = WidthMask(w);
  const uint64_t sign = (d >> (w - 1)) & 1;
  return ((d << 1) ^ (sign ? mask : 0)) & mask;
}
inline uint64_t UnZigZag(uint64_t z, int w) { return ((z >> 1) ^ (uint64_t{0} - (z & 1))) & WidthMask(w); }

// Symbol of zigzag value z; *extra_bits raw bits (*extra) follow it.
inline int ValueSymbol(uint64_t z, int* extra_bits, uint64_t* extra) {
  if (z < kLiteralSymbols) {
    *extra_bits = 0;
    *extra = 0;
    return static_cast<int>(z);
  }
  const int len = 64 - std::countl_zero(z);  // 5..64
  *extra_bits = len - 1;
  *extra = z & (WidthMask(len - 1));
  return kLiteralSymbols + len - 5;
}

// Appends one complete record (header, payload, checksum). positions are
// relative to `first`, strictly increasing, < count; deltas non-zero and
// < 2^w; n >= 1.
void EncodeRecord(const uint64_t* positions, const uint64_t* deltas, uint64_t n, int w,
                  uint32_t tensor_index, uint64_t first, uint64_t count, std::vector<uint8_t>* out);

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
Result<RecordView> ParseRecord(const uint8_t* data, uint64_t available, int w,
                               uint64_t* need_bytes = nullptr);

// Canonical code lengths from the stored table (validated: Kraft <= 1).
Status ParseCodeLengths(const uint8_t* table, uint32_t bytes, uint8_t lengths[kSymbols]);

struct HuffmanDecoder {
  // Entry for the next max_bits stream bits: symbol << 4 | code length, or 0.
  std::vector<uint16_t> table;
  int max_bits = 0;
};
void BuildDecoder(const uint8_t lengths[kSymbols], HuffmanDecoder* dec);

// Reads one value (returns zigzag value) or fails. Forced inline: it runs
// once per change in every decode loop.
[[gnu::always_inline]] inline bool DecodeValue(BitReader& in, const HuffmanDecoder& dec, int w, uint64_t* z) {
  const uint16_t e = dec.table[in.Peek(dec.max_bits)];
  if (e == 0) return false;
  in.Skip(e & 15);
  const int sym = e >> 4;
  if (sym < kLiteralSymbols) {
    *z = static_cast<uint64_t>(sym);
    return static_cast<uint64_t>(sym) <= WidthMask(w);
  }
  const int len = sym - kLiteralSymbols + 5;
  if (len > w) return false;
  *z = (uint64_t{1} << (len - 1)) | in.Read(len - 1);
  return true;
}

// Decodes a parsed record, calling fn(position_in_segment, delta) for every
// non-zero delta in increasing position order. Validates every stream.
template <class Fn>
Status DecodeRecord(const RecordView& r, int w, Fn&& fn) {
  const RecordHeader& h = r.h;
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
  if (h.encoding == kDense) {
    uint64_t changed = 0;
    for (uint64_t i = 0; i < h.element_count; ++i) {
      uint64_t z;
      if (!DecodeValue(vin, dec, w, &z) || vin.Overrun())
        return TERN_ERROR(kCorrupt, "DENSE segment: bad value code at element ", i);
      if (z != 0) {
        ++changed;
        fn(i, UnZigZag(z, w));
      }
    }
    TERN_REQUIRE(vin.FinishedCleanly(), kCorrupt, "DENSE segment: values stream not cleanly consumed");
    TERN_REQUIRE(changed == h.changed_count, kCorrupt, "DENSE segment: changed count mismatch");
    return Status::Ok();
  }
  // SPARSE
  BitReader pin(r.positions, h.position_bytes);
  const int k = h.rice_k;
  const uint64_t count = h.element_count;
  uint64_t next = 0;  // smallest position allowed for the next change
  for (uint64_t j = 0; j < h.changed_count; ++j) {
    uint64_t q;
    // gap < count, so q <= (count - 1) >> k bounds the unary run.
    if (!pin.ReadUnary((count - 1) >> k, &q))
      return TERN_ERROR(kCorrupt, "SPARSE segment: bad position code at change ", j);
    const uint64_t gap = (q << k) | pin.Read(k);
    if (pin.Overrun() || gap >= count - next)
      return TERN_ERROR(kCorrupt, "SPARSE segment: position out of range at change ", j);
    const uint64_t pos = next + gap;
    uint64_t z;
    if (!DecodeValue(vin, dec, w, &z) || vin.Overrun() || z == 0)
      return TERN_ERROR(kCorrupt, "SPARSE segment: bad value code at change ", j);
    fn(pos, UnZigZag(z, w));
    next = pos + 1;
  }
  TERN_REQUIRE(pin.FinishedCleanly(), kCorrupt, "SPARSE segment: positions stream not cleanly consumed");
  TERN_REQUIRE(vin.FinishedCleanly(), kCorrupt, "SPARSE segment: values stream not cleanly consumed");
  return Status::Ok();
}

}  // namespace tern::patchfmt
