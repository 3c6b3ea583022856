// Signed manifests and chunk hashes: the codec's strictness, the signature's
// coverage, and the chain signature -> root -> hash list -> chunk that keeps
// an untrusted relay from altering bytes (docs/security.md).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "agent/manifest/object_ref.h"
#include "base/coding.h"
#include "base/hash.h"
#include "tern/transport.h"
#include "tern/version_manifest.h"

namespace tern {
namespace {

std::string Hex(std::string_view b) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : b) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

std::span<const uint8_t> Bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::array<uint8_t, 32> FixedSeed() {
  std::array<uint8_t, 32> s;
  for (int i = 0; i < 32; ++i) s[i] = static_cast<uint8_t>(i + 1);
  return s;
}

// An object of `data` cut into chunks; its hash list and root.
struct Object {
  std::vector<std::string> chunks;
  std::vector<Sha256Hash> hashes;
  ManifestObject desc;
};

Object MakeObject(ObjectKind kind, uint64_t from, uint64_t to, std::string data,
                  uint32_t chunk_bytes) {
  Object o;
  for (size_t at = 0; at < data.size(); at += chunk_bytes) {
    o.chunks.push_back(data.substr(at, chunk_bytes));
    o.hashes.push_back(Sha256Of(Bytes(o.chunks.back())));
  }
  o.desc = {kind, from, to, data.size(), chunk_bytes, static_cast<uint32_t>(o.chunks.size()),
            ChunkHashRoot(o.hashes)};
  return o;
}

std::string HashList(const std::vector<Sha256Hash>& hashes) {
  std::string out;
  for (const auto& h : hashes) out.append(reinterpret_cast<const char*>(h.data()), 32);
  return out;
}

// The spec's worked example (docs/format/agent.md §6).
VersionManifest Example() {
  VersionManifest m;
  for (int i = 0; i < 16; ++i) m.board_id[i] = static_cast<uint8_t>(0xb0 + i);
  m.version = 2;
  m.parent = 1;
  m.created_unix_ms = 1764547200000;  // 2025-12-01T00:00:00Z
  m.base_digest.lanes = {1, 2, 3, 4};
  m.target_digest.lanes = {5, 6, 7, 8};
  m.objects.push_back(MakeObject(ObjectKind::kPatch, 1, 2, "abcdefghij", 4).desc);
  m.objects.push_back(MakeObject(ObjectKind::kKeyframe, 2, 2, "keyfrm", 4).desc);
  return m;
}

Code CodeOf(const Status& s) { return s.code(); }

TEST(VersionManifest, RoundTrip) {
  const VersionManifest m = Example();
  auto bytes = EncodeManifest(m);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(bytes->size(), kManifestHeaderBytes + 2 * kManifestObjectBytes);
  auto back = DecodeManifest(*bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, m);

  auto signer = ManifestSigner::Generate();
  ASSERT_TRUE(signer.ok()) << signer.status().ToString();
  auto signed_bytes = signer->Sign(m);
  ASSERT_TRUE(signed_bytes.ok());
  EXPECT_EQ(signed_bytes->size(), bytes->size() + kManifestTrailerBytes);
  EXPECT_EQ(signed_bytes->substr(0, bytes->size()), *bytes);
  ManifestVerifier verifier;
  ASSERT_TRUE(verifier.AddTrustedKey(signer->public_key()).ok());
  auto verified = verifier.Verify(*signed_bytes);
  ASSERT_TRUE(verified.ok()) << verified.status().ToString();
  EXPECT_EQ(*verified, m);
}

VersionManifest WithFiles() {
  VersionManifest m = Example();
  m.files.push_back({"config.json", 3, Sha256Of(Bytes("{}\n"))});
  m.files.push_back({"tokenizer.json", 0, Sha256Of(Bytes(""))});
  return m;
}

// Format 2: the version's model files, each name and digest signed.
TEST(VersionManifest, FilesRoundTripAsFormat2) {
  const VersionManifest m = WithFiles();
  auto bytes = EncodeManifest(m);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(DecodeFixed16(reinterpret_cast<const uint8_t*>(bytes->data()) + 8), kManifestFormatFiles);
  EXPECT_EQ(bytes->size(), kManifestHeaderBytes + 2 * kManifestObjectBytes +
                               2 * kManifestFileBytes + strlen("config.json") +
                               strlen("tokenizer.json"));
  auto back = DecodeManifest(*bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, m);
  auto size = ManifestBytesOf(*bytes);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, bytes->size());

