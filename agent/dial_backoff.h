// When a member dials a root again after a failed dial (docs/agent.md §7a).
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

}  // namespace tern::agent
