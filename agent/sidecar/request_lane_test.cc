// The request lane's parsing and stamps, and the gate's admission rules.
#include "agent/sidecar/request_lane.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "agent/sidecar/commit_point.h"
#include "agent/sidecar/version_gate.h"

namespace tern::agent {
namespace {

VersionConstraint Parse(const std::string& body_text, Status* error = nullptr) {
  Json body = Json::parse(body_text);
  auto c = TakeConstraint(body);
  if (error) *error = c.ok() ? Status::Ok() : c.status();
  return c.ok() ? *c : VersionConstraint{};
}

TEST(RequestLane, TakesTheSeedSystemsField) {
  Json body = Json::parse(
      R"({"model":"m","weight_version":{"min_version":3,"exact_version":null},"prompt":"p"})");
  auto c = TakeConstraint(body);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->min_version, 3u);
  EXPECT_FALSE(c->exact_version);
  EXPECT_EQ(body.dump(), R"({"model":"m","prompt":"p"})");  // removed, order kept
  EXPECT_EQ(Parse(R"({"weight_version":{"exact_version":7}})").exact_version, 7u);
  EXPECT_FALSE(Parse(R"({"weight_version":null})").Target());
  EXPECT_FALSE(Parse(R"({"prompt":"p"})").Target());
}

TEST(RequestLane, RefusesMalformedLanes) {
  for (const char* bad :
       {R"({"weight_version":3})", R"({"weight_version":"3"})", R"({"weight_version":[3]})",
        R"({"weight_version":{"min_version":"3"}})", R"({"weight_version":{"min_version":-1}})",
        R"({"weight_version":{"exact_version":1.5}})",
        R"({"weight_version":{"exact_version":true}})",
        R"({"weight_version":{"max_version":3}})"}) {
    Status error;
    Parse(bad, &error);
    EXPECT_EQ(error.code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(error.message().find("weight_version"), std::string::npos) << error.message();
    EXPECT_EQ(error.message().find(".cc:"), std::string::npos) << "no source location for clients";
  }
}

TEST(RequestLane, SatisfiedByFollowsTheSeed) {
  VersionConstraint none, min3{3, {}}, exact5{{}, 5};
  EXPECT_TRUE(none.SatisfiedBy(std::nullopt));
  EXPECT_FALSE(min3.SatisfiedBy(std::nullopt));
  EXPECT_TRUE(none.SatisfiedBy(1));
  EXPECT_FALSE(min3.SatisfiedBy(2));
  EXPECT_TRUE(min3.SatisfiedBy(3));
  EXPECT_TRUE(exact5.SatisfiedBy(5));
  EXPECT_FALSE(exact5.SatisfiedBy(6));
  EXPECT_EQ(exact5.Target(), 5u);
}

TEST(RequestLane, HeadersRaiseTheFloor) {
  auto c = WithHeaders(VersionConstraint{2, {}}, "4", "", 10);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->min_version, 4u);
  c = WithHeaders(VersionConstraint{}, "", "3", 10);  // at most 3 behind head 10
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->min_version, 7u);
  EXPECT_FALSE(WithHeaders(VersionConstraint{}, "x1", "", 10).ok());
  EXPECT_FALSE(WithHeaders(VersionConstraint{}, "", "-1", 10).ok());
  EXPECT_FALSE(WithHeaders(VersionConstraint{{}, 3}, "5", "", 10).ok());  // exact below floor
}

TEST(RequestLane, NotReadyBodyHasTheSeedsKeys) {
  Json j = Json::parse(NotReadyBody(VersionConstraint{4, {}}, 3));
  EXPECT_EQ(j["type"], "WeightVersionNotReady");
  EXPECT_EQ(j["target_version"], 4);
  EXPECT_EQ(j["applied"], 3);
  EXPECT_TRUE(j["message"].is_string());
  EXPECT_EQ(j.size(), 4u);
  j = Json::parse(NotReadyBody(VersionConstraint{}, std::nullopt));
  EXPECT_TRUE(j["target_version"].is_null());
  EXPECT_TRUE(j["applied"].is_null());
}

