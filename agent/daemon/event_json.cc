// GET /events' JSON (agent/daemon/event_json.h).
#include "agent/daemon/event_json.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "agent/daemon/event_ring.h"

namespace tern::agent {
namespace {

using Json = nlohmann::json;

// The kinds a parsed event may name; others become Kind 0.
constexpr AgentEvent::Kind kKnownKinds[] = {
    AgentEvent::Kind::kVersionPublished, AgentEvent::Kind::kVersionServed,
    AgentEvent::Kind::kMemberJoined,     AgentEvent::Kind::kMemberLeft,
    AgentEvent::Kind::kMemberFailed,     AgentEvent::Kind::kMemberDemoted,
    AgentEvent::Kind::kMemberDrained,    AgentEvent::Kind::kMemberRemoved,
};
// Long enough for any run id an agent writes (16 hex digits today).
constexpr size_t kMaxRunBytes = 64;

// Each reader names the field in its error; `where` is "" for the reply's
// own fields, "event I: " inside an event.
Result<const Json*> Field(const Json& o, const char* name, const std::string& where) {
  auto it = o.find(name);
  TERN_REQUIRE(it != o.end(), kProtocol, "events: ", where, name, " is missing");
  return &*it;
}

Result<uint64_t> U64(const Json& o, const char* name, const std::string& where,
                     uint64_t max = std::numeric_limits<uint64_t>::max()) {
  TERN_ASSIGN_OR_RETURN(const Json* v, Field(o, name, where));
  TERN_REQUIRE(v->is_number_unsigned(), kProtocol, "events: ", where, name,
               " is not a non-negative integer");
  const uint64_t x = v->get<uint64_t>();
  TERN_REQUIRE(x <= max, kProtocol, "events: ", where, name, " is ", x, ": at most ", max);
  return x;
}

Result<bool> Bool(const Json& o, const char* name, const std::string& where) {
  TERN_ASSIGN_OR_RETURN(const Json* v, Field(o, name, where));
  TERN_REQUIRE(v->is_boolean(), kProtocol, "events: ", where, name, " is not true or false");
  return v->get<bool>();
}

Status Text(const Json& v, const std::string& what, size_t max_bytes, std::string* out) {
  TERN_REQUIRE(v.is_string(), kProtocol, "events: ", what, " is not a string");
  const std::string& s = v.get_ref<const std::string&>();
  TERN_REQUIRE(s.size() <= max_bytes, kProtocol, "events: ", what, " is ", s.size(),
               " bytes: at most ", max_bytes);
  *out = s;
  return Status::Ok();
}

Status TextField(const Json& o, const char* name, const std::string& where, size_t max_bytes,
                 std::string* out) {
  TERN_ASSIGN_OR_RETURN(const Json* v, Field(o, name, where));
  return Text(*v, where + name, max_bytes, out);
}

AgentEvent::Kind KindOf(std::string_view name) {
  for (AgentEvent::Kind k : kKnownKinds)
    if (name == AgentEventKindName(k)) return k;
  return static_cast<AgentEvent::Kind>(0);
}

Result<AgentEvent> ParseEvent(const Json& j, size_t index) {
  const std::string where = "event " + std::to_string(index) + ": ";
  TERN_REQUIRE(j.is_object(), kProtocol, "events: ", where, "is not an object");
  AgentEvent e;
  TERN_ASSIGN_OR_RETURN(e.seq, U64(j, "seq", where));
  TERN_REQUIRE(e.seq >= 1, kProtocol, "events: ", where, "seq is 0: seqs begin at 1");
  TERN_ASSIGN_OR_RETURN(const Json* at, Field(j, "at_s", where));
  TERN_REQUIRE(at->is_number() && std::isfinite(at->get<double>()), kProtocol, "events: ", where,
               "at_s is not a finite number");
  e.at_s = at->get<double>();
  std::string kind;
  TERN_RETURN_IF_ERROR(TextField(j, "kind", where, kMaxEventTextBytes, &kind));
  e.kind = KindOf(kind);
  TERN_ASSIGN_OR_RETURN(e.version, U64(j, "version", where));
  TERN_ASSIGN_OR_RETURN(const uint64_t epoch,
                        U64(j, "epoch", where, std::numeric_limits<uint32_t>::max()));
  e.epoch = static_cast<uint32_t>(epoch);
  std::string digest;
  TERN_RETURN_IF_ERROR(TextField(j, "digest", where, kMaxEventTextBytes, &digest));
  auto d = ViewDigest::Parse(digest);
  TERN_REQUIRE(d.ok(), kProtocol, "events: ", where, "digest: ", d.status().message());
  e.digest = *d;
  TERN_RETURN_IF_ERROR(TextField(j, "member", where, kMaxEventTextBytes, &e.member));
  TERN_RETURN_IF_ERROR(TextField(j, "slot_dir", where, kMaxEventTextBytes, &e.slot_dir));
  TERN_ASSIGN_OR_RETURN(e.all_tensors, Bool(j, "all_tensors", where));
  TERN_ASSIGN_OR_RETURN(const Json* changed, Field(j, "changed_tensors", where));
  TERN_REQUIRE(changed->is_array(), kProtocol, "events: ", where,
               "changed_tensors is not an array");
  TERN_REQUIRE(changed->size() <= kMaxEventTensors, kProtocol, "events: ", where,
               "changed_tensors names ", changed->size(), " tensors: at most ", kMaxEventTensors);
  e.changed_tensors.resize(changed->size());
  for (size_t i = 0; i < changed->size(); ++i)
    TERN_RETURN_IF_ERROR(Text((*changed)[i], where + "changed_tensors[" + std::to_string(i) + "]",
                              kMaxEventTextBytes, &e.changed_tensors[i]));
  return e;
}

}  // namespace

std::string EventJsonText(const AgentEvent& e) {
  Json j;
  j["seq"] = e.seq;
  j["at_s"] = e.at_s;
  j["kind"] = AgentEventKindName(e.kind);
  j["version"] = e.version;
  j["epoch"] = e.epoch;
  j["digest"] = e.digest.ToString();
  j["member"] = e.member;
  j["slot_dir"] = e.slot_dir;
  j["all_tensors"] = e.all_tensors;
  j["changed_tensors"] = e.changed_tensors;
  // Names are the checkpoint's: replace what is not UTF-8 rather than throw.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string EventsReplyJson(const std::vector<AgentEvent>& events, uint64_t after_seq,
                            uint64_t last_seq, std::string_view run, size_t budget_bytes) {
  Json j;
  j["events"] = Json::array();
  size_t bytes = 0, written = 0;
  for (const AgentEvent& e : events) {
    std::string text = EventJsonText(e);
    if (written > 0 && bytes + text.size() > budget_bytes) break;  // the next poll's
    if (text.size() > budget_bytes) {  // the first, too large on its own
      AgentEvent whole = e;
      whole.all_tensors = true;
      whole.changed_tensors.clear();
      text = EventJsonText(whole);
    }
    bytes += text.size();
    j["events"].push_back(Json::parse(text));
    ++written;
  }
  // A gap: events after `after_seq` that the ring no longer holds.
  const uint64_t first = events.empty() ? 0 : events.front().seq;
  j["gap"] = first > after_seq + 1 ? first - after_seq - 1 : 0;
  // Seqs at or below `after_seq`: the agent restarted (seqs begin at 1 again).
  j["restarted"] = !events.empty() && first <= after_seq;
  j["next"] = written == 0 ? std::min(after_seq, last_seq) : events[written - 1].seq;
  j["last_seq"] = last_seq;
  j["run"] = std::string(run);
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Result<AgentEventPoll> ParseEventsReply(std::string_view text, size_t max_events) {
  TERN_REQUIRE(max_events >= 1 && max_events <= kMaxEventsPerWait, kInvalidArgument,
               "events: max_events is ", max_events, ": want 1..", kMaxEventsPerWait);
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  TERN_REQUIRE(!j.is_discarded(), kProtocol, "events: the reply is not JSON");
  TERN_REQUIRE(j.is_object(), kProtocol, "events: the reply is not a JSON object");
  const std::string top;
  AgentEventPoll poll;
  TERN_ASSIGN_OR_RETURN(const Json* events, Field(j, "events", top));
  TERN_REQUIRE(events->is_array(), kProtocol, "events: events is not an array");
  TERN_REQUIRE(events->size() <= max_events, kProtocol, "events: ", events->size(),
               " events where at most ", max_events, " were asked for");
  poll.events.reserve(events->size());
  for (size_t i = 0; i < events->size(); ++i) {
    TERN_ASSIGN_OR_RETURN(AgentEvent e, ParseEvent((*events)[i], i));
    TERN_REQUIRE(poll.events.empty() || e.seq > poll.events.back().seq, kProtocol, "events: event ",
                 i, ": seq ", e.seq, " does not follow seq ", poll.events.back().seq);
    poll.events.push_back(std::move(e));
  }
  TERN_ASSIGN_OR_RETURN(poll.gap, U64(j, "gap", top));
  TERN_ASSIGN_OR_RETURN(poll.restarted, Bool(j, "restarted", top));
  TERN_ASSIGN_OR_RETURN(poll.next, U64(j, "next", top));
  TERN_ASSIGN_OR_RETURN(poll.last_seq, U64(j, "last_seq", top));
  if (j.contains("run")) TERN_RETURN_IF_ERROR(TextField(j, "run", top, kMaxRunBytes, &poll.run));
  return poll;
}

}  // namespace tern::agent
