// libFuzzer target: ParseEventsReply (agent/daemon/event_json.h) on
// arbitrary bytes must return a poll or an error, never crash; the events
// of a poll it returns, written again as GET /events writes them, parse to
// the same events.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "agent/daemon/event_json.h"
#include "agent/daemon/event_ring.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  auto poll = tern::agent::ParseEventsReply(in, tern::agent::kMaxEventsPerWait);
  if (!poll.ok()) return 0;
  const std::string again =
      tern::agent::EventsReplyJson(poll->events, 0, poll->last_seq, poll->run);
  auto back = tern::agent::ParseEventsReply(again, tern::agent::kMaxEventsPerWait);
  if (!back.ok() || back->events.size() != poll->events.size() || back->run != poll->run)
    std::abort();
  for (size_t i = 0; i < poll->events.size(); ++i)
    if (back->events[i] != poll->events[i]) std::abort();
  return 0;
}
