// Signed version manifests: the first piece of the agent's trust model
// (docs/security.md). Spec: docs/format/agent.md.
//
// A publisher describes version v of a board in a VersionManifest (parent,
// view digests, and per object its size, chunking and the Merkle root over
// the SHA-256 of every chunk), signs it with Ed25519, and members accept
// bytes only when they chain up to a manifest signed by a trusted key:
//   signature -> manifest -> chunk_hashes_root -> chunk hash list -> chunk.
// A relay nobody trusts can then forward bytes but cannot alter them.
//
// Contract: DecodeManifest and ManifestVerifier::Verify take untrusted bytes
// and either return a manifest that passes ValidateManifest or an error
// (kCorrupt for malformed bytes, kMismatch for well-formed but inconsistent
// fields, kAuth for an unknown key or a bad signature); they never crash and
// bound every count. EncodeManifest refuses a manifest that Decode would
// refuse, so encode/decode is a bijection on valid manifests.
//
// Key sets (docs/format/agent.md §10): a verifier starts at key set 0, the
// keys added with AddTrustedKey*, and moves to later ones with ReplaceKeys
// (tern/key_set.h checks and applies signed key sets). It refuses
// (kAuth, naming the key id) what a revoked key, an expired key or a key
// not in its current set signed.
//
// Thread safety: manifests and hashes are values. A ManifestSigner may Sign
// from many threads at once. A ManifestVerifier may Verify from many threads
// at once, also while ReplaceKeys runs (each call sees one key set whole);
// AddTrustedKey* (key set 0, at start) must not race with Verify.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tern/digest.h"
#include "tern/export.h"
#include "tern/status.h"

namespace tern {

using Sha256Hash = std::array<uint8_t, 32>;
using ManifestKeyId = std::array<uint8_t, 8>;
using BoardId = std::array<uint8_t, 16>;

// Bounds (the spec's MUSTs).
inline constexpr uint32_t kMaxManifestObjects = 64;
// 2^21 chunks: a hash list of at most 64 MiB; at 4 MiB chunks an 8 TiB object.
inline constexpr uint32_t kMaxManifestChunks = uint32_t{1} << 21;
// Format 1: objects only. Format 2 adds the version's model files (spec
// §3.1); a manifest without files is still written as format 1, byte for
// byte what it always was, so versions published before files existed
// verify unchanged.
inline constexpr uint16_t kManifestFormat = 1;
inline constexpr uint16_t kManifestFormatFiles = 2;
// Format 3 carries the board epoch (docs/agent/board.md §4a): written only
// for epoch >= 1, so every manifest of epoch 0 stays format 1 or 2.
inline constexpr uint16_t kManifestFormatEpoch = 3;
inline constexpr size_t kManifestHeaderBytes = 128;
inline constexpr size_t kManifestObjectBytes = 72;
inline constexpr size_t kManifestFileBytes = 48;  // + the name, in the names block
inline constexpr uint32_t kMaxManifestFiles = 64;
inline constexpr size_t kMaxManifestFileNameBytes = 128;
inline constexpr uint64_t kMaxManifestFileBytes = uint64_t{64} << 20;        // one file
inline constexpr uint64_t kMaxManifestFilesTotalBytes = uint64_t{256} << 20;  // all of them
// The longest canonical manifest (unsigned).
inline constexpr size_t kMaxManifestBytes =
    kManifestHeaderBytes + kManifestObjectBytes * kMaxManifestObjects +
    (kManifestFileBytes + kMaxManifestFileNameBytes) * kMaxManifestFiles;
inline constexpr size_t kManifestSignatureBytes = 64;
// What Sign appends to the canonical manifest: key_id + signature.
inline constexpr size_t kManifestTrailerBytes = 8 + kManifestSignatureBytes;
// Every signed record (a manifest, a HEAD beacon) opens with its own magic
// of this many bytes; a manifest's is "TERNMANI".
inline constexpr size_t kRecordMagicBytes = 8;
inline constexpr std::string_view kManifestMagic{"TERNMANI", kRecordMagicBytes};

enum class ObjectKind : uint8_t { kPatch = 1, kKeyframe = 2, kSquash = 3 };

struct ManifestObject {
  ObjectKind kind = ObjectKind::kPatch;
  uint64_t from_version = 0;
  uint64_t to_version = 0;
  uint64_t bytes = 0;        // 1 ..
  uint32_t chunk_bytes = 0;  // 1 .. kMaxChunkBytes (include/tern/transport.h)
  uint32_t chunk_count = 0;  // == ceil(bytes / chunk_bytes), <= kMaxManifestChunks
  Sha256Hash chunk_hashes_root{};  // ChunkHashRoot over the object's chunks

