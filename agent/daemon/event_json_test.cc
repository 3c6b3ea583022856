// GET /events' JSON (event_json.h): what the port writes parses back to the
// same events; a reply that breaks a rule is refused naming the field; a
// kind this build does not know is kept as Kind 0; every bound holds.
#include "agent/daemon/event_json.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "agent/daemon/event_ring.h"

namespace tern::agent {
namespace {

using Json = nlohmann::json;

std::vector<AgentEvent> SomeEvents() {
  AgentEvent served;
  served.seq = 7;
  served.at_s = 12.25;
  served.kind = AgentEvent::Kind::kVersionServed;
  served.version = 3;
  served.epoch = 2;
  served.digest.lanes = {1, 0xffffffffffffffffull, 3, 0x0123456789abcdefull};
  served.member = "10.0.0.2:7000";
  served.slot_dir = "/srv/tern/views/b";
  served.changed_tensors = {"model.embed", "model.layers.0.w"};
  AgentEvent joined;
  joined.seq = 8;
  joined.at_s = 13;
  joined.kind = AgentEvent::Kind::kMemberJoined;
  joined.member = "10.0.0.3:7000";
  AgentEvent keyframe = served;
  keyframe.seq = 9;
  keyframe.version = 4;
  keyframe.all_tensors = true;
  keyframe.changed_tensors.clear();
  return {served, joined, keyframe};
}

// The reply for SomeEvents() as the port writes it, as JSON to break.
Json Reply() { return Json::parse(EventsReplyJson(SomeEvents(), 6, 9, "00112233aabbccdd")); }

// The error ParseEventsReply gives for `j`, or "" when it parses.
std::string ErrorOf(const Json& j, size_t max_events = kMaxEventsPerWait) {
  auto p = ParseEventsReply(j.dump(), max_events);
  if (p.ok()) return "";
  EXPECT_EQ(p.status().code(), Code::kProtocol) << p.status().ToString();
  return p.status().message();
}

TEST(EventJson, TheReplyParsesBackToTheSameEvents) {
  const std::vector<AgentEvent> events = SomeEvents();
  auto p = ParseEventsReply(EventsReplyJson(events, 6, 9, "00112233aabbccdd"), 3);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->events.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(p->events[i], events[i]) << "event " << i;
  EXPECT_EQ(p->gap, 0u);
  EXPECT_FALSE(p->restarted);
  EXPECT_EQ(p->next, 9u);
  EXPECT_EQ(p->last_seq, 9u);
  EXPECT_EQ(p->run, "00112233aabbccdd");
  // After seq 2: seqs 3..6 were dropped (a gap); after 20: a restart.
  p = ParseEventsReply(EventsReplyJson(events, 2, 9, "r"), 3);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->gap, 4u);
  p = ParseEventsReply(EventsReplyJson(events, 20, 9, "r"), 3);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->restarted);
  // No events: next stays at what was asked (at most the newest).
  p = ParseEventsReply(EventsReplyJson({}, 5, 9, "r"), 1);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->events.empty());
  EXPECT_EQ(p->next, 5u);
}

TEST(EventJson, AnOlderAgentsReplyWithoutRunAndAnUnknownKindParse) {
  Json j = Reply();
  j.erase("run");
  j["events"][1]["kind"] = "version_withdrawn";  // a kind from a newer agent
  j["events"][1]["colour"] = "blue";             // a field this build does not know
  j["also_new"] = 1;
  auto p = ParseEventsReply(j.dump(), 3);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->run, "");
  EXPECT_EQ(static_cast<int>(p->events[1].kind), 0);
  EXPECT_STREQ(AgentEventKindName(p->events[1].kind), "unknown");
  EXPECT_EQ(p->events[2].seq, 9u);
}

TEST(EventJson, EachBrokenFieldIsRefusedByName) {
  struct Case {
    const char* why;
    std::function<void(Json&)> breakit;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"events not an array", [](Json& j) { j["events"] = "x"; }, "events is not an array"},
      {"events missing", [](Json& j) { j.erase("events"); }, "events is missing"},
      {"gap negative", [](Json& j) { j["gap"] = -1; }, "gap is not a non-negative integer"},
      {"restarted not bool", [](Json& j) { j["restarted"] = 1; }, "restarted is not true or false"},
      {"next a float", [](Json& j) { j["next"] = 1.5; }, "next is not a non-negative integer"},
      {"last_seq missing", [](Json& j) { j.erase("last_seq"); }, "last_seq is missing"},
      {"run too long", [](Json& j) { j["run"] = std::string(65, 'a'); }, "run is 65 bytes"},
      {"event not an object", [](Json& j) { j["events"][0] = 3; }, "event 0: is not an object"},
      {"seq zero", [](Json& j) { j["events"][0]["seq"] = 0; }, "event 0: seq is 0"},
      {"seq not rising", [](Json& j) { j["events"][1]["seq"] = 7; },
       "event 1: seq 7 does not follow seq 7"},
      {"at_s a string", [](Json& j) { j["events"][0]["at_s"] = "now"; },
       "event 0: at_s is not a finite number"},
      {"kind missing", [](Json& j) { j["events"][2].erase("kind"); }, "event 2: kind is missing"},
      {"epoch too big", [](Json& j) { j["events"][0]["epoch"] = 1ull << 32; },
       "event 0: epoch is 4294967296: at most 4294967295"},
      {"version negative", [](Json& j) { j["events"][0]["version"] = -3; },
       "event 0: version is not a non-negative integer"},
      {"digest bad", [](Json& j) { j["events"][0]["digest"] = "tern1:00"; }, "event 0: digest: "},
      {"member a number", [](Json& j) { j["events"][1]["member"] = 5; },
       "event 1: member is not a string"},
      {"slot_dir too long", [](Json& j) { j["events"][0]["slot_dir"] = std::string(4097, 's'); },
       "event 0: slot_dir is 4097 bytes: at most 4096"},
      {"all_tensors missing", [](Json& j) { j["events"][0].erase("all_tensors"); },
       "event 0: all_tensors is missing"},
      {"changed not an array", [](Json& j) { j["events"][0]["changed_tensors"] = "w"; },
       "event 0: changed_tensors is not an array"},
      {"a name not a string", [](Json& j) { j["events"][0]["changed_tensors"][1] = nullptr; },
       "event 0: changed_tensors[1] is not a string"},
  };
  for (const Case& c : cases) {
    Json j = Reply();
    c.breakit(j);
    const std::string error = ErrorOf(j);
    EXPECT_NE(error.find(c.message), std::string::npos) << c.why << ": " << error;
  }
}

