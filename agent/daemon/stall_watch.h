// When a member reports the parent of one stripe stalled (PARENT_REPORT;
// docs/agent.md §4): a pure rule, so that it is tested on a fake clock.
#pragma once

#include <cstdint>

namespace tern::agent {

// One stripe's parent as the member watches it, from the relay's figures
// for that stripe's link.
struct StallWatch {
  uint64_t verified_bytes = 0;  // LinkStats::bytes_in: whole chunks, verified
  uint64_t wire_bytes = 0;      // LinkStats::wire_bytes_in: bytes as they arrive
  uint64_t verified_us = 0;     // when verified_bytes last grew (or the watch began)
  uint64_t wire_us = 0;         // when wire_bytes last grew (or verified_bytes did)
};

// Takes one look at the link at now_us; true when the parent is to be
// reported stalled now (the watch then starts afresh, so a parent is
// reported again at most once per stall time). `due`: a version is due
// (HEAD is newer than what the member serves or holds); while none is,
// nothing is expected and the clock restarts. The rule: no byte at all for
// stall_us, or bytes but no whole verified chunk for 2 * stall_us. A chunk
// that arrives slowly (a loaded or thin link: 4 MiB in more than 10 s) is
// given one more stall time; a parent that trickles bytes without ever
// completing a chunk is still caught. stall_us 0: never.
constexpr bool ParentStalled(StallWatch& w, uint64_t verified_bytes, uint64_t wire_bytes, bool due,
                             uint64_t now_us, uint64_t stall_us) {
  const bool verified_moved = verified_bytes != w.verified_bytes;
  const bool wire_moved = wire_bytes != w.wire_bytes;
  w.verified_bytes = verified_bytes;
  w.wire_bytes = wire_bytes;
  if (verified_moved || !due) w.verified_us = now_us;
  if (wire_moved || verified_moved || !due) w.wire_us = now_us;
  if (stall_us == 0) return false;
  // As sums, not differences: a time stored from a later look never
  // underflows into a stall.
  const bool stalled = now_us > w.wire_us + stall_us || now_us > w.verified_us + 2 * stall_us;
  if (stalled) w.verified_us = w.wire_us = now_us;
  return stalled;
}

}  // namespace tern::agent
