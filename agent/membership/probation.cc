#include "agent/membership/probation.h"

#include <algorithm>
#include <limits>

namespace tern::agent {

namespace {

uint64_t SaturatingMul(uint64_t a, uint64_t b) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a)
    return std::numeric_limits<uint64_t>::max();
  return a * b;
}

uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return b > std::numeric_limits<uint64_t>::max() - a ? std::numeric_limits<uint64_t>::max()
                                                      : a + b;
}

}  // namespace

uint64_t ProbationWaitUs(const ProbationOptions& options, ParentFault fault, uint32_t strikes) {
  if (options.quiet_us == 0) return 0;
  if (fault == ParentFault::kBadChunks)
    return SaturatingMul(options.quiet_us, kProbationBackoffMax);
  // 2^(strikes-1), capped: the shift stays below 32 however many strikes.
  const uint32_t shift = std::min<uint32_t>(std::max<uint32_t>(strikes, 1) - 1, 31);
  const uint64_t factor = std::min<uint64_t>(uint64_t{1} << shift, kProbationBackoffMax);
  return SaturatingMul(options.quiet_us, factor);
}

void RecordDemotion(const ProbationOptions& options, ParentFault fault, uint64_t now_us,
                    RelayProbation* p) {
  // A clean run as long as the longest wait since it last relayed again
  // clears its record.
  const uint64_t clean_us = SaturatingMul(options.quiet_us, kProbationBackoffMax);
  if (p->promoted_us != 0 && now_us >= SaturatingAdd(p->promoted_us, clean_us)) p->strikes = 0;
  if (p->strikes < std::numeric_limits<uint32_t>::max()) ++p->strikes;
  if (p->demotions_total < std::numeric_limits<uint32_t>::max()) ++p->demotions_total;
  p->last_fault = fault;
  p->demoted_us = now_us;
  const uint64_t wait_us = ProbationWaitUs(options, fault, p->strikes);
  // Never 0 for a real wait (0 means "never"), even at time 0.
  p->relay_again_us = wait_us == 0 ? 0 : std::max<uint64_t>(SaturatingAdd(now_us, wait_us), 1);
}

bool ProbationOver(const RelayProbation& p, uint64_t now_us) {
  return p.relay_again_us != 0 && now_us >= p.relay_again_us;
}

void RecordPromotion(uint64_t now_us, RelayProbation* p) {
  p->relay_again_us = 0;
  p->promoted_us = std::max<uint64_t>(now_us, 1);
}

}  // namespace tern::agent