  auto signer = ManifestSigner::FromSeed(FixedSeed());
  ASSERT_TRUE(signer.ok());
  auto signed_bytes = signer->Sign(m);
  ASSERT_TRUE(signed_bytes.ok());
  ManifestVerifier verifier;
  ASSERT_TRUE(verifier.AddTrustedKey(signer->public_key()).ok());
  auto verified = verifier.Verify(*signed_bytes);
  ASSERT_TRUE(verified.ok()) << verified.status().ToString();
  EXPECT_EQ(*verified, m);
  for (size_t i = 0; i < signed_bytes->size(); ++i) {
    std::string bad = *signed_bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    ASSERT_FALSE(verifier.Verify(bad).ok()) << "flipping byte " << i << " was accepted";
  }
  for (size_t n = 0; n < signed_bytes->size(); ++n)
    ASSERT_EQ(CodeOf(verifier.Verify(signed_bytes->substr(0, n)).status()), Code::kCorrupt) << n;
  for (size_t n = 0; n < bytes->size(); ++n)
    ASSERT_EQ(CodeOf(DecodeManifest(bytes->substr(0, n)).status()), Code::kCorrupt) << n;
}

// A manifest without files is format 1, byte for byte what it was before
// files existed: versions published then verify unchanged.
TEST(VersionManifest, NoFilesIsFormat1) {
  auto bytes = EncodeManifest(Example());
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(DecodeFixed16(reinterpret_cast<const uint8_t*>(bytes->data()) + 8), kManifestFormat);
  EXPECT_EQ(bytes->size(), kManifestHeaderBytes + 2 * kManifestObjectBytes);
}

TEST(VersionManifest, FileRulesAreEnforced) {
  for (const char* bad : {"", ".hidden", "a/b", "model.safetensors", "x.safetensors.index.json",
                          "tab\tname"}) {
    VersionManifest m = Example();
    m.files.push_back({bad, 1, {}});
    EXPECT_EQ(CodeOf(EncodeManifest(m).status()), Code::kMismatch) << bad;
  }
  EXPECT_FALSE(ValidModelFileName(std::string(kMaxManifestFileNameBytes + 1, 'a')));
  EXPECT_TRUE(ValidModelFileName(std::string(kMaxManifestFileNameBytes, 'a')));
  EXPECT_TRUE(ValidModelFileName("tokenizer.model"));
  VersionManifest m = WithFiles();
  std::swap(m.files[0], m.files[1]);
  EXPECT_EQ(CodeOf(EncodeManifest(m).status()), Code::kMismatch) << "out of order";
  m = WithFiles();
  m.files[1].name = m.files[0].name;
  EXPECT_EQ(CodeOf(EncodeManifest(m).status()), Code::kMismatch) << "duplicate";
  m = WithFiles();
  m.files[0].bytes = kMaxManifestFileBytes + 1;
  EXPECT_EQ(CodeOf(EncodeManifest(m).status()), Code::kMismatch) << "too large";
  m = Example();
  for (uint32_t i = 0; i <= kMaxManifestFiles; ++i)
    m.files.push_back({"f" + std::to_string(1000 + i), 1, {}});
  EXPECT_EQ(CodeOf(EncodeManifest(m).status()), Code::kMismatch) << "too many";
  m.files.pop_back();
  EXPECT_TRUE(EncodeManifest(m).ok());
  m = Example();
  for (int i = 0; i < 5; ++i) m.files.push_back({"f" + std::to_string(i), kMaxManifestFileBytes, {}});
  EXPECT_EQ(CodeOf(EncodeManifest(m).status()), Code::kMismatch) << "total too large";

  // Hand-edited bytes: the file count, the names length, a reserved field.
  auto good = EncodeManifest(WithFiles());
  ASSERT_TRUE(good.ok());
  const size_t f0 = kManifestHeaderBytes + 2 * kManifestObjectBytes;
  struct Case {
    const char* what;
    size_t at;
    uint16_t value;
  };
  for (const Case& c : {Case{"file count 0", 124, 0}, Case{"file count 3", 124, 3},
                        Case{"file count 65", 124, 65}, Case{"names short", 126, 24},
                        Case{"names long", 126, 26}, Case{"file reserved", f0 + 10, 1},
                        Case{"name length 0", f0 + 8, 0}, Case{"name length long", f0 + 8, 200}}) {
    std::string bad = *good;
    bad[c.at] = static_cast<char>(c.value & 0xff);
    bad[c.at + 1] = static_cast<char>(c.value >> 8);
    EXPECT_EQ(CodeOf(DecodeManifest(bad).status()), Code::kCorrupt) << c.what;
  }
  // A name with a '/' in the signed bytes: well-formed, refused by the rule.
  std::string slash = *good;
  slash[slash.size() - 1] = '/';
  EXPECT_EQ(CodeOf(DecodeManifest(slash).status()), Code::kMismatch);
}

