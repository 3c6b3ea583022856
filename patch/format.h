// Constants and fixed-size layouts of "tern patch format" versions 1 to 3.
// The normative text is docs/format/patch.md; keep the two in step.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "format/record.h"

namespace tern::patch {

static_assert(std::endian::native == std::endian::little,
              "the fixed headers are memcpy'd; a big-endian port must byte-swap them");

inline constexpr char kMagic[8] = {'T', 'E', 'R', 'N', 'P', 'T', 'C', 'H'};
inline constexpr char kTrailerMagic[8] = {'T', 'E', 'R', 'N', 'E', 'N', 'D', '1'};
// Version 2 adds the CONTEXT encoding (positions and values coded given the
// base); version 3 adds tensors coded as packed 4-bit elements (the tensor
// entry's coding byte). Everything else is version 1's. Readers accept all
// three; a writer asked for format 2 writes version 3 exactly when it codes a
// tensor as nibbles (so that an older reader refuses it as a newer version).
inline constexpr uint16_t kFormatVersion1 = 1;
inline constexpr uint16_t kFormatVersion2 = 2;
inline constexpr uint16_t kFormatVersion3 = 3;
inline constexpr uint16_t kNewestFormatVersion = kFormatVersion3;

// A tensor entry's coding byte (version 3): how its records see its bytes.
inline constexpr uint8_t kCodingElements = 0;  // elements of its dtype (versions 1 and 2)
inline constexpr uint8_t kCodingNibbles = 1;   // packed 4-bit elements (integer dtypes of 8+ bits)

// Bounds a reader enforces before allocating or looping (spec "Limits").
inline constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;
inline constexpr uint32_t kMaxTensors = uint32_t{1} << 20;
inline constexpr uint32_t kMaxNameBytes = 1024;
inline constexpr uint32_t kMaxRank = 8;
// The segment record's layout, encodings and alphabet are format/record.h's
// (the one definition that patch/ and gpu/ share).
using format::Encoding;
using format::kContext;
using format::kDense;
using format::kLiteralSymbols;
using format::kMaxClasses;
using format::kMaxCodeBits;
using format::kMaxContextTableBytes;
using format::kMaxSegmentElements;
using format::kMaxTableBytes;
using format::kRaw;
using format::kSparse;
using format::kSymbols;
using format::RecordHeader;

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

// Per tensor entry: u16 name_bytes, u8 dtype, u8 rank, u8 coding (0 before
// version 3), u8[3] reserved (0), name, rank x u64 shape, u64 elements, u64
// segment_count.
inline constexpr size_t kTensorEntryFixedBytes = 8;

inline constexpr size_t kChecksumBytes = format::kRecordChecksumBytes;

struct Trailer {
  char magic[8];
  uint64_t record_count;
  uint64_t checksum;  // XXH3-64 of magic, record_count, manifest checksum, record checksums
};
static_assert(sizeof(Trailer) == 24);

}  // namespace tern::patch
