// The agent's event ring (ordering, bounds, gaps, deadlines) and the
// --on-serve hook that follows it (coalescing, a deadline that kills, exit
// statuses counted).
#include "agent/daemon/event_ring.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "agent/daemon/serve_hook.h"
#include "tests/support/files.h"

namespace tern::agent {
namespace {

AgentEvent Served(uint64_t version, std::string slot = "/data/views/a") {
  AgentEvent e;
  e.kind = AgentEvent::Kind::kVersionServed;
  e.version = version;
  e.slot_dir = std::move(slot);
  e.changed_tensors = {"layer.0.w"};
  return e;
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(EventRing, NumbersKeepsTheNewestAndShowsAGap) {
  EventRing ring(SteadyClock(), /*capacity=*/4);
  for (uint64_t v = 1; v <= 6; ++v) EXPECT_EQ(ring.Push(Served(v)), v);
  std::vector<AgentEvent> out;
  ASSERT_TRUE(ring.Wait(0, 100, 0, &out).ok());
  // Events 1 and 2 were dropped: the first held is 3, above after + 1.
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out.front().seq, 3u);
  EXPECT_EQ(out.back().seq, 6u);
  EXPECT_EQ(out.back().version, 6u);
  ASSERT_TRUE(ring.Wait(4, 1, 0, &out).ok());
  ASSERT_EQ(out.size(), 1u);  // max_events
  EXPECT_EQ(out[0].seq, 5u);
  // Nothing newer: an empty answer once the timeout passes.
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(ring.Wait(6, 10, 150, &out).ok());
  EXPECT_TRUE(out.empty());
  EXPECT_GE(Since(t0), 0.14);
  // A seq beyond the ring's (a caller that outlived a restart): what is held.
  ASSERT_TRUE(ring.Wait(99, 10, 0, &out).ok());
  EXPECT_EQ(out.size(), 4u);
}

TEST(EventRing, AWaiterWakesForTheNextEventAndOnClose) {
  EventRing ring(SteadyClock(), 16, /*max_waiters=*/1);
  std::vector<AgentEvent> got;
  Status st;
  std::thread waiter([&] { st = ring.Wait(0, 10, 10000, &got); });
  // The bound on waiters: a second one is refused while the first waits.
  for (int i = 0; i < 1000 && ring.waiters() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(ring.waiters(), 1u);
  std::vector<AgentEvent> other;
  EXPECT_EQ(ring.Wait(0, 10, 50, &other).code(), Code::kResourceExhausted);
  EXPECT_TRUE(ring.Wait(0, 10, 0, &other).ok());  // no wait: no bound
  const auto t0 = std::chrono::steady_clock::now();
  ring.Push(Served(1));
  waiter.join();
  EXPECT_LT(Since(t0), 2.0);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].version, 1u);

  std::thread closed([&] { st = ring.Wait(1, 10, 10000, &got); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ring.Close();
  closed.join();
  EXPECT_EQ(st.code(), Code::kUnavailable);
  EXPECT_EQ(ring.Wait(0, 10, 0, &got).code(), Code::kUnavailable);
}

class ServeHookTest : public ::testing::Test {
 protected:
  LogFn Log() {
    return [this](std::string_view l) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.emplace_back(l);
    };
  }
  bool Logged(const std::string& part) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& l : lines_)
      if (l.find(part) != std::string::npos) return true;
    return false;
  }
  static bool WaitFor(const std::function<bool()>& cond, double seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    while (Since(t0) < seconds) {
      if (cond()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return cond();
  }
  tern::testing::TempDir tmp_{"serve_hook"};
  std::mutex mu_;
  std::vector<std::string> lines_;
};

// The event on stdin and in the environment; versions served while the
// hook was away are coalesced into one run for the newest.
TEST_F(ServeHookTest, RunsForTheNewestWithTheEvent) {
  EventRing ring(SteadyClock());
  const std::string out = tmp_ / "out";
  ring.Push(Served(1));
  ring.Push(Served(2));
  AgentEvent joined;
  joined.kind = AgentEvent::Kind::kMemberJoined;
  ring.Push(joined);
  AgentEvent third = Served(3, "/data/views/b");
  third.epoch = 2;  // after two supersedes (docs/agent/board.md §4a)
  ring.Push(third);
  ServeHook hook(ring,
                 "cat > " + out +
                     ".json; echo \"$TERN_EVENT_VERSION $TERN_EVENT_SLOT_DIR $TERN_EVENT_EPOCH\" > " +
                     out + ".env",
                 10000, Log());
  hook.Start();
  ASSERT_TRUE(WaitFor([&] { return hook.counts().ok.load() == 1; }, 10));
  EXPECT_EQ(hook.counts().coalesced.load(), 2u);
  auto j = nlohmann::json::parse(tern::testing::Slurp(out + ".json"));
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["epoch"], 2);
  EXPECT_EQ(j["kind"], "version_served");
  EXPECT_EQ(j["slot_dir"], "/data/views/b");
  EXPECT_EQ(j["changed_tensors"], nlohmann::json::array({"layer.0.w"}));
  EXPECT_EQ(tern::testing::Slurp(out + ".env"), "3 /data/views/b 2\n");
  // A later version runs again.
  ring.Push(Served(4));
  ASSERT_TRUE(WaitFor([&] { return hook.counts().ok.load() == 2; }, 10));
  EXPECT_TRUE(Logged("exited 0"));
  hook.Stop();
}

// A hook that outlives its deadline is killed (its children too) and
// counted; a failing one is counted as failed; neither stops the next run.
TEST_F(ServeHookTest, SlowHookIsKilledAndFailuresCounted) {
  EventRing ring(SteadyClock());
  const std::string marker = tmp_ / "late";
  ServeHook hook(
      ring,
      "if [ \"$TERN_EVENT_VERSION\" = 1 ]; then sleep 30; touch " + marker + "; else exit 3; fi",
      300, Log());
  hook.Start();
  const auto t0 = std::chrono::steady_clock::now();
  ring.Push(Served(1));
  ASSERT_TRUE(WaitFor([&] { return hook.counts().killed.load() == 1; }, 10));
  EXPECT_LT(Since(t0), 5.0);
  EXPECT_TRUE(Logged("killed after"));
  ring.Push(Served(2));
  ASSERT_TRUE(WaitFor([&] { return hook.counts().failed.load() == 1; }, 10));
  EXPECT_TRUE(Logged("exited 3"));
  hook.Stop();
  EXPECT_FALSE(std::filesystem::exists(marker));
}

// Stop kills a run in flight at once rather than waiting for it.
TEST_F(ServeHookTest, StopKillsARunInFlight) {
  EventRing ring(SteadyClock());
  ServeHook hook(ring, "sleep 30", 60000, Log());
  hook.Start();
  ring.Push(Served(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t0 = std::chrono::steady_clock::now();
  ring.Close();
  hook.Stop();
  EXPECT_LT(Since(t0), 5.0);
  EXPECT_EQ(hook.counts().killed.load(), 1u);
}

}  // namespace
}  // namespace tern::agent
