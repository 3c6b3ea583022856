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

namespace {

bool Same(const tern::AgentEvent& a, const tern::AgentEvent& b) {
  return a.seq == b.seq && a.at_s == b.at_s && a.kind == b.kind && a.version == b.version &&
         a.epoch == b.epoch && a.digest.lanes == b.digest.lanes && a.member == b.member &&
         a.slot_dir == b.slot_dir && a.all_tensors == b.all_tensors &&
         a.changed_tensors == b.changed_tensors;
}

}  // namespace

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
    if (!Same(back->events[i], poll->events[i])) std::abort();
  return 0;
}