TEST(RequestLane, StampsTopLevelOrMetaInfo) {
  Json openai = Json::parse(R"({"id":"x","choices":[]})");
  StampResponse(openai, 3, 4);
  EXPECT_EQ(openai["weight_version_start"], 3);
  EXPECT_EQ(openai["weight_version_end"], 4);
  Json generate = Json::parse(R"({"text":"t","meta_info":{"id":"r"}})");
  StampResponse(generate, 5, 5);
  EXPECT_EQ(generate["meta_info"]["weight_version_start"], 5);
  EXPECT_EQ(generate["meta_info"]["weight_version"], "5");
  EXPECT_FALSE(generate.contains("weight_version_start"));
}

TEST(RequestLane, StampsEventsSplitAnywhere) {
  const std::string stream = "data: {\"id\":\"a\"}\n\ndata: {}\n\n: comment\n\ndata: [DONE]\n\n";
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    EventStamper s(2, /*meta_info=*/false);
    std::string out;
    s.Feed(stream.substr(0, cut), 3, out);
    s.Feed(stream.substr(cut), 3, out);
    s.Flush(out);
    EXPECT_EQ(out,
              "data: {\"weight_version_start\":2,\"weight_version_end\":3,\"id\":\"a\"}\n\n"
              "data: {\"weight_version_start\":2,\"weight_version_end\":3}\n\n"
              ": comment\n\ndata: [DONE]\n\n")
        << cut;
  }
  EventStamper g(1, /*meta_info=*/true);
  std::string out;
  g.Feed("data: {\"text\":\"t\",\"meta_info\":{\"k\":1}}\r\n\r\n", 1, out);
  EXPECT_NE(out.find(R"("meta_info":{"k":1,"weight_version":"1","weight_version_start":1)"),
            std::string::npos)
      << out;
  EXPECT_TRUE(out.ends_with("\r\n\r\n"));
}

TEST(RequestLane, OversizedEventPassesThroughUnstamped) {
  EventStamper s(1, false, /*max_event_bytes=*/16);
  std::string out;
  const std::string big = "data: {\"x\":\"" + std::string(64, 'a') + "\"}";
  s.Feed(big.substr(0, 40), 1, out);
  s.Feed(big.substr(40) + "\n\ndata: {}\n\n", 1, out);
  EXPECT_EQ(out, big + "\n\ndata: {\"weight_version_start\":1,\"weight_version_end\":1}\n\n");
}

TEST(VersionGate, RefusesUntilAVersionIsApplied) {
  VersionGate gate(CommitMode::kQuiesce);
  EXPECT_FALSE(gate.Admit(VersionConstraint{}, 0).ticket);
  ASSERT_TRUE(gate.Commit(3, nullptr, 1000).ok());
  auto a = gate.Admit(VersionConstraint{}, 0);
  ASSERT_TRUE(a.ticket);
  EXPECT_EQ(a.ticket->start_version(), 3u);
  EXPECT_FALSE(gate.Admit(VersionConstraint{{}, 2}, 0).ticket);
}

TEST(VersionGate, BehindButReachableWaitsForTheCommit) {
  VersionGate gate(CommitMode::kInPlace);
  ASSERT_TRUE(gate.Commit(1, nullptr, 1000).ok());
  // Unknown version: refused at once, no wait.
  auto t0 = std::chrono::steady_clock::now();
  auto a = gate.Admit(VersionConstraint{2, {}}, 5000);
  EXPECT_FALSE(a.ticket);
  EXPECT_FALSE(a.waited);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  gate.SetHead(2);
  std::thread committer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(gate.Commit(2, nullptr, 1000).ok());
  });
  a = gate.Admit(VersionConstraint{2, {}}, 5000);
  committer.join();
  ASSERT_TRUE(a.ticket);
  EXPECT_TRUE(a.waited);
  EXPECT_EQ(a.ticket->start_version(), 2u);
  gate.SetHead(3);
  a = gate.Admit(VersionConstraint{3, {}}, 30);  // reachable, but not in time
  EXPECT_FALSE(a.ticket);
  EXPECT_EQ(a.applied, 2u);
}

