// Per-segment logic of the GPU encoder, as TERN_HD functions (format/hd.h):
// from a segment's changes (positions, deltas) to one format-1 record, the
// same bytes as patch/'s encoder writes (gpu/encode_ops_test.cc compares
// them with tern::EncodeSegment). Same bytes, not just a valid record, so
// that a patch published from GPU memory is identical to the CPU one and
// golden files and digests of patches stay comparable.
//
// The record checksum (XXH3-64) is left to the host, which needs the bytes
// anyway to send them: EncodeRecordBody writes header and payload only.
#pragma once

#include <cstdint>

#include "format/huffman_build.h"
#include "gpu/ops/codec_ops.h"

namespace tern::gpu {

// Bounded output into a caller's buffer; a write past the capacity is
// dropped and flagged (the caller sized the buffer for the worst case, so
// this is a bug check, not a control path).
struct ByteSink {
  uint8_t* data;
  uint64_t capacity;
  uint64_t size = 0;
  bool overflow = false;
  TERN_HD void Push(uint8_t b) {
    if (size < capacity) {
      data[size] = b;
    } else {
      overflow = true;
    }
    ++size;
  }
};

// LSB-first bit writer (spec §4); Finish pads with zero bits to a byte.
struct BitSink {
  ByteSink* out;
  uint64_t acc = 0;
  int nacc = 0;
  TERN_HD explicit BitSink(ByteSink* o) : out(o) {}
  TERN_HD void Put(uint64_t v, int n) {  // n <= 64
    while (n > 0) {
      const int take = n < 32 ? n : 32;
      acc |= (v & ((uint64_t{1} << take) - 1)) << nacc;
      nacc += take;
      v = take < 64 ? v >> take : 0;
      n -= take;
      while (nacc >= 8) {
        out->Push(static_cast<uint8_t>(acc));
        acc >>= 8;
        nacc -= 8;
      }
    }
  }
  TERN_HD void PutUnary(uint64_t q) {
    while (q >= 32) {
      Put(0, 32);
      q -= 32;
    }
    Put(uint64_t{1} << q, static_cast<int>(q) + 1);
  }
  TERN_HD void Finish() {
    if (nacc > 0) out->Push(static_cast<uint8_t>(acc));
    acc = 0;
    nacc = 0;
  }
};

// Huffman code lengths and canonical codes (format/huffman_build.h, the one
// copy patch/'s encoders use too). Counts are 32-bit (a segment has at most
// 2^24 elements, so every sum fits): half the local memory of a GPU thread.
TERN_HD void BuildLengths(const uint32_t freq[kSymbols], uint8_t lengths[kSymbols]) {
  hd::BuildLengths<kSymbols, kMaxCodeBits>(freq, lengths);
}
TERN_HD void CanonicalCodes(const uint8_t lengths[kSymbols], uint16_t codes[kSymbols]) {
  hd::CanonicalCodes<kSymbols, kMaxCodeBits>(lengths, codes);
}

TERN_HD int UsedSymbols(const uint8_t lengths[kSymbols]) {
  int nsym = kSymbols;
  while (nsym > 0 && lengths[nsym - 1] == 0) --nsym;
  return nsym;
}
TERN_HD uint64_t TableBytes(const uint8_t lengths[kSymbols]) { return 1 + (UsedSymbols(lengths) + 1) / 2; }
TERN_HD uint64_t CodeBits(const uint32_t freq[kSymbols], const uint8_t lengths[kSymbols]) {
  uint64_t bits = 0;
  for (int s = 0; s < kSymbols; ++s) bits += uint64_t{freq[s]} * lengths[s];
  return bits;
}

// Positions are u32 (relative to the segment, < 2^24): half the scratch of
// the CPU's u64 and the same stream.
TERN_HD uint64_t RiceBits(const uint32_t* positions, uint64_t n, int k) {
  uint64_t bits = n * static_cast<uint64_t>(k + 1);
  uint64_t next = 0;
  for (uint64_t j = 0; j < n; ++j) {
    bits += (positions[j] - next) >> k;
    next = uint64_t{positions[j]} + 1;
  }
  return bits;
}

// Largest record EncodeRecordBody writes for `count` elements of width w:
// it writes RAW unless a coded form is smaller, so RAW's size bounds it.
TERN_HD uint64_t MaxRecordBodyBytes(uint64_t count, int w) {
  return sizeof(RecordHeader) + (count * static_cast<uint64_t>(w) + 7) / 8;
}

// Writes the record (header and payload, no checksum) for count <= 2^24
// elements and n >= 1 changes at strictly increasing positions < count with
// non-zero deltas < 2^w, choosing SPARSE, DENSE or RAW as patch/'s
// EncodeRecord does. Returns bytes written,
// or 0 on overflow of `out` (capacity MaxRecordBodyBytes suffices).
TERN_HD uint64_t EncodeRecordBody(const uint32_t* positions, const uint64_t* deltas, uint64_t n, int w,
                                  uint32_t tensor_index, uint64_t first, uint64_t count, uint8_t* out,
                                  uint64_t capacity) {
  uint32_t freq[kSymbols];
  for (int s = 0; s < kSymbols; ++s) freq[s] = 0;
  uint64_t extra_bits = 0;
  for (uint64_t j = 0; j < n; ++j) {
    int eb;
    uint64_t ex;
    freq[ValueSymbol(ZigZag(deltas[j], w), &eb, &ex)]++;
    extra_bits += static_cast<uint64_t>(eb);
  }
  const uint64_t mean_gap = (count - n) / n;
  const int k0 = mean_gap ? 63 - Clz64(mean_gap) : 0;
  int best_k = 0;
  uint64_t best_pos_bits = ~uint64_t{0};
  const int k_lo = k0 - 2 > 0 ? k0 - 2 : 0, k_hi = k0 + 2 < 62 ? k0 + 2 : 62;
  for (int k = k_lo; k <= k_hi; ++k) {
    const uint64_t bits = RiceBits(positions, n, k);
    if (bits < best_pos_bits) best_pos_bits = bits, best_k = k;
  }
  uint8_t sparse_len[kSymbols];
  BuildLengths(freq, sparse_len);
  const uint64_t sparse_bytes =
      TableBytes(sparse_len) + (best_pos_bits + 7) / 8 + (CodeBits(freq, sparse_len) + extra_bits + 7) / 8;
  uint32_t dense_freq[kSymbols];
  for (int s = 0; s < kSymbols; ++s) dense_freq[s] = freq[s];
  dense_freq[0] += static_cast<uint32_t>(count - n);
  uint8_t dense_len[kSymbols];
  BuildLengths(dense_freq, dense_len);
  const uint64_t dense_bytes = TableBytes(dense_len) + (CodeBits(dense_freq, dense_len) + extra_bits + 7) / 8;
  const uint64_t raw_bytes = (count * static_cast<uint64_t>(w) + 7) / 8;

  RecordHeader h{};
  h.tensor_index = tensor_index;
  h.first_element = first;
  h.element_count = count;
  h.changed_count = n;
  ByteSink sink{out, capacity};
  for (uint64_t i = 0; i < sizeof(RecordHeader); ++i) sink.Push(0);  // header last
  if (raw_bytes < sparse_bytes && raw_bytes < dense_bytes) {
    h.encoding = kRaw;
    BitSink bw(&sink);
    uint64_t j = 0;
    for (uint64_t i = 0; i < count; ++i) {
      const bool hit = j < n && positions[j] == i;
      bw.Put(hit ? deltas[j] : 0, w);
      j += hit;
    }
    bw.Finish();
    h.value_bytes = static_cast<uint32_t>(sink.size - sizeof(RecordHeader));
  } else {
    const bool sparse = sparse_bytes <= dense_bytes;
    const uint8_t* lengths = sparse ? sparse_len : dense_len;
    uint16_t codes[kSymbols];
    CanonicalCodes(lengths, codes);
    h.encoding = sparse ? kSparse : kDense;
    const int nsym = UsedSymbols(lengths);
    sink.Push(static_cast<uint8_t>(nsym));
    for (int s = 0; s < nsym; s += 2) {
      const uint8_t hi = s + 1 < nsym ? lengths[s + 1] : 0;
      sink.Push(static_cast<uint8_t>(lengths[s] | (hi << 4)));
    }
    h.table_bytes = static_cast<uint32_t>(sink.size - sizeof(RecordHeader));
    auto put_value = [&](BitSink& bw, uint64_t delta) {
      int eb;
      uint64_t ex;
      const int sym = ValueSymbol(ZigZag(delta, w), &eb, &ex);
      bw.Put(codes[sym], lengths[sym]);
      bw.Put(ex, eb);
    };
    if (sparse) {
      h.rice_k = static_cast<uint8_t>(best_k);
      const uint64_t pos_start = sink.size;
      BitSink pw(&sink);
      uint64_t next = 0;
      for (uint64_t j = 0; j < n; ++j) {
        const uint64_t gap = positions[j] - next;
        pw.PutUnary(gap >> best_k);
        pw.Put(gap, best_k);
        next = uint64_t{positions[j]} + 1;
      }
      pw.Finish();
      h.position_bytes = static_cast<uint32_t>(sink.size - pos_start);
      const uint64_t val_start = sink.size;
      BitSink vw(&sink);
      for (uint64_t j = 0; j < n; ++j) put_value(vw, deltas[j]);
      vw.Finish();
      h.value_bytes = static_cast<uint32_t>(sink.size - val_start);
    } else {
      const uint64_t val_start = sink.size;
      BitSink vw(&sink);
      uint64_t j = 0;
      for (uint64_t i = 0; i < count; ++i) {
        const bool hit = j < n && positions[j] == i;
        put_value(vw, hit ? deltas[j] : 0);
        j += hit;
      }
      vw.Finish();
      h.value_bytes = static_cast<uint32_t>(sink.size - val_start);
    }
  }
  if (sink.overflow) return 0;
  const uint8_t* hb = reinterpret_cast<const uint8_t*>(&h);
  for (uint64_t i = 0; i < sizeof(RecordHeader); ++i) out[i] = hb[i];
  return sink.size;
}

}  // namespace tern::gpu
