// Fuzzer: one CONTEXT record (format 2) decoded against a base segment, with
// the record's checksum recomputed and its range pinned to the base, so that
// mutations reach the context table and the class streams. Input: byte 0
// picks the float dtype, bytes 1-2 the element count, then the base's bytes,
// then the record. The fast decoder must fail cleanly or report each element
// at most once, below the count, with deltas non-zero within the width, as
// many as changed_count; the reference decoder must agree on validity and on
// the changes; and what decodes against a base must pass the base-free check.
#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "patch/container.h"
#include "patch/context_codec.h"
#include "patch/reference_decoder.h"
#include "tern/status.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tern;
  using namespace tern::patch;
  static constexpr DType kTypes[] = {DType::kBF16,   DType::kF16,    DType::kF32,    DType::kF64,
                                     DType::kF8E4M3, DType::kF8E5M2, DType::kF8E8M0, DType::kF4};
  if (size < 3) return 0;
  const DType dt = kTypes[data[0] % 8];
  const int w = ElementBits(dt);
  const uint64_t n = 1 + (uint64_t{data[1]} | (uint64_t{data[2]} << 8)) % 12288;  // up to 3 blocks
  const uint64_t base_bytes = (n * static_cast<uint64_t>(w) + 7) / 8;
  if (size - 3 < base_bytes) return 0;
  std::vector<uint8_t> base(data + 3, data + 3 + base_bytes);
  std::vector<uint8_t> rec(data + 3 + base_bytes, data + size);
  if (rec.size() < sizeof(RecordHeader) + kChecksumBytes) return 0;
  RecordHeader h;
  std::memcpy(&h, rec.data(), sizeof h);
  h.tensor_index = 0;
  h.first_element = 0;
  h.element_count = n;
  std::memcpy(rec.data(), &h, sizeof h);
  const uint64_t total =
      sizeof(RecordHeader) + uint64_t{h.table_bytes} + h.position_bytes + h.value_bytes + kChecksumBytes;
  if (total > rec.size()) return 0;
  rec.resize(total);
  const uint64_t sum = XXH3_64bits(rec.data(), total - kChecksumBytes);
  std::memcpy(rec.data() + total - kChecksumBytes, &sum, kChecksumBytes);
  auto r = ParseRecord(rec.data(), rec.size(), w, nullptr, true);
  if (!r.ok()) return 0;

  const ContextField f = ContextFieldOf(dt);
  std::vector<uint8_t> seen(n, 0);
  std::vector<RefChange> fast;
  const Status s = DecodeRecordOnBase(*r, w, base.data(), f, [&](uint64_t pos, uint64_t delta) {
    TERN_ASSERT(pos < n && !seen[pos], "position out of range or repeated");
    TERN_ASSERT(delta != 0 && (w == 64 || delta >> w == 0), "delta zero or wider than the element");
    seen[pos] = 1;
    fast.push_back({0, pos, delta, w});
  });
  if (s.ok()) TERN_ASSERT(fast.size() == r->h.changed_count, "changed count not honoured");
  if (s.ok() && r->h.encoding == kContext) TERN_ASSERT(ValidateContextStreams(*r, w).ok(), "base-free check stricter");

  // The same record in a format-2 patch, through the reference decoder.
  TensorDesc desc;
  desc.name = "t";
  desc.dtype = dt;
  desc.shape = {n};
  ViewDigest zero;
  const std::vector<std::span<const uint8_t>> records = {rec};
  const std::vector<uint8_t> patch = WritePatch({desc}, 0, 1, zero, zero, records, kFormatVersion2);
  ServeView view;
  view.tensors.push_back({&desc, base.data()});
  auto ref = ReferenceDecode(patch, &view);
  TERN_ASSERT(ref.ok() == s.ok(), "fast and reference decoders disagree: ", s.ToString(), " vs ",
              ref.status().ToString());
  if (ref.ok()) {
    auto by_element = [](const RefChange& a, const RefChange& b) { return a.element < b.element; };
    std::sort(fast.begin(), fast.end(), by_element);
    std::sort(ref->begin(), ref->end(), by_element);
    TERN_ASSERT(*ref == fast, "fast and reference decoders disagree on the changes");
  }
  return 0;
}
