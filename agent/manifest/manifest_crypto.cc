// SHA-256 chunk hashes, their Merkle root, and Ed25519 signatures over
// manifests, on OpenSSL 3 (docs/format/agent.md §4-5). No exceptions: every
// OpenSSL failure becomes a Status carrying OpenSSL's error text.
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <chrono>
#include <cstring>
#include <set>

#include "base/coding.h"
#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "tern/version_manifest.h"

namespace tern {
namespace {

EVP_PKEY* Pkey(const std::unique_ptr<void, PkeyDeleter>& p) {
  return static_cast<EVP_PKEY*>(p.get());
}

// Drains OpenSSL's error queue into one line.
std::string OpenSslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no OpenSSL error text" : out;
}

Sha256Hash Digest(const uint8_t* a, size_t n) {
  Sha256Hash out;
  unsigned int len = 0;
  // EVP_Digest with SHA-256 cannot fail short of memory exhaustion.
  TERN_ASSERT(EVP_Digest(a, n, out.data(), &len, EVP_sha256(), nullptr) == 1 && len == 32,
              "SHA-256 failed: ", OpenSslErrors());
  return out;
}

Sha256Hash Node(const Sha256Hash& l, const Sha256Hash& r) {
  uint8_t buf[65];
  buf[0] = 0x01;
  std::memcpy(buf + 1, l.data(), 32);
  std::memcpy(buf + 33, r.data(), 32);
  return Digest(buf, sizeof(buf));
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

Result<std::array<uint8_t, 32>> RawPublicKey(EVP_PKEY* pkey) {
  std::array<uint8_t, 32> out;
  size_t len = out.size();
  if (EVP_PKEY_get_raw_public_key(pkey, out.data(), &len) != 1 || len != 32)
    return TERN_ERROR(kInternal, "reading the Ed25519 public key: ", OpenSslErrors());
  return out;
}

Status RequireEd25519(EVP_PKEY* pkey, const char* what) {
  TERN_REQUIRE(EVP_PKEY_get_id(pkey) == EVP_PKEY_ED25519, kInvalidArgument, what,
               " is not an Ed25519 key");
  return Status::Ok();
}

}  // namespace

void PkeyDeleter::operator()(void* pkey) const { EVP_PKEY_free(static_cast<EVP_PKEY*>(pkey)); }

// ---- Chunk hashes ----

Sha256Hash Sha256Of(std::span<const uint8_t> bytes) { return Digest(bytes.data(), bytes.size()); }

Sha256Hash ChunkHashRoot(std::span<const Sha256Hash> chunk_hashes) {
  if (chunk_hashes.empty()) return Digest(nullptr, 0);  // RFC 6962: hash of nothing
  std::vector<Sha256Hash> level;
  level.reserve(chunk_hashes.size());
  for (const Sha256Hash& h : chunk_hashes) {
    uint8_t buf[33];
    buf[0] = 0x00;
    std::memcpy(buf + 1, h.data(), 32);
    level.push_back(Digest(buf, sizeof(buf)));
  }
  // Pair neighbours level by level; an odd last node moves up unchanged
  // (the same tree as RFC 6962's split at the largest power of two).
  while (level.size() > 1) {
    size_t out = 0;
    for (size_t i = 0; i + 1 < level.size(); i += 2) level[out++] = Node(level[i], level[i + 1]);
    if (level.size() % 2 == 1) level[out++] = level.back();
    level.resize(out);
  }
  return level[0];
}

Result<std::vector<Sha256Hash>> VerifyChunkHashList(std::string_view list_bytes,
                                                    const Sha256Hash& root,
                                                    uint32_t chunk_count) {
  TERN_REQUIRE(chunk_count >= 1 && chunk_count <= kMaxManifestChunks, kCorrupt,
               "chunk hash list of ", chunk_count, " chunks outside [1, ", kMaxManifestChunks,
               "]");
  TERN_REQUIRE(list_bytes.size() == uint64_t{chunk_count} * 32, kCorrupt,
               "chunk hash list is ", list_bytes.size(), " bytes, want ", chunk_count, " * 32");
  std::vector<Sha256Hash> hashes(chunk_count);
  std::memcpy(hashes.data(), list_bytes.data(), list_bytes.size());
  TERN_REQUIRE(ChunkHashRoot(hashes) == root, kAuth,
               "chunk hash list does not match the signed root");
  return hashes;
}

Status VerifyChunk(const Sha256Hash& expected, std::span<const uint8_t> bytes) {
  TERN_REQUIRE(Sha256Of(bytes) == expected, kAuth, "chunk of ", bytes.size(),
               " bytes does not match its listed SHA-256");
  return Status::Ok();
}

ManifestKeyId KeyIdOf(const std::array<uint8_t, 32>& public_key) {
  const Sha256Hash h = Digest(public_key.data(), public_key.size());
  ManifestKeyId id;
  std::memcpy(id.data(), h.data(), id.size());
  return id;
}

// ---- Signer ----

Result<ManifestSigner> ManifestSigner::FromPkey(void* raw) {
  std::unique_ptr<void, PkeyDeleter> pkey(raw);
  TERN_RETURN_IF_ERROR(RequireEd25519(static_cast<EVP_PKEY*>(raw), "the signing key"));
  TERN_ASSIGN_OR_RETURN(auto pub, RawPublicKey(static_cast<EVP_PKEY*>(raw)));
  ManifestSigner s;
  s.pkey_ = std::move(pkey);
  s.public_key_ = pub;
  s.key_id_ = KeyIdOf(pub);
  return s;
}

Result<ManifestSigner> ManifestSigner::FromPem(std::string_view pem) {
  TERN_REQUIRE(pem.size() <= (1 << 16), kInvalidArgument, "private key PEM of ", pem.size(),
               " bytes is implausibly large");
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  TERN_REQUIRE(bio != nullptr, kResourceExhausted, "BIO_new_mem_buf: ", OpenSslErrors());
  EVP_PKEY* pkey = PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr);
  TERN_REQUIRE(pkey != nullptr, kInvalidArgument, "reading the private key PEM: ",
               OpenSslErrors());
  return FromPkey(pkey);
}

