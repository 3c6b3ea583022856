// Signed key sets: the codec's strictness, the chain (replay, gaps, forged
// and revoked signers), and what a verifier refuses after a rotation:
// manifests, beacons and key sets signed by a revoked or expired key
// (key_set.h; docs/format/agent.md §10).
#include "tern/key_set.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "agent/freshness/beacon.h"

namespace tern::agent {
namespace {

constexpr uint64_t kWallMs = 1'800'000'000'000;  // 2027
constexpr uint64_t kNotAfterMs = 1'900'000'000'000;

ManifestSigner Signer(uint8_t seed_byte) {
  std::array<uint8_t, 32> seed{};
  seed.fill(seed_byte);
  return std::move(ManifestSigner::FromSeed(seed)).value();
}

// Key set `seq`: `keys` active (sorted as the format wants), `revoked` revoked.
KeySet MakeKeySet(uint64_t seq, std::vector<TrustedKey> keys,
                  std::vector<ManifestKeyId> revoked = {}) {
  std::sort(keys.begin(), keys.end(),
            [](const TrustedKey& a, const TrustedKey& b) { return a.public_key < b.public_key; });
  std::sort(revoked.begin(), revoked.end());
  return KeySet{seq, kWallMs, std::move(keys), std::move(revoked)};
}

VersionManifest Manifest(uint64_t version) {
  VersionManifest m;
  m.board_id[0] = 0xB0;
  m.version = version;
  m.parent = 0;
  m.created_unix_ms = kWallMs;
  m.objects.push_back(ManifestObject{ObjectKind::kKeyframe, version, version, 10, 10, 1, {}});
  return m;
}

HeadBeacon Beacon() {
  HeadBeacon b;
  b.board_id[0] = 0xB0;
  b.incarnation = 1;
  b.seq = 1;
  b.head = 1;
  b.root_unix_ms = kWallMs;
  b.interval_ms = 1000;
  b.root_id = "root";
  return b;
}

class KeySetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    verifier_.SetWallClock([this] { return now_ms_; });
    ASSERT_TRUE(verifier_.AddTrustedKey(a_.public_key()).ok());
  }
  ManifestSigner a_ = Signer(1), b_ = Signer(2), c_ = Signer(3);
  uint64_t now_ms_ = kWallMs;
  ManifestVerifier verifier_;
};

TEST(KeySetCodec, RoundTripsWithTheSpecifiedLayout) {
  const ManifestSigner a = Signer(1), b = Signer(2);
  const KeySet ks = MakeKeySet(1, {{b.public_key(), kNotAfterMs}}, {a.key_id()});
  auto bytes = EncodeKeySet(ks);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  ASSERT_EQ(bytes->size(), kKeySetFixedBytes + kKeySetKeyBytes + 8);
  EXPECT_EQ(bytes->substr(0, 8), "TERNKEYS");
  EXPECT_EQ(uint8_t((*bytes)[8]), 1);   // format
  EXPECT_EQ(uint8_t((*bytes)[10]), 1);  // key count
  EXPECT_EQ(uint8_t((*bytes)[12]), 1);  // revoked count
  EXPECT_EQ(uint8_t((*bytes)[16]), 1);  // seq
  EXPECT_EQ(0, std::memcmp(bytes->data() + 32, b.public_key().data(), 32));
  EXPECT_EQ(0, std::memcmp(bytes->data() + 72, a.key_id().data(), 8));
  // The example in docs/format/agent.md §10.4.
  const uint8_t not_after[8] = {0x00, 0x38, 0xd3, 0x60, 0xba, 0x01, 0x00, 0x00};
  EXPECT_EQ(0, std::memcmp(bytes->data() + 64, not_after, 8));
  const uint8_t created[8] = {0x00, 0x50, 0x5c, 0x18, 0xa3, 0x01, 0x00, 0x00};
  EXPECT_EQ(0, std::memcmp(bytes->data() + 24, created, 8));
  auto back = DecodeKeySet(*bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, ks);
}