TEST(VersionManifest, KeyIdIsPrefixOfPublicKeyHash) {
  auto signer = ManifestSigner::FromSeed(FixedSeed());
  ASSERT_TRUE(signer.ok());
  const Sha256Hash h = Sha256Of(signer->public_key());
  EXPECT_TRUE(std::equal(signer->key_id().begin(), signer->key_id().end(), h.begin()));
}

TEST(VersionManifest, EveryByteIsCoveredBySignature) {
  auto signer = ManifestSigner::FromSeed(FixedSeed());
  ASSERT_TRUE(signer.ok());
  auto signed_bytes = signer->Sign(Example());
  ASSERT_TRUE(signed_bytes.ok());
  ManifestVerifier verifier;
  ASSERT_TRUE(verifier.AddTrustedKey(signer->public_key()).ok());
  ASSERT_TRUE(verifier.Verify(*signed_bytes).ok());
  for (size_t i = 0; i < signed_bytes->size(); ++i) {
    for (uint8_t flip : {uint8_t{0x01}, uint8_t{0x80}}) {
      std::string bad = *signed_bytes;
      bad[i] = static_cast<char>(bad[i] ^ flip);
      auto r = verifier.Verify(bad);
      ASSERT_FALSE(r.ok()) << "flipping byte " << i << " was accepted";
      EXPECT_TRUE(r.status().code() == Code::kAuth || r.status().code() == Code::kCorrupt)
          << i << ": " << r.status().ToString();
    }
  }
}

TEST(VersionManifest, WrongOrUnknownKeyIsRefused) {
  auto publisher = ManifestSigner::FromSeed(FixedSeed());
  auto forger = ManifestSigner::Generate();
  ASSERT_TRUE(publisher.ok() && forger.ok());
  ManifestVerifier verifier;
  ASSERT_TRUE(verifier.AddTrustedKey(publisher->public_key()).ok());

  // Signed by a key nobody trusts: unknown key id.
  auto forged = forger->Sign(Example());
  ASSERT_TRUE(forged.ok());
  EXPECT_EQ(CodeOf(verifier.Verify(*forged).status()), Code::kAuth);

  // The forger claims the publisher's key id: the signature fails.
  std::string claimed = *forged;
  const size_t id_at = claimed.size() - kManifestTrailerBytes;
  std::copy(publisher->key_id().begin(), publisher->key_id().end(), claimed.begin() + id_at);
  auto r = verifier.Verify(claimed);
  EXPECT_EQ(CodeOf(r.status()), Code::kAuth);
  EXPECT_NE(r.status().ToString().find("signature"), std::string::npos) << r.status().ToString();

  // A verifier with no keys trusts nothing.
  auto good = publisher->Sign(Example());
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(CodeOf(ManifestVerifier().Verify(*good).status()), Code::kAuth);
  // Listing the same key twice is refused.
  EXPECT_EQ(CodeOf(verifier.AddTrustedKey(publisher->public_key())), Code::kAlreadyExists);
}

