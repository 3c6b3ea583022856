// Constants and fixed-size layouts of "tern patch format" versions 1 and 2.
// The normative text is docs/format/patch.md; keep the two in step.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "format/value_code.h"

namespace tern::patch {

static_assert(std::endian::native == std::endian::little,
              "the fixed headers are memcpy'd; a big-endian port must byte-swap them");

inline constexpr char kMagic[8] = {'T', 'E', 'R', 'N', 'P', 'T', 'C', 'H'};
inline constexpr char kTrailerMagic[8] = {'T', 'E', 'R', 'N', 'E', 'N', 'D', '1'};
// Version 2 adds the CONTEXT encoding (positions and values coded given the
// base); everything else is version 1's. Readers accept both.
inline constexpr uint16_t kFormatVersion1 = 1;
inline constexpr uint16_t kFormatVersion2 = 2;
inline constexpr uint16_t kNewestFormatVersion = kFormatVersion2;

// Bounds a reader enforces before allocating or looping (spec "Limits").
inline constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;
inline constexpr uint32_t kMaxTensors = uint32_t{1} << 20;
inline constexpr uint32_t kMaxNameBytes = 1024;
inline constexpr uint32_t kMaxRank = 8;
inline constexpr uint64_t kMaxSegmentElements = uint64_t{1} << 24;

enum Encoding : uint8_t { kSparse = 0, kDense = 1, kRaw = 2, kContext = 3 };

// CONTEXT (format 2, spec §6.4): elements fall into classes by their base
// value's exponent field; at most kMaxClasses. The context table holds K,
// e0 and one entry per class, so it is bounded by the entry's largest form.
inline constexpr int kMaxClasses = 16;
inline constexpr uint32_t kMaxContextTableBytes = 3 + kMaxClasses * (4 + 1 + 5 + 5 + 39);

// Value alphabet: zigzag values 0..15 are their own symbol; larger values of
// bit length L (5..64) are symbol 16 + (L - 5) followed by the L-1 bits below
// the leading one.
inline constexpr int kLiteralSymbols = hd::kLiteralSymbols;  // format/value_code.h
inline constexpr int kSymbols = kLiteralSymbols + 60;  // 76
inline constexpr int kMaxCodeBits = 15;
inline constexpr uint32_t kMaxTableBytes = 1 + (kSymbols + 1) / 2;

struct FileHeader {
  char magic[8];
  uint16_t version;
  uint16_t flags;          // MUST be 0
  uint32_t reserved;       // MUST be 0
  uint64_t manifest_bytes; // manifest body, excluding its checksum
  uint64_t checksum;       // XXH3-64 of bytes [0, 24)
};
static_assert(sizeof(FileHeader) == 32);
static_assert(offsetof(FileHeader, version) == 8 && offsetof(FileHeader, manifest_bytes) == 16 &&
              offsetof(FileHeader, checksum) == 24);

struct ManifestFixed {
  uint64_t base_version;
  uint64_t target_version;
  uint8_t base_digest[32];
  uint8_t target_digest[32];
  uint32_t tensor_count;
  uint32_t reserved;  // MUST be 0
};
static_assert(sizeof(ManifestFixed) == 88);
static_assert(offsetof(ManifestFixed, base_digest) == 16 && offsetof(ManifestFixed, tensor_count) == 80);

// Per tensor entry: u16 name_bytes, u8 dtype, u8 rank, u32 reserved(0), name,
// rank x u64 shape, u64 elements, u64 segment_count.
inline constexpr size_t kTensorEntryFixedBytes = 8;

struct RecordHeader {
  uint32_t tensor_index;
  uint8_t encoding;
  uint8_t rice_k;          // SPARSE: 0..63; otherwise MUST be 0
  uint16_t reserved0;      // MUST be 0
  uint64_t first_element;
  uint64_t element_count;  // 1 .. kMaxSegmentElements
  uint64_t changed_count;  // elements with a non-zero delta
  uint32_t table_bytes;
  uint32_t position_bytes;
  uint32_t value_bytes;
  uint32_t reserved1;      // MUST be 0
};
static_assert(sizeof(RecordHeader) == 48);
static_assert(offsetof(RecordHeader, first_element) == 8 && offsetof(RecordHeader, changed_count) == 24 &&
              offsetof(RecordHeader, table_bytes) == 32 && offsetof(RecordHeader, reserved1) == 44);

inline constexpr size_t kChecksumBytes = 8;

struct Trailer {
  char magic[8];
  uint64_t record_count;
  uint64_t checksum;  // XXH3-64 of magic, record_count, manifest checksum, record checksums
};
static_assert(sizeof(Trailer) == 24);

}  // namespace tern::patch