TEST(KeySetCodec, RefusesEveryTruncationTrailingByteAndBadField) {
  const ManifestSigner a = Signer(1), b = Signer(2), c = Signer(3);
  const std::string bytes = *EncodeKeySet(
      MakeKeySet(2, {{b.public_key(), 0}, {c.public_key(), kNotAfterMs}}, {a.key_id()}));
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_EQ(DecodeKeySet(bytes.substr(0, n)).status().code(), Code::kCorrupt) << n;
  EXPECT_EQ(DecodeKeySet(bytes + 'x').status().code(), Code::kCorrupt);
  auto with = [&](size_t at, uint8_t v) {
    std::string x = bytes;
    x[at] = static_cast<char>(v);
    return DecodeKeySet(x).status().code();
  };
  EXPECT_EQ(with(0, 'X'), Code::kCorrupt);   // magic
  EXPECT_EQ(with(8, 2), Code::kCorrupt);     // format
  EXPECT_EQ(with(10, 0), Code::kCorrupt);    // no key
  EXPECT_EQ(with(10, 17), Code::kCorrupt);   // more keys than bytes (and than 16)
  EXPECT_EQ(with(12, 2), Code::kCorrupt);    // more revoked ids than bytes
  EXPECT_EQ(with(13, 1), Code::kCorrupt);    // 257 revoked ids
  EXPECT_EQ(with(14, 1), Code::kCorrupt);    // reserved
  // seq 0.
  std::string zero = bytes;
  std::memset(zero.data() + 16, 0, 8);
  EXPECT_EQ(DecodeKeySet(zero).status().code(), Code::kCorrupt);
  // Keys out of order: swap the two 40-byte entries.
  std::string swapped = bytes;
  std::memcpy(swapped.data() + 32, bytes.data() + 72, 40);
  std::memcpy(swapped.data() + 72, bytes.data() + 32, 40);
  EXPECT_EQ(DecodeKeySet(swapped).status().code(), Code::kCorrupt);
  // A key both listed and revoked, and the same key twice.
  EXPECT_FALSE(EncodeKeySet(MakeKeySet(1, {{b.public_key(), 0}}, {b.key_id()})).ok());
  EXPECT_FALSE(EncodeKeySet(MakeKeySet(1, {{b.public_key(), 0}, {b.public_key(), 1}})).ok());
  EXPECT_FALSE(EncodeKeySet(MakeKeySet(1, {})).ok());
}

TEST_F(KeySetTest, RotationRevokesTheOldKeyForManifestsBeaconsAndKeySets) {
  const std::string manifest_a = *a_.Sign(Manifest(1));
  const std::string beacon_a = *SignBeacon(a_, Beacon());
  ASSERT_TRUE(verifier_.Verify(manifest_a).ok());
  ASSERT_TRUE(VerifyBeacon(verifier_, beacon_a).ok());
  // B signed by nobody trusted yet. The verifier says which refusal it was:
  // the key, not the bytes.
  SignerStanding signer = SignerStanding::kTrusted;
  EXPECT_EQ(verifier_.Verify(*b_.Sign(Manifest(2)), &signer).status().code(), Code::kAuth);
  EXPECT_EQ(signer, SignerStanding::kUnknown);
  ASSERT_TRUE(verifier_.Verify(manifest_a, &signer).ok());
  EXPECT_EQ(signer, SignerStanding::kTrusted);
  std::string altered = manifest_a;
  altered.back() ^= 1;  // a bit of the signature
  EXPECT_EQ(verifier_.Verify(altered, &signer).status().code(), Code::kAuth);
  EXPECT_EQ(signer, SignerStanding::kTrusted);  // a trusted key id, the bytes altered
  EXPECT_EQ(verifier_.Verify(manifest_a.substr(0, 10), &signer).status().code(), Code::kCorrupt);
  EXPECT_EQ(signer, SignerStanding::kNotRead);

  const std::string ks1 = *SignKeySet(a_, MakeKeySet(1, {{b_.public_key(), 0}}, {a_.key_id()}));
  auto applied = ApplyKeySet(verifier_, ks1);
  ASSERT_TRUE(applied.ok()) << applied.status().ToString();
  EXPECT_EQ(verifier_.key_set_seq(), 1u);
  EXPECT_EQ(verifier_.key_count(), 1u);
  EXPECT_TRUE(verifier_.Trusts(b_.key_id()));
  EXPECT_FALSE(verifier_.Trusts(a_.key_id()));

  EXPECT_TRUE(verifier_.Verify(*b_.Sign(Manifest(2))).ok());
  EXPECT_TRUE(VerifyBeacon(verifier_, *SignBeacon(b_, Beacon())).ok());
  // Everything A signs now, old or new, is refused, naming A's key id.
  for (const std::string& s : {manifest_a, *a_.Sign(Manifest(3))}) {
    signer = SignerStanding::kTrusted;
    const Status st = verifier_.Verify(s, &signer).status();
    EXPECT_EQ(st.code(), Code::kAuth);
    EXPECT_EQ(signer, SignerStanding::kRevoked);
    EXPECT_NE(st.message().find("revoked key id " + KeyIdHex(a_.key_id())), std::string::npos)
        << st.ToString();
  }
  EXPECT_EQ(VerifyBeacon(verifier_, beacon_a).status().code(), Code::kAuth);
  // A cannot sign key set 2 (it would bring itself back).
  const std::string ks2_by_a = *SignKeySet(a_, MakeKeySet(2, {{a_.public_key(), 0}}));
  const Status st = ApplyKeySet(verifier_, ks2_by_a).status();
  EXPECT_EQ(st.code(), Code::kAuth);
  EXPECT_NE(st.message().find("revoked"), std::string::npos) << st.ToString();
  EXPECT_EQ(verifier_.key_set_seq(), 1u);
}