TEST(VersionGate, QuiesceDrainsAndInPlaceDrainsOnlyExact) {
  for (CommitMode mode : {CommitMode::kQuiesce, CommitMode::kInPlace}) {
    VersionGate gate(mode);
    ASSERT_TRUE(gate.Commit(1, nullptr, 1000).ok());
    auto loose = gate.Admit(VersionConstraint{}, 0);
    ASSERT_TRUE(loose.ticket);
    std::atomic<bool> applied{false};
    Status s = gate.Commit(
        2,
        [&] {
          applied = true;
          return Status::Ok();
        },
        50);
    if (mode == CommitMode::kQuiesce) {
      EXPECT_EQ(s.code(), Code::kTimeout);  // the loose request is still in flight
      EXPECT_FALSE(applied);
      EXPECT_EQ(gate.applied(), 1u);
    } else {
      EXPECT_TRUE(s.ok());
      EXPECT_EQ(gate.SettledVersion(), 2u);
    }
    loose.ticket.reset();
    auto exact = gate.Admit(VersionConstraint{{}, *gate.applied()}, 0);
    ASSERT_TRUE(exact.ticket);
    EXPECT_EQ(gate.Commit(9, nullptr, 50).code(), Code::kTimeout);
    exact.ticket.reset();
    EXPECT_TRUE(gate.Commit(9, nullptr, 50).ok());
    EXPECT_EQ(gate.applied(), 9u);
  }
}

TEST(VersionGate, FailedApplyKeepsTheVersion) {
  VersionGate gate(CommitMode::kInPlace);
  ASSERT_TRUE(gate.Commit(4, nullptr, 1000).ok());
  EXPECT_EQ(gate.Commit(
                    5, [] { return Status(Code::kIo, "engine refused"); }, 1000)
                .code(),
            Code::kIo);
  EXPECT_EQ(gate.applied(), 4u);
  EXPECT_FALSE(gate.committing());
}

TEST(VersionGate, CommitIfUnchangedSkipsAfterAnotherCommit) {
  VersionGate gate(CommitMode::kInPlace);
  ASSERT_TRUE(gate.Commit(4, nullptr, 1000).ok());
  const uint64_t seen = gate.commits();
  ASSERT_TRUE(gate.Commit(5, nullptr, 1000).ok());  // a commit point flipped past it
  ASSERT_TRUE(gate.CommitIfUnchanged(4, seen, 1000).ok());
  EXPECT_EQ(gate.applied(), 5u);  // not flipped back
  ASSERT_TRUE(gate.CommitIfUnchanged(6, gate.commits(), 1000).ok());
  EXPECT_EQ(gate.applied(), 6u);
}

