// Beacon acceptance and staleness (freshness.h; docs/security.md "Freshness").
#include "agent/freshness/freshness.h"

#include <tuple>

namespace tern::agent {

const char* BeaconVerdictName(BeaconVerdict v) {
  switch (v) {
    case BeaconVerdict::kAccepted: return "accepted";
    case BeaconVerdict::kMalformed: return "malformed";
    case BeaconVerdict::kForged: return "forged";
    case BeaconVerdict::kUntrusted:
      return "untrusted";
    case BeaconVerdict::kForeign: return "foreign";
    case BeaconVerdict::kReplayed: return "replayed";
    case BeaconVerdict::kSkewed: return "skewed";
  }
  return "?";
}

BeaconVerdict FreshnessTracker::Offer(const ManifestVerifier& verifier,
                                      std::string_view signed_beacon, const BoardId& board,
                                      uint64_t now_us, uint64_t wall_unix_ms, std::string* why) {
  SignerStanding signer = SignerStanding::kNotRead;
  auto b = VerifyBeacon(verifier, signed_beacon, &signer);
  if (!b.ok()) {
    *why = b.status().ToString();
    if (b.status().code() != Code::kAuth) return Count(BeaconVerdict::kMalformed);
    return Count(signer == SignerStanding::kTrusted ? BeaconVerdict::kForged
                                                    : BeaconVerdict::kUntrusted);
  }
  if (board == BoardId{} || b->board_id != board) {
    *why = "a beacon of another board";
    return Count(BeaconVerdict::kForeign);
  }
  if (accepted_any_ && std::tie(b->incarnation, b->seq) <= std::tie(last_.incarnation, last_.seq)) {
    *why = "beacon " + std::to_string(b->incarnation) + "/" + std::to_string(b->seq) +
           " is not newer than the last accepted, " + std::to_string(last_.incarnation) + "/" +
           std::to_string(last_.seq);
    return Count(BeaconVerdict::kReplayed);
  }
  // Differences of two wall clocks, in ms since 1970: far inside int64.
  skew_ms_ = static_cast<int64_t>(b->root_unix_ms) - static_cast<int64_t>(wall_unix_ms);
  const uint64_t skew_abs = skew_ms_ < 0 ? uint64_t(-skew_ms_) : uint64_t(skew_ms_);
  skew_exceeded_ = skew_abs > options_.max_skew_ms;
  if (skew_exceeded_) {
    *why = "the root's clock is " + std::to_string(skew_ms_) + " ms off ours (bound " +
           std::to_string(options_.max_skew_ms) + " ms)";
    return Count(BeaconVerdict::kSkewed);
  }
  accepted_any_ = true;
  last_ = std::move(b).value();
  last_us_ = now_us;
  return Count(BeaconVerdict::kAccepted);
}

Freshness FreshnessTracker::Report(uint64_t now_us, uint64_t version, uint32_t epoch) const {
  Freshness f;
  f.beacons = counts_;
  f.clock_skew_ms = skew_ms_;
  f.skew_exceeded = skew_exceeded_;
  if (!accepted_any_) {
    if (skew_exceeded_) f.stale_reason = "clock skew";
    return f;
  }
  f.beacon_head = last_.head;
  f.beacon_head_epoch = last_.head_epoch;
  const bool superseded = last_.head_epoch > epoch;
  f.lag_versions = !superseded && last_.head > version ? last_.head - version : 0;
  f.incarnation = last_.incarnation;
  f.seq = last_.seq;
  f.root_id = last_.root_id;
  const uint64_t age_us = now_us > last_us_ ? now_us - last_us_ : 0;
  f.last_beacon_age_s = static_cast<double>(age_us) * 1e-6;
  if (age_us > uint64_t{options_.stale_after_ms} * 1000) {
    f.stale_reason = skew_exceeded_ ? "clock skew" : "cut off";
  } else if (superseded) {
    f.stale_reason = "superseded";
  } else if (f.lag_versions > options_.max_lag_versions) {
    f.stale_reason = "behind";
  } else {
    f.stale = false;
    f.stale_reason.clear();
  }
  return f;
}

}  // namespace tern::agent
