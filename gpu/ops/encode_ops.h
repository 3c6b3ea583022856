// Per-segment logic of the GPU encoder, as TERN_HD functions (format/hd.h):
// from a segment's changes (positions, deltas) to one format-1 record in a
// bounded device buffer. The choice of encoding and the payload are
// format/record_encode.h's, the code patch/'s EncodeRecord runs too, so a
// patch published from GPU memory is the CPU's byte for byte
// (gpu/ops/codec_ops_test.cc compares them with tern::EncodeSegment) and
// golden files and digests of patches stay comparable.
//
// The record checksum (XXH3-64) is left to the host, which needs the bytes
// anyway to send them: EncodeRecordBody writes header and payload only.
#pragma once

#include <cstdint>

#include "format/bit_stream.h"
#include "format/record_encode.h"
#include "gpu/ops/codec_ops.h"

namespace tern::gpu {

using format::ByteSink;

// Largest record EncodeRecordBody writes for `count` elements of width w:
// it writes RAW unless a coded form is smaller, so RAW's size bounds it.
TERN_HD uint64_t MaxRecordBodyBytes(uint64_t count, int w) {
  return sizeof(RecordHeader) + (count * static_cast<uint64_t>(w) + 7) / 8;
}

// Writes the record (header and payload, no checksum) for count <= 2^24
// elements and n >= 1 changes at strictly increasing positions < count with
// non-zero deltas < 2^w, choosing SPARSE, DENSE or RAW as patch/'s
// EncodeRecord does. Positions are u32 (relative to the segment, < 2^24) and
// code counts u32: half the scratch and local memory of the CPU's u64, the
// same bytes. Returns bytes written, or 0 on overflow of `out` (capacity
// MaxRecordBodyBytes suffices).
TERN_HD uint64_t EncodeRecordBody(const uint32_t* positions, const uint64_t* deltas, uint64_t n, int w,
                                  uint32_t tensor_index, uint64_t first, uint64_t count, uint8_t* out,
                                  uint64_t capacity) {
  format::RecordPlan plan;
  format::PlanRecord<uint32_t>(positions, deltas, n, w, count, &plan);
  RecordHeader h{};
  h.tensor_index = tensor_index;
  h.first_element = first;
  h.element_count = count;
  h.changed_count = n;
  ByteSink sink{out, capacity};
  for (uint64_t i = 0; i < sizeof(RecordHeader); ++i) sink.Push(0);  // header last
  format::WriteRecordPayload(plan, plan.Choice(), positions, deltas, n, w, count, &sink, &h);
  if (sink.overflow) return 0;
  const uint8_t* hb = reinterpret_cast<const uint8_t*>(&h);
  for (uint64_t i = 0; i < sizeof(RecordHeader); ++i) out[i] = hb[i];
  return sink.size;
}

}  // namespace tern::gpu
