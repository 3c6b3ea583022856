// Freshness end to end (docs/security.md "Freshness"): the root's signed
// HEAD beacons reach every member on its control connection; a member cut
// off from the root becomes stale within the bound and fresh again once
// the link is back; forged and replayed beacons (a man in the middle on the
// root's link) are refused and counted, and blocking the real ones makes a
// member stale, never fresh; a clock past the skew bound is reported. A
// standby's takeover is in agent_test.cc (StandbyRootTakesOverThroughEtcd).
// A rotation that reaches a relay before its children recovers the same way.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "agent/control/control_wire.h"
#include "agent/freshness/beacon.h"
#include "agent/ops/admin_http.h"
#include "agent/testing/agent_test_fixture.h"
#include "tern/key_set.h"

namespace tern {
namespace {

using agent_test::WaitFor;

constexpr uint32_t kIntervalMs = 100;
constexpr uint32_t kStaleAfterMs = 600;

class AgentFreshnessTest : public agent_test::AgentSystemFixture {
 protected:
  void SetUp() override {
    AgentSystemFixture::SetUp();
    CaptureLogs([](AgentOptions& o) {
      o.beacon_interval_ms = kIntervalMs;
      o.stale_after_ms = kStaleAfterMs;
    });
  }

  AgentFreshness FreshnessOf(const std::string& name) {
    return members_[name].agent->Snapshot().freshness;
  }
  bool Fresh(const std::string& name) { return !FreshnessOf(name).stale; }
  std::string Describe(const std::string& name) {
    const AgentFreshness f = FreshnessOf(name);
    return name + ": " + (f.stale ? "stale (" + f.stale_reason + ")" : std::string("fresh")) +
           ", beacon age " + std::to_string(f.last_beacon_age_s) + " s, HEAD " +
           std::to_string(f.beacon_head) + ", accepted " + std::to_string(f.beacons_accepted) +
           ", forged " + std::to_string(f.beacons_forged) + ", untrusted " +
           std::to_string(f.beacons_untrusted) + ", replayed " +
           std::to_string(f.beacons_replayed) + ", skewed " + std::to_string(f.beacons_skewed);
  }
};

TEST_F(AgentFreshnessTest, ACutOffMemberGoesStaleWithinTheBoundAndFreshAfterReconnect) {
  StartRoot();
  auto cut = std::make_shared<std::atomic<bool>>(false);
  FaultPolicy silent;
  silent.silence_made_connections = [cut] { return cut->load(); };
  StartMember("cut", "eu", &silent);
  StartMember("ok", "eu");
  // A relay-only member gets beacons too (its control link is its own).
  {
    AgentOptions o = BaseOptions("relay");
    o.join = "root";
    o.region = "eu";
    o.relay_only = true;
    o.trusted_keys_pem = {root_key_};
    o.transport = NewTransportFor("relay");
    auto a = Agent::Start(o);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    members_["relay"].agent = std::move(a).value();
    members_["relay"].dir = o.data_dir;
  }
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 3; }, 30));
  // Not fresh before the first beacon: a member never assumes it.
  for (const char* name : {"cut", "ok", "relay"})
    ASSERT_TRUE(WaitFor([&] { return Fresh(name); }, 10)) << Describe(name);
  members_.erase("relay");  // AllServe counts serving members
  Publish(1);
  ASSERT_TRUE(AllServe(1)) << Lagging(1);
  ASSERT_TRUE(WaitFor([&] { return FreshnessOf("cut").beacon_head == 1; }, 10)) << Describe("cut");
  const uint64_t incarnation = FreshnessOf("cut").incarnation;
  EXPECT_EQ(incarnation, root_->Snapshot().freshness.incarnation);

  cut->store(true);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitFor([&] { return !Fresh("cut"); }, 10)) << Describe("cut");
  const double took_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Within the bound of the last beacon it had (one interval before the
  // cut, or less), plus the test's polling and a loaded machine's slack
  // (the member's tick runs late under a sanitizer beside other tests).
  EXPECT_LE(took_s, (kStaleAfterMs + kIntervalMs) * 1e-3 + 5.0) << Describe("cut");
  EXPECT_GT(FreshnessOf("cut").last_beacon_age_s, kStaleAfterMs * 1e-3) << "stale early";
  EXPECT_EQ(FreshnessOf("cut").stale_reason, "cut off");
  Publish(2);  // it cannot hear of this one
  ASSERT_TRUE(WaitFor([&] { return members_["ok"].agent->Snapshot().served_version == 2; }, 30));
  EXPECT_TRUE(WaitFor([&] { return Fresh("ok"); }, 10)) << Describe("ok");
  EXPECT_TRUE(!Fresh("cut")) << Describe("cut");
  EXPECT_EQ(members_["cut"].agent->Snapshot().served_version, 1u);
  EXPECT_GE(Logged("cut", "no valid HEAD beacon from the root"), 1u);
  // The root drops it (silent for dead_after_ms), and its next dial is cut
  // too: its HELLO is lost on a connection that looks open. Only dropping a
  // connection that brings no beacon gets it back.
  auto at_root = [&] {
    for (const auto& m : root_->Snapshot().members)
      if (m.id == "cut") return true;
    return false;
  };
  ASSERT_TRUE(WaitFor([&] { return !at_root(); }, 10));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  cut->store(false);
  // It drops the silent connection, dials again, joins, catches up.
  ASSERT_TRUE(AllServe(2, 30)) << Lagging(2) << Describe("cut");
  ASSERT_TRUE(WaitFor([&] { return Fresh("cut"); }, 10)) << Describe("cut");
  const AgentFreshness f = FreshnessOf("cut");
  EXPECT_EQ(f.beacon_head, 2u);
  EXPECT_EQ(f.incarnation, incarnation);
  EXPECT_EQ(f.beacons_replayed + f.beacons_forged + f.beacons_malformed + f.beacons_foreign, 0u)
      << Describe("cut");
}

