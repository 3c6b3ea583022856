// Per-element and per-segment logic of the GPU codec kernels, as TERN_HD
// functions (format/hd.h): element access by width, and a bounds-checked
// decoder of one format-1 segment record's streams. An independent
// implementation of docs/format/patch.md §1, §4 and §6 (patch/'s own decoder
// is private to it, table-driven and host-only); gpu/ops/codec_ops_test.cc checks
// it against patch/'s reference decoder and encoder, valid and corrupted
// streams alike. What both sides compute from one source lives in base/:
// the values' zigzag and symbols (§5, format/value_code.h) and the digest's
// element terms (§8, format/digest_terms.h; the golden files pin them).
//
// The decoder accepts exactly what the CPU decoder accepts: a segment either
// decodes to the same (position, delta) list or fails. It reads only inside
// the stream lengths it is given and every loop is bounded by the record's
// counts (element_count <= 2^24), so hostile streams cost bounded work.
#pragma once

#include <cstdint>

#include "format/digest_terms.h"
#include "format/hd.h"
#include "format/value_code.h"

namespace tern::gpu {

// ---- Record layout (spec §3.3), the same bytes as patch/format.h ---------

enum Encoding : uint8_t { kSparse = 0, kDense = 1, kRaw = 2 };
inline constexpr int kSymbols = 76;
inline constexpr int kMaxCodeBits = 15;
inline constexpr uint32_t kMaxTableBytes = 1 + (kSymbols + 1) / 2;
inline constexpr uint64_t kMaxSegmentElements = uint64_t{1} << 24;
inline constexpr uint64_t kRecordChecksumBytes = 8;

struct RecordHeader {
  uint32_t tensor_index;
  uint8_t encoding;
  uint8_t rice_k;
  uint16_t reserved0;
  uint64_t first_element;
  uint64_t element_count;
  uint64_t changed_count;
  uint32_t table_bytes;
  uint32_t position_bytes;
  uint32_t value_bytes;
  uint32_t reserved1;
};
static_assert(sizeof(RecordHeader) == 48, "spec §3.3");

// ---- Values -----------------------------------------------------------------

// WidthMask, ZigZag, UnZigZag, ValueSymbol: format/value_code.h, shared with patch/.

// Element i's raw bits (spec §1; F4: low nibble first). Byte-wise so any
// alignment works; the kernels use wider accesses where they know better.
TERN_HD uint64_t LoadElement(const uint8_t* data, uint64_t i, int w) {
  if (w == 4) return (data[i >> 1] >> ((i & 1) * 4)) & 15;
  const int bytes = w / 8;
  const uint8_t* p = data + i * static_cast<uint64_t>(bytes);
  uint64_t v = 0;
  for (int b = 0; b < bytes; ++b) v |= static_cast<uint64_t>(p[b]) << (8 * b);
  return v;
}
TERN_HD void StoreElement(uint8_t* data, uint64_t i, int w, uint64_t v) {
  if (w == 4) {
    const int shift = static_cast<int>(i & 1) * 4;
    data[i >> 1] = static_cast<uint8_t>((data[i >> 1] & ~(15 << shift)) | ((v & 15) << shift));
    return;
  }
  const int bytes = w / 8;
  uint8_t* p = data + i * static_cast<uint64_t>(bytes);
  for (int b = 0; b < bytes; ++b) p[b] = static_cast<uint8_t>(v >> (8 * b));
}

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

// ---- Bit reader (spec §4) ---------------------------------------------------

// LSB-first; bits past the end read as zero and set Overrun(), exactly as
// patch/bitio.h's reader, so both decoders fail on the same inputs. The next
// stream bits are cached in a register and refilled (8 byte loads) only when
// a read needs more than the cache holds: on a GPU thread the loads, not the
// shifts, are the cost, and a change takes ~10 bits of each stream.
struct BitReader {
  const uint8_t* data = nullptr;
  uint64_t bytes = 0;
  uint64_t pos = 0;     // bits consumed
  uint64_t cache = 0;   // stream bits [pos, pos + cached), zero past the end
  int cached = 0;

