// The recovery from a wrong version number (docs/agent/board.md §4a): a
// supersede renumbers below HEAD into the next board epoch, through the
// root's admin port (POST /publish {"supersede": true}, PublishToRoot with
// AgentClientOptions::supersede) or Agent::Supersede; members follow it by
// position and never move back. Agents in one process over loopback; the
// same with real processes: tests/cli/test_agent.py.
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>

#include "agent/relay/data_wire.h"
#include "agent/testing/agent_test_fixture.h"
#include "tern/version_manifest.h"

namespace tern::agent_test {
namespace {

class AgentSupersedeTest : public AgentSystemFixture {
 protected:
  void SetUp() override {
    AgentSystemFixture::SetUp();
    tweak_ = [](AgentOptions& o) {
      if (o.id != "root") return;
      o.admin_listen = "127.0.0.1:0";
      o.admin_token = "t0ken";
      o.max_version_jump = 100;
    };
  }
  AgentClientOptions Client(bool force = false, bool supersede = false) const {
    AgentClientOptions c;
    c.token = "t0ken";
    c.timeout_ms = 60000;
    c.force = force;
    c.supersede = supersede;
    return c;
  }
  // Publishes the trace's next step as `version` over the admin port.
  Status PublishStep(uint64_t version, bool force = false, bool supersede = false) {
    const std::string path = NextStep();
    by_version_[version] = path;
    return PublishToRoot(root_->Snapshot().admin_address, path, version, Client(force, supersede));
  }
  std::string Dump() {
    std::lock_guard<std::mutex> lock(log_->mu);
    std::string out;
    for (const auto& l : log_->lines) out += l + "\n";
    return out;
  }
  std::map<uint64_t, std::string> by_version_;  // the checkpoint published as each version
};

// The operator's way in: every refusal of §4a's rules changes nothing, and
// the supersede itself is served by the root in epoch 1, bit for bit.
TEST_F(AgentSupersedeTest, TheAdminRouteRefusesWhatTheRulesForbidAndPublishesTheRest) {
  StartRoot();
  const std::string admin = root_->Snapshot().admin_address;
  // An empty board has nothing to withdraw.
  Status empty = PublishToRoot(admin, NextStep(), 1, Client(false, true));
  EXPECT_EQ(empty.code(), Code::kInvalidArgument) << empty.ToString();
  EXPECT_NE(empty.message().find("board is empty"), std::string::npos) << empty.ToString();
  ASSERT_TRUE(PublishStep(1).ok());
  ASSERT_TRUE(PublishStep(2).ok());
  // The wrong number: refused unless forced, then HEAD.
  Status far = PublishStep(1000000);
  EXPECT_NE(far.message().find("beyond HEAD"), std::string::npos) << far.ToString();
  Status forced = PublishToRoot(admin, by_version_[1000000], 1000000, Client(/*force=*/true));
  ASSERT_TRUE(forced.ok()) << forced.ToString();
  EXPECT_EQ(root_->Snapshot().head, 1000000u);
  // An ordinary publish below the wrong HEAD names the way back.
  const std::string right = NextStep();
  Status below = PublishToRoot(admin, right, 3, Client());
  EXPECT_EQ(below.code(), Code::kInvalidArgument) << below.ToString();
  EXPECT_NE(below.message().find("supersede"), std::string::npos) << below.ToString();
  // A supersede not below HEAD, to 0, or to a number the log holds.
  for (uint64_t v : {uint64_t{1000000}, uint64_t{1000001}, uint64_t{0}}) {
    Status s = PublishToRoot(admin, right, v, Client(false, true));
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << v << ": " << s.ToString();
    EXPECT_NE(s.message().find("not below HEAD"), std::string::npos) << s.ToString();
  }
  Status taken = PublishToRoot(admin, right, 2, Client(false, true));
  EXPECT_EQ(taken.code(), Code::kInvalidArgument) << taken.ToString();  // 409 on the wire
  EXPECT_NE(taken.message().find("in the board's log already"), std::string::npos)
      << taken.ToString();
  EXPECT_EQ(root_->Snapshot().head, 1000000u);
  EXPECT_EQ(root_->Snapshot().head_epoch, 0u);
  // The supersede: HEAD 3 of epoch 1, served by the root bit for bit.
  Status s = PublishToRoot(admin, right, 3, Client(false, true));
  ASSERT_TRUE(s.ok()) << s.ToString();
  AgentSnapshot snap = root_->Snapshot();
  EXPECT_EQ(snap.head, 3u);
  EXPECT_EQ(snap.head_epoch, 1u);
  EXPECT_EQ(snap.served_version, 3u);
  EXPECT_EQ(snap.served_epoch, 1u);
  EXPECT_EQ(FirstDifference(dir_ / "root" / "current", right), "");
  auto status = AgentStatusJson(admin, Client());
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_NE(status->find("\"head_epoch\": 1"), std::string::npos) << *status;
  EXPECT_NE(status->find("\"served_epoch\": 1"), std::string::npos) << *status;
  // The withdrawn number stays taken; the next ordinary publish works.
  Status again = PublishToRoot(admin, NextStep(), 1000000, Client(true));
  EXPECT_FALSE(again.ok());
  EXPECT_EQ(root_->Snapshot().head, 3u);
  ASSERT_TRUE(PublishStep(4).ok());
  snap = root_->Snapshot();
  EXPECT_EQ(snap.head, 4u);
  EXPECT_EQ(snap.head_epoch, 1u);
  EXPECT_EQ(FirstDifference(dir_ / "root" / "current", by_version_[4]), "");
  // In process, Agent::Supersede keeps the same rules.
  EXPECT_EQ(root_->Supersede(by_version_[4], 1000).code(), Code::kInvalidArgument);
  EXPECT_EQ(root_->Supersede(by_version_[4], 1).code(), Code::kAlreadyExists);
  EXPECT_EQ(root_->Snapshot().head, 4u);
}

// Members follow a supersede by position (§4a "Tests it needs"): 1, 2, the
// forced 1000000 that every member serves, then the supersede to 3 with the
// right weights: every member serves 3 in epoch 1 bit for bit (a relay's
// children through the tree), 4 follows as an ordinary publish, a member
// stopped during the supersede rejoins serving the withdrawn 1000000 and
// catches up, and the withdrawn version's validly signed manifest, replayed
// by a relay in front of 4's, is refused by its children ("serving 3 of
// epoch 1"); no member's position ever goes down.
TEST_F(AgentSupersedeTest, MembersFollowASupersedeAndNeverMoveBack) {
  CaptureLogs([](AgentOptions& o) {
    if (o.id != "root") return;
    o.admin_listen = "127.0.0.1:0";
    o.admin_token = "t0ken";
    o.max_version_jump = 100;
  });
  StartRoot(/*root_fanout=*/1);
  // The relay under the root replays what it once offered, when told to.
  struct Replay {
    std::mutex mu;
    ManifestVerifier root_key;
    std::map<uint64_t, std::string> offers;  // version -> an OFFER the relay sent
    uint64_t version = 0;                    // 0: off
    int replayed = 0;
  };
  auto replay = std::make_shared<Replay>();
  ASSERT_TRUE(replay->root_key.AddTrustedKeyPem(root_key_).ok());
  FaultPolicy policy;
  policy.rewrite_message = [replay](std::string m) -> std::vector<std::string> {
    if (agent::DataTypeOf(m) != uint8_t(agent::DataType::kOffer)) return {m};
    auto offer = agent::DecodeOffer(m);
    if (!offer.ok()) return {m};
    auto manifest = replay->root_key.Verify(offer->signed_manifest);
    if (!manifest.ok()) return {m};
    std::lock_guard<std::mutex> lock(replay->mu);
    replay->offers.emplace(manifest->version, m);
    if (replay->version != 0 && manifest->version != replay->version &&
        replay->offers.count(replay->version)) {
      ++replay->replayed;
      return {replay->offers[replay->version], m};
    }
    return {m};
  };
  StartMember("relay", "eu", &policy);
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 1; }, 30));
  for (const char* name : {"a", "b", "late"}) StartMember(name, "eu");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 4; }, 30));
  // Positions never go down, sampled while the test runs.
  std::atomic<bool> stop{false};
  std::mutex went_back_mu;
  std::string went_back;
  struct Joined {  // joins the sampler however the test ends
    std::atomic<bool>& stop;
    std::thread thread;
    ~Joined() {
      stop = true;
      if (thread.joinable()) thread.join();
    }
  } watch{stop, std::thread([&] {
    std::map<std::string, std::pair<uint32_t, uint64_t>> last;
    while (!stop) {
      for (const char* name : {"relay", "a", "b"}) {
        const AgentSnapshot s = members_[name].agent->Snapshot();
        const std::pair<uint32_t, uint64_t> pos{s.served_epoch, s.served_version};
        if (pos < last[name]) {
          std::lock_guard<std::mutex> lock(went_back_mu);
          went_back += std::string(name) + " " + std::to_string(last[name].second) + "->" +
                       std::to_string(pos.second) + "; ";
        }
        last[name] = pos;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  })};
  const std::string admin = root_->Snapshot().admin_address;
  auto served_as = [&](uint64_t version, uint32_t epoch) {
    for (auto& [id, m] : members_) {
      if (!m.agent) continue;
      const AgentSnapshot s = m.agent->Snapshot();
      EXPECT_EQ(s.served_epoch, epoch) << id;
      EXPECT_EQ(FirstDifference(m.dir + "/current", by_version_[version]), "") << id;
    }
  };
  ASSERT_TRUE(PublishStep(1).ok());
  ASSERT_TRUE(AllServe(1)) << Lagging(1) << Dump();
  ASSERT_TRUE(PublishStep(2).ok());
  ASSERT_TRUE(AllServe(2)) << Lagging(2) << Dump();
  ASSERT_TRUE(PublishStep(1000000, /*force=*/true).ok());
  ASSERT_TRUE(AllServe(1000000)) << Lagging(1000000) << Dump();
  served_as(1000000, 0);

  StopMember("late");
  Status s = PublishStep(3, false, /*supersede=*/true);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(AllServe(3)) << Lagging(3) << Dump();
  served_as(3, 1);
  for (const char* name : {"relay", "a", "b"}) {
    const AgentSnapshot snap = members_[name].agent->Snapshot();
    EXPECT_EQ(snap.head, 3u) << name;
    EXPECT_EQ(snap.head_epoch, 1u) << name;
  }
  // The events carry the epoch: a member's served 1000000 (epoch 0) and 3
  // (epoch 1), the root's published 3 (epoch 1).
  auto epoch_of = [](Agent& agent, AgentEvent::Kind kind, uint64_t version) -> int64_t {
    std::vector<AgentEvent> events;
    EXPECT_TRUE(agent.WaitEvents(0, 1024, 0, &events).ok());
    for (const AgentEvent& e : events)
      if (e.kind == kind && e.version == version) return e.epoch;
    return -1;
  };
  EXPECT_EQ(epoch_of(*members_["a"].agent, AgentEvent::Kind::kVersionServed, 1000000), 0);
  EXPECT_EQ(epoch_of(*members_["a"].agent, AgentEvent::Kind::kVersionServed, 3), 1);
  EXPECT_EQ(epoch_of(*root_, AgentEvent::Kind::kVersionPublished, 3), 1);
  EXPECT_EQ(epoch_of(*root_, AgentEvent::Kind::kVersionServed, 3), 1);

  // The relay replays the withdrawn version's manifest in front of 4's.
  {
    std::lock_guard<std::mutex> lock(replay->mu);
    ASSERT_TRUE(replay->offers.count(1000000)) << "the relay never offered 1000000";
    replay->version = 1000000;
  }
  ASSERT_TRUE(PublishStep(4).ok());
  ASSERT_TRUE(AllServe(4)) << Lagging(4) << Dump();
  served_as(4, 1);
  {
    std::lock_guard<std::mutex> lock(replay->mu);
    EXPECT_GE(replay->replayed, 1);
    replay->version = 0;
  }
  size_t refused = 0;
  for (const char* name : {"a", "b"})
    refused += Logged(name, "refusing a manifest for version 1000000 of epoch 0: serving 3 of epoch 1") +
               Logged(name, "refusing a manifest for version 1000000 of epoch 0: serving 4 of epoch 1");
  EXPECT_GE(refused, 1u) << "no child logged the replayed manifest's refusal";

  // The member stopped during the supersede rejoins serving the withdrawn
  // 1000000 (above HEAD's number, in the log) and catches up.
  StartMember("late", "eu");
  ASSERT_TRUE(AllServe(4)) << Lagging(4) << Dump();
  served_as(4, 1);
  EXPECT_EQ(members_["late"].agent->Snapshot().served_epoch, 1u);
  ASSERT_TRUE(PublishStep(5).ok());
  ASSERT_TRUE(AllServe(5)) << Lagging(5) << Dump();
  served_as(5, 1);
  stop = true;
  watch.thread.join();
  EXPECT_EQ(went_back, "");
}

}  // namespace
}  // namespace tern::agent_test
