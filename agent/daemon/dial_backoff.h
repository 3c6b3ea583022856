// When a member dials a root again after a failed dial (docs/agent.md §7a),
// and a parent whose link failed (§7).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace tern::agent {

inline constexpr uint64_t kDialBackoffUsMin = 100'000;
// One root address: a root that is down is asked at most every 5 s.
inline constexpr uint64_t kDialBackoffUsMax = 5'000'000;
// Several (a root and its standbys): a standby leads one lease (seconds)
// after the root died, and members should find it within about a second of
// that, not up to 5 s later.
inline constexpr uint64_t kDialBackoffUsMaxStandby = 1'000'000;

struct DialRetry {
  uint64_t backoff_us;  // the backoff from now on
  uint64_t wait_us;     // until the next dial
};

// After a failed dial, with `next_index` the address index advanced past the
// one that failed (the member dials join[next_index % addresses] next). Every
// address is tried in turn at the minimum spacing; the backoff grows (doubles)
// only once a whole round of addresses failed, and waits before the next
// round. With one address that is a doubling per failure.
constexpr DialRetry AfterFailedDial(uint64_t backoff_us, size_t next_index, size_t addresses) {
  if (addresses > 1 && next_index % addresses != 0) {
    return {std::max(backoff_us, kDialBackoffUsMin), kDialBackoffUsMin};
  }
  const uint64_t cap = addresses > 1 ? kDialBackoffUsMaxStandby : kDialBackoffUsMax;
  const uint64_t next = std::clamp<uint64_t>(backoff_us * 2, kDialBackoffUsMin, cap);
  return {next, next};
}

// ---- Parents ----
//
// A parent whose link failed is dialled again after 100 ms, then after a
// wait that doubles per failure up to 2 s, until the root sends PARENTS
// (a new parent is dialled at once, and the schedule starts afresh). The
// root re-plans at once when the parent's connection to it closes, or after
// --dead-after-ms when the parent is cut off silently: meanwhile a child
// dials it a handful of times, not once per tick. A failure long after the
// last dial (the link held up) starts the schedule afresh.
inline constexpr uint64_t kParentRedialUsMin = 100'000;
inline constexpr uint64_t kParentRedialUsMax = 2'000'000;

// One stripe's parent. Values; the caller passes its clock's time in.
struct ParentRedial {
  bool due = false;         // a dial is wanted (from next_us on)
  uint64_t next_us = 0;     // not before this
  uint64_t backoff_us = 0;  // the wait after the last failure (0: none yet)
  uint64_t dialled_us = 0;  // when it was last dialled
  uint32_t failures = 0;    // since PARENTS named this parent, or the link held
  uint64_t first_failure_us = 0;
};

// PARENTS named a parent for this stripe: dial it now, with a clean record.
constexpr void ParentAssigned(ParentRedial& r) { r = ParentRedial{.due = true}; }

// The link to this stripe's parent failed at now_us. Returns true for the
// first failure of a run (the one worth a log line).
constexpr bool ParentFailed(ParentRedial& r, uint64_t now_us) {
  // A link that held up longer than the longest wait was a success.
  if (r.failures > 0 && now_us - r.dialled_us > 2 * kParentRedialUsMax) r.failures = 0;
  if (r.failures == 0) {
    r.backoff_us = 0;
    r.first_failure_us = now_us;
  }
  ++r.failures;
  r.backoff_us = std::clamp<uint64_t>(r.backoff_us * 2, kParentRedialUsMin, kParentRedialUsMax);
  r.next_us = now_us + r.backoff_us;
  r.due = true;
  return r.failures == 1;
}

// Whether to dial now; if so, records the dial.
constexpr bool TakeParentRedial(ParentRedial& r, uint64_t now_us) {
  if (!r.due || now_us < r.next_us) return false;
  r.due = false;
  r.dialled_us = now_us;
  return true;
}

}  // namespace tern::agent