  TERN_HD BitReader() {}
  TERN_HD BitReader(const uint8_t* d, uint64_t n) : data(d), bytes(n) {}
  TERN_HD uint64_t bits() const { return bytes * 8; }
  TERN_HD void Fill() {
    const uint64_t byte = pos >> 3;
    uint64_t w = 0;
    for (int b = 0; b < 8 && byte + b < bytes; ++b) w |= static_cast<uint64_t>(data[byte + b]) << (8 * b);
    cache = w >> (pos & 7);
    cached = 64 - static_cast<int>(pos & 7);  // >= 57
  }
  // Next n <= 56 bits, not consumed.
  TERN_HD uint64_t Peek(int n) {
    if (cached < n) Fill();
    return n == 0 ? 0 : (cache & (~uint64_t{0} >> (64 - n)));
  }
  TERN_HD void Skip(uint64_t n) {
    pos += n;
    if (n < static_cast<uint64_t>(cached)) {
      cache >>= n;
      cached -= static_cast<int>(n);
    } else {
      cached = 0;
    }
  }
  TERN_HD uint64_t Read(int n) {  // n <= 64
    if (n > 56) {
      const uint64_t lo = Read(32);
      return lo | (Read(n - 32) << 32);
    }
    const uint64_t v = Peek(n);
    Skip(static_cast<uint64_t>(n));
    return v;
  }
  // Zero bits up to the next one bit (consumed); false when the stream ends
  // first or the run exceeds max_q.
  TERN_HD bool ReadUnary(uint64_t max_q, uint64_t* q) {
    uint64_t n = 0;
    for (;;) {
      if (pos >= bits()) return false;
      const uint64_t w = Peek(56);
      if (w != 0) {
        const int tz = Ctz64(w);
        n += static_cast<uint64_t>(tz);
        Skip(static_cast<uint64_t>(tz) + 1);
        if (n > max_q || pos > bits()) return false;
        *q = n;
        return true;
      }
      n += 56;
      Skip(56);
      if (n > max_q) return false;
    }
  }
  TERN_HD bool Overrun() const { return pos > bits(); }
  TERN_HD bool FinishedCleanly() const {
    if (pos > bits() || (pos + 7) / 8 != bytes) return false;
    if ((pos & 7) == 0) return true;
    return (data[bytes - 1] >> (pos & 7)) == 0;
  }
};

// ---- Canonical Huffman decode (spec §5) -------------------------------------

// Decodes bit by bit with per-length counts (as zlib's puff): 76 symbols and
// 15-bit codes need 16 + 76 bytes, small enough for every GPU thread to
// hold one, where a lookup table would need up to 64 KiB.
// TODO(perf): a 8-bit first-level table in shared memory per record.
struct HuffmanCode {
  uint16_t count[kMaxCodeBits + 1];  // codes of each length
  uint8_t symbol[kSymbols];          // symbols in canonical order
  int max_bits;
};

enum DecodeError : int {
  kDecodeOk = 0,
  kBadTable,       // code table malformed (size, padding, Kraft, not minimal)
  kBadValue,       // no code word, a symbol too long for w, or stream overrun
  kBadPosition,    // SPARSE: bad unary run or position out of range
  kZeroDelta,      // SPARSE: a zero delta
  kCountMismatch,  // changed_count differs from the stream's non-zero deltas
  kNotClean,       // a stream not consumed exactly (spec §4)
  kBadHeader,      // header fields the decoder relies on are inconsistent
};

TERN_HD int ParseCodeTable(const uint8_t* table, uint32_t bytes, HuffmanCode* code) {
  if (bytes < 1) return kBadTable;
  const int nsym = table[0];
  if (nsym < 1 || nsym > kSymbols) return kBadTable;
  if (bytes != 1 + static_cast<uint32_t>((nsym + 1) / 2)) return kBadTable;
  if ((nsym & 1) && (table[bytes - 1] >> 4) != 0) return kBadTable;
  uint8_t lengths[kSymbols];
  for (int s = 0; s < kSymbols; ++s) lengths[s] = s < nsym ? (table[1 + s / 2] >> (4 * (s & 1))) & 15 : 0;
  if (lengths[nsym - 1] == 0) return kBadTable;
  uint64_t kraft = 0;
  for (int len = 0; len <= kMaxCodeBits; ++len) code->count[len] = 0;
  code->max_bits = 0;
  for (int s = 0; s < nsym; ++s) {
    if (!lengths[s]) continue;
    kraft += uint64_t{1} << (kMaxCodeBits - lengths[s]);
    code->count[lengths[s]]++;
    if (lengths[s] > code->max_bits) code->max_bits = lengths[s];
  }
  if (kraft > (uint64_t{1} << kMaxCodeBits)) return kBadTable;
  uint16_t offs[kMaxCodeBits + 2];
  offs[1] = 0;
  for (int len = 1; len <= kMaxCodeBits; ++len) offs[len + 1] = offs[len] + code->count[len];
  for (int s = 0; s < nsym; ++s)
    if (lengths[s]) code->symbol[offs[lengths[s]]++] = static_cast<uint8_t>(s);
  return kDecodeOk;
}

// The next symbol, or -1 when the bits form no code word within max_bits.
TERN_HD int DecodeSymbol(BitReader& in, const HuffmanCode& c) {
  const uint64_t bits = in.Peek(c.max_bits);
  int code = 0, first = 0, index = 0;
  for (int len = 1; len <= c.max_bits; ++len) {
    code |= static_cast<int>((bits >> (len - 1)) & 1);
    const int count = c.count[len];
    if (code - first < count) {
      in.Skip(static_cast<uint64_t>(len));
      return c.symbol[index + (code - first)];
    }
    index += count;
    first += count;
    first <<= 1;
    code <<= 1;
  }
  return -1;
}

// A value's zigzag form, or false (bad code, too wide for w).
TERN_HD bool DecodeValue(BitReader& in, const HuffmanCode& c, int w, uint64_t* z) {
  const int sym = DecodeSymbol(in, c);
  if (sym < 0) return false;
  if (sym < kLiteralSymbols) {
    *z = static_cast<uint64_t>(sym);
    return static_cast<uint64_t>(sym) <= WidthMask(w);
  }
  const int len = sym - kLiteralSymbols + 5;
  if (len > w) return false;
  *z = (uint64_t{1} << (len - 1)) | in.Read(len - 1);
  return true;
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
  if (h.element_count < 1 || h.element_count > kMaxSegmentElements || h.changed_count > h.element_count)
    return kBadHeader;
  if (h.encoding == kRaw) {
    if (h.value_bytes != (h.element_count * static_cast<uint64_t>(w) + 7) / 8) return kBadHeader;
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
  if (h.encoding != kSparse && h.encoding != kDense) return kBadHeader;
  HuffmanCode code;
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
  if (h.changed_count < 1 || h.rice_k > 63) return kBadHeader;
  BitReader pin(s.positions, h.position_bytes);
  const int k = h.rice_k;
  const uint64_t count = h.element_count;
  uint64_t next = 0;
  for (uint64_t j = 0; j < h.changed_count; ++j) {
    uint64_t q;
    if (!pin.ReadUnary((count - 1) >> k, &q)) return kBadPosition;
    const uint64_t gap = (q << k) | pin.Read(k);
    if (pin.Overrun() || gap >= count - next) return kBadPosition;
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