TEST(VersionManifest, TruncatedOrTrailingIsCorrupt) {
  auto signer = ManifestSigner::FromSeed(FixedSeed());
  ASSERT_TRUE(signer.ok());
  auto signed_bytes = signer->Sign(Example());
  ASSERT_TRUE(signed_bytes.ok());
  ManifestVerifier verifier;
  ASSERT_TRUE(verifier.AddTrustedKey(signer->public_key()).ok());
  for (size_t n = 0; n < signed_bytes->size(); ++n)
    EXPECT_EQ(CodeOf(verifier.Verify(signed_bytes->substr(0, n)).status()), Code::kCorrupt) << n;
  EXPECT_EQ(CodeOf(verifier.Verify(*signed_bytes + '\0').status()), Code::kCorrupt);

  auto bytes = EncodeManifest(Example());
  ASSERT_TRUE(bytes.ok());
  for (size_t n = 0; n < bytes->size(); ++n)
    EXPECT_EQ(CodeOf(DecodeManifest(bytes->substr(0, n)).status()), Code::kCorrupt) << n;
  EXPECT_EQ(CodeOf(DecodeManifest(*bytes + 'x').status()), Code::kCorrupt);
}

// Decode of hand-edited canonical bytes: each rule with its code.
TEST(VersionManifest, DecodeRefusesBadFields) {
  auto good = EncodeManifest(Example());
  ASSERT_TRUE(good.ok());
  ASSERT_TRUE(DecodeManifest(*good).ok());
  const size_t o0 = kManifestHeaderBytes, o1 = o0 + kManifestObjectBytes;
  struct Case {
    const char* what;
    size_t at;
    uint64_t value;
    int width;
    Code code;
  };
  const Case cases[] = {
      {"magic", 0, 'X', 1, Code::kCorrupt},
      {"format", 8, 4, 2, Code::kCorrupt},
      {"format 3 with epoch 0", 8, 3, 2, Code::kCorrupt},
      {"format 2 without files", 8, 2, 2, Code::kCorrupt},
      {"flags", 10, 1, 2, Code::kCorrupt},
      {"header reserved", 12, 1, 4, Code::kCorrupt},
      {"version 0", 32, 0, 8, Code::kMismatch},
      {"parent not older", 40, 2, 8, Code::kMismatch},
      {"count 0", 120, 0, 4, Code::kCorrupt},
      {"count 65", 120, 65, 4, Code::kCorrupt},
      {"count 3 (length)", 120, 3, 4, Code::kCorrupt},
      {"count reserved", 124, 1, 4, Code::kCorrupt},
      {"kind 0", o0, 0, 1, Code::kCorrupt},
      {"kind 4", o0, 4, 1, Code::kCorrupt},
      {"object reserved", o0 + 2, 1, 1, Code::kCorrupt},
      {"object reserved 2", o0 + 36, 1, 4, Code::kCorrupt},
      {"chunk_bytes 0", o0 + 4, 0, 4, Code::kMismatch},
      {"chunk_bytes over max", o0 + 4, kMaxChunkBytes + 1, 4, Code::kMismatch},
      {"patch from", o0 + 8, 0, 8, Code::kMismatch},
      {"patch to", o0 + 16, 3, 8, Code::kMismatch},
      {"bytes 0", o0 + 24, 0, 8, Code::kMismatch},
      {"bytes vs chunk_count", o0 + 24, 13, 8, Code::kMismatch},
      {"chunk_count", o0 + 32, 4, 4, Code::kMismatch},
      {"keyframe from", o1 + 8, 1, 8, Code::kMismatch},
      {"order (two patches)", o1, 1, 1, Code::kMismatch},
  };
  for (const Case& c : cases) {
    std::string bad = *good;
    EncodeFixed(reinterpret_cast<uint8_t*>(bad.data() + c.at), c.value, c.width);
    auto r = DecodeManifest(bad);
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), c.code) << c.what << ": " << r.status().ToString();
    // One clear line.
    EXPECT_EQ(r.status().ToString().find('\n'), std::string::npos) << c.what;
  }
}

TEST(VersionManifest, EncodeRefusesWhatDecodeRefuses) {
  VersionManifest m = Example();
  m.objects[0].chunk_count = 2;
  EXPECT_EQ(CodeOf(EncodeManifest(m).status()), Code::kMismatch);
  m = Example();
  m.objects.clear();
  EXPECT_EQ(CodeOf(EncodeManifest(m).status()), Code::kMismatch);
  m = Example();
  m.objects.resize(kMaxManifestObjects + 1, m.objects[0]);
  EXPECT_EQ(CodeOf(EncodeManifest(m).status()), Code::kMismatch);
  // Squashes: from before the parent, strictly ordered; 64 objects is fine.
  m = Example();
  m.version = 100;
  m.parent = 99;
  m.objects.clear();
  m.objects.push_back(MakeObject(ObjectKind::kPatch, 99, 100, "p", 1).desc);
  for (uint64_t from = 0; from < kMaxManifestObjects - 1; ++from)
    m.objects.push_back(MakeObject(ObjectKind::kSquash, from, 100, "sq", 1).desc);
  auto bytes = EncodeManifest(m);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto back = DecodeManifest(*bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, m);
  m.objects.back().from_version = 99;  // a squash from the parent is a patch
  EXPECT_EQ(CodeOf(EncodeManifest(m).status()), Code::kMismatch);
}