TEST_F(KeySetTest, ReplayedOldAndSkippedKeySetsAreRefused) {
  const std::string ks1 = *SignKeySet(a_, MakeKeySet(1, {{b_.public_key(), 0}}));
  const std::string ks2 = *SignKeySet(b_, MakeKeySet(2, {{c_.public_key(), 0}}));
  // 2 before 1: a gap.
  EXPECT_EQ(ApplyKeySet(verifier_, ks2).status().code(), Code::kAuth);  // B not yet trusted
  ASSERT_TRUE(ApplyKeySet(verifier_, ks1).ok());
  EXPECT_EQ(ApplyKeySet(verifier_, ks1).status().code(), Code::kAlreadyExists);  // replay
  ASSERT_TRUE(ApplyKeySet(verifier_, ks2).ok());
  EXPECT_EQ(verifier_.key_set_seq(), 2u);
  // A signed key set 1 and is no longer listed; a replay of it is still
  // refused as old, and changes nothing.
  EXPECT_EQ(ApplyKeySet(verifier_, ks1).status().code(), Code::kAlreadyExists);
  // A gap signed by a trusted key: kMismatch.
  const std::string ks4 = *SignKeySet(c_, MakeKeySet(4, {{a_.public_key(), 0}}));
  EXPECT_EQ(ApplyKeySet(verifier_, ks4).status().code(), Code::kMismatch);
  // An older sequence number signed by a trusted key: kAlreadyExists.
  const std::string old = *SignKeySet(c_, MakeKeySet(2, {{a_.public_key(), 0}}));
  EXPECT_EQ(ApplyKeySet(verifier_, old).status().code(), Code::kAlreadyExists);
  EXPECT_EQ(verifier_.key_set_seq(), 2u);
  EXPECT_TRUE(verifier_.Trusts(c_.key_id()));
}