Result<ManifestSigner> ManifestSigner::FromSeed(const std::array<uint8_t, 32>& seed) {
  EVP_PKEY* pkey =
      EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, seed.data(), seed.size());
  TERN_REQUIRE(pkey != nullptr, kInternal, "Ed25519 key from seed: ", OpenSslErrors());
  return FromPkey(pkey);
}

Result<ManifestSigner> ManifestSigner::Generate() {
  EVP_PKEY* pkey = EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519");
  TERN_REQUIRE(pkey != nullptr, kInternal, "Ed25519 key generation: ", OpenSslErrors());
  return FromPkey(pkey);
}

namespace {
Result<std::string> WritePem(EVP_PKEY* pkey, bool private_key) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new(BIO_s_mem()));
  TERN_REQUIRE(bio != nullptr, kResourceExhausted, "BIO_new: ", OpenSslErrors());
  const int ok = private_key
                     ? PEM_write_bio_PrivateKey(bio.get(), pkey, nullptr, nullptr, 0, nullptr, nullptr)
                     : PEM_write_bio_PUBKEY(bio.get(), pkey);
  TERN_REQUIRE(ok == 1, kInternal, "writing the key as PEM: ", OpenSslErrors());
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}
}  // namespace

Result<std::string> ManifestSigner::PrivateKeyPem() const { return WritePem(Pkey(pkey_), true); }
Result<std::string> ManifestSigner::PublicKeyPem() const { return WritePem(Pkey(pkey_), false); }

Result<std::string> ManifestSigner::Sign(const VersionManifest& m) const {
  TERN_ASSIGN_OR_RETURN(std::string out, EncodeManifest(m));
  return SignFramed(std::move(out));
}

Result<std::string> ManifestSigner::SignRecord(std::string_view record) const {
  TERN_REQUIRE(record.size() >= kRecordMagicBytes, kInvalidArgument, "a signed record of ",
               record.size(), " bytes has no magic");
  TERN_REQUIRE(record.substr(0, kRecordMagicBytes) != kManifestMagic, kInvalidArgument,
               "a signed record may not open with the manifest's magic");
  return SignFramed(std::string(record));
}

