#include "patch/segment_codec.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "format/huffman_build.h"
#include "patch/context_codec.h"

namespace tern::patch {

// The construction is format/huffman_build.h's, shared with the GPU encoder.
void BuildLengths(const uint64_t freq[kSymbols], uint8_t lengths[kSymbols]) {
  hd::BuildLengths<kSymbols, kMaxCodeBits>(freq, lengths);
}

void CanonicalCodes(const uint8_t lengths[kSymbols], uint16_t codes[kSymbols]) {
  hd::CanonicalCodes<kSymbols, kMaxCodeBits>(lengths, codes);
}

uint64_t CodeBits(const uint64_t freq[kSymbols], const uint8_t lengths[kSymbols]) {
  uint64_t bits = 0;
  for (int s = 0; s < kSymbols; ++s) bits += freq[s] * lengths[s];
  return bits;
}

uint32_t TableBytes(const uint8_t lengths[kSymbols]) {
  int nsym = kSymbols;
  while (nsym > 0 && lengths[nsym - 1] == 0) --nsym;
  return 1 + static_cast<uint32_t>((nsym + 1) / 2);
}

void WriteTable(const uint8_t lengths[kSymbols], std::vector<uint8_t>* out) {
  int nsym = kSymbols;
  while (nsym > 0 && lengths[nsym - 1] == 0) --nsym;
  out->push_back(static_cast<uint8_t>(nsym));
  for (int s = 0; s < nsym; s += 2) {
    const uint8_t hi = s + 1 < nsym ? lengths[s + 1] : 0;
    out->push_back(static_cast<uint8_t>(lengths[s] | (hi << 4)));
  }
}

uint64_t RiceBits(const uint64_t* positions, uint64_t n, int k) {
  uint64_t bits = n * static_cast<uint64_t>(k + 1);
  uint64_t next = 0;
  for (uint64_t j = 0; j < n; ++j) {
    bits += (positions[j] - next) >> k;
    next = positions[j] + 1;
  }
  return bits;
}

namespace {
uint64_t Bytes(uint64_t bits) { return (bits + 7) / 8; }
}  // namespace

void EncodeRecord(const uint64_t* positions, const uint64_t* deltas, uint64_t n, int w,
                  uint32_t tensor_index, uint64_t first, uint64_t count, std::vector<uint8_t>* out,
                  const ContextBase& base) {
  TERN_ASSERT(n >= 1 && n <= count && count <= kMaxSegmentElements);
  uint64_t freq[kSymbols] = {};
  uint64_t extra_bits = 0;
  for (uint64_t j = 0; j < n; ++j) {
    int eb;
    uint64_t ex;
    freq[ValueSymbol(ZigZag(deltas[j], w), &eb, &ex)]++;
    extra_bits += static_cast<uint64_t>(eb);
  }
  // SPARSE cost: best Rice parameter near log2(mean gap) (the cost is convex in k).
  const uint64_t mean_gap = (count - n) / n;
  const int k0 = mean_gap ? 63 - std::countl_zero(mean_gap) : 0;
  int best_k = 0;
  uint64_t best_pos_bits = ~uint64_t{0};
  for (int k = std::max(0, k0 - 2); k <= std::min(62, k0 + 2); ++k) {
    const uint64_t bits = RiceBits(positions, n, k);
    if (bits < best_pos_bits) best_pos_bits = bits, best_k = k;
  }
  uint8_t sparse_len[kSymbols];
  BuildLengths(freq, sparse_len);
  const uint64_t sparse_bytes = TableBytes(sparse_len) + Bytes(best_pos_bits) +
                                Bytes(CodeBits(freq, sparse_len) + extra_bits);
  uint64_t dense_freq[kSymbols];
  std::memcpy(dense_freq, freq, sizeof(freq));
  dense_freq[0] += count - n;
  uint8_t dense_len[kSymbols];
  BuildLengths(dense_freq, dense_len);
  const uint64_t dense_bytes = TableBytes(dense_len) + Bytes(CodeBits(dense_freq, dense_len) + extra_bits);
  const uint64_t raw_bytes = Bytes(count * static_cast<uint64_t>(w));

  RecordHeader h{};
  h.tensor_index = tensor_index;
  h.first_element = first;
  h.element_count = count;
  h.changed_count = n;
  const size_t start = out->size();
  out->resize(start + sizeof(RecordHeader));
  thread_local ContextPayload context;
  if (base.tensor != nullptr && base.field.ok &&
      EncodeContext(positions, deltas, n, w, base.tensor, base.field, base.max_classes, first, count,
                    std::min({sparse_bytes, dense_bytes, raw_bytes}), &context)) {
    h.encoding = kContext;
    h.table_bytes = context.table_bytes;
    h.position_bytes = context.position_bytes;
    h.value_bytes = context.value_bytes;
    out->insert(out->end(), context.bytes.begin(), context.bytes.end());
  } else if (raw_bytes < sparse_bytes && raw_bytes < dense_bytes) {
    h.encoding = kRaw;
    BitWriter bw(out);
    uint64_t j = 0;
    for (uint64_t i = 0; i < count; ++i) {
      const bool hit = j < n && positions[j] == i;
      bw.Put(hit ? deltas[j] : 0, w);
      j += hit;
    }
    bw.Finish();
    h.value_bytes = static_cast<uint32_t>(out->size() - start - sizeof(RecordHeader));
  } else {
    const bool sparse = sparse_bytes <= dense_bytes;
    const uint8_t* lengths = sparse ? sparse_len : dense_len;
    uint16_t codes[kSymbols] = {};
    CanonicalCodes(lengths, codes);
    h.encoding = sparse ? kSparse : kDense;
    WriteTable(lengths, out);
    h.table_bytes = static_cast<uint32_t>(out->size() - start - sizeof(RecordHeader));
    auto put_value = [&](BitWriter& bw, uint64_t delta) {
      int eb;
      uint64_t ex;
      const int sym = ValueSymbol(ZigZag(delta, w), &eb, &ex);
      bw.Put(codes[sym], lengths[sym]);
      bw.Put(ex, eb);
    };
    if (sparse) {
      h.rice_k = static_cast<uint8_t>(best_k);
      const size_t pos_start = out->size();
      BitWriter pw(out);
      uint64_t next = 0;
      for (uint64_t j = 0; j < n; ++j) {
        const uint64_t gap = positions[j] - next;
        pw.PutUnary(gap >> best_k);
        pw.Put(gap, best_k);
        next = positions[j] + 1;
      }
      pw.Finish();
      h.position_bytes = static_cast<uint32_t>(out->size() - pos_start);
      const size_t val_start = out->size();
      BitWriter vw(out);
      for (uint64_t j = 0; j < n; ++j) put_value(vw, deltas[j]);
      vw.Finish();
      h.value_bytes = static_cast<uint32_t>(out->size() - val_start);
    } else {
      const size_t val_start = out->size();
      BitWriter vw(out);
      uint64_t j = 0;
      for (uint64_t i = 0; i < count; ++i) {
        const bool hit = j < n && positions[j] == i;
        put_value(vw, hit ? deltas[j] : 0);
        j += hit;
      }
      vw.Finish();
      h.value_bytes = static_cast<uint32_t>(out->size() - val_start);
    }
  }
  std::memcpy(out->data() + start, &h, sizeof(h));
  const uint64_t sum = XXH3_64bits(out->data() + start, out->size() - start);
  const size_t at = out->size();
  out->resize(at + kChecksumBytes);
  std::memcpy(out->data() + at, &sum, kChecksumBytes);
}

Result<RecordView> ParseRecord(const uint8_t* data, uint64_t available, int w, uint64_t* need_bytes,
                               bool context_ok) {
  TERN_REQUIRE(available >= sizeof(RecordHeader), kCorrupt, "truncated segment record header");
  RecordView r{};
  std::memcpy(&r.h, data, sizeof(RecordHeader));
  const RecordHeader& h = r.h;
  TERN_REQUIRE(h.reserved0 == 0 && h.reserved1 == 0, kCorrupt, "segment record: reserved field not zero");
  TERN_REQUIRE(h.encoding <= kRaw || (h.encoding == kContext && context_ok), kCorrupt,
               "segment record: unknown encoding ", int{h.encoding});
  TERN_REQUIRE(h.element_count >= 1 && h.element_count <= kMaxSegmentElements, kCorrupt,
               "segment record: element count ", h.element_count, " out of range");
  TERN_REQUIRE(h.changed_count <= h.element_count, kCorrupt, "segment record: changed count exceeds elements");
  switch (h.encoding) {
    case kSparse:
      TERN_REQUIRE(h.changed_count >= 1 && h.rice_k <= 63, kCorrupt, "SPARSE record: bad count or Rice k");
      TERN_REQUIRE(h.table_bytes >= 2 && h.table_bytes <= kMaxTableBytes, kCorrupt, "record: bad table size");
      break;
    case kDense:
      TERN_REQUIRE(h.rice_k == 0 && h.position_bytes == 0, kCorrupt, "DENSE record: stray position fields");
      TERN_REQUIRE(h.table_bytes >= 2 && h.table_bytes <= kMaxTableBytes, kCorrupt, "record: bad table size");
      break;
    case kRaw:
      TERN_REQUIRE(h.rice_k == 0 && h.position_bytes == 0 && h.table_bytes == 0, kCorrupt,
                   "RAW record: stray table or position fields");
      TERN_REQUIRE(h.value_bytes == (h.element_count * static_cast<uint64_t>(w) + 7) / 8, kCorrupt,
                   "RAW record: value bytes do not match element count");
      break;
    case kContext:
      TERN_REQUIRE(h.changed_count >= 1 && h.rice_k == 0, kCorrupt, "CONTEXT record: bad count or Rice k");
      TERN_REQUIRE(h.table_bytes >= 4 && h.table_bytes <= kMaxContextTableBytes, kCorrupt,
                   "CONTEXT record: bad table size");
      break;
  }
  const uint64_t total = sizeof(RecordHeader) + uint64_t{h.table_bytes} + h.position_bytes + h.value_bytes +
                         kChecksumBytes;
  if (total > available) {
    if (need_bytes) *need_bytes = total;
    return TERN_ERROR(kCorrupt, "truncated segment record (", total, " bytes, ", available, " left)");
  }
  uint64_t sum;
  std::memcpy(&sum, data + total - kChecksumBytes, kChecksumBytes);
  TERN_REQUIRE(XXH3_64bits(data, total - kChecksumBytes) == sum, kCorrupt, "segment record checksum mismatch");
  r.table = data + sizeof(RecordHeader);
  r.positions = r.table + h.table_bytes;
  r.values = r.positions + h.position_bytes;
  r.total_bytes = total;
  r.checksum = sum;
  return r;
}

Status ParseCodeLengths(const uint8_t* table, uint32_t bytes, uint8_t lengths[kSymbols]) {
  TERN_REQUIRE(bytes >= 1, kCorrupt, "empty code table");
  const int nsym = table[0];
  TERN_REQUIRE(nsym >= 1 && nsym <= kSymbols, kCorrupt, "code table: ", nsym, " symbols");
  TERN_REQUIRE(bytes == 1 + static_cast<uint32_t>((nsym + 1) / 2), kCorrupt, "code table: size mismatch");
  std::memset(lengths, 0, kSymbols);
  for (int s = 0; s < nsym; ++s) lengths[s] = (table[1 + s / 2] >> (4 * (s & 1))) & 15;
  if (nsym & 1) TERN_REQUIRE((table[bytes - 1] >> 4) == 0, kCorrupt, "code table: padding not zero");
  TERN_REQUIRE(lengths[nsym - 1] != 0, kCorrupt, "code table: not minimal");
  uint64_t kraft = 0;
  for (int s = 0; s < nsym; ++s)
    if (lengths[s]) kraft += uint64_t{1} << (kMaxCodeBits - lengths[s]);
  TERN_REQUIRE(kraft <= (uint64_t{1} << kMaxCodeBits), kCorrupt, "code table: lengths oversubscribe the code");
  return Status::Ok();
}

void BuildDecoder(const uint8_t lengths[kSymbols], HuffmanDecoder* dec) {
  int max_bits = 0;
  for (int s = 0; s < kSymbols; ++s) max_bits = std::max<int>(max_bits, lengths[s]);
  uint16_t codes[kSymbols] = {};
  CanonicalCodes(lengths, codes);
  dec->max_bits = max_bits;
  dec->table.assign(size_t{1} << max_bits, 0);
  for (int s = 0; s < kSymbols; ++s) {
    const int len = lengths[s];
    if (!len) continue;
    const uint16_t entry = static_cast<uint16_t>((s << 4) | len);
    for (size_t i = codes[s]; i < dec->table.size(); i += size_t{1} << len) dec->table[i] = entry;
  }
}

void BuildFastTable(int w, bool zero_ok, HuffmanDecoder* dec) {
  dec->fast.assign(dec->table.size(), 0);
  for (size_t i = 0; i < dec->table.size(); ++i) {
    const uint16_t t = dec->table[i];
    if (t == 0) continue;
    const int code_len = t & 15;
    const int sym = t >> 4;
    uint32_t e;
    if (sym < kLiteralSymbols) {
      if ((sym == 0 && !zero_ok) || static_cast<uint64_t>(sym) > WidthMask(w)) continue;
      e = static_cast<uint32_t>(code_len) | (static_cast<uint32_t>(code_len) << 8) |
          (static_cast<uint32_t>(sym) << 24);
    } else {
      const int len = sym - kLiteralSymbols + 5;
      const int extra = len - 1;
      if (len > w || code_len + extra > 56) continue;
      e = static_cast<uint32_t>(code_len + extra) | (static_cast<uint32_t>(code_len) << 8) |
          (static_cast<uint32_t>(extra) << 12);
    }
    dec->fast[i] = e;
  }
}

}  // namespace tern::patch
