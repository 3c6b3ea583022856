// Signed key sets: key rotation and revocation for the keys that sign a
// board's records (docs/security.md "Key rotation and revocation"). Byte
// layout and rules: docs/format/agent.md §10.
//
// A key set is a signed record (tern/version_manifest.h, SignRecord): the
// canonical key set, the key id, an Ed25519 signature over both, by a key
// of the previous key set. Key set 0 is the verifier's configured keys;
// ApplyKeySet moves a ManifestVerifier from key set N to N + 1.
//
// Contract: DecodeKeySet, VerifyKeySet and ApplyKeySet take untrusted bytes,
// bound every length and count, and return a well-formed key set or an
// error (kCorrupt: malformed; kAuth: an untrusted, revoked or expired
// signing key, or a bad signature; kAlreadyExists: not newer than the
// verifier's set; kMismatch: a gap in the chain, or a revoked key listed
// again); they never crash. EncodeKeySet refuses what DecodeKeySet would
// refuse, so encode/decode is a bijection on valid key sets.
//
// Thread safety: values and reentrant functions; ApplyKeySet may run while
// other threads Verify with the same verifier.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tern/status.h"
#include "tern/version_manifest.h"

namespace tern {

inline constexpr std::string_view kKeySetMagic{"TERNKEYS", kRecordMagicBytes};
inline constexpr uint16_t kKeySetFormat = 1;
inline constexpr size_t kKeySetFixedBytes = 32;
inline constexpr size_t kKeySetKeyBytes = 40;  // public key + not_after
inline constexpr size_t kMaxKeySetKeys = 16;
inline constexpr size_t kMaxKeySetRevoked = 256;
inline constexpr size_t kMaxKeySetBytes =
    kKeySetFixedBytes + kKeySetKeyBytes * kMaxKeySetKeys + 8 * kMaxKeySetRevoked;
inline constexpr size_t kMaxSignedKeySetBytes = kMaxKeySetBytes + kManifestTrailerBytes;

struct KeySet {
  uint64_t seq = 0;              // >= 1
  uint64_t created_unix_ms = 0;  // informative
  // 1..kMaxKeySetKeys, strictly ascending by public key.
  std::vector<TrustedKey> keys;
  // 0..kMaxKeySetRevoked, strictly ascending; none is a listed key's id.
  std::vector<ManifestKeyId> revoked;
  bool operator==(const KeySet&) const = default;
};

Result<std::string> EncodeKeySet(const KeySet& ks);
// Strict: exactly one canonical key set, no trailing bytes.
Result<KeySet> DecodeKeySet(std::string_view bytes);

// Canonical key set + key id + signature (the signer: a key of the
// previous key set).
Result<std::string> SignKeySet(const ManifestSigner& signer, const KeySet& ks);
// The key set, only when a key the verifier trusts now signed it; kCorrupt
// for malformed bytes, refused before any signature check when longer than
// kMaxSignedKeySetBytes. Does not check the sequence number.
Result<KeySet> VerifyKeySet(const ManifestVerifier& verifier, std::string_view signed_bytes);
// Verifies signed_bytes against the verifier's current key set N and, when
// it is key set N + 1, makes it the verifier's (docs/format/agent.md §10.3).
// Returns the key set applied.
Result<KeySet> ApplyKeySet(ManifestVerifier& verifier, std::string_view signed_bytes);

}  // namespace tern