// A man in the middle on the root's link: it records the root's beacons and
// adds a forged one (a newer beacon signed by another key, carrying the
// root's key id) and a replay of an old one to each; then it drops the
// real ones, and the member must go stale on forged and replayed alone.
TEST_F(AgentFreshnessTest, ForgedAndReplayedBeaconsAreRefusedAndCounted) {
  struct Mitm {
    std::mutex mu;
    ManifestVerifier root_key;
    ManifestSigner mallory = std::move(ManifestSigner::Generate()).value();
    std::string first;  // the first BEACON message seen
    bool drop_real = false;
    int forged = 0, replayed = 0;
  };
  auto mitm = std::make_shared<Mitm>();
  FaultPolicy policy;
  policy.rewrite_message = [mitm](std::string m) -> std::vector<std::string> {
    if (m.empty() || uint8_t(m[0]) != uint8_t(agent::ControlType::kBeacon)) return {m};
    auto msg = agent::DecodeControl(m);
    if (!msg.ok()) return {m};
    const std::string& signed_beacon = std::get<agent::Beacon>(*msg).signed_beacon;
    std::lock_guard<std::mutex> lock(mitm->mu);
    auto b = agent::VerifyBeacon(mitm->root_key, signed_beacon);
    if (!b.ok()) return {m};  // the key is not set yet
    if (mitm->first.empty()) {
      mitm->first = m;
      return {m};
    }
    agent::HeadBeacon newer = *b;
    newer.seq += 1000;
    newer.head += 1000;
    std::string forged = *agent::SignBeacon(mitm->mallory, newer);
    forged.replace(forged.size() - kManifestTrailerBytes, 8,
                   signed_beacon.substr(signed_beacon.size() - kManifestTrailerBytes, 8));
    ++mitm->forged;
    ++mitm->replayed;
    std::vector<std::string> out;
    if (!mitm->drop_real) out.push_back(m);
    out.push_back(*agent::EncodeControl(agent::Beacon{forged}));
    out.push_back(mitm->first);
    return out;
  };
  StartRoot(3, &policy);
  {
    std::lock_guard<std::mutex> lock(mitm->mu);
    ASSERT_TRUE(mitm->root_key.AddTrustedKeyPem(root_key_).ok());
  }
  StartMember("m", "eu");
  ASSERT_TRUE(WaitFor(
      [&] {
        const AgentFreshness f = FreshnessOf("m");
        return f.beacons_forged >= 3 && f.beacons_replayed >= 3;
      },
      20))
      << Describe("m");
  // The real beacons still come (waited for: a loaded machine may delay one).
  EXPECT_TRUE(WaitFor([&] { return Fresh("m"); }, 10)) << Describe("m");
  AgentFreshness f = FreshnessOf("m");
  EXPECT_LT(f.beacon_head, 1000u) << "a forged HEAD was taken";
  EXPECT_GE(Logged("m", "refused a HEAD beacon (forged"), 1u);
  EXPECT_GE(Logged("m", "refused a HEAD beacon (replayed"), 1u);
  EXPECT_EQ(f.beacons_malformed + f.beacons_untrusted + f.beacons_foreign + f.beacons_skewed, 0u)
      << Describe("m");

  // Only forged and replayed beacons from now on: stale, never fresh.
  {
    std::lock_guard<std::mutex> lock(mitm->mu);
    mitm->drop_real = true;
  }
  ASSERT_TRUE(WaitFor([&] { return !Fresh("m"); }, 10)) << Describe("m");
  f = FreshnessOf("m");
  EXPECT_EQ(f.stale_reason, "cut off");
  EXPECT_LT(f.beacon_head, 1000u);
  const uint64_t accepted = f.beacons_accepted;
  std::this_thread::sleep_for(std::chrono::milliseconds(3 * kIntervalMs));
  EXPECT_EQ(FreshnessOf("m").beacons_accepted, accepted);
  EXPECT_TRUE(FreshnessOf("m").stale);
}

