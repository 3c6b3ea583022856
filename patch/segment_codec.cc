#include "patch/segment_codec.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "format/record_encode.h"
#include "patch/context_codec.h"

namespace tern::patch {

void EncodeRecord(const uint64_t* positions, const uint64_t* deltas, uint64_t n, int w,
                  uint32_t tensor_index, uint64_t first, uint64_t count, std::vector<uint8_t>* out,
                  const ContextBase& base) {
  TERN_ASSERT(n >= 1 && n <= count && count <= kMaxSegmentElements);
  format::RecordPlan plan;
  format::PlanRecord<uint64_t>(positions, deltas, n, w, count, &plan);
  RecordHeader h{};
  h.tensor_index = tensor_index;
  h.first_element = first;
  h.element_count = count;
  h.changed_count = n;
  const size_t start = out->size();
  out->resize(start + sizeof(RecordHeader));
  thread_local ContextPayload context;
  if (base.tensor != nullptr && base.field.ok &&
      EncodeContext(positions, deltas, n, w, base.tensor, base.field, base.max_classes, first,
                    count, plan.SmallestBytes(), &context)) {
    h.encoding = kContext;
    h.table_bytes = context.table_bytes;
    h.position_bytes = context.position_bytes;
    h.value_bytes = context.value_bytes;
    out->insert(out->end(), context.bytes.begin(), context.bytes.end());
  } else {
    VectorSink sink{out};
    format::WriteRecordPayload(plan, plan.Choice(), positions, deltas, n, w, count, &sink, &h);
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
  if (const char* why = format::RecordHeaderProblem(h, w, context_ok))
    return TERN_ERROR(kCorrupt, why);
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
  if (const char* why = format::ParseCodeLengths(table, bytes, lengths))
    return TERN_ERROR(kCorrupt, why);
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
      const int len = format::SymbolValueBits(sym);
      const int extra = len - 1;
      if (len > w || code_len + extra > 56) continue;
      e = static_cast<uint32_t>(code_len + extra) | (static_cast<uint32_t>(code_len) << 8) |
          (static_cast<uint32_t>(extra) << 12);
    }
    dec->fast[i] = e;
  }
}

}  // namespace tern::patch
