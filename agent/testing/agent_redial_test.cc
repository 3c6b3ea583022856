// A relay parent that dies while cut off from the root (docs/agent.md §7):
// its children redial it with backoff, not on every tick, and log a
// bounded number of lines until the root, which hears nothing from it,
// drops it after --dead-after-ms and moves them.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "agent/testing/agent_test_fixture.h"

namespace tern {
namespace {

using agent_test::WaitFor;

class AgentRedialTest : public agent_test::AgentSystemFixture {
 protected:
  std::string ParentAtRoot(const std::string& id) {
    for (const auto& m : root_->Snapshot().members)
      if (m.id == id) return m.parent;
    return "(not joined)";
  }

  // Every captured line, for a failure's message.
  std::string AllLines() {
    std::lock_guard<std::mutex> lock(log_->mu);
    std::string out;
    for (const auto& l : log_->lines) out += l + "\n";
    return out;
  }
};

// The relay's process stops (its children's links close, its port refuses
// dials) while its connections to the root stay open and silent (a relay
// cut off from the root: no LEAVE, no close; the fault transport holds them
// open). Each child dials it again after 0.1, 0.2, 0.4, 0.8, 1.6 s: about
// 5 dials in the 3 s before the root drops it (one per 50 ms tick before:
// about 60), one log line of the agent's own per child, one relay line per
// dial. Then the children serve the next version bit for bit.
TEST_F(AgentRedialTest, ChildrenOfASilentlyCutOffRelayRedialWithBackoff) {
  constexpr uint32_t kDeadAfterMs = 3000;
  CaptureLogs([](AgentOptions& o) { o.dead_after_ms = kDeadAfterMs; });
  StartRoot(/*root_fanout=*/1);
  auto cut = std::make_shared<std::atomic<bool>>(false);
  FaultPolicy silent;
  silent.silence_made_connections = [cut] { return cut->load(); };
  StartMember("relay", "eu", &silent);
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 1; }, 30));
  StartMember("c0", "eu");
  StartMember("c1", "eu");
  ASSERT_TRUE(WaitFor([&] { return root_->Snapshot().members.size() == 3; }, 30));
  ASSERT_EQ(ParentAtRoot("c0"), "relay");
  ASSERT_EQ(ParentAtRoot("c1"), "relay");
  Publish(1);
  ASSERT_TRUE(AllServe(1)) << Lagging(1);
  ASSERT_TRUE(WaitFor(
      [&] {
        return members_["c0"].agent->Snapshot().parent == "relay" &&
               members_["c1"].agent->Snapshot().parent == "relay";
      },
      30));

  // Cut off from the root, then stopped: the root hears nothing (no LEAVE,
  // no close), its children see their links close and their dials refused.
  cut->store(true);
  members_["relay"].agent->Stop();
  members_["relay"].agent.reset();  // its transport stays: it holds the silent connections
  members_.erase("relay");
  ASSERT_TRUE(
      WaitFor([&] { return ParentAtRoot("c0") != "relay" && ParentAtRoot("c1") != "relay"; }, 30));
  ASSERT_TRUE(WaitFor(
      [&] {
        return members_["c0"].agent->Snapshot().parent != "relay" &&
               members_["c1"].agent->Snapshot().parent != "relay";
      },
      30));
  for (const char* child : {"c0", "c1"}) {
    // One relay line per failed link: the link that closed, then each dial.
    const size_t dials = Logged(child, "relay: parent relay (stripe 0) failed");
    EXPECT_GE(dials, 2u) << child << ": the dead parent was never dialled again";
    EXPECT_LE(dials, 10u) << child << ": redialled without backoff";
    EXPECT_EQ(Logged(child, "parent relay of stripe 0 failed"), 1u) << child;
    EXPECT_LE(Logged(child, "parent relay of stripe 0"), 2u) << child;  // + the summary
  }
  if (HasFailure()) ADD_FAILURE() << AllLines();
  Publish(2);
  ASSERT_TRUE(AllServe(2)) << Lagging(2);
  ExpectBitwiseEqual(2);
}

}  // namespace
}  // namespace tern