// A member whose wall clock runs a minute ahead of the root's: every beacon
// is refused for skew, the member is stale for "clock skew", and /status and
// /metrics say so.
TEST_F(AgentFreshnessTest, ClockSkewBeyondTheBoundIsRefusedAndReported) {
  StartRoot();
  tweak_ = [inner = tweak_](AgentOptions& o) {
    inner(o);
    o.beacon_max_skew_ms = 2000;
    o.admin_listen = "127.0.0.1:0";
    o.wall_clock_unix_ms = [] {
      return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::chrono::system_clock::now().time_since_epoch())
                                       .count()) +
             60'000;
    };
  };
  StartMember("ahead", "eu");
  ASSERT_TRUE(WaitFor([&] { return FreshnessOf("ahead").beacons_skewed >= 3; }, 20))
      << Describe("ahead");
  ASSERT_TRUE(WaitFor([&] { return FreshnessOf("ahead").stale_reason == "clock skew"; }, 10))
      << Describe("ahead");
  const AgentFreshness f = FreshnessOf("ahead");
  EXPECT_TRUE(f.stale);
  EXPECT_TRUE(f.clock_skew_exceeded);
  EXPECT_NEAR(static_cast<double>(f.clock_skew_ms), -60'000, 2'000);
  EXPECT_EQ(f.beacons_accepted, 0u);
  EXPECT_GE(Logged("ahead", "refused a HEAD beacon (skewed"), 1u);

  const std::string admin = members_["ahead"].agent->Snapshot().admin_address;
  auto status = agent::AdminGet(admin, "/status", {});
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_NE(status->find("\"stale_reason\": \"clock skew\""), std::string::npos) << *status;
  EXPECT_NE(status->find("\"clock_skew_exceeded\": true"), std::string::npos) << *status;
  auto metrics = agent::AdminGet(admin, "/metrics", {});
  ASSERT_TRUE(metrics.ok()) << metrics.status().ToString();
  EXPECT_NE(metrics->find("\ntern_agent_stale 1\n"), std::string::npos) << *metrics;
  EXPECT_NE(metrics->find("tern_agent_beacons_total{verdict=\"skewed\"}"), std::string::npos)
      << *metrics;
}

