// Adversaries in the tree, end to end through real agents (attacks on the
// trust model of docs/security.md: "a byte flipped in a forwarded chunk; a
// forged manifest; a relay that rewrites a chunk and its checksum; a
// replayed old version"): a relay member whose transport lies above the
// chunk checksum, one whose link flips a byte below it, and one whose
// transport rewrites the OFFERs it sends (a forged manifest, a replayed old
// one). The relay-level tests of the same checks, with a scripted parent,
// are in relay_test.cc.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/ops/admin_http.h"
#include "agent/relay/data_wire.h"
#include "agent/testing/agent_test_fixture.h"
#include "tern/version_manifest.h"

namespace tern {
namespace {

using agent_test::FirstDifference;
using agent_test::WaitFor;

class AgentAdversaryTest : public agent_test::AgentSystemFixture {
 protected:
  AgentMemberStatus MemberAtRoot(const std::string& id) {
    for (const auto& m : root_->Snapshot().members)
      if (m.id == id) return m;
    ADD_FAILURE() << id << " is not joined";
    return {};
  }

  std::vector<std::string> ChildrenOf(const std::string& id) {
    std::vector<std::string> out;
    for (const auto& m : root_->Snapshot().members)
      if (m.parent == id) out.push_back(m.id);
    return out;
  }
};

// Samples what members serve while a test runs: a member must never serve
// an older version than it did (no rollback by a replayed or forged
// version). Bounded: it stops when destroyed.
class ServedWatch {
 public:
  explicit ServedWatch(std::map<std::string, Agent*> agents) : agents_(std::move(agents)) {
    thread_ = std::thread([this] {
      std::map<std::string, uint64_t> last;
      while (!stop_) {
        for (const auto& [id, a] : agents_) {
          const uint64_t v = a->Snapshot().served_version;
          std::lock_guard<std::mutex> lock(mu_);
          if (v < last[id])
            went_back_ += id + ": " + std::to_string(last[id]) + " -> " + std::to_string(v) + "; ";
          last[id] = v;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
  }
  ~ServedWatch() {
    stop_ = true;
    thread_.join();
  }
  std::string went_back() {
    std::lock_guard<std::mutex> lock(mu_);
    return went_back_;
  }

 private:
  std::map<std::string, Agent*> agents_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::string went_back_;
  std::thread thread_;
};

// A relay that rewrites every chunk it forwards and recomputes the
// transport's checksum (a compromised machine): its children's transports
// accept each chunk, the signed SHA-256 per chunk refuses it, the children
// report the relay (PARENT_REPORT), the root demotes it to a leaf, and the
// chunks come from elsewhere: every member serves every version bit for bit.
TEST_F(AgentAdversaryTest, RelayRewritingChunksAndTheirChecksumIsCaughtAndDemoted) {
  CaptureLogs();
  tweak_ = [logs = tweak_](AgentOptions& o) {
    logs(o);
    if (o.id == "root") o.admin_listen = "127.0.0.1:0";
  };
  StartRoot(/*root_fanout=*/1);
  FaultPolicy liar;
  liar.tamper_at_byte = 0;
  liar.tamper_chunks = UINT32_MAX;  // it keeps lying
  StartMember("liar", "eu", &liar);
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 1; }, 30));
  for (int i = 0; i < 4; ++i) StartMember("m" + std::to_string(i), "eu");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 5; }, 30));
  const std::vector<std::string> below = ChildrenOf("liar");
  ASSERT_FALSE(below.empty());

