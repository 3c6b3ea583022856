// Key-set codec, signature and chaining (docs/format/agent.md §10).
#include "tern/key_set.h"

#include <cstring>

#include "base/coding.h"

namespace tern {
namespace {

Status Validate(const KeySet& ks, Code code) {
  auto fail = [&](const std::string& why) { return Status(code, "key set: " + why); };
  if (ks.seq == 0) return fail("sequence number 0");
  if (ks.keys.empty() || ks.keys.size() > kMaxKeySetKeys)
    return fail(std::to_string(ks.keys.size()) + " keys (1..16)");
  if (ks.revoked.size() > kMaxKeySetRevoked)
    return fail(std::to_string(ks.revoked.size()) + " revoked ids (0..256)");
  for (size_t i = 1; i < ks.keys.size(); ++i)
    if (!(ks.keys[i - 1].public_key < ks.keys[i].public_key))
      return fail("keys not in strictly ascending order");
  for (size_t i = 1; i < ks.revoked.size(); ++i)
    if (!(ks.revoked[i - 1] < ks.revoked[i]))
      return fail("revoked ids not in strictly ascending order");
  for (const TrustedKey& k : ks.keys) {
    const ManifestKeyId id = KeyIdOf(k.public_key);
    for (const ManifestKeyId& r : ks.revoked)
      if (r == id) return fail("key id " + KeyIdHex(id) + " both listed and revoked");
  }
  return Status::Ok();
}

}  // namespace

Result<std::string> EncodeKeySet(const KeySet& ks) {
  TERN_RETURN_IF_ERROR(Validate(ks, Code::kInvalidArgument));
  std::string out(kKeySetMagic);
  PutFixed16(&out, kKeySetFormat);
  PutFixed16(&out, static_cast<uint16_t>(ks.keys.size()));
  PutFixed16(&out, static_cast<uint16_t>(ks.revoked.size()));
  PutFixed16(&out, 0);
  PutFixed64(&out, ks.seq);
  PutFixed64(&out, ks.created_unix_ms);
  TERN_ASSERT(out.size() == kKeySetFixedBytes, "key set layout drifted: ", out.size());
  for (const TrustedKey& k : ks.keys) {
    out.append(reinterpret_cast<const char*>(k.public_key.data()), k.public_key.size());
    PutFixed64(&out, k.not_after_unix_ms);
  }
  for (const ManifestKeyId& id : ks.revoked)
    out.append(reinterpret_cast<const char*>(id.data()), id.size());
  return out;
}

Result<KeySet> DecodeKeySet(std::string_view in) {
  TERN_REQUIRE(in.size() >= kKeySetFixedBytes && in.size() <= kMaxKeySetBytes, kCorrupt,
               "key set of ", in.size(), " bytes outside ", kKeySetFixedBytes, "..",
               kMaxKeySetBytes);
  TERN_REQUIRE(in.substr(0, kRecordMagicBytes) == kKeySetMagic, kCorrupt,
               "not a key set (bad magic)");
  const uint64_t format = DecodeFixedAt(in, 8, 2);
  TERN_REQUIRE(format == kKeySetFormat, kCorrupt, "key set format ", format,
               " (this agent reads ", kKeySetFormat, ")");
  const uint64_t key_count = DecodeFixedAt(in, 10, 2);
  const uint64_t revoked_count = DecodeFixedAt(in, 12, 2);
  TERN_REQUIRE(DecodeFixedAt(in, 14, 2) == 0, kCorrupt, "key set: reserved bytes not zero");
  TERN_REQUIRE(key_count >= 1 && key_count <= kMaxKeySetKeys, kCorrupt, "key set of ",
               key_count, " keys (1..", kMaxKeySetKeys, ")");
  TERN_REQUIRE(revoked_count <= kMaxKeySetRevoked, kCorrupt, "key set revoking ", revoked_count,
               " key ids (at most ", kMaxKeySetRevoked, ")");
  const uint64_t want = kKeySetFixedBytes + kKeySetKeyBytes * key_count + 8 * revoked_count;
  TERN_REQUIRE(in.size() == want, kCorrupt, "key set of ", in.size(), " bytes, its counts say ",
               want);
  KeySet ks;
  ks.seq = DecodeFixedAt(in, 16, 8);
  ks.created_unix_ms = DecodeFixedAt(in, 24, 8);
  size_t at = kKeySetFixedBytes;
  ks.keys.resize(key_count);
  for (TrustedKey& k : ks.keys) {
    std::memcpy(k.public_key.data(), in.data() + at, k.public_key.size());
    k.not_after_unix_ms = DecodeFixedAt(in, at + 32, 8);
    at += kKeySetKeyBytes;
  }
  ks.revoked.resize(revoked_count);
  for (ManifestKeyId& id : ks.revoked) {
    std::memcpy(id.data(), in.data() + at, id.size());
    at += id.size();
  }
  TERN_RETURN_IF_ERROR(Validate(ks, Code::kCorrupt));
  return ks;
}

Result<std::string> SignKeySet(const ManifestSigner& signer, const KeySet& ks) {
  TERN_ASSIGN_OR_RETURN(std::string record, EncodeKeySet(ks));
  return signer.SignRecord(record);
}

Result<KeySet> VerifyKeySet(const ManifestVerifier& verifier, std::string_view signed_bytes) {
  TERN_REQUIRE(signed_bytes.size() <= kMaxSignedKeySetBytes, kCorrupt, "signed key set of ",
               signed_bytes.size(), " bytes (at most ", kMaxSignedKeySetBytes, ")");
  TERN_REQUIRE(signed_bytes.substr(0, kRecordMagicBytes) == kKeySetMagic, kCorrupt,
               "not a key set (bad magic)");
  // Parse first: a malformed record is kCorrupt whoever signed it, and the
  // parser is fuzzed on its own.
  TERN_REQUIRE(signed_bytes.size() >= kManifestTrailerBytes, kCorrupt, "signed key set of ",
               signed_bytes.size(), " bytes is too short");
  TERN_ASSIGN_OR_RETURN(KeySet ks, DecodeKeySet(signed_bytes.substr(
                                       0, signed_bytes.size() - kManifestTrailerBytes)));
  TERN_RETURN_IF_ERROR(verifier.VerifyRecord(signed_bytes).status());
  return ks;
}

Result<KeySet> ApplyKeySet(ManifestVerifier& verifier, std::string_view signed_bytes) {
  TERN_REQUIRE(signed_bytes.size() >= kManifestTrailerBytes &&
                   signed_bytes.size() <= kMaxSignedKeySetBytes,
               kCorrupt, "signed key set of ", signed_bytes.size(), " bytes (", kManifestTrailerBytes,
               "..", kMaxSignedKeySetBytes, ")");
  // The sequence number first: a key set already held is refused as such
  // even when its signer has since been rotated out (the root resends the
  // whole chain at every join).
  TERN_ASSIGN_OR_RETURN(const KeySet unsigned_ks,
                        DecodeKeySet(signed_bytes.substr(0, signed_bytes.size() -
                                                                kManifestTrailerBytes)));
  const uint64_t held = verifier.key_set_seq();
  TERN_REQUIRE(unsigned_ks.seq > held, kAlreadyExists, "key set ", unsigned_ks.seq,
               " is not newer than the one held (", held, "): replayed or old");
  TERN_ASSIGN_OR_RETURN(KeySet ks, VerifyKeySet(verifier, signed_bytes));
  TERN_REQUIRE(ks.seq == held + 1, kMismatch, "key set ", ks.seq, " skips from key set ", held,
               " (the ones between come first)");
  // The signature was checked against the set held then; ReplaceKeys
  // re-checks the sequence number under the verifier's lock, so a key set
  // applied meanwhile by another thread makes this one fail, not fork.
  TERN_RETURN_IF_ERROR(verifier.ReplaceKeys(ks.seq, ks.keys, ks.revoked));
  return ks;
}

}  // namespace tern
