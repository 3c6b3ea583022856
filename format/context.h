// The CONTEXT encoding's definitions (docs/format/patch.md §6.4), as TERN_HD
// functions (format/hd.h): the exponent field of each dtype, an element's
// class, and the context table. patch/context_codec.h (the CPU's blocked,
// SIMD decode and the encoder) and gpu/ops/context_ops.h (one thread per
// record) both call these.
#pragma once

#include <cstdint>

#include "format/hd.h"
#include "format/record.h"

namespace tern::format {

// The exponent field x(v) = (v >> shift) & mask of a dtype; ok is false for
// dtypes that have none (integers, BOOL): they never use CONTEXT.
struct ContextField {
  bool ok = false;
  int shift = 0;
  uint32_t mask = 0;
};
// By the dtype codes of §9 (tern::DType's values).
TERN_HD ContextField ContextFieldOfCode(int dtype_code) {
  switch (dtype_code) {
    case 9:
      return {true, 7, 0xff};  // BF16
    case 8:
      return {true, 10, 0x1f};  // F16
    case 12:
      return {true, 23, 0xff};  // F32
    case 13:
      return {true, 52, 0x7ff};  // F64
    case 4:
      return {true, 3, 0xf};  // F8_E4M3
    case 3:
      return {true, 2, 0x1f};  // F8_E5M2
    case 5:
      return {true, 0, 0xff};  // F8_E8M0
    case 16:
      return {true, 1, 0x3};  // F4
    default:
      return {};
  }
}

// Class of a base value: min(max(e0 - x, 0), K - 1).
TERN_HD int ContextClassOf(uint64_t base_value, ContextField f, uint32_t e0, int classes) {
  const int32_t c =
      static_cast<int32_t>(e0) - static_cast<int32_t>((base_value >> f.shift) & f.mask);
  return c < 0 ? 0 : (c > classes - 1 ? classes - 1 : c);
}

// Where one class's parts lie: its substreams within the record's
// positions and values streams, its code table within the context table.
struct ContextClassLayout {
  uint64_t changes;
  int rice_k;
  uint32_t position_at, position_bytes;
  uint32_t value_at, value_bytes;
  uint32_t table_at, table_bytes;  // 0 bytes when the class has no changes
};
struct ContextLayout {
  int classes;  // K
  uint32_t e0;
  ContextClassLayout cls[kMaxClasses];
};

// Parses a CONTEXT record's table (h.table_bytes bytes at p) against its
// header with every rule of §6.4 but the rank bound (which needs the base):
// K in 2..16, e0 <= 4095, canonical varints, per-class counts summing to
// changed_count, substream lengths >= 1 summing to position_bytes and
// value_bytes, Rice k <= 24, valid code tables (which the caller then
// reads at table_at into its own decoder's form).
TERN_HD const char* ParseContextLayout(const RecordHeader& h, const uint8_t* p, ContextLayout* t) {
  const uint64_t n = h.table_bytes;
  if (n < 3) return "CONTEXT table too short";
  t->classes = p[0];
  t->e0 = static_cast<uint32_t>(p[1]) | (static_cast<uint32_t>(p[2]) << 8);
  if (t->classes < 2 || t->classes > kMaxClasses) return "CONTEXT table: bad class count";
  if (t->e0 > 4095) return "CONTEXT table: e0 out of range";
  uint64_t at = 3, changes = 0, pos_bytes = 0, val_bytes = 0;
  for (int c = 0; c < t->classes; ++c) {
    ContextClassLayout& cc = t->cls[c];
    cc = ContextClassLayout{};
    if (!ReadVarint(p, n, &at, h.element_count, &cc.changes))
      return "CONTEXT table: bad count of a class";
    changes += cc.changes;
    if (changes > h.changed_count) return "CONTEXT table: class counts exceed the changed count";
    if (cc.changes == 0) continue;
    if (at >= n) return "CONTEXT table: truncated class";
    cc.rice_k = p[at++];
    if (cc.rice_k > 24) return "CONTEXT table: Rice k above 24";
    uint64_t pb, vb;
    if (!ReadVarint(p, n, &at, h.position_bytes, &pb) ||
        !ReadVarint(p, n, &at, h.value_bytes, &vb) || pb < 1 || vb < 1)
      return "CONTEXT table: bad stream lengths of a class";
    if (pb > h.position_bytes - pos_bytes || vb > h.value_bytes - val_bytes)
      return "CONTEXT table: class streams exceed the record's streams";
    cc.position_at = static_cast<uint32_t>(pos_bytes);
    cc.position_bytes = static_cast<uint32_t>(pb);
    cc.value_at = static_cast<uint32_t>(val_bytes);
    cc.value_bytes = static_cast<uint32_t>(vb);
    pos_bytes += pb;
    val_bytes += vb;
    if (at >= n) return "CONTEXT table: truncated class";
    const uint32_t tb = 1 + (static_cast<uint32_t>(p[at]) + 1) / 2;
    if (tb > n - at) return "CONTEXT table: truncated code table";
    uint8_t lengths[kSymbols];
    if (const char* why = ParseCodeLengths(p + at, tb, lengths)) return why;
    cc.table_at = static_cast<uint32_t>(at);
    cc.table_bytes = tb;
    at += tb;
  }
  if (at != n) return "CONTEXT table: trailing bytes";
  if (changes != h.changed_count)
    return "CONTEXT table: class counts do not sum to the changed count";
  if (pos_bytes != h.position_bytes || val_bytes != h.value_bytes)
    return "CONTEXT table: class streams do not fill the record's streams";
  return nullptr;
}

}  // namespace tern::format