// A signed beacon of a later board epoch (docs/agent/board.md §4a: a
// supersede withdrew the number the member serves) makes the member stale,
// "superseded", although its number is the beacon's HEAD; the same beacons
// re-signed by another key are refused (untrusted) and change nothing. The
// test holds the root's signing key and rewrites its real beacons on the
// way (HEAD beacon format 2). TODO: a supersede published through the root
// and members re-basing onto it, once the daemon does (board.md §4a Status).
TEST_F(AgentFreshnessTest, ABeaconOfALaterEpochMakesAMemberStaleSuperseded) {
  struct Rewriter {
    std::mutex mu;
    ManifestVerifier root_key;
    ManifestSigner root = std::move(ManifestSigner::Generate()).value();
    ManifestSigner mallory = std::move(ManifestSigner::Generate()).value();
    bool epoch_one = false, by_mallory = false;
  };
  auto rw = std::make_shared<Rewriter>();
  ASSERT_TRUE(rw->root_key.AddTrustedKey(rw->root.public_key()).ok());
  const std::string pem = *rw->root.PrivateKeyPem();
  CaptureLogs([pem](AgentOptions& o) {
    o.beacon_interval_ms = kIntervalMs;
    o.stale_after_ms = kStaleAfterMs;
    o.signing_key_pem = pem;  // only a root reads it
  });
  FaultPolicy policy;
  policy.rewrite_message = [rw](std::string m) -> std::vector<std::string> {
    if (m.empty() || uint8_t(m[0]) != uint8_t(agent::ControlType::kBeacon)) return {m};
    auto msg = agent::DecodeControl(m);
    if (!msg.ok()) return {m};
    std::lock_guard<std::mutex> lock(rw->mu);
    if (!rw->epoch_one) return {m};
    auto b = agent::VerifyBeacon(rw->root_key, std::get<agent::Beacon>(*msg).signed_beacon);
    if (!b.ok()) return {m};
    b->head_epoch = 1;
    return {*agent::EncodeControl(
        agent::Beacon{*agent::SignBeacon(rw->by_mallory ? rw->mallory : rw->root, *b)})};
  };
  StartRoot(3, &policy);
  StartMember("m", "eu");
  Publish(1);
  ASSERT_TRUE(WaitFor([&] { return Fresh("m") && FreshnessOf("m").beacon_head == 1; }, 20))
      << Describe("m");

  {  // another key's epoch: refused; at worst the member is cut off
    std::lock_guard<std::mutex> lock(rw->mu);
    rw->epoch_one = rw->by_mallory = true;
  }
  ASSERT_TRUE(WaitFor([&] { return FreshnessOf("m").beacons_untrusted >= 3; }, 20))
      << Describe("m");
  EXPECT_EQ(FreshnessOf("m").beacons_forged, 0u) << "a key the member does not know is not forgery";
  EXPECT_NE(FreshnessOf("m").stale_reason, "superseded");
  {
    std::lock_guard<std::mutex> lock(rw->mu);
    rw->epoch_one = false;
  }
  EXPECT_TRUE(WaitFor([&] { return Fresh("m"); }, 10)) << Describe("m");

  {  // the publisher's key, epoch 1: stale, "superseded", though HEAD is 1
    std::lock_guard<std::mutex> lock(rw->mu);
    rw->epoch_one = true;
    rw->by_mallory = false;
  }
  ASSERT_TRUE(WaitFor([&] { return FreshnessOf("m").stale_reason == "superseded"; }, 20))
      << Describe("m");
  const AgentFreshness f = FreshnessOf("m");
  EXPECT_TRUE(f.stale);
  EXPECT_EQ(f.beacon_head, 1u);
  EXPECT_EQ(f.lag_versions, 0u);
}

