// AgentEventFollower (include/tern/agent.h) against a scripted admin port:
// a restarted agent whose new run numbered past the last seq read is
// followed from its first event; an agent that cannot be reached is polled
// again after a growing backoff; a refusal or a reply that is not the
// events' JSON is returned, not retried.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "agent/daemon/event_json.h"
#include "tern/agent.h"

namespace tern {
namespace {

// GET /events as an agent answers it, from a script the test changes.
class ScriptedAgent {
 public:
  enum class Mode { kOk, kUnauthorized, kBusy, kGarbage };

  ScriptedAgent() {
    server_.Get("/events", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mu_);
      const uint64_t after = std::stoull(req.get_param_value("after"));
      const size_t max = std::stoul(req.get_param_value("max"));
      afters_.push_back(after);
      switch (mode_) {
        case Mode::kUnauthorized:
          res.status = 401;
          res.set_content(R"({"error": "admin: missing or wrong bearer token"})",
                          "application/json");
          return;
        case Mode::kBusy:
          res.status = 503;
          res.set_content(R"({"error": "events: 4 listeners already wait"})", "application/json");
          return;
        case Mode::kGarbage:
          res.set_content(R"({"events": 7})", "application/json");
          return;
        case Mode::kOk:
          break;
      }
      // The ring's rule: the events after `after`; an `after` beyond the
      // newest (from before a restart) counts as 0.
      const uint64_t last = events_.empty() ? 0 : events_.back().seq;
      const uint64_t from = after > last ? 0 : after;
      std::vector<AgentEvent> out;
      for (const AgentEvent& e : events_)
        if (e.seq > from && out.size() < max) out.push_back(e);
      res.set_content(agent::EventsReplyJson(out, after, last, run_), "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // httplib 0.11's stop() does nothing before the loop runs: wait for it.
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~ScriptedAgent() {
    server_.stop();
    thread_.join();
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // A new process: `count` events published, versions 1..count.
  void Restart(std::string run, uint64_t count) {
    std::lock_guard<std::mutex> lock(mu_);
    run_ = std::move(run);
    events_.clear();
    for (uint64_t v = 1; v <= count; ++v) {
      AgentEvent e;
      e.seq = v;
      e.kind = AgentEvent::Kind::kVersionPublished;
      e.version = v;
      e.all_tensors = true;
      events_.push_back(e);
    }
  }
  void set_mode(Mode m) {
    std::lock_guard<std::mutex> lock(mu_);
    mode_ = m;
  }
  std::vector<uint64_t> afters() {
    std::lock_guard<std::mutex> lock(mu_);
    return afters_;
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  Mode mode_ = Mode::kOk;
  std::string run_;
  std::vector<AgentEvent> events_;
  std::vector<uint64_t> afters_;
};

AgentEventFollower::Options Fast() {
  AgentEventFollower::Options o;
  o.poll_ms = 0;
  o.backoff_min_ms = 40;
  o.backoff_max_ms = 160;
  return o;
}

std::vector<uint64_t> Versions(const std::vector<AgentEvent>& events) {
  std::vector<uint64_t> v;
  for (const AgentEvent& e : events) v.push_back(e.version);
  return v;
}

double SecondsOf(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(AgentEventFollower, ANewRunThatNumberedPastIsFollowedFromItsFirstEvent) {
  ScriptedAgent agent;
  agent.Restart("run-a", 3);
  std::atomic<bool> cancel{false};
  AgentEventFollower f(agent.address(), {}, 0, Fast());
  auto got = f.Next(cancel);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(Versions(*got), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(f.after_seq(), 3u);
  EXPECT_EQ(f.run(), "run-a");
  // The agent restarts and numbers 5 events before the next poll: after
  // seq 3 it would answer 4 and 5 only (no gap, no restart to see).
  agent.Restart("run-b", 5);
  got = f.Next(cancel);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(Versions(*got), (std::vector<uint64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(f.after_seq(), 5u);
  EXPECT_EQ(f.run(), "run-b");
  EXPECT_EQ(agent.afters(), (std::vector<uint64_t>{0, 3, 0}));
  // Nothing new: no events, the same place.
  got = f.Next(cancel);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->empty());
  EXPECT_EQ(f.after_seq(), 5u);
}

TEST(AgentEventFollower, ARestartWithFewerEventsIsSeenByTheAgentsOwnRule) {
  ScriptedAgent agent;
  agent.Restart("", 4);  // an agent older than "run"
  std::atomic<bool> cancel{false};
  AgentEventFollower f(agent.address(), {}, 0, Fast());
  ASSERT_TRUE(f.Next(cancel).ok());
  agent.Restart("", 2);
  auto got = f.Next(cancel);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(Versions(*got), (std::vector<uint64_t>{1, 2}));
}

TEST(AgentEventFollower, AnAgentThatCannotBeReachedIsPolledAgainAfterAGrowingBackoff) {
  std::string address;
  {
    ScriptedAgent gone;  // a port nobody listens on once it is destroyed
    address = gone.address();
  }
  std::atomic<bool> cancel{false};
  AgentEventFollower f(address, {}, 7, Fast());
  std::vector<double> took;
  for (int i = 0; i < 4; ++i)
    took.push_back(SecondsOf([&] {
      auto got = f.Next(cancel);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_TRUE(got->empty());
    }));
  EXPECT_GE(took[0], 0.035);  // 40 ms
  EXPECT_GE(took[1], 0.075);  // 80 ms
  EXPECT_GE(took[2], 0.155);  // 160 ms: the ceiling
  EXPECT_GE(took[3], 0.155);
  EXPECT_LT(took[3], 2.0);
  EXPECT_EQ(f.after_seq(), 7u);
  // Cancelled: the backoff ends at once.
  cancel = true;
  EXPECT_LT(SecondsOf([&] { ASSERT_TRUE(f.Next(cancel).ok()); }), 0.1);
}

TEST(AgentEventFollower, BusyListenersAreRetriedRefusalsAndGarbageAreReturned) {
  ScriptedAgent agent;
  agent.Restart("r", 2);
  std::atomic<bool> cancel{false};
  AgentEventFollower f(agent.address(), {}, 0, Fast());
  agent.set_mode(ScriptedAgent::Mode::kBusy);
  auto got = f.Next(cancel);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->empty());
  agent.set_mode(ScriptedAgent::Mode::kOk);
  got = f.Next(cancel);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->size(), 2u);
  agent.set_mode(ScriptedAgent::Mode::kUnauthorized);
  got = f.Next(cancel);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Code::kAuth);
  EXPECT_NE(got.status().message().find("bearer token"), std::string::npos);
  agent.set_mode(ScriptedAgent::Mode::kGarbage);
  got = f.Next(cancel);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Code::kProtocol);
  EXPECT_NE(got.status().message().find("events is not an array"), std::string::npos);
  EXPECT_EQ(f.after_seq(), 2u);
}

}  // namespace
}  // namespace tern