// Format 3 (docs/agent/board.md §4a): the epoch and the supersede flag,
// signed like every other field; the supersede's patch runs backwards.
VersionManifest Supersede() {
  VersionManifest m = Example();
  m.epoch = 1;
  m.supersede = true;
  m.version = 3;
  m.parent = 1000000;
  m.objects.clear();
  m.objects.push_back(MakeObject(ObjectKind::kPatch, 1000000, 3, "backwards", 4).desc);
  m.objects.push_back(MakeObject(ObjectKind::kKeyframe, 3, 3, "keyfrm", 4).desc);
  return m;
}

TEST(VersionManifest, Format3CarriesEpochAndSupersede) {
  for (const bool with_files : {false, true}) {
    VersionManifest m = Supersede();
    if (with_files) m.files = WithFiles().files;
    auto bytes = EncodeManifest(m);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    const auto* p = reinterpret_cast<const uint8_t*>(bytes->data());
    EXPECT_EQ(DecodeFixed16(p + 8), kManifestFormatEpoch);
    EXPECT_EQ(DecodeFixed16(p + 10), 1u);  // supersede
    EXPECT_EQ(DecodeFixed32(p + 12), 1u);  // epoch
    EXPECT_EQ(DecodeFixed16(p + 124), m.files.size());
    auto size = ManifestBytesOf(*bytes);
    ASSERT_TRUE(size.ok()) << size.status().ToString();
    EXPECT_EQ(*size, bytes->size());
    auto back = DecodeManifest(*bytes);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, m);

    auto signer = ManifestSigner::FromSeed(FixedSeed());
    ASSERT_TRUE(signer.ok());
    auto signed_bytes = signer->Sign(m);
    ASSERT_TRUE(signed_bytes.ok());
    ManifestVerifier verifier;
    ASSERT_TRUE(verifier.AddTrustedKey(signer->public_key()).ok());
    auto verified = verifier.Verify(*signed_bytes);
    ASSERT_TRUE(verified.ok()) << verified.status().ToString();
    EXPECT_EQ(verified->epoch, 1u);
    EXPECT_TRUE(verified->supersede);
    for (size_t i = 8; i < 16; ++i) {  // format, flags, epoch: signed
      std::string bad = *signed_bytes;
      bad[i] = static_cast<char>(bad[i] ^ 0x01);
      ASSERT_FALSE(verifier.Verify(bad).ok()) << "flipping byte " << i << " was accepted";
    }
  }
  // A later publication of the epoch: no flag, version above parent, no file.
  VersionManifest next = Example();
  next.epoch = 1;
  next.version = 4;
  next.parent = 3;
  next.objects[0] = MakeObject(ObjectKind::kPatch, 3, 4, "p", 1).desc;
  next.objects[1] = MakeObject(ObjectKind::kKeyframe, 4, 4, "k", 1).desc;
  auto bytes = EncodeManifest(next);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(DecodeFixed16(reinterpret_cast<const uint8_t*>(bytes->data()) + 10), 0u);
  auto back = DecodeManifest(*bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, next);
  // Epoch 0 is still format 1, byte for byte the golden example's.
  VersionManifest zero = Example();
  zero.epoch = 0;
  auto old = EncodeManifest(zero);
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(DecodeFixed16(reinterpret_cast<const uint8_t*>(old->data()) + 8), kManifestFormat);
}

