// The HEAD beacon codec, its signatures, and a member's acceptance and
// staleness rules (beacon.h, freshness.h).
#include "agent/freshness/freshness.h"

#include <gtest/gtest.h>

#include <cstring>

#include "agent/freshness/beacon.h"

namespace tern::agent {
namespace {

constexpr uint64_t kWallMs = 1'800'000'000'000;  // 2027

HeadBeacon Sample() {
  HeadBeacon b;
  b.board_id[0] = 0xB0;
  b.board_id[15] = 0x0D;
  b.incarnation = 7;
  b.seq = 1;
  b.head = 42;
  b.root_unix_ms = kWallMs;
  b.interval_ms = 1000;
  b.root_id = "root-a";
  return b;
}

ManifestSigner Signer(uint8_t seed_byte) {
  std::array<uint8_t, 32> seed{};
  seed.fill(seed_byte);
  return std::move(ManifestSigner::FromSeed(seed)).value();
}

TEST(HeadBeacon, RoundTripsWithTheSpecifiedLayout) {
  const HeadBeacon b = Sample();
  auto bytes = EncodeBeacon(b);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  ASSERT_EQ(bytes->size(), kBeaconFixedBytes + 6);
  EXPECT_EQ(bytes->substr(0, 8), "TERNBEAC");
  EXPECT_EQ(uint8_t((*bytes)[8]), 1);      // format
  EXPECT_EQ(uint8_t((*bytes)[12]), 0xB0);  // board id
  EXPECT_EQ(uint8_t((*bytes)[28]), 7);     // incarnation
  EXPECT_EQ(uint8_t((*bytes)[36]), 1);     // seq
  EXPECT_EQ(uint8_t((*bytes)[44]), 42);    // head
  EXPECT_EQ(uint8_t((*bytes)[64]), 6);     // root id length
  EXPECT_EQ(bytes->substr(68), "root-a");
  auto back = DecodeBeacon(*bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, b);
}

TEST(HeadBeacon, RefusesEveryTruncationTrailingByteAndBadField) {
  const std::string bytes = *EncodeBeacon(Sample());
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_EQ(DecodeBeacon(bytes.substr(0, n)).status().code(), Code::kCorrupt) << n;
  EXPECT_EQ(DecodeBeacon(bytes + 'x').status().code(), Code::kCorrupt);
  auto with = [&](size_t at, uint8_t v) {
    std::string b = bytes;
    b[at] = static_cast<char>(v);
    return DecodeBeacon(b).status().code();
  };
  EXPECT_EQ(with(0, 'X'), Code::kCorrupt);  // magic
  EXPECT_EQ(with(8, 2), Code::kCorrupt);    // format
  EXPECT_EQ(with(10, 1), Code::kCorrupt);   // reserved
  EXPECT_EQ(with(66, 1), Code::kCorrupt);   // reserved
  EXPECT_EQ(with(28, 0), Code::kCorrupt);   // incarnation 0
  EXPECT_EQ(with(36, 0), Code::kCorrupt);   // seq 0
  EXPECT_EQ(with(64, 7), Code::kCorrupt);   // root id length past the end
  HeadBeacon b = Sample();
  b.root_id.assign(kMaxBeaconRootIdBytes + 1, 'r');
  EXPECT_EQ(EncodeBeacon(b).status().code(), Code::kInvalidArgument);
  b = Sample();
  b.interval_ms = kMaxBeaconIntervalMs + 1;
  EXPECT_EQ(EncodeBeacon(b).status().code(), Code::kInvalidArgument);
  b = Sample();
  b.root_id.assign(kMaxBeaconRootIdBytes, 'r');
  auto longest = EncodeBeacon(b);
  ASSERT_TRUE(longest.ok());
  EXPECT_EQ(longest->size(), kBeaconFixedBytes + kMaxBeaconRootIdBytes);  // format 2: 4 more
}

TEST(HeadBeacon, VerifiesOnlyUnderATrustedKeyAndNeverAsAManifest) {
  const ManifestSigner root = Signer(1), mallory = Signer(2);
  ManifestVerifier trusted;
  ASSERT_TRUE(trusted.AddTrustedKey(root.public_key()).ok());
  const std::string signed_beacon = *SignBeacon(root, Sample());
  auto ok = VerifyBeacon(trusted, signed_beacon);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(*ok, Sample());

  EXPECT_EQ(VerifyBeacon(trusted, *SignBeacon(mallory, Sample())).status().code(), Code::kAuth);
  // Mallory's signature under the root's key id.
  std::string forged = *SignBeacon(mallory, Sample());
  forged.replace(forged.size() - kManifestTrailerBytes, 8,
                 signed_beacon.substr(signed_beacon.size() - kManifestTrailerBytes, 8));
  EXPECT_EQ(VerifyBeacon(trusted, forged).status().code(), Code::kAuth);
  // Any changed byte of the signed part.
  for (size_t at : {size_t{12}, size_t{44}, size_t{52}, signed_beacon.size() - 1}) {
    std::string b = signed_beacon;
    b[at] ^= 1;
    EXPECT_EQ(VerifyBeacon(trusted, b).status().code(), Code::kAuth) << at;
  }
  EXPECT_EQ(VerifyBeacon(trusted, signed_beacon + std::string(400, 'x')).status().code(),
            Code::kCorrupt);

  // Domain separation: a manifest is no beacon and a beacon no manifest.
  VersionManifest m;
  m.board_id = Sample().board_id;
  m.version = 1;
  m.objects.push_back({ObjectKind::kKeyframe, 1, 1, 10, 10, 1, {}});
  const std::string signed_manifest = *root.Sign(m);
  EXPECT_EQ(VerifyBeacon(trusted, signed_manifest).status().code(), Code::kCorrupt);
  EXPECT_EQ(trusted.VerifyRecord(signed_manifest).status().code(), Code::kCorrupt);
  EXPECT_FALSE(trusted.Verify(signed_beacon).ok());
  EXPECT_EQ(root.SignRecord(signed_manifest.substr(0, kManifestHeaderBytes)).status().code(),
            Code::kInvalidArgument);
}

// Format 2 (docs/agent/board.md §4a): HEAD's board epoch at byte 68, the
// root id after it; written only for epoch >= 1, so an epoch-0 beacon is
// format 1 byte for byte.
TEST(HeadBeacon, Format2CarriesTheEpoch) {
  HeadBeacon b = Sample();
  b.head_epoch = 3;
  auto bytes = EncodeBeacon(b);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  ASSERT_EQ(bytes->size(), kBeaconFixedBytesEpoch + 6);
  EXPECT_EQ(uint8_t((*bytes)[8]), 2);   // format
  EXPECT_EQ(uint8_t((*bytes)[68]), 3);  // head_epoch
  EXPECT_EQ(bytes->substr(72), "root-a");
  auto back = DecodeBeacon(*bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, b);
  for (size_t n = 0; n < bytes->size(); ++n)
    EXPECT_EQ(DecodeBeacon(bytes->substr(0, n)).status().code(), Code::kCorrupt) << n;
  std::string zero = *bytes;  // format 2 with epoch 0: one encoding per beacon
  zero[68] = 0;
  EXPECT_EQ(DecodeBeacon(zero).status().code(), Code::kCorrupt);
  b.root_id.assign(kMaxBeaconRootIdBytes, 'r');
  auto longest = EncodeBeacon(b);
  ASSERT_TRUE(longest.ok());
  EXPECT_EQ(longest->size(), kMaxBeaconBytes);
  // The epoch is signed.
  const ManifestSigner root = Signer(1);
  ManifestVerifier trusted;
  ASSERT_TRUE(trusted.AddTrustedKey(root.public_key()).ok());
  std::string signed_bytes = *SignBeacon(root, Sample());
  std::string bumped = *SignBeacon(root, b);
  bumped[68] = 4;
  EXPECT_EQ(VerifyBeacon(trusted, bumped).status().code(), Code::kAuth);
  EXPECT_EQ(uint8_t(signed_bytes[8]), 1);  // epoch 0: format 1
}

class Tracker : public ::testing::Test {
 protected:
  Tracker() { EXPECT_TRUE(trusted_.AddTrustedKey(root_.public_key()).ok()); }

