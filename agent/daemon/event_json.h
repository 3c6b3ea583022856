// GET /events' JSON (docs/agent/operations.md "Events"): an AgentEvent as
// the --on-serve hook and the admin port show it, the reply the port
// writes, and the parser a client of the port reads it with
// (PollAgentEvents, tern_client_wait_events). Writer and reader sit
// together so that they stay in step.
//
// The parser reads a reply from another process: every count and length is
// bounded (at most max_events events, kMaxEventTensors names an event,
// kMaxEventTextBytes a string), every field is checked for its type and
// range, and a reply that breaks a rule is kProtocol naming the field
// ("events: event 3: changed_tensors[7] is not a string"). Fields it does
// not know are ignored (a newer agent may add some); a kind it does not
// know is kept as AgentEvent::Kind 0 ("unknown"), so that seqs stay
// consecutive.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tern/agent.h"
#include "tern/status.h"

namespace tern::agent {

// The longest member id, slot path or tensor name a parsed event may hold.
inline constexpr size_t kMaxEventTextBytes = 4096;

// The event as the hook and GET /events show it (one JSON object).
std::string EventJsonText(const AgentEvent& e);

// The most a GET /events answer carries, well under a client's 16 MiB
// reply bound (AdminClientOptions::max_reply_bytes).
inline constexpr size_t kEventsReplyBytesMax = 4 << 20;

// GET /events' answer for the `events` found after `after_seq`: {"events",
// "gap", "restarted", "next", "last_seq", "run"}. At most `budget_bytes` of
// events: those that do not fit wait for the next poll ("next" is the last
// one written), but the first is always written; an event whose names alone
// pass the budget is written as all_tensors, its names left out (what a
// reader must assume when it cannot tell).
std::string EventsReplyJson(const std::vector<AgentEvent>& events, uint64_t after_seq,
                            uint64_t last_seq, std::string_view run,
                            size_t budget_bytes = kEventsReplyBytesMax);

// Parses that answer; at most max_events events (1..kMaxEventsPerWait).
Result<AgentEventPoll> ParseEventsReply(std::string_view text, size_t max_events);

}  // namespace tern::agent