// The commit point an engine driver holds open: exact-version requests
// drain before Begin returns, none is admitted while it is open, End flips
// (or not) and reopens.
TEST(CommitPoint, HoldsAdmissionClosedFromBeginToEnd) {
  VersionGate gate(CommitMode::kInPlace);
  ASSERT_TRUE(gate.Commit(1, nullptr, 1000).ok());
  CommitPoint commit(gate, 5000, 60000);
  auto exact = gate.Admit(VersionConstraint{{}, 1}, 0);
  ASSERT_TRUE(exact.ticket);
  auto begun = std::async(std::launch::async, [&] { return commit.Begin(2, 10000); });
  EXPECT_EQ(begun.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout)
      << "Begin returned with an exact-version request in flight";
  exact.ticket.reset();
  ASSERT_TRUE(begun.get().ok());
  EXPECT_TRUE(commit.open());
  // While open, nothing is admitted: not an exact 1, nor a request for any version.
  auto late_exact = std::async(std::launch::async,
                               [&] { return gate.Admit(VersionConstraint{{}, 1}, 0); });
  auto late_any = std::async(std::launch::async, [&] { return gate.Admit(VersionConstraint{}, 0); });
  EXPECT_EQ(late_exact.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  EXPECT_EQ(late_any.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  EXPECT_EQ(commit.Begin(3, 1000).code(), Code::kUnavailable);  // one at a time
  EXPECT_EQ(commit.End(3, true).code(), Code::kNotFound);       // not the open one
  ASSERT_TRUE(commit.End(2, true).ok());
  EXPECT_EQ(gate.applied(), 2u);
  EXPECT_FALSE(commit.open());
  EXPECT_FALSE(late_exact.get().ticket);  // version 1 has passed
  auto any = late_any.get();
  ASSERT_TRUE(any.ticket);
  EXPECT_EQ(any.ticket->start_version(), 2u);
}

TEST(CommitPoint, NotLoadedOrNotEndedKeepsTheVersion) {
  VersionGate gate(CommitMode::kInPlace);
  ASSERT_TRUE(gate.Commit(4, nullptr, 1000).ok());
  CommitPoint commit(gate, 1000, 60000);
  ASSERT_TRUE(commit.Begin(5, 10000).ok());
  ASSERT_TRUE(commit.End(5, false).ok());
  EXPECT_EQ(gate.applied(), 4u);
  // A driver that never ends: the hold time ends the commit, not loaded,
  // and admission reopens; its late End finds nothing.
  ASSERT_TRUE(commit.Begin(5, 50).ok());
  EXPECT_TRUE(gate.Admit(VersionConstraint{}, 0).ticket);  // waited out the hold
  EXPECT_EQ(gate.applied(), 4u);
  EXPECT_EQ(commit.End(5, true).code(), Code::kNotFound);
  EXPECT_EQ(gate.applied(), 4u);
  // Bounds.
  EXPECT_EQ(commit.Begin(0, 10).code(), Code::kInvalidArgument);
  EXPECT_EQ(commit.Begin(6, 0).code(), Code::kInvalidArgument);
  EXPECT_EQ(commit.Begin(6, 60001).code(), Code::kInvalidArgument);
  // Requests that do not drain: kTimeout, nothing changed, admission open.
  auto exact = gate.Admit(VersionConstraint{{}, 4}, 0);
  ASSERT_TRUE(exact.ticket);
  EXPECT_EQ(commit.Begin(6, 10000).code(), Code::kTimeout);
  EXPECT_FALSE(commit.open());
  EXPECT_EQ(gate.applied(), 4u);
  EXPECT_TRUE(gate.Admit(VersionConstraint{{}, 4}, 0).ticket);
}

TEST(CommitPoint, TheNextBeginWaitsForAHoldThatRanOutToClose) {
  // The hold's end reopens admission a moment before the commit's thread
  // marks itself done; a driver that begins again in that moment is let in,
  // not refused as "a commit is open" (seen on a loaded CI machine).
  VersionGate gate(CommitMode::kInPlace);
  ASSERT_TRUE(gate.Commit(1, nullptr, 1000).ok());
  CommitPoint commit(gate, 1000, 60000);
  for (uint64_t v = 2; v < 40; ++v) {
    // A 1 ms hold may run out before Begin returns (kTimeout); never refused as open.
    ASSERT_NE(commit.Begin(v, 1).code(), Code::kUnavailable) << v;
    ASSERT_TRUE(gate.Admit(VersionConstraint{}, 0).ticket) << v;  // the hold ran out
  }
  ASSERT_TRUE(commit.Begin(40, 10000).ok());
  ASSERT_TRUE(commit.End(40, true).ok());
  EXPECT_EQ(gate.applied(), 40u);
}

TEST(CommitPoint, DestroyedWhileOpenEndsNotLoaded) {
  VersionGate gate(CommitMode::kInPlace);
  ASSERT_TRUE(gate.Commit(1, nullptr, 1000).ok());
  {
    CommitPoint commit(gate, 1000, 60000);
    ASSERT_TRUE(commit.Begin(2, 60000).ok());
  }
  EXPECT_EQ(gate.applied(), 1u);
  EXPECT_FALSE(gate.committing());
}

}  // namespace
}  // namespace tern::agent