  BeaconVerdict Offer(const HeadBeacon& b, uint64_t now_us, uint64_t wall_ms = kWallMs,
                      const ManifestSigner* by = nullptr) {
    std::string why;
    const BeaconVerdict v = tracker_.Offer(trusted_, *SignBeacon(by ? *by : root_, b),
                                           Sample().board_id, now_us, wall_ms, &why);
    EXPECT_EQ(v == BeaconVerdict::kAccepted, why.empty()) << why;
    return v;
  }
  static HeadBeacon At(uint64_t incarnation, uint64_t seq, uint64_t head = 42) {
    HeadBeacon b = Sample();
    b.incarnation = incarnation;
    b.seq = seq;
    b.head = head;
    return b;
  }

  ManifestSigner root_ = Signer(1);
  ManifestVerifier trusted_;
  FreshnessOptions options_{/*stale_after_ms=*/5000, /*max_skew_ms=*/2000, /*max_lag_versions=*/1};
  FreshnessTracker tracker_{options_};
};

TEST_F(Tracker, StaleUntilTheFirstBeaconThenCutOffWhenBeaconsStop) {
  Freshness f = tracker_.Report(0, 42, 0);
  EXPECT_TRUE(f.stale);
  EXPECT_EQ(f.stale_reason, "no beacon yet");
  EXPECT_EQ(f.last_beacon_age_s, -1);

  ASSERT_EQ(Offer(At(7, 1), 1'000'000), BeaconVerdict::kAccepted);
  f = tracker_.Report(1'000'000 + 5'000'000, 42, 0);  // exactly stale_after: still fresh
  EXPECT_FALSE(f.stale) << f.stale_reason;
  EXPECT_EQ(f.beacon_head, 42u);
  EXPECT_EQ(f.root_id, "root-a");
  EXPECT_DOUBLE_EQ(f.last_beacon_age_s, 5.0);
  f = tracker_.Report(1'000'000 + 5'000'001, 42, 0);
  EXPECT_TRUE(f.stale);
  EXPECT_EQ(f.stale_reason, "cut off");

  ASSERT_EQ(Offer(At(7, 2), 7'000'000), BeaconVerdict::kAccepted);  // the link is back
  EXPECT_FALSE(tracker_.Report(7'000'000, 42, 0).stale);
  EXPECT_EQ(tracker_.Report(7'000'000, 42, 0).beacons[0], 2u);
}

// A beacon of a later epoch than the member serves makes it stale,
// "superseded", whatever the numbers say: 1000000 of epoch 0 is behind 3 of
// epoch 1. Once the member serves epoch 1 it is fresh again.
TEST_F(Tracker, SupersededWhenTheSignedHeadIsOfALaterEpoch) {
  HeadBeacon b = At(7, 1, /*head=*/3);
  b.head_epoch = 1;
  ASSERT_EQ(Offer(b, 0), BeaconVerdict::kAccepted);
  Freshness f = tracker_.Report(0, 1000000, 0);
  EXPECT_TRUE(f.stale);
  EXPECT_EQ(f.stale_reason, "superseded");
  EXPECT_EQ(f.beacon_head, 3u);
  EXPECT_EQ(f.beacon_head_epoch, 1u);
  EXPECT_EQ(f.lag_versions, 0u);
  f = tracker_.Report(0, 2, 0);  // a lower number, the old epoch: superseded too
  EXPECT_EQ(f.stale_reason, "superseded");
  EXPECT_FALSE(tracker_.Report(0, 3, 1).stale);
  f = tracker_.Report(0, 1, 1);
  EXPECT_EQ(f.stale_reason, "behind");
  EXPECT_EQ(f.lag_versions, 2u);
}

TEST_F(Tracker, BehindWhenTheSignedHeadIsMoreThanTheLagAhead) {
  ASSERT_EQ(Offer(At(7, 1, /*head=*/10), 0), BeaconVerdict::kAccepted);
  EXPECT_FALSE(tracker_.Report(0, 10, 0).stale);
  EXPECT_FALSE(tracker_.Report(0, 9, 0).stale);  // one behind: within max_lag_versions
  const Freshness f = tracker_.Report(0, 8, 0);
  EXPECT_TRUE(f.stale);
  EXPECT_EQ(f.stale_reason, "behind");
  EXPECT_EQ(f.lag_versions, 2u);
}

TEST_F(Tracker, RefusesReplaysUnknownKeysAndOtherBoardsAndCountsThem) {
  ASSERT_EQ(Offer(At(7, 5), 0), BeaconVerdict::kAccepted);
  EXPECT_EQ(Offer(At(7, 5), 1), BeaconVerdict::kReplayed);  // the same again
  EXPECT_EQ(Offer(At(7, 4), 2), BeaconVerdict::kReplayed);  // an older one
  const ManifestSigner mallory = Signer(2);
  EXPECT_EQ(Offer(At(7, 6), 3, kWallMs, &mallory), BeaconVerdict::kUntrusted);
  HeadBeacon other = At(7, 6);
  other.board_id[0] ^= 1;
  EXPECT_EQ(Offer(other, 4), BeaconVerdict::kForeign);
  std::string why;
  EXPECT_EQ(tracker_.Offer(trusted_, "TERNBEAC", Sample().board_id, 5, kWallMs, &why),
            BeaconVerdict::kMalformed);
  EXPECT_EQ(tracker_.Offer(trusted_, *SignBeacon(root_, At(7, 6)), BoardId{}, 5, kWallMs, &why),
            BeaconVerdict::kForeign)
      << "a member with no board accepts no beacon";

  const Freshness f = tracker_.Report(6, 42, 0);
  EXPECT_EQ(f.seq, 5u);  // refusals moved nothing
  EXPECT_EQ(f.beacons[size_t(BeaconVerdict::kAccepted)], 1u);
  EXPECT_EQ(f.beacons[size_t(BeaconVerdict::kReplayed)], 2u);
  EXPECT_EQ(f.beacons[size_t(BeaconVerdict::kUntrusted)], 1u);
  EXPECT_EQ(f.beacons[size_t(BeaconVerdict::kForged)], 0u);
  EXPECT_EQ(f.beacons[size_t(BeaconVerdict::kForeign)], 2u);
  EXPECT_EQ(f.beacons[size_t(BeaconVerdict::kMalformed)], 1u);
}

// A refused signature is sorted by where its key stands in this member's
// key set: a signature that does not verify under a key id it trusts is
// forged; a key it does not trust now (one a rotation brought that it has
// not learned yet, one expired by its clock, one revoked) is "untrusted",
// which is as much the member's own state as the sender's.
TEST_F(Tracker, RefusedSignaturesAreForgedOnlyUnderATrustedKeyId) {
  const ManifestSigner next = Signer(3), mallory = Signer(2);
  uint64_t now_ms = kWallMs;
  trusted_.SetWallClock([&now_ms] { return now_ms; });
  std::string why;
  EXPECT_EQ(Offer(At(7, 1), 0, kWallMs, &next), BeaconVerdict::kUntrusted);  // not learned yet
  std::string under_root = *SignBeacon(mallory, At(7, 1));
  const std::string by_root = *SignBeacon(root_, At(7, 1));
  under_root.replace(under_root.size() - kManifestTrailerBytes, 8,
                     by_root.substr(by_root.size() - kManifestTrailerBytes, 8));
  EXPECT_EQ(tracker_.Offer(trusted_, under_root, Sample().board_id, 0, kWallMs, &why),
            BeaconVerdict::kForged);
  EXPECT_NE(why.find("signature does not verify"), std::string::npos) << why;

  // Key set 1: the root's key expires at kWallMs, the next one is added.
  ASSERT_TRUE(
      trusted_.ReplaceKeys(1, {{root_.public_key(), kWallMs}, {next.public_key(), 0}}, {}).ok());
  ASSERT_EQ(Offer(At(7, 1), 1), BeaconVerdict::kAccepted);
  now_ms = kWallMs + 1;
  EXPECT_EQ(Offer(At(7, 2), 2, now_ms), BeaconVerdict::kUntrusted);  // expired by our clock
  ASSERT_EQ(Offer(At(7, 2), 2, now_ms, &next), BeaconVerdict::kAccepted);
  // Key set 2 revokes the root's key.
  ASSERT_TRUE(trusted_.ReplaceKeys(2, {{next.public_key(), 0}}, {root_.key_id()}).ok());
  EXPECT_EQ(
      tracker_.Offer(trusted_, *SignBeacon(root_, At(7, 3)), Sample().board_id, 3, now_ms, &why),
      BeaconVerdict::kUntrusted);
  EXPECT_NE(why.find("revoked key id"), std::string::npos) << why;

  const Freshness f = tracker_.Report(3, 42, 0);
  EXPECT_EQ(f.seq, 2u);  // refusals moved nothing
  EXPECT_EQ(f.beacons[size_t(BeaconVerdict::kAccepted)], 2u);
  EXPECT_EQ(f.beacons[size_t(BeaconVerdict::kForged)], 1u);
  EXPECT_EQ(f.beacons[size_t(BeaconVerdict::kUntrusted)], 3u);
  EXPECT_STREQ(BeaconVerdictName(BeaconVerdict::kUntrusted), "untrusted");
}

TEST_F(Tracker, ANewIncarnationIsAcceptedAtOnceAndTheDeposedRootNeverAgain) {
  ASSERT_EQ(Offer(At(7, 900), 0), BeaconVerdict::kAccepted);
  ASSERT_EQ(Offer(At(9, 1), 1), BeaconVerdict::kAccepted);  // the standby took over
  EXPECT_EQ(tracker_.Report(1, 42, 0).incarnation, 9u);
  EXPECT_EQ(Offer(At(7, 901), 2), BeaconVerdict::kReplayed);  // the deposed root
  ASSERT_EQ(Offer(At(9, 2), 3), BeaconVerdict::kAccepted);
}

TEST_F(Tracker, ClockSkewBeyondTheBoundIsRefusedAndReported) {
  ASSERT_EQ(Offer(At(7, 1), 0, kWallMs + 1500), BeaconVerdict::kAccepted);  // within 2000 ms
  EXPECT_EQ(tracker_.Report(0, 42, 0).clock_skew_ms, -1500);
  EXPECT_EQ(Offer(At(7, 2), 1, kWallMs + 2001), BeaconVerdict::kSkewed);
  EXPECT_EQ(Offer(At(7, 3), 2, kWallMs - 60'000), BeaconVerdict::kSkewed);
  Freshness f = tracker_.Report(2, 42, 0);
  EXPECT_TRUE(f.skew_exceeded);
  EXPECT_EQ(f.clock_skew_ms, 60'000);
  EXPECT_FALSE(f.stale);  // the accepted one is still recent
  f = tracker_.Report(6'000'000, 42, 0);
  EXPECT_TRUE(f.stale);
  EXPECT_EQ(f.stale_reason, "clock skew");
  EXPECT_EQ(f.beacons[size_t(BeaconVerdict::kSkewed)], 2u);
  // The clock fixed: the next beacon is accepted (seq 3 was refused, not taken).
  ASSERT_EQ(Offer(At(7, 3), 7'000'000), BeaconVerdict::kAccepted);
  EXPECT_FALSE(tracker_.Report(7'000'000, 42, 0).skew_exceeded);
}

}  // namespace
}  // namespace tern::agent