  bool operator==(const ManifestObject&) const = default;
};

// A model file that is not a tensor (config.json, tokenizer files, the
// quantization config): shipped with the version, present in every slot
// that serves it (docs/agent.md §3 "Model files").
struct ManifestFile {
  std::string name;  // ValidModelFileName
  uint64_t bytes = 0;  // 0 .. kMaxManifestFileBytes
  Sha256Hash sha256{};

  bool operator==(const ManifestFile&) const = default;
};

// A name a model file may have: 1 .. kMaxManifestFileNameBytes bytes, no
// '/', no NUL, no control character, not starting with '.', and not a
// tensor file (*.safetensors) or the safetensors index
// (*.safetensors.index.json): those are the view, which the objects carry.
TERN_EXPORT bool ValidModelFileName(std::string_view name);

struct VersionManifest {
  BoardId board_id{};
  uint64_t version = 0;  // >= 1
  // < version (0: none); > version only for a supersede.
  uint64_t parent = 0;
  // The board epoch (docs/agent/board.md §4a); publications are ordered by
  // (epoch, version). 0 until the first supersede; >= 1 is format 3.
  uint32_t epoch = 0;
  // The first publication of its epoch: epoch >= 1, parent >= 1 and
  // version < parent (renumbering downwards); it names patch(parent->version)
  // and keyframe(version).
  bool supersede = false;
  uint64_t created_unix_ms = 0;
  ViewDigest base_digest;    // D(parent)
  ViewDigest target_digest;  // D(version)
  // 1 .. kMaxManifestObjects, strictly ordered by (kind, from_version):
  // patch: from == parent, to == version; keyframe: from == to == version;
  // squash: from < parent (epoch >= 1: from != parent, from != version;
  // the board checks that from precedes parent on its chain), to == version.
  std::vector<ManifestObject> objects;
  // 0 .. kMaxManifestFiles, strictly ordered by name, at most
  // kMaxManifestFilesTotalBytes together. Empty: format 1 (no files).
  std::vector<ManifestFile> files;

  bool operator==(const VersionManifest&) const = default;
};

// The consistency rules above, kMismatch naming the first one broken.
TERN_EXPORT Status ValidateManifest(const VersionManifest& m);
// Canonical bytes (kManifestHeaderBytes + kManifestObjectBytes per object,
// then per file kManifestFileBytes and its name).
TERN_EXPORT Result<std::string> EncodeManifest(const VersionManifest& m);
// The length of the canonical manifest whose header `in` begins with (its
// format, object count and, format 2, file count and names length),
// checked against the bounds; kCorrupt for a header that cannot start one.
TERN_EXPORT Result<size_t> ManifestBytesOf(std::string_view in);
// Strict: exactly one canonical manifest, no trailing bytes.
TERN_EXPORT Result<VersionManifest> DecodeManifest(std::string_view bytes);

// ---- Chunk hashes ----
TERN_EXPORT Sha256Hash Sha256Of(std::span<const uint8_t> bytes);
// Merkle root (RFC 6962 leaf/node prefixes, an odd node promoted; spec §4).
TERN_EXPORT Sha256Hash ChunkHashRoot(std::span<const Sha256Hash> chunk_hashes);
// Parses a chunk hash list (chunk_count * 32 bytes exactly) and checks it
// against the signed root: kCorrupt on a wrong length, kAuth on a wrong root.
TERN_EXPORT Result<std::vector<Sha256Hash>> VerifyChunkHashList(std::string_view list_bytes,
                                                                const Sha256Hash& root,
                                                                uint32_t chunk_count);
// kAuth when SHA-256(bytes) is not the listed hash.
TERN_EXPORT Status VerifyChunk(const Sha256Hash& expected, std::span<const uint8_t> bytes);

// ---- Ed25519 ----
// First 8 bytes of SHA-256 of the raw 32-byte public key.
TERN_EXPORT ManifestKeyId KeyIdOf(const std::array<uint8_t, 32>& public_key);

struct PkeyDeleter {
  TERN_EXPORT void operator()(void* pkey) const;
};

class TERN_EXPORT ManifestSigner {
 public:
  static Result<ManifestSigner> FromPem(std::string_view private_key_pem);
  // From a raw 32-byte Ed25519 seed (fixed keys in tests and spec examples).
  static Result<ManifestSigner> FromSeed(const std::array<uint8_t, 32>& seed);
  static Result<ManifestSigner> Generate();

  Result<std::string> PrivateKeyPem() const;
  Result<std::string> PublicKeyPem() const;
  const std::array<uint8_t, 32>& public_key() const { return public_key_; }
  const ManifestKeyId& key_id() const { return key_id_; }

