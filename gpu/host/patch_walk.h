// Where the records of a format-1 patch lie, for the GPU apply: the tensor
// table and each record's header and offset. Internal to gpu/.
//
// Validation is patch/'s, through its public API: WalkPatch first requires
// VerifiedPrefixBytes(patch) == patch.size(), which checks the file header,
// manifest, every record's framing and checksum and the trailer (everything
// but the contents of the segment streams, which the device decoder checks).
// Only then does it read offsets, so it trusts bytes that are already
// verified and keeps no second copy of the container rules.
// TODO(api): patch/ could expose its record walk (tern/patch.h); this file
// would shrink to a call.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "gpu/ops/codec_ops.h"
#include "tern/digest.h"
#include "tern/status.h"
#include "tern/view.h"

namespace tern::gpu {

struct WalkedTensor {
  TensorDesc desc;
  uint64_t segment_count = 0;
};

struct WalkedRecord {
  RecordHeader h;
  uint64_t offset = 0;       // of the record header in the patch
  uint64_t total_bytes = 0;  // header, payload and checksum
};

struct WalkedPatch {
  uint64_t base_version = 0, target_version = 0;
  ViewDigest base_digest, target_digest;
  std::vector<WalkedTensor> tensors;
  std::vector<WalkedRecord> records;  // tensor order, then element order
};

Result<WalkedPatch> WalkPatch(std::span<const uint8_t> patch);

}  // namespace tern::gpu