TEST_F(KeySetTest, ForgedAndTamperedKeySetsAreRefused) {
  // Signed by a key nobody trusts.
  const std::string forged = *SignKeySet(c_, MakeKeySet(1, {{c_.public_key(), 0}}));
  Status st = ApplyKeySet(verifier_, forged).status();
  EXPECT_EQ(st.code(), Code::kAuth);
  EXPECT_NE(st.message().find(KeyIdHex(c_.key_id())), std::string::npos) << st.ToString();
  // Every single-bit flip of a good one is refused (corrupt or bad signature).
  const std::string good = *SignKeySet(a_, MakeKeySet(1, {{b_.public_key(), 0}}));
  for (size_t i = 0; i < good.size(); ++i) {
    std::string x = good;
    x[i] ^= 0x01;
    EXPECT_FALSE(VerifyKeySet(verifier_, x).ok()) << i;
  }
  for (size_t n = 0; n < good.size(); ++n)
    EXPECT_FALSE(ApplyKeySet(verifier_, good.substr(0, n)).ok()) << n;
  EXPECT_EQ(VerifyKeySet(verifier_, good + std::string(kMaxSignedKeySetBytes, '\0')).status().code(),
            Code::kCorrupt);
  EXPECT_EQ(verifier_.key_set_seq(), 0u);
  // A manifest or beacon signature is not a key set's, nor the reverse.
  EXPECT_EQ(VerifyKeySet(verifier_, *a_.Sign(Manifest(1))).status().code(), Code::kCorrupt);
  EXPECT_EQ(VerifyKeySet(verifier_, *SignBeacon(a_, Beacon())).status().code(), Code::kCorrupt);
  EXPECT_EQ(VerifyBeacon(verifier_, good).status().code(), Code::kCorrupt);
  EXPECT_EQ(verifier_.Verify(good).status().code(), Code::kCorrupt);
  ASSERT_TRUE(ApplyKeySet(verifier_, good).ok());
}

TEST_F(KeySetTest, ExpiredKeysSignNothing) {
  const std::string ks1 =
      *SignKeySet(a_, MakeKeySet(1, {{b_.public_key(), kWallMs + 1000}, {c_.public_key(), 0}}));
  ASSERT_TRUE(ApplyKeySet(verifier_, ks1).ok());
  const std::string manifest_b = *b_.Sign(Manifest(2));
  EXPECT_TRUE(verifier_.Verify(manifest_b).ok());
  now_ms_ = kWallMs + 1000;  // not_after is the last valid millisecond
  EXPECT_TRUE(verifier_.Verify(manifest_b).ok());
  now_ms_ = kWallMs + 1001;
  SignerStanding signer = SignerStanding::kTrusted;
  const Status st = verifier_.Verify(manifest_b, &signer).status();
  EXPECT_EQ(st.code(), Code::kAuth);
  EXPECT_EQ(signer, SignerStanding::kExpired);
  EXPECT_NE(st.message().find("key id " + KeyIdHex(b_.key_id()) + ", expired"), std::string::npos)
      << st.ToString();
  EXPECT_EQ(VerifyBeacon(verifier_, *SignBeacon(b_, Beacon())).status().code(), Code::kAuth);
  EXPECT_FALSE(verifier_.Trusts(b_.key_id()));
  // The expired key cannot rotate either; the unexpired one can.
  const std::string ks2_by_b = *SignKeySet(b_, MakeKeySet(2, {{b_.public_key(), 0}}));
  EXPECT_EQ(ApplyKeySet(verifier_, ks2_by_b).status().code(), Code::kAuth);
  const std::string ks2_by_c = *SignKeySet(c_, MakeKeySet(2, {{b_.public_key(), 0}}));
  ASSERT_TRUE(ApplyKeySet(verifier_, ks2_by_c).ok());
  EXPECT_TRUE(verifier_.Verify(manifest_b).ok());  // B renewed by C
}

TEST_F(KeySetTest, ARevokedKeyNeverComesBack) {
  ASSERT_TRUE(ApplyKeySet(verifier_, *SignKeySet(a_, MakeKeySet(1, {{b_.public_key(), 0}},
                                                                {a_.key_id()})))
                  .ok());
  ASSERT_TRUE(ApplyKeySet(verifier_, *SignKeySet(b_, MakeKeySet(2, {{c_.public_key(), 0}}))).ok());
  // Key set 3 lists A again without revoking it: refused, A stays revoked.
  const Status st =
      ApplyKeySet(verifier_, *SignKeySet(c_, MakeKeySet(3, {{a_.public_key(), 0}}))).status();
  EXPECT_EQ(st.code(), Code::kMismatch);
  EXPECT_EQ(verifier_.key_set_seq(), 2u);
  EXPECT_EQ(verifier_.Verify(*a_.Sign(Manifest(4))).status().code(), Code::kAuth);
  // Key set 0 is only for the configured keys.
  EXPECT_EQ(verifier_.AddTrustedKey(a_.public_key()).code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace tern::agent