TEST(VersionManifest, Format3RulesAreRefused) {
  struct Case {
    const char* what;
    std::function<void(VersionManifest*)> edit;
  };
  const Case encode_cases[] = {
      {"supersede in epoch 0", [](VersionManifest* m) { m->epoch = 0; }},
      {"supersede above its parent",
       [](VersionManifest* m) {
         m->version = 2000000;
         m->objects[0].to_version = 2000000;
         m->objects[1].from_version = m->objects[1].to_version = 2000000;
       }},
      {"supersede without a keyframe", [](VersionManifest* m) { m->objects.pop_back(); }},
      {"supersede without the patch",
       [](VersionManifest* m) { m->objects.erase(m->objects.begin()); }},
      {"below parent without supersede", [](VersionManifest* m) { m->supersede = false; }},
      {"squash from the parent",
       [](VersionManifest* m) {
         m->objects.push_back(MakeObject(ObjectKind::kSquash, 1000000, 3, "sq", 1).desc);
       }},
  };
  for (const Case& c : encode_cases) {
    VersionManifest m = Supersede();
    c.edit(&m);
    auto r = EncodeManifest(m);
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), Code::kMismatch) << c.what << ": " << r.status().ToString();
  }
  // A squash from a withdrawn number above the parent is a chain edge the
  // board checks, not a codec error.
  VersionManifest from_withdrawn = Example();
  from_withdrawn.epoch = 1;
  from_withdrawn.version = 5;
  from_withdrawn.parent = 4;
  from_withdrawn.objects = {MakeObject(ObjectKind::kPatch, 4, 5, "p", 1).desc,
                            MakeObject(ObjectKind::kSquash, 1000000, 5, "sq", 1).desc};
  EXPECT_TRUE(EncodeManifest(from_withdrawn).ok());
  from_withdrawn.epoch = 0;  // epoch 0 keeps "squash from before the parent"
  EXPECT_EQ(CodeOf(EncodeManifest(from_withdrawn).status()), Code::kMismatch);

  auto good = EncodeManifest(Supersede());
  ASSERT_TRUE(good.ok());
  struct ByteCase {
    const char* what;
    size_t at;
    uint64_t value;
    int width;
    Code code;
  };
  const ByteCase byte_cases[] = {
      {"epoch 0 in format 3", 12, 0, 4, Code::kCorrupt},
      {"undefined flag", 10, 3, 2, Code::kCorrupt},
      {"format 2 with an epoch", 8, 2, 2, Code::kCorrupt},
      {"supersede version above parent", 32, 2000000, 8, Code::kMismatch},
      {"names without files", 126, 1, 2, Code::kCorrupt},
  };
  for (const ByteCase& c : byte_cases) {
    std::string bad = *good;
    EncodeFixed(reinterpret_cast<uint8_t*>(bad.data() + c.at), c.value, c.width);
    auto r = DecodeManifest(bad);
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), c.code) << c.what << ": " << r.status().ToString();
  }
  // A format-1/2-only reader sees "manifest format 3"; this one reads it, and
  // a supersede flag on format 1 stays refused.
  auto plain = EncodeManifest(Example());
  ASSERT_TRUE(plain.ok());
  std::string flagged = *plain;
  EncodeFixed(reinterpret_cast<uint8_t*>(flagged.data() + 10), 1, 2);
  EXPECT_EQ(CodeOf(DecodeManifest(flagged).status()), Code::kCorrupt);
}

// RFC 6962 §2.1 as written: split at the largest power of two below n.
Sha256Hash ReferenceRoot(std::span<const Sha256Hash> h) {
  if (h.size() == 1) {
    std::string leaf(1, '\0');
    leaf.append(reinterpret_cast<const char*>(h[0].data()), 32);
    return Sha256Of(Bytes(leaf));
  }
  size_t k = 1;
  while (k * 2 < h.size()) k *= 2;
  const Sha256Hash l = ReferenceRoot(h.subspan(0, k)), r = ReferenceRoot(h.subspan(k));
  std::string node(1, '\1');
  node.append(reinterpret_cast<const char*>(l.data()), 32);
  node.append(reinterpret_cast<const char*>(r.data()), 32);
  return Sha256Of(Bytes(node));
}

