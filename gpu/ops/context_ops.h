// Format 2's CONTEXT segments (docs/format/patch.md §6.4) for the GPU
// apply, as TERN_HD functions (format/hd.h): a decoder of one CONTEXT record
// against its base. The exponent fields, classes and the context table are
// format/context.h's, which patch/context_codec.h (the CPU's blocked, SIMD
// decoder) calls too; gpu/ops/context_ops_test.cc holds the two decoders
// equal on the golden files, on random records and on corrupted ones (the
// same accept/reject decision).
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

#include "format/context.h"
#include "format/hd.h"
#include "gpu/ops/codec_ops.h"

namespace tern::gpu {

using format::ContextClassOf;
using format::ContextField;
using format::ContextFieldOfCode;

// A parsed context table and each class's value code.
struct ContextTableHd {
  format::ContextLayout layout;
  CanonicalDecoder code[kMaxClasses];
};

// Parses and checks a CONTEXT record's table against its header (every rule
// of §6.4 but the rank bound, which needs the base). Returns a DecodeError.
TERN_HD int ParseContextTable(const RecordHeader& h, const uint8_t* p, ContextTableHd* t) {
  if (format::ParseContextLayout(h, p, &t->layout) != nullptr) return kBadTable;
  for (int c = 0; c < t->layout.classes; ++c) {
    const format::ContextClassLayout& cc = t->layout.cls[c];
    if (cc.changes == 0) continue;
    if (ParseCodeTable(p + cc.table_at, cc.table_bytes, &t->code[c]) != kDecodeOk) return kBadTable;
  }
  return kDecodeOk;
}

// One class's gap: a Rice code with parameter k, < count (spec §6, §6.4).
TERN_HD bool ReadContextGap(BitReader& in, int k, uint64_t count, uint64_t* gap) {
  return format::ReadRice(in, k, count, gap) && !in.Overrun() && *gap < count;
}

// Decodes one CONTEXT record against `base`, the segment's tensor as it is
// before the apply (element first_element + i is the segment's element i),
// calling fn(position_in_segment, delta) for every change in increasing
// position order. Returns a DecodeError; on an error fn may already have
// been called for earlier changes.
template <class Fn>
TERN_HD int DecodeContextSegment(const SegmentStreams& s, int w, const uint8_t* base,
                                 ContextField f, Fn&& fn) {
  const RecordHeader& h = s.h;
  if (h.encoding != kContext || !f.ok || format::RecordHeaderProblem(h, w, true) != nullptr)
    return kBadHeader;
  ContextTableHd table;
  const int e = ParseContextTable(h, s.table, &table);
  if (e != kDecodeOk) return e;
  const format::ContextLayout& t = table.layout;
  const uint64_t count = h.element_count;
  BitReader pos[kMaxClasses], val[kMaxClasses];
  uint64_t left[kMaxClasses];  // changes still to come
  uint64_t next[kMaxClasses];  // rank of the next change among the class's members
  uint64_t seen[kMaxClasses];  // members passed so far
  int active = 0;
  for (int c = 0; c < t.classes; ++c) {
    const format::ContextClassLayout& cc = t.cls[c];
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
      if (!DecodeValue(val[c], table.code[c], w, &z) || val[c].Overrun()) return kBadValue;
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
TERN_HD int DecodeRecordOnBase(const SegmentStreams& s, int w, const uint8_t* base, ContextField f,
                               Fn&& fn) {
  if (s.h.encoding == kContext) return DecodeContextSegment(s, w, base, f, fn);
  return DecodeSegment(s, w, fn);
}

}  // namespace tern::gpu