  Publish(1);
  ASSERT_TRUE(AllServe(1)) << Lagging(1);
  ExpectBitwiseEqual(1);
  EXPECT_GE(transports_["liar"].fault->stats().tampered, 1u) << "the relay forwarded nothing";
  ASSERT_TRUE(WaitFor([&] { return MemberAtRoot("liar").demoted; }, 10));
  EXPECT_TRUE(ChildrenOf("liar").empty());
  // Its children's transports passed the chunks; SHA-256 refused them, and
  // a child reported the liar (the first report moves all its children).
  size_t refused = 0, reported = 0;
  for (const auto& id : below) {
    refused += Logged(id, "from liar failed SHA-256");
    reported += Logged(id, "reporting parent liar of stripe 0 to the root: bad chunks");
  }
  EXPECT_GE(refused, 1u);
  EXPECT_GE(reported, 1u);
  auto metrics = agent::AdminGet(root_->Snapshot().admin_address, "/metrics", {});
  ASSERT_TRUE(metrics.ok()) << metrics.status().ToString();
  EXPECT_NE(metrics->find("tern_agent_member_demoted{member=\"liar\",region=\"eu\"} 1"),
            std::string::npos)
      << *metrics;
  // Its probation shows: bad chunks wait 16 quiet periods (16 x 60 s) at once.
  EXPECT_NE(metrics->find("tern_agent_member_demotions_total{member=\"liar\",region=\"eu\"} 1\n"),
            std::string::npos)
      << *metrics;
  EXPECT_NE(metrics->find("tern_agent_member_probation_seconds{member=\"liar\",region=\"eu\"} 9"),
            std::string::npos)
      << *metrics;
  const AgentMemberStatus liar_status = MemberAtRoot("liar");
  EXPECT_EQ(liar_status.demoted_for, "bad chunks");
  EXPECT_EQ(liar_status.demotions, 1u);
  EXPECT_GT(liar_status.relay_again_in_s, 900);
  EXPECT_LE(liar_status.relay_again_in_s, 960);
  auto status = agent::AdminGet(root_->Snapshot().admin_address, "/status", {});
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_NE(status->find("\"demoted_for\": \"bad chunks\""), std::string::npos) << *status;
  EXPECT_NE(status->find("\"demotions\": 1,"), std::string::npos) << *status;

  Publish(2);
  ASSERT_TRUE(AllServe(2)) << Lagging(2);
  ExpectBitwiseEqual(2);
  EXPECT_TRUE(ChildrenOf("liar").empty());
}

// A byte flipped on a forwarding relay's link, below the transport's
// checksum (a bad NIC or cable, not a liar): the child's transport refuses
// the chunk, the relay sends it again, and nobody is blamed: no chunk fails
// SHA-256 at the children and the relay keeps them.
TEST_F(AgentAdversaryTest, ByteFlippedInAForwardedChunkIsResent) {
  StartRoot(/*root_fanout=*/1);
  FaultPolicy flaky;
  flaky.corrupt_at_byte = 1000;
  StartMember("flaky", "eu", &flaky);
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 1; }, 30));
  for (const char* name : {"a", "b"}) StartMember(name, "eu");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 3; }, 30));
  ASSERT_EQ(ChildrenOf("flaky").size(), 2u);

  Publish(1);
  ASSERT_TRUE(AllServe(1)) << Lagging(1);
  ExpectBitwiseEqual(1);
  EXPECT_EQ(transports_["flaky"].fault->stats().corrupted, 1u);
  // The relay's heartbeat counts its resend.
  ASSERT_TRUE(WaitFor([&] { return MemberAtRoot("flaky").chunk_retries >= 1; }, 10))
      << "the flipped chunk was not resent by the relay";
  for (const char* name : {"a", "b"}) {
    EXPECT_EQ(MemberAtRoot(name).chunk_retries, 0u) << name << " saw a chunk fail SHA-256";
    EXPECT_EQ(MemberAtRoot(name).parent, "flaky") << name;
  }
  EXPECT_FALSE(MemberAtRoot("flaky").demoted);

  Publish(2);
  ASSERT_TRUE(AllServe(2)) << Lagging(2);
  ExpectBitwiseEqual(2);
  EXPECT_FALSE(MemberAtRoot("flaky").demoted);
}