// A rotation whose key set reaches a relay before its children: the root's
// transport drops the KEY_SETS message to the two children (member_conns_
// is ordered by id: "a", "b", then "relay"), so the relay trusts the new
// key and they do not. The relay passes on what the new key signed; the
// children refuse it as a key they do not trust, which is no fault of the
// relay's (never reported as bad chunks), and count the new key's beacons
// as untrusted, not forged. Those refused beacons make them stale ("cut
// off"), so they dial the root again, learn the key set with the WELCOME,
// and serve the version bit for bit.
TEST_F(AgentFreshnessTest, ChildrenBehindARotationBlameNoRelayAndCatchUp) {
  constexpr uint32_t kSlowStaleMs = 8000;  // the window in which they disagree
  const ManifestSigner key_a = std::move(ManifestSigner::Generate()).value();
  const ManifestSigner key_b = std::move(ManifestSigner::Generate()).value();
  const std::string a_pem = *key_a.PrivateKeyPem();
  CaptureLogs([a_pem](AgentOptions& o) {
    o.beacon_interval_ms = kIntervalMs;
    o.stale_after_ms = kSlowStaleMs;
    o.signing_key_pem = a_pem;  // only a root reads it
    // A relay that withholds a due version is reported stalled after this
    // (the documented cost of a lagging key set): out of this test's reach,
    // so that only a report of bad chunks could demote it here.
    o.parent_stall_ms = 60'000;
  });
  struct Drop {
    std::mutex mu;
    int to_drop = 0, dropped = 0;
  };
  auto drop = std::make_shared<Drop>();
  FaultPolicy policy;
  policy.rewrite_message = [drop](std::string m) -> std::vector<std::string> {
    if (m.empty() || uint8_t(m[0]) != uint8_t(agent::ControlType::kKeySets)) return {m};
    auto msg = agent::DecodeControl(m);
    if (!msg.ok() || !std::holds_alternative<agent::KeySets>(*msg)) return {m};
    std::lock_guard<std::mutex> lock(drop->mu);
    if (drop->to_drop == 0) return {m};
    --drop->to_drop;
    ++drop->dropped;
    return {};
  };
  StartRoot(/*root_fanout=*/1, &policy);
  StartMember("relay", "eu");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 1; }, 30));
  for (const char* name : {"a", "b"}) StartMember(name, "eu");
  auto parent_of = [&](const std::string& id) {
    for (const auto& m : root_->Snapshot().members)
      if (m.id == id) return m.parent;
    return std::string("(not joined)");
  };
  ASSERT_TRUE(WaitFor([&] { return parent_of("a") == "relay" && parent_of("b") == "relay"; }, 30))
      << "a under " << parent_of("a") << ", b under " << parent_of("b");
  Publish(1);
  ASSERT_TRUE(AllServe(1)) << Lagging(1);

  KeySet ks;
  ks.seq = 1;
  ks.keys = {TrustedKey{key_b.public_key(), 0}};
  ks.revoked = {key_a.key_id()};
  const std::string signed_ks = *SignKeySet(key_a, ks);
  {
    std::lock_guard<std::mutex> lock(drop->mu);
    drop->to_drop = 2;
  }
  ASSERT_TRUE(root_->RotateKeys(signed_ks, *key_b.PrivateKeyPem()).ok());
  ASSERT_TRUE(WaitFor([&] { return Logged("relay", "key set 1 applied") == 1; }, 10));
  {
    std::lock_guard<std::mutex> lock(drop->mu);
    ASSERT_EQ(drop->dropped, 2);
  }
  // Well inside kSlowStaleMs of their last accepted beacon: they have not
  // dialled again yet.
  EXPECT_EQ(Logged("a", "key set 1 applied") + Logged("b", "key set 1 applied"), 0u);
  Publish(2);

  ASSERT_TRUE(AllServe(2)) << Lagging(2);
  ExpectBitwiseEqual(2);
  size_t refused = 0;
  for (const char* name : {"a", "b"}) {
    EXPECT_EQ(Logged(name, "key set 1 applied"), 1u) << name;
    EXPECT_EQ(Logged(name, "to the root: bad chunks"), 0u) << name << " blamed the relay";
    refused += Logged(name, "OFFER manifest", "untrusted key id");
    const AgentFreshness f = FreshnessOf(name);
    EXPECT_GE(f.beacons_untrusted, 1u) << Describe(name);
    EXPECT_EQ(f.beacons_forged, 0u) << Describe(name);
  }
  EXPECT_GE(refused, 1u) << "no child logged refusing the relay's OFFER of the new key's manifest";
  for (const auto& m : root_->Snapshot().members) {
    if (m.id != "relay") continue;
    EXPECT_EQ(m.demotions, 0u) << "the relay was planned around";
  }

  Publish(3);
  ASSERT_TRUE(AllServe(3)) << Lagging(3);
  ExpectBitwiseEqual(3);
}

}  // namespace
}  // namespace tern