Result<std::string> ManifestSigner::SignFramed(std::string out) const {
  out.append(reinterpret_cast<const char*>(key_id_.data()), key_id_.size());
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  TERN_REQUIRE(ctx != nullptr, kResourceExhausted, "EVP_MD_CTX_new: ", OpenSslErrors());
  uint8_t sig[kManifestSignatureBytes];
  size_t sig_len = sizeof(sig);
  if (EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, Pkey(pkey_)) != 1 ||
      EVP_DigestSign(ctx.get(), sig, &sig_len, reinterpret_cast<const uint8_t*>(out.data()),
                     out.size()) != 1 ||
      sig_len != sizeof(sig))
    return TERN_ERROR(kInternal, "Ed25519 signing: ", OpenSslErrors());
  out.append(reinterpret_cast<const char*>(sig), sizeof(sig));
  return out;
}

// ---- Verifier ----

std::string KeyIdHex(const ManifestKeyId& id) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : id) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

// Every key set's revoked ids accumulate; this bounds them all together
// (16 sets of 256 revoked ids).
inline constexpr size_t kMaxRevokedKeyIdsTotal = 4096;
inline constexpr size_t kMaxKeySetKeys = 16;  // key_set.h kMaxKeySetKeys

struct ManifestVerifier::State {
  struct Key {
    ManifestKeyId id;
    uint64_t not_after_unix_ms = 0;
    std::shared_ptr<void> pkey;  // EVP_PKEY, shared with Verify calls in flight
  };
  mutable Mutex mu;
  uint64_t seq GUARDED_BY(mu) = 0;
  std::vector<Key> keys GUARDED_BY(mu);
  std::set<ManifestKeyId> revoked GUARDED_BY(mu);
  std::function<uint64_t()> wall_ms;  // set before sharing; empty: the system clock
};

namespace {
Result<std::shared_ptr<void>> PublicPkey(const std::array<uint8_t, 32>& public_key) {
  EVP_PKEY* raw =
      EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, public_key.data(), public_key.size());
  TERN_REQUIRE(raw != nullptr, kInvalidArgument, "Ed25519 public key: ", OpenSslErrors());
  return std::shared_ptr<void>(raw, PkeyDeleter{});
}
}  // namespace

ManifestVerifier::ManifestVerifier() : state_(std::make_unique<State>()) {}
ManifestVerifier::~ManifestVerifier() = default;
ManifestVerifier::ManifestVerifier(ManifestVerifier&&) noexcept = default;
ManifestVerifier& ManifestVerifier::operator=(ManifestVerifier&&) noexcept = default;

void ManifestVerifier::SetWallClock(std::function<uint64_t()> unix_ms) {
  state_->wall_ms = std::move(unix_ms);
}

