// A member's view of how fresh it is, from the root's signed HEAD beacons
// (beacon.h; the rules: docs/security.md "Freshness").
//
// Offer checks one signed beacon and says why it is refused, or accepts it:
//   malformed  not a well-formed signed beacon;
//   forged     under a key id this member trusts, with a signature that
//              does not verify: altered or forged bytes;
//   untrusted  signed by a key this member does not trust now: one it has
//              not learned yet (its key set is behind a rotation), a
//              revoked one, or one expired by this member's clock. Its own
//              state as much as the sender's, so counted apart from forged;
//   foreign    signed for another board;
//   replayed   not newer than the last accepted: (incarnation, seq) must
//              increase lexicographically, so a standby that takes over (a
//              larger incarnation) is accepted at once, and an old beacon,
//              or one of a deposed root, never again;
//   skewed     the root's wall time differs from ours by more than
//              max_skew_ms (a beacon recorded long ago, or a clock to fix).
// Only an accepted beacon moves the state. Report then says, at a time:
//   fresh      a beacon was accepted within stale_after_ms and its HEAD is
//              at most max_lag_versions ahead of the version this member
//              stands at;
//   stale      otherwise, with the reason: "no beacon yet", "cut off" (none
//              accepted for stale_after_ms; "clock skew" when the last
//              signed one was refused for skew), "superseded" (the beacon's
//              HEAD is of a later board epoch than the one the member
//              serves: its number was withdrawn, docs/agent/board.md §4a,
//              whatever the numbers say) or "behind" (beacons come, but
//              name a HEAD more than max_lag_versions ahead).
// Staleness fails safe: blocking, forging or replaying beacons can only make
// a member stale, never fresh.
//
// Thread safety: none; the owner serialises calls (the agent holds its mutex).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "agent/freshness/beacon.h"

namespace tern::agent {

struct FreshnessOptions {
  uint32_t stale_after_ms = 5000;  // 1..
  uint32_t max_skew_ms = 30000;
  uint64_t max_lag_versions = 1;
};

enum class BeaconVerdict : uint8_t {
  kAccepted,
  kMalformed,
  kForged,
  kUntrusted,
  kForeign,
  kReplayed,
  kSkewed,
};
inline constexpr size_t kBeaconVerdicts = 7;
static_assert(size_t(BeaconVerdict::kSkewed) + 1 == kBeaconVerdicts);
const char* BeaconVerdictName(BeaconVerdict v);  // "accepted", "forged", ...

struct Freshness {
  bool stale = true;
  std::string stale_reason = "no beacon yet";  // empty when fresh
  double last_beacon_age_s = -1;               // -1: none accepted
  // From the last accepted beacon (0 / empty: none).
  uint64_t beacon_head = 0;
  uint32_t beacon_head_epoch = 0;
  // beacon_head minus the member's version, within one epoch; 0 when not
  // ahead or superseded (numbers of two epochs do not subtract).
  uint64_t lag_versions = 0;
  uint64_t incarnation = 0, seq = 0;
  std::string root_id;
  // The root's wall time minus ours at the last validly signed beacon of
  // this board (accepted or refused as skewed); skew_exceeded: refused.
  int64_t clock_skew_ms = 0;
  bool skew_exceeded = false;
  std::array<uint64_t, kBeaconVerdicts> beacons{};  // offered, by verdict
};

class FreshnessTracker {
 public:
  explicit FreshnessTracker(FreshnessOptions options) : options_(options) {}

  // `board`: the member's board (all zero refuses every beacon as foreign);
  // `now_us`: its monotonic clock; `wall_unix_ms`: its wall clock. *why
  // gets the reason of a refusal.
  BeaconVerdict Offer(const ManifestVerifier& verifier, std::string_view signed_beacon,
                      const BoardId& board, uint64_t now_us, uint64_t wall_unix_ms,
                      std::string* why);
  // `version`, `epoch`: what the member serves (relay-only: holds) and
  // its board epoch.
  Freshness Report(uint64_t now_us, uint64_t version, uint32_t epoch) const;
  // When a beacon was last accepted (0: never).
  uint64_t last_accepted_us() const { return last_us_; }

 private:
  BeaconVerdict Count(BeaconVerdict v) {
    ++counts_[static_cast<size_t>(v)];
    return v;
  }

  const FreshnessOptions options_;
  bool accepted_any_ = false;
  HeadBeacon last_;       // the last accepted
  uint64_t last_us_ = 0;  // when
  int64_t skew_ms_ = 0;
  bool skew_exceeded_ = false;
  std::array<uint64_t, kBeaconVerdicts> counts_{};
};

}  // namespace tern::agent
