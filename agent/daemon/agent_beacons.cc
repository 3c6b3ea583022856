// Signed HEAD beacons (agent/freshness/; docs/security.md "Freshness"): the
// root sends one to every member every beacon interval on its control
// connection, relay-only members included; a member verifies each, tracks
// its freshness, and drops a control connection that brings no valid
// beacon for stale_after_ms (agent/daemon/agent_impl.h).
//
// Direct, not relayed down the trees: every member already holds one
// control connection to the root, and a relay that dropped or delayed
// beacons could then make its subtree stale without being the cut-off one.
#include <bit>
#include <chrono>

#include "agent/daemon/agent_impl.h"

namespace tern::agent {

Status AgentImpl::CheckFreshnessOptions() const {
  TERN_REQUIRE(opt_.beacon_interval_ms >= 1 && opt_.beacon_interval_ms <= kMaxBeaconIntervalMs,
               kInvalidArgument, "agent: beacon interval ", opt_.beacon_interval_ms,
               " ms outside 1..", kMaxBeaconIntervalMs);
  TERN_REQUIRE(opt_.stale_after_ms >= 1 && opt_.stale_after_ms <= 3'600'000, kInvalidArgument,
               "agent: stale-after ", opt_.stale_after_ms, " ms outside 1..3600000");
  TERN_REQUIRE(opt_.beacon_max_skew_ms >= 1 && opt_.beacon_max_skew_ms <= 86'400'000,
               kInvalidArgument, "agent: beacon max skew ", opt_.beacon_max_skew_ms,
               " ms outside 1..86400000");
  return Status::Ok();
}

uint64_t AgentImpl::WallUnixMs() const {
  if (opt_.wall_clock_unix_ms) return opt_.wall_clock_unix_ms();
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// The tick thread alone numbers, signs and sends beacons, so they leave in
// sequence order on every connection (a member refuses one out of order).
void AgentImpl::RootBeaconTick() {
  HeadBeacon b;
  std::vector<std::shared_ptr<Connection>> conns;
  {
    MutexLock lock(mu_);
    const uint64_t now_us = clock_.NowUs();
    if (!started_ || leadership_lost_ || !board_ || now_us < next_beacon_us_) return;
    next_beacon_us_ = now_us + uint64_t{opt_.beacon_interval_ms} * 1000;
    if (member_conns_.empty()) return;
    b.board_id = board_->id();
    b.incarnation = beacon_incarnation_;
    b.seq = ++beacon_seq_;
    b.head = board_->head();
    b.head_epoch = board_->head_pos().epoch;
    b.interval_ms = opt_.beacon_interval_ms;
    b.root_id = id_;
    for (const auto& [id, conn] : member_conns_) conns.push_back(conn);
    beacons_sent_ += conns.size();
  }
  b.root_unix_ms = WallUnixMs();
  auto signed_beacon = SignBeacon(*Signer(), b);
  if (!signed_beacon.ok()) {
    Log("cannot sign a HEAD beacon: " + signed_beacon.status().ToString());
    return;
  }
  Outbox out;
  const Beacon msg{std::move(signed_beacon).value()};
  for (const auto& c : conns) Send(out, c, msg);
  Flush(out);
}

void AgentImpl::MemberOnBeaconLocked(const Beacon& m) {
  // The root's tick thread may send a new member's first beacon before the
  // joining thread has sent its WELCOME: before it, the member may have no
  // board to judge it by, and the next one comes an interval later.
  if (!joined_) return;
  std::string why;
  const BeaconVerdict v =
      freshness_.Offer(verifier_, m.signed_beacon, board_id_, clock_.NowUs(), WallUnixMs(), &why);
  if (v == BeaconVerdict::kAccepted) return;
  // One line at the 1st, 2nd, 4th, 8th... refusal of each kind: a root (or
  // a man in the middle) sending bad beacons every second cannot flood the log.
  const uint64_t n =
      freshness_.Report(clock_.NowUs(), VersionLocked(), ServedEpochLocked()).beacons[size_t(v)];
  if (std::has_single_bit(n))
    Log(std::string("refused a HEAD beacon (") + BeaconVerdictName(v) + ", " + std::to_string(n) +
        " so far): " + why);
}

std::shared_ptr<Connection> AgentImpl::MemberCutOffLocked() {
  if (!root_conn_) return nullptr;
  const uint64_t now_us = clock_.NowUs();
  const uint64_t since = std::max(root_link_since_us_, freshness_.last_accepted_us());
  if (now_us - std::min(now_us, since) <= uint64_t{opt_.stale_after_ms} * 1000) return nullptr;
  Log("no valid HEAD beacon from the root for " + std::to_string(opt_.stale_after_ms) +
      " ms: stale (cut off); dropping the control connection to dial again");
  return root_conn_;
}

void AgentImpl::FreshnessSnapshotLocked(AgentSnapshot& s) const {
  AgentFreshness& f = s.freshness;
  if (opt_.root) {
    f.beacon_head = s.head;
    f.incarnation = beacon_incarnation_;
    f.seq = beacon_seq_;
    f.root_id = id_;
    f.beacons_sent = beacons_sent_;
    return;
  }
  const Freshness r = freshness_.Report(clock_.NowUs(), VersionLocked(), ServedEpochLocked());
  f.stale = r.stale;
  f.stale_reason = r.stale_reason;
  f.last_beacon_age_s = r.last_beacon_age_s;
  f.beacon_head = r.beacon_head;
  f.lag_versions = r.lag_versions;
  f.incarnation = r.incarnation;
  f.seq = r.seq;
  f.root_id = r.root_id;
  f.clock_skew_ms = r.clock_skew_ms;
  f.clock_skew_exceeded = r.skew_exceeded;
  auto count = [&](BeaconVerdict v) { return r.beacons[size_t(v)]; };
  f.beacons_accepted = count(BeaconVerdict::kAccepted);
  f.beacons_malformed = count(BeaconVerdict::kMalformed);
  f.beacons_forged = count(BeaconVerdict::kForged);
  f.beacons_untrusted = count(BeaconVerdict::kUntrusted);
  f.beacons_foreign = count(BeaconVerdict::kForeign);
  f.beacons_replayed = count(BeaconVerdict::kReplayed);
  f.beacons_skewed = count(BeaconVerdict::kSkewed);
}

}  // namespace tern::agent