uint64_t ManifestVerifier::NowUnixMs() const {
  if (state_->wall_ms) return state_->wall_ms();
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

size_t ManifestVerifier::key_count() const {
  MutexLock l(state_->mu);
  return state_->keys.size();
}

uint64_t ManifestVerifier::key_set_seq() const {
  MutexLock l(state_->mu);
  return state_->seq;
}

bool ManifestVerifier::Trusts(const ManifestKeyId& id) const {
  const uint64_t now = NowUnixMs();
  MutexLock l(state_->mu);
  if (state_->revoked.count(id)) return false;
  for (const State::Key& k : state_->keys)
    if (k.id == id) return k.not_after_unix_ms == 0 || now <= k.not_after_unix_ms;
  return false;
}

Status ManifestVerifier::AddTrustedKey(const std::array<uint8_t, 32>& public_key) {
  TERN_ASSIGN_OR_RETURN(std::shared_ptr<void> pkey, PublicPkey(public_key));
  const ManifestKeyId id = KeyIdOf(public_key);
  MutexLock l(state_->mu);
  TERN_REQUIRE(state_->seq == 0, kInvalidArgument,
               "trusted keys are added before any key set (key set ", state_->seq, " holds)");
  for (const State::Key& k : state_->keys)
    TERN_REQUIRE(k.id != id, kAlreadyExists, "a trusted key with this key id is already listed");
  state_->keys.push_back(State::Key{id, 0, std::move(pkey)});
  return Status::Ok();
}

Status ManifestVerifier::ReplaceKeys(uint64_t seq, const std::vector<TrustedKey>& keys,
                                     const std::vector<ManifestKeyId>& revoked) {
  TERN_REQUIRE(!keys.empty() && keys.size() <= kMaxKeySetKeys, kInvalidArgument, "a key set of ",
               keys.size(), " keys (1..", kMaxKeySetKeys, ")");
  std::vector<State::Key> next;
  for (const TrustedKey& k : keys) {
    TERN_ASSIGN_OR_RETURN(std::shared_ptr<void> pkey, PublicPkey(k.public_key));
    const ManifestKeyId id = KeyIdOf(k.public_key);
    for (const State::Key& n : next)
      TERN_REQUIRE(n.id != id, kInvalidArgument, "key set ", seq, " lists key id ",
                   KeyIdHex(id), " twice");
    next.push_back(State::Key{id, k.not_after_unix_ms, std::move(pkey)});
  }
  MutexLock l(state_->mu);
  TERN_REQUIRE(seq > state_->seq, kAlreadyExists, "key set ", seq,
               " is not newer than the one held (", state_->seq, "): replayed or old");
  TERN_REQUIRE(seq == state_->seq + 1, kMismatch, "key set ", seq, " skips from key set ",
               state_->seq, " (the ones between come first)");
  std::set<ManifestKeyId> all_revoked = state_->revoked;
  all_revoked.insert(revoked.begin(), revoked.end());
  TERN_REQUIRE(all_revoked.size() <= kMaxRevokedKeyIdsTotal, kResourceExhausted, "key set ", seq,
               " would revoke ", all_revoked.size(), " key ids in all (at most ",
               kMaxRevokedKeyIdsTotal, ")");
  for (const State::Key& n : next)
    TERN_REQUIRE(!all_revoked.count(n.id), kMismatch, "key set ", seq, " lists key id ",
                 KeyIdHex(n.id), ", which is revoked");
  state_->seq = seq;
  state_->keys = std::move(next);
  state_->revoked = std::move(all_revoked);
  return Status::Ok();
}

Result<std::array<uint8_t, 32>> Ed25519PublicKeyFromPem(std::string_view pem) {
  TERN_REQUIRE(pem.size() <= (1 << 16), kInvalidArgument, "key PEM of ", pem.size(),
               " bytes is implausibly large");
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  TERN_REQUIRE(bio != nullptr, kResourceExhausted, "BIO_new_mem_buf: ", OpenSslErrors());
  std::unique_ptr<void, PkeyDeleter> pkey(PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr));
  if (pkey == nullptr) {
    ERR_clear_error();
    std::unique_ptr<BIO, BioFree> again(
        BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
    TERN_REQUIRE(again != nullptr, kResourceExhausted, "BIO_new_mem_buf: ", OpenSslErrors());
    pkey.reset(PEM_read_bio_PrivateKey(again.get(), nullptr, nullptr, nullptr));
  }
  TERN_REQUIRE(pkey != nullptr, kInvalidArgument, "reading the key PEM: ", OpenSslErrors());
  TERN_RETURN_IF_ERROR(RequireEd25519(Pkey(pkey), "the key"));
  return RawPublicKey(Pkey(pkey));
}

Status ManifestVerifier::AddTrustedKeyPem(std::string_view pem) {
  TERN_REQUIRE(pem.size() <= (1 << 16), kInvalidArgument, "public key PEM of ", pem.size(),
               " bytes is implausibly large");
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  TERN_REQUIRE(bio != nullptr, kResourceExhausted, "BIO_new_mem_buf: ", OpenSslErrors());
  std::unique_ptr<void, PkeyDeleter> pkey(PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr));
  TERN_REQUIRE(pkey != nullptr, kInvalidArgument, "reading the public key PEM: ",
               OpenSslErrors());
  TERN_RETURN_IF_ERROR(RequireEd25519(Pkey(pkey), "the trusted key"));
  TERN_ASSIGN_OR_RETURN(auto pub, RawPublicKey(Pkey(pkey)));
  return AddTrustedKey(pub);
}

