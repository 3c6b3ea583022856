// Element types of a serve view, as named by safetensors.
//
// The codec never interprets values: it works on each element's raw bits,
// whose width is ElementBits(). Packed 4-bit types (F4 = FP4 E2M1) store two
// elements per byte, the even element in the low nibble.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "tern/export.h"

namespace tern {

// Numbers are part of the patch format (docs/format/patch.md, "dtype codes"):
// append only.
enum class DType : uint8_t {
  kBool = 0,
  kU8 = 1,
  kI8 = 2,
  kF8E5M2 = 3,
  kF8E4M3 = 4,
  kF8E8M0 = 5,
  kI16 = 6,
  kU16 = 7,
  kF16 = 8,
  kBF16 = 9,
  kI32 = 10,
  kU32 = 11,
  kF32 = 12,
  kF64 = 13,
  kI64 = 14,
  kU64 = 15,
  kF4 = 16,  // FP4 E2M1, packed two per byte
};

inline constexpr int kDTypeCount = 17;

// Width of one element in bits: 1 byte for BOOL, 4 for F4.
TERN_EXPORT int ElementBits(DType dtype);
// The safetensors spelling ("BF16", "F8_E4M3", ...).
TERN_EXPORT std::string_view DTypeName(DType dtype);
TERN_EXPORT std::optional<DType> DTypeFromName(std::string_view name);
// Bytes that `elements` elements occupy (packed types round up).
TERN_EXPORT uint64_t DTypeBytes(DType dtype, uint64_t elements);
// True when the numeric code is a known DType.
TERN_EXPORT bool DTypeValid(uint8_t code);

}  // namespace tern
