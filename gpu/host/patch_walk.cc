#include "gpu/host/patch_walk.h"

#include <cstring>

#include "base/coding.h"
#include "tern/patch.h"

namespace tern::gpu {

Result<WalkedPatch> WalkPatch(std::span<const uint8_t> patch) {
  TERN_ASSIGN_OR_RETURN(const uint64_t verified, VerifiedPrefixBytes(patch));
  TERN_REQUIRE(verified == patch.size(), kCorrupt, "truncated patch: ", patch.size() - verified,
               " bytes after the last complete unit");
  // Verified: every read below is inside the patch and every field in range.
  const uint8_t* p = patch.data();
  const uint64_t manifest_bytes = DecodeFixed64(p + 16);
  const uint8_t* m = p + 32;
  WalkedPatch w;
  w.base_version = DecodeFixed64(m);
  w.target_version = DecodeFixed64(m + 8);
  w.base_digest = ViewDigest::FromBytes(m + 16);
  w.target_digest = ViewDigest::FromBytes(m + 48);
  const uint32_t tensor_count = DecodeFixed32(m + 80);
  uint64_t at = 88;
  uint64_t records = 0;
  w.tensors.reserve(tensor_count);
  for (uint32_t t = 0; t < tensor_count; ++t) {
    const uint16_t name_bytes = DecodeFixed16(m + at);
    WalkedTensor wt;
    wt.desc.dtype = static_cast<DType>(m[at + 2]);
    const int rank = m[at + 3];
    const bool nibbles = m[at + 4] != 0;  // the coding byte (format 3), verified above
    at += 8;
    wt.desc.name.assign(reinterpret_cast<const char*>(m + at), name_bytes);
    // TODO(gpu): fold nibble changes into element changes on the device, as
    // patch/apply_record.h's DecodeElementChanges does on the host.
    TERN_REQUIRE(!nibbles, kUnsupported, "tensor '", wt.desc.name,
                 "' is coded as nibbles (patch format 3): the GPU apply does not decode it yet; apply on the host");
    at += name_bytes;
    for (int r = 0; r < rank; ++r, at += 8) wt.desc.shape.push_back(DecodeFixed64(m + at));
    wt.segment_count = DecodeFixed64(m + at + 8);
    at += 16;
    records += wt.segment_count;
    w.tensors.push_back(std::move(wt));
  }
  TERN_ASSERT(at == manifest_bytes);
  at = 32 + manifest_bytes + 8;
  w.records.reserve(records);
  for (uint64_t r = 0; r < records; ++r) {
    WalkedRecord rec;
    std::memcpy(&rec.h, p + at, sizeof(RecordHeader));
    rec.offset = at;
    rec.total_bytes = sizeof(RecordHeader) + uint64_t{rec.h.table_bytes} + rec.h.position_bytes +
                      rec.h.value_bytes + kRecordChecksumBytes;
    at += rec.total_bytes;
    w.records.push_back(rec);
  }
  TERN_ASSERT(at + 24 == patch.size());
  return w;
}

}  // namespace tern::gpu
