// Fuzzer: one segment record, with its checksum recomputed so that mutations
// reach the stream decoders (the whole-patch fuzzer mostly stops at the
// checksums). Input: byte 0 picks the element width, the rest is the record.
// DecodeRecord must fail cleanly or report changes that obey the format:
// positions strictly increasing below element_count, deltas non-zero and
// within the width, as many as changed_count.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <xxhash.h>

#include "patch/segment_codec.h"
#include "tern/status.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tern;
  using namespace tern::patch;
  if (size < 1) return 0;
  static constexpr int kWidths[] = {4, 8, 16, 32, 64};
  const int w = kWidths[data[0] % 5];
  std::vector<uint8_t> rec(data + 1, data + size);
  if (rec.size() >= sizeof(RecordHeader)) {
    RecordHeader h;
    std::memcpy(&h, rec.data(), sizeof h);
    const uint64_t total = sizeof(RecordHeader) + uint64_t{h.table_bytes} + h.position_bytes +
                           h.value_bytes + kChecksumBytes;
    if (total <= rec.size()) {
      const uint64_t sum = XXH3_64bits(rec.data(), total - kChecksumBytes);
      std::memcpy(rec.data() + total - kChecksumBytes, &sum, kChecksumBytes);
    }
  }
  auto r = ParseRecord(rec.data(), rec.size(), w);
  if (!r.ok()) return 0;
  uint64_t calls = 0, next = 0;
  const Status s = DecodeRecord(*r, w, [&](uint64_t pos, uint64_t delta) {
    TERN_ASSERT(pos >= next && pos < r->h.element_count, "position out of order or range");
    TERN_ASSERT(delta != 0 && (w == 64 || delta >> w == 0), "delta zero or wider than the element");
    next = pos + 1;
    ++calls;
  });
  if (s.ok()) TERN_ASSERT(calls == r->h.changed_count, "changed count not honoured");
  return 0;
}
