// The header of one safetensors file: parse (strict, untrusted) and write
// (byte-compatible with the reference writer). Layout: u64 little-endian N,
// N bytes of UTF-8 JSON (padded with spaces), then the data region; offsets in
// the JSON are relative to the data region. See docs/checkpoint.md.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "tern/status.h"
#include "tern/view.h"

namespace tern::checkpoint {

inline constexpr uint64_t kLengthBytes = 8;
// Far beyond any real model (HF rank <= 8) yet small enough to bound memory.
inline constexpr size_t kRankMax = 64;

struct HeaderTensor {
  TensorDesc desc;
  uint64_t begin_bytes = 0;  // relative to the data region
  uint64_t end_bytes = 0;
};

struct ParsedHeader {
  uint64_t json_bytes = 0;  // N
  uint64_t data_offset_bytes() const { return kLengthBytes + json_bytes; }
  bool has_metadata = false;
  std::map<std::string, std::string> metadata;
  std::vector<HeaderTensor> tensors;  // in data order (ascending offsets)
};

// Validates the header of a file whose first bytes are `file` (all of it, or
// at least the 8 + N header bytes) and whose size is `file_bytes`: JSON well
// formed, known dtypes, shapes that match their byte spans, data contiguous
// from offset 0 with no overlap or gap, ending exactly at the end of the file
// (as the reference reader requires). kCorrupt on bad input, kUnsupported
// for dtypes of the format that tern has no DType for (C64, F6_*, *FNUZ).
Result<ParsedHeader> ParseHeader(std::span<const uint8_t> file, uint64_t file_bytes);

struct PlacedTensor {
  const TensorDesc* desc = nullptr;
  uint64_t begin_bytes = 0;
  uint64_t end_bytes = 0;
};

// The 8-byte length, the JSON as serde_json writes it (`__metadata__` first
// when non-empty, then tensors in the order given) and space padding to a
// multiple of 8 bytes. kInvalidArgument when a name or metadata entry is not
// valid UTF-8.
Result<std::string> SerializeHeader(const std::map<std::string, std::string>& metadata,
                                    std::span<const PlacedTensor> tensors);

}  // namespace tern::checkpoint
