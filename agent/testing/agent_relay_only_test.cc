// Relay-only members (AgentOptions::relay_only, docs/agent.md §4): they join,
// relay every version, verify and forward, and serve nothing — no view
// store, no DIR/current. One process over the loopback transport: a root
// and two regions whose relays are relay-only members (one the region's
// head, one joined below a serving head), their children serving every
// version bit for bit, and a child of a relay-only member that falls behind
// catching up from the root.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "agent/testing/agent_test_fixture.h"
#include "agent/testing/agent_test_util.h"
#include "tern/agent.h"

namespace tern {
namespace {

namespace fs = std::filesystem;

using agent_test::FirstDifference;
using agent_test::WaitFor;

// The system tests' fixture; members whose id names a relay are relay-only,
// and every agent's log is captured.
class RelayOnlyTest : public agent_test::AgentSystemFixture {
 protected:
  void SetUp() override {
    AgentSystemFixture::SetUp();
    CaptureLogs([](AgentOptions& o) { o.relay_only = IsRelayOnly(o.id); });
  }

  static bool IsRelayOnly(const std::string& name) {
    return name.find("relay") != std::string::npos;
  }

  // Joins one member and waits until the root has planned it, so that the
  // tree follows the join order.
  void Join(const std::string& name, const std::string& region) {
    const size_t before = root_->Snapshot().members.size();
    StartMember(name, region);
    ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == before + 1; }, 30))
        << name;
  }

  // A member's options as StartMember makes them, for starts expected to fail.
  AgentOptions Options(const std::string& name) {
    AgentOptions o = BaseOptions(name);
    o.join = "root";
    o.region = "us";
    o.trusted_keys_pem = {root_key_};
    o.transport = NewTransportFor(name);
    return o;
  }

  // Serving members serve `version`; relay-only ones hold it.
  bool AllAt(uint64_t version) {
    return WaitFor(
        [&] {
          for (auto& [id, m] : members_) {
            const AgentSnapshot s = m.agent->Snapshot();
            if ((IsRelayOnly(id) ? s.held_version : s.served_version) != version) return false;
          }
          return true;
        },
        60);
  }
  std::string Where() {
    std::string out;
    for (auto& [id, m] : members_) {
      const AgentSnapshot s = m.agent->Snapshot();
      out +=
          id + "@" + std::to_string(s.served_version) + "/" + std::to_string(s.held_version) + " ";
    }
    return out;
  }
};

TEST_F(RelayOnlyTest, RelayOnlyMembersRelayEveryVersionAndServeNothing) {
  StartRoot();
  // ap: the relay-only member joins first and heads the region.
  Join("ap-relay", "ap");
  for (const char* name : {"ap-a", "ap-b", "ap-c"}) Join(name, "ap");
  // eu: a serving head; the relay-only member and eu-b fill it (fan-out 2);
  // eu-c and eu-d then find two slots at depth 2 and take eu-relay's,
  // although eu-b sorts first (docs/topology.md, relay-only members).
  for (const char* name : {"eu-a", "eu-relay"}) Join(name, "eu");
  for (const char* name : {"eu-b", "eu-c", "eu-d"}) Join(name, "eu");
  Join("us-a", "us");

  auto tree = [&] {
    std::map<std::string, AgentMemberStatus> by_id;
    for (const auto& m : root_->Snapshot().members) by_id[m.id] = m;
    return by_id;
  };
  {
    auto t = tree();
    EXPECT_EQ(t["ap-relay"].parent, "root");
    EXPECT_EQ(t["ap-a"].parent, "ap-relay");
    EXPECT_EQ(t["ap-b"].parent, "ap-relay");
    EXPECT_EQ(t["eu-relay"].parent, "eu-a");
    EXPECT_EQ(t["eu-c"].parent, "eu-relay");
    EXPECT_EQ(t["eu-d"].parent, "eu-relay");
    EXPECT_TRUE(t["ap-relay"].relay_only && t["eu-relay"].relay_only && !t["eu-a"].relay_only);
  }

  auto check = [&](uint64_t v) {
    ASSERT_TRUE(AllAt(v)) << "version " << v << ": " << Where();
    for (auto& [id, m] : members_) {
      const std::string dir = (dir_ / id).string();
      if (IsRelayOnly(id)) {
        // No view, no spare, nothing served; what it keeps on disk is the
        // last few versions' objects.
        EXPECT_FALSE(fs::exists(fs::symlink_status(dir + "/current"))) << id;
        EXPECT_FALSE(fs::exists(dir + "/views")) << id;
        EXPECT_EQ(m.agent->Snapshot().served_version, 0u) << id;
        for (const auto& f : fs::directory_iterator(dir + "/objects")) {
          const std::string name = f.path().filename().string();
          const uint64_t to = std::stoull(name.substr(name.rfind('-') + 1));
          EXPECT_GT(to + 4, v) << id << " still keeps " << name << " at version " << v;
        }
      } else {
        EXPECT_EQ(FirstDifference(dir + "/current", steps_[v]), "") << id << " at version " << v;
      }
    }
  };
  for (uint64_t v = 1; v <= 3; ++v) {
    Publish(v);
    check(v);
  }

  // A child of the relay-only member falls five versions behind and comes
  // back: eu-relay keeps the last four versions' objects only, so the
  // child catches up from the root's object service as any member would,
  // planned under eu-relay again.
  members_.erase("eu-c");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 9; }, 30));
  for (uint64_t v = 4; v <= 8; ++v) {
    Publish(v);
    check(v);
  }
  Join("eu-c", "eu");
  EXPECT_EQ(tree()["eu-c"].parent, "eu-relay");
  check(8);
  EXPECT_GE(Logged("eu-c", "came from the board's object service"), 1u);
  Publish(9);
  check(9);

  // The root's view: relay-only members report the version they hold, lag
  // 0, and forwarded bytes to their children.
  for (const char* id : {"ap-relay", "eu-relay"}) {
    EXPECT_TRUE(WaitFor(
        [&] {
          auto m = tree()[id];
          return m.served_version == 9 && m.lag == 0 && m.bytes_out > 0;
        },
        10))
        << id << ": version " << tree()[id].served_version << ", lag " << tree()[id].lag
        << ", bytes out " << tree()[id].bytes_out;
  }
  EXPECT_EQ(Logged("ap-relay", "serving version"), 0u);
  for (const auto& v : root_->Snapshot().versions) EXPECT_GE(v.last_served_s, 0) << v.version;
}

TEST_F(RelayOnlyTest, RelayOnlyRefusesAServingDirAndServingMembersFlags) {
  StartRoot();
  Join("m", "us");
  Publish(1);
  ASSERT_TRUE(AllAt(1)) << Where();
  members_.clear();
  // m's DIR serves a view: a relay-only member there would leave it stale.
  AgentOptions o = Options("m");
  o.relay_only = true;
  auto a = Agent::Start(o);
  ASSERT_EQ(a.status().code(), Code::kInvalidArgument) << a.status().ToString();
  EXPECT_NE(a.status().message().find("current exists"), std::string::npos)
      << a.status().ToString();
  // A seed, or no relaying, makes no sense for it.
  AgentOptions seeded = Options("s");
  seeded.relay_only = true;
  seeded.seed_checkpoint = steps_[1];
  seeded.seed_version = 1;
  EXPECT_EQ(Agent::Start(seeded).status().code(), Code::kInvalidArgument);
  AgentOptions leaf = Options("l");
  leaf.relay_only = true;
  leaf.may_relay = false;
  EXPECT_EQ(Agent::Start(leaf).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace tern