Status ManifestVerifier::VerifyFramed(std::string_view in, size_t body, const char* what,
                                      SignerStanding* signer) const {
  SignerStanding ignored = SignerStanding::kNotRead;
  SignerStanding& standing = signer != nullptr ? *signer : ignored;
  ManifestKeyId id;
  std::memcpy(id.data(), in.data() + body, id.size());
  const uint64_t now = NowUnixMs();
  std::shared_ptr<void> pkey;
  {
    MutexLock l(state_->mu);
    if (state_->revoked.count(id)) {
      standing = SignerStanding::kRevoked;
      return TERN_ERROR(kAuth, what, " signed by revoked key id ", KeyIdHex(id), " (key set ",
                        state_->seq, ")");
    }
    for (const State::Key& k : state_->keys) {
      if (k.id != id) continue;
      if (k.not_after_unix_ms != 0 && now > k.not_after_unix_ms) {
        standing = SignerStanding::kExpired;
        return TERN_ERROR(kAuth, what, " signed by key id ", KeyIdHex(id), ", expired at ",
                          k.not_after_unix_ms, " ms (now ", now, ")");
      }
      pkey = k.pkey;
    }
    if (pkey == nullptr) {
      standing = SignerStanding::kUnknown;
      return TERN_ERROR(kAuth, what, " signed by an untrusted key id ", KeyIdHex(id), " (key set ",
                        state_->seq, ")");
    }
    standing = SignerStanding::kTrusted;  // whatever the signature says below
  }
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  TERN_REQUIRE(ctx != nullptr, kResourceExhausted, "EVP_MD_CTX_new: ", OpenSslErrors());
  TERN_REQUIRE(EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr,
                                    static_cast<EVP_PKEY*>(pkey.get())) == 1,
               kInternal, "EVP_DigestVerifyInit: ", OpenSslErrors());
  const auto* p = reinterpret_cast<const uint8_t*>(in.data());
  const int r = EVP_DigestVerify(ctx.get(), p + body + 8, kManifestSignatureBytes, p, body + 8);
  if (r != 1) {
    ERR_clear_error();  // a bad signature is the expected refusal, not a library fault
    return TERN_ERROR(kAuth, what, " signature does not verify");
  }
  return Status::Ok();
}

Result<std::string_view> ManifestVerifier::VerifyRecord(std::string_view in,
                                                        SignerStanding* signer) const {
  if (signer != nullptr) *signer = SignerStanding::kNotRead;
  TERN_REQUIRE(in.size() >= kRecordMagicBytes + kManifestTrailerBytes, kCorrupt,
               "signed record of ", in.size(), " bytes is too short");
  TERN_REQUIRE(in.substr(0, kRecordMagicBytes) != kManifestMagic, kCorrupt,
               "a manifest is not a signed record");
  const size_t body = in.size() - kManifestTrailerBytes;
  TERN_RETURN_IF_ERROR(VerifyFramed(in, body, "record", signer));
  return in.substr(0, body);
}

Result<VersionManifest> ManifestVerifier::Verify(std::string_view in,
                                                 SignerStanding* signer) const {
  if (signer != nullptr) *signer = SignerStanding::kNotRead;
  // Framing first (the length follows from the object count), then the
  // signature, and only then the full parse: the parser sees untrusted bytes
  // only after a trusted key vouched for them, or in DecodeManifest's
  // fuzzed form.
  TERN_REQUIRE(in.size() >= kManifestHeaderBytes + kManifestTrailerBytes, kCorrupt,
               "signed manifest of ", in.size(), " bytes is too short");
  TERN_ASSIGN_OR_RETURN(const size_t body, ManifestBytesOf(in));  // header layout, §2
  TERN_REQUIRE(in.size() == body + kManifestTrailerBytes, kCorrupt, "signed manifest of ",
               body + kManifestTrailerBytes, " bytes by its header, got ", in.size());
  TERN_RETURN_IF_ERROR(VerifyFramed(in, body, "manifest", signer));
  return DecodeManifest(in.substr(0, body));
}

}  // namespace tern