TEST(EventJson, CountsAndTextAreBounded) {
  // More events than were asked for.
  EXPECT_NE(ErrorOf(Reply(), 2).find("3 events where at most 2 were asked for"), std::string::npos);
  EXPECT_EQ(ParseEventsReply("{}", 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseEventsReply("{}", kMaxEventsPerWait + 1).status().code(), Code::kInvalidArgument);
  // More names than an event may carry.
  Json j = Reply();
  j["events"][0]["changed_tensors"] = Json::array();
  for (size_t i = 0; i <= kMaxEventTensors; ++i) j["events"][0]["changed_tensors"].push_back("t");
  EXPECT_NE(ErrorOf(j).find("changed_tensors names 65537 tensors: at most 65536"),
            std::string::npos);
  // A name at the bound parses; one byte more does not.
  j = Reply();
  j["events"][0]["changed_tensors"][0] = std::string(kMaxEventTextBytes, 'n');
  EXPECT_EQ(ErrorOf(j), "");
  j["events"][0]["changed_tensors"][0] = std::string(kMaxEventTextBytes + 1, 'n');
  EXPECT_NE(ErrorOf(j).find("changed_tensors[0] is 4097 bytes"), std::string::npos);
}

TEST(EventJson, AReplyStaysWithinItsByteBudgetAndTheRestWaitsForTheNextPoll) {
  // 100 served events of 1000 names each (about 25 kB each).
  std::vector<AgentEvent> events;
  for (uint64_t seq = 1; seq <= 100; ++seq) {
    AgentEvent e = SomeEvents()[0];
    e.seq = seq;
    for (int i = 0; i < 1000; ++i) e.changed_tensors.push_back("model.layers." + std::to_string(i));
    events.push_back(std::move(e));
  }
  const size_t budget = 200 << 10;
  const std::string text = EventsReplyJson(events, 0, 100, "r", budget);
  EXPECT_LE(text.size(), budget + 1024);  // the reply's own fields
  auto p = ParseEventsReply(text, kMaxEventsPerWait);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_GE(p->events.size(), 2u);
  ASSERT_LT(p->events.size(), 100u);
  EXPECT_EQ(p->next, p->events.back().seq);  // resume after the last one written
  EXPECT_EQ(p->last_seq, 100u);
  EXPECT_EQ(p->events.back().changed_tensors.size(), 1002u);
  // One event over the budget on its own: written, as all tensors.
  p = ParseEventsReply(EventsReplyJson(events, 0, 100, "r", 10 << 10), kMaxEventsPerWait);
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->events.size(), 1u);
  EXPECT_TRUE(p->events[0].all_tensors);
  EXPECT_TRUE(p->events[0].changed_tensors.empty());
  EXPECT_EQ(p->next, 1u);
}

TEST(EventJson, NotJsonTruncatedAndDeepNestingAreRefused) {
  const std::string good = EventsReplyJson(SomeEvents(), 6, 9, "r");
  for (size_t cut = 0; cut < good.size(); ++cut) {
    auto p = ParseEventsReply(std::string_view(good).substr(0, cut), kMaxEventsPerWait);
    ASSERT_FALSE(p.ok()) << "cut at " << cut;
    EXPECT_EQ(p.status().code(), Code::kProtocol);
  }
  EXPECT_NE(ParseEventsReply("[1, 2]", 8).status().message().find("not a JSON object"),
            std::string::npos);
  EXPECT_NE(ParseEventsReply("<html>503</html>", 8).status().message().find("is not JSON"),
            std::string::npos);
  // 100000 nested arrays as an unknown field: refused or parsed, never a
  // stack overflow (nlohmann's parser keeps its own stack).
  std::string deep = "{\"x\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  auto p = ParseEventsReply(deep, 8);
  EXPECT_FALSE(p.ok());  // no "events"
}

TEST(EventJson, RunIdsDifferBetweenRings) {
  EventRing a(SteadyClock()), b(SteadyClock());
  EXPECT_EQ(a.run().size(), 16u);
  EXPECT_NE(a.run(), b.run());
}

}  // namespace
}  // namespace tern::agent