  // Canonical manifest + key_id + Ed25519(canonical manifest + key_id).
  Result<std::string> Sign(const VersionManifest& m) const;
  // The same framing over another signed record of the board (a HEAD
  // beacon, agent/freshness/beacon.h): record + key_id + Ed25519(record +
  // key_id). The record must open with its own 8-byte magic, never the
  // manifest's (kInvalidArgument otherwise), so that no signature over one
  // kind of record verifies as another.
  Result<std::string> SignRecord(std::string_view record) const;

 private:
  static Result<ManifestSigner> FromPkey(void* pkey);  // takes ownership
  Result<std::string> SignFramed(std::string body) const;  // body + key_id + signature
  std::unique_ptr<void, PkeyDeleter> pkey_;
  std::array<uint8_t, 32> public_key_{};
  ManifestKeyId key_id_{};
};

// The raw Ed25519 public key of a PEM: a public key (SubjectPublicKeyInfo)
// or a private key (PKCS#8); kInvalidArgument for anything else.
TERN_EXPORT Result<std::array<uint8_t, 32>> Ed25519PublicKeyFromPem(std::string_view pem);

// Lower-case hex of a key id, as errors and `tern keys id` print it.
TERN_EXPORT std::string KeyIdHex(const ManifestKeyId& id);

// A key of a key set: the raw Ed25519 public key and when it stops signing.
struct TrustedKey {
  std::array<uint8_t, 32> public_key{};
  uint64_t not_after_unix_ms = 0;  // 0: no expiry
  bool operator==(const TrustedKey&) const = default;
};

// Where the key that signed some bytes stands in a verifier's key set, as
// Verify judged it. A refusal (kAuth) with kTrusted is a signature that does
// not verify: the bytes were altered or forged under a trusted key id. The
// others refuse the key whatever the bytes: signed by a key this side has
// not learned yet (its key set is behind), or before a rotation, or judged
// by a clock past the key's expiry.
enum class SignerStanding : uint8_t {
  kNotRead,  // the framing failed before the key id was read
  kTrusted,  // an active, unexpired key of the current set
  kUnknown,  // not in the current set
  kRevoked,
  kExpired,
};

class TERN_EXPORT ManifestVerifier {
 public:
  ManifestVerifier();
  ~ManifestVerifier();
  ManifestVerifier(ManifestVerifier&&) noexcept;
  ManifestVerifier& operator=(ManifestVerifier&&) noexcept;

  // Key set 0 (no expiry); only before the first ReplaceKeys
  // (kInvalidArgument after).
  Status AddTrustedKeyPem(std::string_view public_key_pem);
  Status AddTrustedKey(const std::array<uint8_t, 32>& public_key);
  size_t key_count() const;  // active keys of the current set

  // The wall clock expiry is judged by (ms since 1970); the system clock
  // unless set. Set it before the verifier is shared.
  void SetWallClock(std::function<uint64_t()> unix_ms);
  uint64_t NowUnixMs() const;

  // The current key set's sequence number (0: the configured keys).
  uint64_t key_set_seq() const;
  // Whether `id` is an active key of the current set, not expired now.
  bool Trusts(const ManifestKeyId& id) const;
  // Key set `seq` replaces the current one: `keys` become the active keys
  // (1..16, distinct) and `revoked` joins the revoked ids. The caller has
  // checked the record's signature against the current set
  // (tern/key_set.h); this re-checks, atomically, that seq is the
  // current one + 1 (kAlreadyExists: older or the same; kMismatch: a gap)
  // and that no key in `keys` was ever revoked (kMismatch).
  Status ReplaceKeys(uint64_t seq, const std::vector<TrustedKey>& keys,
                     const std::vector<ManifestKeyId>& revoked);

  // The manifest, only when signed_bytes is a canonical manifest signed by a
  // trusted key. kCorrupt: bad framing or manifest; kAuth: unknown, revoked
  // or expired key id, or bad signature. `signer`, when given, says which,
  // judged under the same lock as the verdict (a key set applied meanwhile
  // cannot split them).
  Result<VersionManifest> Verify(std::string_view signed_bytes,
                                 SignerStanding* signer = nullptr) const;
  // The record inside bytes made by ManifestSigner::SignRecord, only when a
  // trusted key signed them (a view into signed_bytes). kCorrupt: shorter
  // than a magic and the trailer, or a manifest's magic; kAuth: unknown,
  // revoked or expired key id, or bad signature; `signer` as for Verify.
  // The caller parses the record.
  Result<std::string_view> VerifyRecord(std::string_view signed_bytes,
                                        SignerStanding* signer = nullptr) const;

 private:
  // bytes[0, body) + key_id signed by a trusted key; `what` names it in errors.
  Status VerifyFramed(std::string_view bytes, size_t body, const char* what,
                      SignerStanding* signer) const;
  struct State;  // manifest_crypto.cc: the key set under a mutex
  std::unique_ptr<State> state_;
};

}  // namespace tern
