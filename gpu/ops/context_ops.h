// Format 2's CONTEXT segments (docs/format/patch.md §6.4) for the GPU
// apply, as TERN_HD functions (format/hd.h): the exponent field per dtype, the
// context table, and a decoder of one CONTEXT record against its base.
// A second implementation of patch/context_codec.h (host-only, private to
// patch/); gpu/ops/context_ops_test.cc holds it to that one on the golden files,
// on random records and on corrupted ones (the same accept/reject decision).
//
// Device shape: one thread per record walks the segment's base elements
// once, in order, with all K classes' stream readers live: element i's class
// comes from its base value; when i is the next change of its class (by rank
// among the class's members) the class's value stream gives its delta. So
// changes come out in increasing position order (the apply's packed-F4 write
// rule relies on that) and every base element is read before anything is
// written (the apply writes only after every record has decoded).
// TODO(perf): the walk is serial over the segment's element_count, not over
// its changes; a warp per record (ballots for class membership, prefix sums
// of class counts) would cut it by 32.
#pragma once

#include <cstdint>

#include "format/hd.h"
#include "gpu/ops/codec_ops.h"

namespace tern::gpu {

inline constexpr uint8_t kContextEncoding = 3;  // spec §3.3
inline constexpr int kMaxContextClasses = 16;
inline constexpr uint32_t kMaxContextTableBytes = 3 + kMaxContextClasses * (4 + 1 + 5 + 5 + 39);

// The exponent field x(v) = (v >> shift) & mask of a dtype (spec §6.4, by
// the dtype codes of §9); mask 0: the dtype has none (no CONTEXT records).
struct ContextFieldHd {
  int shift = 0;
  uint32_t mask = 0;
};
TERN_HD ContextFieldHd ContextFieldOfCode(int dtype_code) {
  switch (dtype_code) {
    case 9: return {7, 0xff};    // BF16
    case 8: return {10, 0x1f};   // F16
    case 12: return {23, 0xff};  // F32
    case 13: return {52, 0x7ff}; // F64
    case 4: return {3, 0xf};     // F8_E4M3
    case 3: return {2, 0x1f};    // F8_E5M2
    case 5: return {0, 0xff};    // F8_E8M0
    case 16: return {1, 0x3};    // F4
    default: return {};
  }
}

// Class of a base value: min(max(e0 - x, 0), K - 1).
TERN_HD int ContextClassOf(uint64_t base_value, ContextFieldHd f, uint32_t e0, int classes) {
  const int32_t c = static_cast<int32_t>(e0) - static_cast<int32_t>((base_value >> f.shift) & f.mask);
  return c < 0 ? 0 : (c > classes - 1 ? classes - 1 : c);
}

struct ContextClassHd {
  uint64_t changes;
  int rice_k;
  uint32_t position_at, position_bytes;  // within the record's positions stream
  uint32_t value_at, value_bytes;        // within its values stream
  HuffmanCode code;
};

struct ContextTableHd {
  int classes;
  uint32_t e0;
  ContextClassHd cls[kMaxContextClasses];
};

// Unsigned LEB128, at most 5 bytes, minimal, <= max.
TERN_HD bool ReadVarint(const uint8_t* p, uint32_t n, uint32_t* at, uint64_t max, uint64_t* v) {
  uint64_t x = 0;
  for (int shift = 0; shift < 35; shift += 7) {
    if (*at >= n) return false;
    const uint8_t b = p[(*at)++];
    x |= static_cast<uint64_t>(b & 0x7fu) << shift;
    if (!(b & 0x80)) {
      if (b == 0 && shift > 0) return false;
      if (x > max) return false;
      *v = x;
      return true;
    }
  }
  return false;
}

// Parses and checks a CONTEXT record's table against its header (every rule
// of §6.4 but the rank bound, which needs the base). Returns a DecodeError.
TERN_HD int ParseContextTable(const RecordHeader& h, const uint8_t* p, ContextTableHd* t) {
  const uint32_t n = h.table_bytes;
  if (n < 3 || n > kMaxContextTableBytes) return kBadTable;
  t->classes = p[0];
  t->e0 = static_cast<uint32_t>(p[1]) | (static_cast<uint32_t>(p[2]) << 8);
  if (t->classes < 2 || t->classes > kMaxContextClasses || t->e0 > 4095) return kBadTable;
  uint32_t at = 3;
  uint64_t changes = 0, pos_bytes = 0, val_bytes = 0;
  for (int c = 0; c < t->classes; ++c) {
    ContextClassHd& cc = t->cls[c];
    cc.changes = 0;
    cc.rice_k = 0;
    cc.position_at = cc.position_bytes = cc.value_at = cc.value_bytes = 0;
    if (!ReadVarint(p, n, &at, h.element_count, &cc.changes)) return kBadTable;
    changes += cc.changes;
    if (changes > h.changed_count) return kBadTable;
    if (cc.changes == 0) continue;
    if (at >= n) return kBadTable;
    cc.rice_k = p[at++];
    if (cc.rice_k > 24) return kBadTable;
    uint64_t pb, vb;
    if (!ReadVarint(p, n, &at, h.position_bytes, &pb) || !ReadVarint(p, n, &at, h.value_bytes, &vb) || pb < 1 ||
        vb < 1)
      return kBadTable;
    if (pb > h.position_bytes - pos_bytes || vb > h.value_bytes - val_bytes) return kBadTable;
    cc.position_at = static_cast<uint32_t>(pos_bytes);
    cc.position_bytes = static_cast<uint32_t>(pb);
    cc.value_at = static_cast<uint32_t>(val_bytes);
    cc.value_bytes = static_cast<uint32_t>(vb);
    pos_bytes += pb;
    val_bytes += vb;
    if (at >= n) return kBadTable;
    const uint32_t tb = 1 + (static_cast<uint32_t>(p[at]) + 1) / 2;
    if (tb > n - at) return kBadTable;
    if (ParseCodeTable(p + at, tb, &cc.code) != kDecodeOk) return kBadTable;
    at += tb;
  }
  if (at != n || changes != h.changed_count) return kBadTable;
  if (pos_bytes != h.position_bytes || val_bytes != h.value_bytes) return kBadTable;
  return kDecodeOk;
}

// One class's gap: a Rice code with parameter k, < count (spec §6, §6.4).
TERN_HD bool ReadContextGap(BitReader& in, int k, uint64_t count, uint64_t* gap) {
  uint64_t q;
  if (!in.ReadUnary((count - 1) >> k, &q)) return false;
  *gap = (q << k) | in.Read(k);
  return !in.Overrun() && *gap < count;
}

// Decodes one CONTEXT record against `base`, the segment's tensor as it is
// before the apply (element first_element + i is the segment's element i),
// calling fn(position_in_segment, delta) for every change in increasing
// position order. Returns a DecodeError; on an error fn may already have
// been called for earlier changes.
template <class Fn>
TERN_HD int DecodeContextSegment(const SegmentStreams& s, int w, const uint8_t* base, ContextFieldHd f, Fn&& fn) {
  const RecordHeader& h = s.h;
  if (h.encoding != kContextEncoding || f.mask == 0) return kBadHeader;
  if (h.element_count < 1 || h.element_count > kMaxSegmentElements || h.changed_count < 1 ||
      h.changed_count > h.element_count)
    return kBadHeader;
  ContextTableHd t;
  const int e = ParseContextTable(h, s.table, &t);
  if (e != kDecodeOk) return e;
  const uint64_t count = h.element_count;
  BitReader pos[kMaxContextClasses], val[kMaxContextClasses];
  uint64_t left[kMaxContextClasses];  // changes still to come
  uint64_t next[kMaxContextClasses];  // rank of the next change among the class's members
  uint64_t seen[kMaxContextClasses];  // members passed so far
  int active = 0;
  for (int c = 0; c < t.classes; ++c) {
    const ContextClassHd& cc = t.cls[c];
    left[c] = cc.changes;
    seen[c] = 0;
    next[c] = 0;
    if (left[c] == 0) continue;
    ++active;
    pos[c] = BitReader(s.positions + cc.position_at, cc.position_bytes);
    val[c] = BitReader(s.values + cc.value_at, cc.value_bytes);
    if (!ReadContextGap(pos[c], cc.rice_k, count, &next[c])) return kBadPosition;
  }
  for (uint64_t i = 0; i < count && active > 0; ++i) {
    const int c = ContextClassOf(LoadElement(base, h.first_element + i, w), f, t.e0, t.classes);
    if (left[c] != 0 && seen[c] == next[c]) {
      uint64_t z;
      if (!DecodeValue(val[c], t.cls[c].code, w, &z) || val[c].Overrun()) return kBadValue;
      if (z == 0) return kZeroDelta;
      fn(i, UnZigZag(z, w));
      if (--left[c] == 0) {
        --active;
      } else {
        uint64_t gap;
        if (!ReadContextGap(pos[c], t.cls[c].rice_k, count, &gap)) return kBadPosition;
        next[c] += gap + 1;
      }
    }
    ++seen[c];
  }
  // A class whose ranks run past its members in this segment: a wrong base
  // or a damaged stream (the CPU decoder's "position past the class's
  // elements").
  if (active > 0) return kBadPosition;
  for (int c = 0; c < t.classes; ++c)
    if (t.cls[c].changes != 0 && (!pos[c].FinishedCleanly() || !val[c].FinishedCleanly())) return kNotClean;
  return kDecodeOk;
}

// Any record of a format-1 or format-2 patch: CONTEXT against the base, the
// others without it (base and f are then unused).
template <class Fn>
TERN_HD int DecodeRecordOnBase(const SegmentStreams& s, int w, const uint8_t* base, ContextFieldHd f, Fn&& fn) {
  if (s.h.encoding == kContextEncoding) return DecodeContextSegment(s, w, base, f, fn);
  return DecodeSegment(s, w, fn);
}

}  // namespace tern::gpu
