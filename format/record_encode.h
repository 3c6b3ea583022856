// Writing one SPARSE, DENSE or RAW segment record (docs/format/patch.md §6),
// as TERN_HD functions (format/hd.h): the encoder's choice of encoding and
// the payload bytes. patch/'s EncodeRecord (which also tries CONTEXT and
// appends the checksum) and gpu/'s EncodeRecordBody (a bounded device
// buffer, the checksum left to the host) both call these, so a patch's bytes
// do not depend on where it was encoded (the golden files pin them).
#pragma once

#include <cstdint>

#include "format/bit_stream.h"
#include "format/hd.h"
#include "format/record.h"

namespace tern::format {

// The three base-free encodings' sizes and codes for one segment's changes.
struct RecordPlan {
  uint8_t sparse_len[kSymbols], dense_len[kSymbols];
  int rice_k;
  uint64_t sparse_bytes, dense_bytes, raw_bytes;

  // The smallest; ties go to SPARSE, then DENSE.
  TERN_HD Encoding Choice() const {
    if (raw_bytes < sparse_bytes && raw_bytes < dense_bytes) return kRaw;
    return sparse_bytes <= dense_bytes ? kSparse : kDense;
  }
  TERN_HD uint64_t SmallestBytes() const {
    const uint64_t m = sparse_bytes < dense_bytes ? sparse_bytes : dense_bytes;
    return raw_bytes < m ? raw_bytes : m;
  }
};

// Plans n >= 1 changes at strictly increasing positions < count <= 2^24
// (relative to the segment) with non-zero deltas < 2^w. Count: the
// frequency type (u64 on the CPU, u32 on the GPU: half a thread's local
// memory; every sum fits either way).
template <class Count, class Position>
TERN_HD void PlanRecord(const Position* positions, const uint64_t* deltas, uint64_t n, int w,
                        uint64_t count, RecordPlan* p) {
  Count freq[kSymbols];
  for (int s = 0; s < kSymbols; ++s) freq[s] = 0;
  uint64_t extra_bits = 0;
  for (uint64_t j = 0; j < n; ++j) {
    int eb;
    uint64_t ex;
    freq[ValueSymbol(ZigZag(deltas[j], w), &eb, &ex)]++;
    extra_bits += static_cast<uint64_t>(eb);
  }
  uint64_t pos_bits;
  p->rice_k = BestRiceK(positions, n, count, 62, &pos_bits);
  BuildLengths(freq, p->sparse_len);
  p->sparse_bytes = TableBytes(p->sparse_len) + (pos_bits + 7) / 8 +
                    (CodeBits(freq, p->sparse_len) + extra_bits + 7) / 8;
  freq[0] += static_cast<Count>(count - n);  // DENSE codes every unchanged element as 0
  BuildLengths(freq, p->dense_len);
  p->dense_bytes = TableBytes(p->dense_len) + (CodeBits(freq, p->dense_len) + extra_bits + 7) / 8;
  p->raw_bytes = (count * static_cast<uint64_t>(w) + 7) / 8;
}

// Appends the payload of encoding `e` (kSparse, kDense or kRaw; the plan's
// Choice() unless the caller knows better) to `out` and fills the header's
// encoding, rice_k and byte counts. The header itself is the caller's.
template <class Position, class Sink>
TERN_HD void WriteRecordPayload(const RecordPlan& p, Encoding e, const Position* positions,
                                const uint64_t* deltas, uint64_t n, int w, uint64_t count,
                                Sink* out, RecordHeader* h) {
  h->encoding = e;
  if (e == kRaw) {
    const uint64_t start = out->Size();
    BitWriter<Sink> bw(out);
    uint64_t j = 0;
    for (uint64_t i = 0; i < count; ++i) {
      const bool hit = j < n && positions[j] == i;
      bw.Put(hit ? deltas[j] : 0, w);
      j += hit;
    }
    bw.Finish();
    h->value_bytes = static_cast<uint32_t>(out->Size() - start);
    return;
  }
  const bool sparse = e == kSparse;
  const uint8_t* lengths = sparse ? p.sparse_len : p.dense_len;
  uint16_t codes[kSymbols];
  CanonicalCodes(lengths, codes);
  const uint64_t table_start = out->Size();
  WriteTable(lengths, out);
  h->table_bytes = static_cast<uint32_t>(out->Size() - table_start);
  if (sparse) {
    h->rice_k = static_cast<uint8_t>(p.rice_k);
    const uint64_t pos_start = out->Size();
    BitWriter<Sink> pw(out);
    uint64_t next = 0;
    for (uint64_t j = 0; j < n; ++j) {
      PutRice(pw, positions[j] - next, p.rice_k);
      next = uint64_t{positions[j]} + 1;
    }
    pw.Finish();
    h->position_bytes = static_cast<uint32_t>(out->Size() - pos_start);
    const uint64_t val_start = out->Size();
    BitWriter<Sink> vw(out);
    for (uint64_t j = 0; j < n; ++j) PutValue(vw, codes, lengths, deltas[j], w);
    vw.Finish();
    h->value_bytes = static_cast<uint32_t>(out->Size() - val_start);
    return;
  }
  const uint64_t val_start = out->Size();
  BitWriter<Sink> vw(out);
  uint64_t j = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const bool hit = j < n && positions[j] == i;
    PutValue(vw, codes, lengths, hit ? deltas[j] : 0, w);
    j += hit;
  }
  vw.Finish();
  h->value_bytes = static_cast<uint32_t>(out->Size() - val_start);
}

}  // namespace tern::format