// A relay whose transport rewrites the OFFERs it sends its children. First
// it replays version 1's validly signed manifest in front of version 3's:
// the children refuse it (logged: they serve 2), keep serving 2 and take 3.
// Then it forges version 4's manifest (signed by another key, claiming the
// publisher's key id): the children refuse it (logged: the signature does
// not verify), drop and report the relay, the root demotes it, and version
// 4 comes from elsewhere. No member ever serves an older version than it
// did, and every one serves every version bit for bit.
TEST_F(AgentAdversaryTest, ForgedAndReplayedManifestsAreRefused) {
  CaptureLogs();
  StartRoot(/*root_fanout=*/1);
  struct Mitm {
    std::mutex mu;
    ManifestVerifier root_key;  // to read the versions of what passes
    ManifestSigner mallory = std::move(ManifestSigner::Generate()).value();
    std::map<uint64_t, std::string> offers;          // version -> an OFFER the relay sent
    uint64_t replay_version = 0, replay_before = 0;  // 0: off
    uint64_t forge_from = 0;                         // 0: off
    int replayed = 0, forged = 0;
  };
  auto mitm = std::make_shared<Mitm>();
  ASSERT_TRUE(mitm->root_key.AddTrustedKeyPem(root_key_).ok());
  FaultPolicy policy;
  policy.rewrite_message = [mitm](std::string m) -> std::vector<std::string> {
    if (agent::DataTypeOf(m) != uint8_t(agent::DataType::kOffer)) return {m};
    auto offer = agent::DecodeOffer(m);
    if (!offer.ok()) return {m};
    auto manifest = mitm->root_key.Verify(offer->signed_manifest);
    if (!manifest.ok()) return {m};
    std::lock_guard<std::mutex> lock(mitm->mu);
    mitm->offers.emplace(manifest->version, m);
    if (mitm->forge_from != 0 && manifest->version >= mitm->forge_from) {
      // The same manifest signed by mallory, with the publisher's key id
      // put in place of hers (the last 72 bytes: key id, signature).
      std::string forged = *mitm->mallory.Sign(*manifest);
      const size_t at = kManifestTrailerBytes;
      forged.replace(forged.size() - at, 8,
                     offer->signed_manifest.substr(offer->signed_manifest.size() - at, 8));
      ++mitm->forged;
      return {agent::EncodeOffer(agent::Offer{offer->object_index, std::move(forged)})};
    }
    if (mitm->replay_before != 0 && manifest->version >= mitm->replay_before &&
        mitm->offers.count(mitm->replay_version)) {
      ++mitm->replayed;
      return {mitm->offers[mitm->replay_version], m};
    }
    return {m};
  };
  StartMember("mitm", "eu", &policy);
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 1; }, 30));
  for (const char* name : {"a", "b"}) StartMember(name, "eu");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 3; }, 30));
  ASSERT_EQ(ChildrenOf("mitm").size(), 2u);
  ServedWatch watch({{"a", members_["a"].agent.get()}, {"b", members_["b"].agent.get()}});
  for (uint64_t v = 1; v <= 2; ++v) {
    Publish(v);
    ASSERT_TRUE(AllServe(v)) << Lagging(v);
  }

  // The replay.
  {
    std::lock_guard<std::mutex> lock(mitm->mu);
    ASSERT_TRUE(mitm->offers.count(1)) << "the relay never offered version 1";
    mitm->replay_version = 1;
    mitm->replay_before = 3;
  }
  Publish(3);
  ASSERT_TRUE(AllServe(3)) << Lagging(3);
  ExpectBitwiseEqual(3);
  {
    std::lock_guard<std::mutex> lock(mitm->mu);
    ASSERT_GE(mitm->replayed, 2);  // to each child
    mitm->replay_before = 0;
  }
  // A replay is not blamed on the parent (a re-offer used to look the same);
  // it can only hold a member back, and a parent that withholds the new
  // version is reported as stalled.
  for (const char* name : {"a", "b"}) {
    EXPECT_GE(Logged(name, "refusing a manifest for version 1: serving 2"), 1u) << name;
    EXPECT_EQ(MemberAtRoot(name).parent, "mitm") << name;
    EXPECT_EQ(MemberAtRoot(name).chunk_retries, 0u) << name;
  }
  EXPECT_FALSE(MemberAtRoot("mitm").demoted);

  // The forgery.
  {
    std::lock_guard<std::mutex> lock(mitm->mu);
    mitm->forge_from = 4;
  }
  Publish(4);
  ASSERT_TRUE(AllServe(4)) << Lagging(4);
  ExpectBitwiseEqual(4);
  {
    std::lock_guard<std::mutex> lock(mitm->mu);
    EXPECT_GE(mitm->forged, 1);
  }
  size_t refused = 0;
  for (const char* name : {"a", "b"}) refused += Logged(name, "manifest signature does not verify");
  EXPECT_GE(refused, 1u) << "no child logged why it refused the forged manifest";
  ASSERT_TRUE(WaitFor([&] { return MemberAtRoot("mitm").demoted; }, 10))
      << "the forging relay kept its place";
  EXPECT_TRUE(ChildrenOf("mitm").empty());

  Publish(5);
  ASSERT_TRUE(AllServe(5)) << Lagging(5);
  ExpectBitwiseEqual(5);
  EXPECT_EQ(watch.went_back(), "");
}

}  // namespace
}  // namespace tern
