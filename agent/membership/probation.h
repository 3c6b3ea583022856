// When a relay that its children reported bad may relay again
// (docs/agent.md §4). A PARENT_REPORT demotes a relay to a leaf
// (topology::DemoteRelay); after a quiet period it relays again
// (topology::PromoteRelay), and a repeat offender waits longer, up to a
// bound. Pure functions over a record: times are passed in, so the policy
// is tested with a fake clock.
//
// Policy:
//  * a stall: the n-th demotion waits quiet_us * 2^(n-1), at most
//    quiet_us * kProbationBackoffMax;
//  * chunks that failed SHA-256 (bytes the publisher did not sign that
//    passed the transport's own checksum: a relay that lies, or whose
//    memory or disk corrupts data): the longest wait at once, every time.
//    Not for ever: children verify every chunk, so such a relay costs
//    re-fetches, not integrity, and one report from a compromised child
//    must not exclude a relay for good;
//  * the count of demotions is forgotten once the member has relayed again
//    for the longest wait without a report.
//
// Thread safety: values and reentrant functions.
#pragma once

#include <cstdint>

#include "agent/control/control_wire.h"

namespace tern::agent {

// The longest wait, in quiet periods.
inline constexpr uint32_t kProbationBackoffMax = 16;

struct ProbationOptions {
  // The wait after a first stall; 0: no probation (a demoted relay stays a
  // leaf until it joins again).
  uint64_t quiet_us = 60'000'000;
};

// One member's demotions while it is joined (a rejoin starts afresh).
struct RelayProbation {
  uint32_t strikes = 0;  // demotions counted (see the policy)
  uint32_t demotions_total = 0;  // every demotion while joined, never forgotten
  ParentFault last_fault = ParentFault::kStalled;
  uint64_t demoted_us = 0;      // when it was last demoted
  uint64_t relay_again_us = 0;  // when it may relay again (0: not demoted, or never)
  uint64_t promoted_us = 0;     // when it last relayed again (0: never)
};

// The wait before a member demoted for `fault`, its `strikes`-th demotion
// (>= 1), may relay again; 0 when there is no probation.
uint64_t ProbationWaitUs(const ProbationOptions& options, ParentFault fault, uint32_t strikes);

// Records a demotion at now_us.
void RecordDemotion(const ProbationOptions& options, ParentFault fault, uint64_t now_us,
                    RelayProbation* p);
// True when a demoted member's wait has passed at now_us.
bool ProbationOver(const RelayProbation& p, uint64_t now_us);
// Records that it relays again.
void RecordPromotion(uint64_t now_us, RelayProbation* p);

}  // namespace tern::agent