TEST(ChunkHashes, RootIsRfc6962MerkleTreeHash) {
  std::vector<Sha256Hash> hashes;
  for (int n = 1; n <= 33; ++n) {
    hashes.push_back(Sha256Of(Bytes(std::to_string(n))));
    EXPECT_EQ(ChunkHashRoot(hashes), ReferenceRoot(hashes)) << n << " chunks";
  }
  // Order matters: swapping two chunk hashes moves the root.
  std::vector<Sha256Hash> swapped = hashes;
  std::swap(swapped[3], swapped[4]);
  EXPECT_NE(ChunkHashRoot(swapped), ChunkHashRoot(hashes));
  // SHA-256 itself (FIPS 180-2 test vector "abc").
  EXPECT_EQ(Hex(std::string_view(reinterpret_cast<const char*>(Sha256Of(Bytes("abc")).data()), 32)),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// A relay rewrites a chunk and the transport checksum that covers it: the
// transport is satisfied, the signed chain is not.
TEST(ChunkHashes, RelayRewritingChunkAndChecksumIsCaught) {
  const Object obj = MakeObject(ObjectKind::kPatch, 1, 2, std::string(1000, 'w'), 64);
  std::string chunk = obj.chunks[5];
  chunk[10] = 'X';
  const uint64_t relay_xxh3 = Xxh3(chunk.data(), chunk.size());  // recomputed by the relay
  EXPECT_EQ(Xxh3(chunk.data(), chunk.size()), relay_xxh3);      // receiver's transport check passes
  auto list = VerifyChunkHashList(HashList(obj.hashes), obj.desc.chunk_hashes_root,
                                  obj.desc.chunk_count);
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_TRUE(VerifyChunk((*list)[5], Bytes(obj.chunks[5])).ok());
  EXPECT_EQ(CodeOf(VerifyChunk((*list)[5], Bytes(chunk))), Code::kAuth);
  // A chunk moved to another index is caught too.
  EXPECT_EQ(CodeOf(VerifyChunk((*list)[5], Bytes(obj.chunks[15]))), Code::kAuth);
}

// The relay also forges the hash list entry for its rewritten chunk: the
// signed root refuses the list.
TEST(ChunkHashes, ForgedHashListIsCaughtByRoot) {
  const Object obj = MakeObject(ObjectKind::kPatch, 1, 2, std::string(1000, 'w'), 64);
  std::vector<Sha256Hash> forged = obj.hashes;
  std::string chunk = obj.chunks[5];
  chunk[10] = 'X';
  forged[5] = Sha256Of(Bytes(chunk));
  auto r = VerifyChunkHashList(HashList(forged), obj.desc.chunk_hashes_root, obj.desc.chunk_count);
  EXPECT_EQ(CodeOf(r.status()), Code::kAuth);
  // Wrong lengths and counts are corrupt, before any hashing.
  const std::string list = HashList(obj.hashes);
  const Sha256Hash& root = obj.desc.chunk_hashes_root;
  EXPECT_EQ(CodeOf(VerifyChunkHashList(list.substr(1), root, obj.desc.chunk_count).status()),
            Code::kCorrupt);
  EXPECT_EQ(CodeOf(VerifyChunkHashList(list + list.substr(0, 32), root, obj.desc.chunk_count)
                       .status()),
            Code::kCorrupt);
  EXPECT_EQ(CodeOf(VerifyChunkHashList("", root, 0).status()), Code::kCorrupt);
  EXPECT_EQ(CodeOf(VerifyChunkHashList(list, root, kMaxManifestChunks + 1).status()),
            Code::kCorrupt);
  // A truncated list with a matching count is caught by the root.
  EXPECT_EQ(CodeOf(VerifyChunkHashList(list.substr(0, list.size() - 32), root,
                                       obj.desc.chunk_count - 1)
                       .status()),
            Code::kAuth);
}

TEST(ManifestKeys, PemRoundTripAndBadPem) {
  auto signer = ManifestSigner::Generate();
  ASSERT_TRUE(signer.ok());
  auto priv = signer->PrivateKeyPem();
  auto pub = signer->PublicKeyPem();
  ASSERT_TRUE(priv.ok() && pub.ok());
  auto again = ManifestSigner::FromPem(*priv);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->key_id(), signer->key_id());
  ManifestVerifier verifier;
  ASSERT_TRUE(verifier.AddTrustedKeyPem(*pub).ok());
  auto signed_bytes = again->Sign(Example());
  ASSERT_TRUE(signed_bytes.ok());
  EXPECT_TRUE(verifier.Verify(*signed_bytes).ok());

  auto bad = ManifestSigner::FromPem("-----BEGIN PRIVATE KEY-----\nnot base64\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().ToString().find("PEM"), std::string::npos) << bad.status().ToString();
  EXPECT_EQ(CodeOf(verifier.AddTrustedKeyPem(*priv)), Code::kInvalidArgument);  // private, not PUBKEY
}

// The spec's worked example (docs/format/agent.md §6): a fixed seed and a
// deterministic signature scheme make the signed bytes fixed. If this fails
// the format changed: bump the format and update the spec, never the hex alone.
TEST(VersionManifest, GoldenSpecExample) {
  auto signer = ManifestSigner::FromSeed(FixedSeed());
  ASSERT_TRUE(signer.ok());
  auto signed_bytes = signer->Sign(Example());
  ASSERT_TRUE(signed_bytes.ok());
  const std::string hex = Hex(*signed_bytes);
  const char* kGolden =
      "5445524e4d414e490100000000000000b0b1b2b3b4b5b6b7b8b9babbbcbdbebf"
      "02000000000000000100000000000000008435d79a0100000100000000000000"
      "0200000000000000030000000000000004000000000000000500000000000000"
      "0600000000000000070000000000000008000000000000000200000000000000"
      "0100000004000000010000000000000002000000000000000a00000000000000"
      "0300000000000000c8ca45fa3e12285fff3e7e915b1ebf190f35a8466718e27e"
      "71703baf3993de4a020000000400000002000000000000000200000000000000"
      "06000000000000000200000000000000c1f9be09459ec540cbb96bde7dc86254"
      "1bf9a07af122782bbe7e6c72b66480c065b60673d6ed884b23b78d2b3566e1ae"
      "ded20650293f1d07510fabb32b38576128a329227f4f7580769ddd727408a85e"
      "e9d27922e21fe9fa46573ff433bf78788bfc4ae9d79dd30f";
  EXPECT_EQ(Hex(std::string_view(reinterpret_cast<const char*>(signer->public_key().data()), 32)),
            "79b5562e8fe654f94078b112e8a98ba7901f853ae695bed7e0e3910bad049664");
  EXPECT_EQ(hex, kGolden);
  if (hex != kGolden)  // the new bytes, 32 a line, as the spec shows them
    for (size_t i = 0; i < hex.size(); i += 64) std::printf("%s\n", hex.substr(i, 64).c_str());
}

// The root's default chunking: small objects in at least 8 chunks (64 KiB
// .. 1 MiB, powers of two), so relays cut through and a connection spreads
// them over its streams; 4 MiB from 16 MiB up.
TEST(DefaultChunkBytes, SmallObjectsGetAtLeastEightChunks) {
  using agent::DefaultChunkBytes;
  EXPECT_EQ(DefaultChunkBytes(1), 64u << 10);
  EXPECT_EQ(DefaultChunkBytes(222'000), 64u << 10);    // a 0.22 MB patch: 4 chunks
  EXPECT_EQ(DefaultChunkBytes(512u << 10), 64u << 10);  // exactly 8
  EXPECT_EQ(DefaultChunkBytes(1'000'000), 64u << 10);   // 16 chunks
  EXPECT_EQ(DefaultChunkBytes(1u << 20), 128u << 10);   // 8
  EXPECT_EQ(DefaultChunkBytes((2u << 20) - 1), 128u << 10);
  EXPECT_EQ(DefaultChunkBytes(8u << 20), 1u << 20);
  EXPECT_EQ(DefaultChunkBytes((16u << 20) - 1), 1u << 20);  // 16 chunks: the cap
  EXPECT_EQ(DefaultChunkBytes(16u << 20), 4u << 20);
  EXPECT_EQ(DefaultChunkBytes(uint64_t{1} << 40), 4u << 20);
  for (uint64_t bytes = 1; bytes < (16u << 20); bytes = bytes * 3 + 7) {
    const uint64_t chunk = DefaultChunkBytes(bytes);
    EXPECT_TRUE(chunk >= (64u << 10) && chunk <= (1u << 20) && (chunk & (chunk - 1)) == 0) << bytes;
    const uint64_t chunks = (bytes - 1) / chunk + 1;
    if (bytes >= (512u << 10)) {
      EXPECT_TRUE(chunks >= 8 && chunks <= 16) << bytes << ": " << chunks;
    } else {
      EXPECT_EQ(chunk, 64u << 10) << bytes;
    }
  }
}

}  // namespace
}  // namespace tern
