// The patch container: file header, manifest, records, trailer (spec
// "Container"). Parsing validates framing and every checksum but does not
// decode segment streams (segment_codec.h does, per record, in parallel).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "patch/segment_codec.h"
#include "tern/digest.h"
#include "tern/status.h"
#include "tern/view.h"

namespace tern::patch {

struct ManifestTensor {
  TensorDesc desc;
  uint64_t elements = 0;  // of its dtype
  uint64_t segment_count = 0;
  int width_bits = 0;     // its dtype's element width: the view's and the digest's
  ContextField context;   // the dtype's exponent field (CONTEXT records)
  // How its records see its bytes (the coding byte, version 3): code_bits-wide
  // elements, code_elements of them. width_bits and elements, except for a
  // tensor coded as nibbles: 4 and elements * width_bits / 4 (and no CONTEXT).
  bool nibbles = false;
  int code_bits = 0;
  uint64_t code_elements = 0;
  // Nibbles per element of the dtype (1 when not coded as nibbles).
  uint64_t nibbles_per_element() const { return nibbles ? static_cast<uint64_t>(width_bits / 4) : 1; }
};

// Whether a tensor of this dtype may be coded as nibbles (version 3): the
// integer dtypes of 8 bits or more, which hold packed 4-bit codes (NVFP4 and
// MXFP4 codes as U8, INT4 as I32).
bool NibbleCodable(DType dtype);

struct ParsedPatch {
  uint16_t format_version = 0;
  uint64_t base_version = 0, target_version = 0;
  ViewDigest base_digest, target_digest;
  std::vector<ManifestTensor> tensors;
  std::vector<RecordView> records;  // tensor/element order
  uint64_t container_bytes = 0;     // header + manifest (+checksum) + trailer
  uint64_t total_bytes = 0;
};

// Whole patch: every unit present and valid, nothing after the trailer.
Result<ParsedPatch> ParsePatch(std::span<const uint8_t> patch);
// Longest prefix of complete, valid units (for cut-through forwarding).
Result<uint64_t> ParsePrefix(std::span<const uint8_t> prefix);

// Streaming parse (patch/apply_stream.cc): the file header and manifest of a
// prefix. False while the prefix ends before them; kCorrupt/kUnsupported as
// ParsePatch. *records_at: the first record's offset. Sets tensors,
// versions, digests, format_version and container_bytes of *out.
Result<bool> ParseHead(std::span<const uint8_t> prefix, ParsedPatch* out, uint64_t* records_at);

// Where the next record starts: its offset, tensor, segment within the
// tensor and the first element it may cover.
struct RecordCursor {
  uint64_t at = 0;
  uint32_t tensor = 0;
  uint64_t segment = 0;
  uint64_t next_free = 0;
};
enum class NextRecordResult { kRecord, kIncomplete, kEnd };
// The record at c->at (every check ParsePatch makes of it, the checksum
// included), advancing *c past it; kIncomplete when `in` ends inside it,
// kEnd after the last record the manifest announces. `rec` points into `in`.
Result<NextRecordResult> NextRecord(std::span<const uint8_t> in, const ParsedPatch& head,
                                    RecordCursor* c, RecordView* rec);

// Writes a patch; `records` are complete records sorted by (tensor, first
// element) with disjoint ranges (our invariant: asserted).
// format_version: 1 or 2 (records with CONTEXT need 2). nibbles: empty, or
// per tensor whether its records code it as nibbles (format 2 only); the
// header then says version 3 when any does.
std::vector<uint8_t> WritePatch(const std::vector<TensorDesc>& descs, uint64_t base_version,
                                uint64_t target_version, const ViewDigest& base_digest,
                                const ViewDigest& target_digest,
                                const std::vector<std::span<const uint8_t>>& records,
                                uint16_t format_version = kFormatVersion1,
                                const std::vector<bool>& nibbles = {});

// kMismatch naming the first tensor whose name, dtype or shape differs.
Status CheckLayout(const std::vector<ManifestTensor>& tensors, const std::vector<const TensorDesc*>& view);

}  // namespace tern::patch
