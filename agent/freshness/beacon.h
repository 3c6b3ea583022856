// Signed HEAD beacons: the root's periodic, signed statement "HEAD of this
// board is H at my wall time T", sent to every member so that a member cut
// off from the publisher can tell (freshness.h; docs/security.md
// "Freshness"). Byte layout: docs/format/agent.md ("HEAD beacons").
//
// A beacon is a signed record (tern/version_manifest.h, SignRecord): the
// canonical beacon, the key id, an Ed25519 signature over both, with the
// manifest signing key. Its magic differs from a manifest's, so neither
// verifies as the other.
//
// Contract: DecodeBeacon and VerifyBeacon take untrusted bytes, bound every
// length, and return one well-formed beacon or an error (kCorrupt:
// malformed; kAuth: untrusted key or bad signature); they never crash.
// EncodeBeacon refuses what DecodeBeacon would refuse, so encode/decode is a
// bijection on valid beacons.
//
// Thread safety: values and reentrant functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tern/status.h"
#include "tern/version_manifest.h"

namespace tern::agent {

inline constexpr std::string_view kBeaconMagic{"TERNBEAC", kRecordMagicBytes};
inline constexpr uint16_t kBeaconFormat = 1;
// Format 2 adds HEAD's board epoch (docs/agent/board.md §4a) at byte 68;
// written only for epoch >= 1, so a beacon of epoch 0 stays format 1 byte
// for byte.
inline constexpr uint16_t kBeaconFormatEpoch = 2;
inline constexpr size_t kBeaconFixedBytes = 68;       // format 1: up to the root id
inline constexpr size_t kBeaconFixedBytesEpoch = 72;  // format 2: up to the root id
inline constexpr size_t kMaxBeaconRootIdBytes = 256;
inline constexpr uint32_t kMaxBeaconIntervalMs = 600'000;
inline constexpr size_t kMaxBeaconBytes = kBeaconFixedBytesEpoch + kMaxBeaconRootIdBytes;
inline constexpr size_t kMaxSignedBeaconBytes = kMaxBeaconBytes + kManifestTrailerBytes;

struct HeadBeacon {
  BoardId board_id{};
  // One root's term over the board, increasing across terms: with the board
  // in etcd, the create revision of the leader key it won (a standby that
  // takes over has a larger one); with the board in DIR, the root's wall
  // time at start in ms. >= 1.
  uint64_t incarnation = 0;
  uint64_t seq = 0;           // >= 1, increases with every beacon of one incarnation
  uint64_t head = 0;          // the board's HEAD when sent (0: nothing published)
  uint32_t head_epoch = 0;    // HEAD's board epoch (>= 1: format 2)
  uint64_t root_unix_ms = 0;  // the root's wall time when sent
  uint32_t interval_ms = 0;   // the root's beacon interval, 1..kMaxBeaconIntervalMs
  std::string root_id;        // 1..kMaxBeaconRootIdBytes
  bool operator==(const HeadBeacon&) const = default;
};

Result<std::string> EncodeBeacon(const HeadBeacon& b);
// Strict: exactly one canonical beacon, no trailing bytes.
Result<HeadBeacon> DecodeBeacon(std::string_view bytes);

// Canonical beacon + key id + signature.
Result<std::string> SignBeacon(const ManifestSigner& signer, const HeadBeacon& b);
// The beacon, only when a trusted key signed it (kAuth otherwise); kCorrupt
// for malformed bytes, refused before any signature check when longer than
// kMaxSignedBeaconBytes. `signer`, when given, says where the signing key
// stands (ManifestVerifier::Verify; kNotRead when the framing failed first).
Result<HeadBeacon> VerifyBeacon(const ManifestVerifier& verifier, std::string_view signed_bytes,
                                SignerStanding* signer = nullptr);

}  // namespace tern::agent
