#include "agent/dial_backoff.h"

#include <gtest/gtest.h>

#include <vector>

namespace tern::agent {
namespace {

// The waits between dials while no root answers, from a fresh join (backoff
// at its minimum, index 0 was just tried).
std::vector<uint64_t> Waits(size_t addresses, int dials) {
  std::vector<uint64_t> waits;
  uint64_t backoff = kDialBackoffUsMin;
  for (int i = 1; i <= dials; ++i) {
    const DialRetry r = AfterFailedDial(backoff, static_cast<size_t>(i), addresses);
    backoff = r.backoff_us;
    waits.push_back(r.wait_us);
  }
  return waits;
}

TEST(DialBackoff, OneRootDoublesPerFailureUpToFiveSeconds) {
  const std::vector<uint64_t> expected = {200'000,   400'000,   800'000,  1'600'000,
                                          3'200'000, 5'000'000, 5'000'000};
  EXPECT_EQ(Waits(1, 7), expected);
}

// With a standby, the first address of a round waits the backoff, the rest
// follow at the minimum spacing, and the backoff stops at 1 s: a standby
// that starts to listen is dialled within about 1.1 s, never 5 s later.
TEST(DialBackoff, StandbysAreTriedInTurnAndTheRoundBackoffStaysUnderASecond) {
  const std::vector<uint64_t> expected = {100'000, 200'000,   100'000, 400'000,   100'000, 800'000,
                                          100'000, 1'000'000, 100'000, 1'000'000, 100'000};
  EXPECT_EQ(Waits(2, 11), expected);
  // Whatever the phase, one address is dialled again within cap + (n-1) * min.
  for (size_t n : {2, 3, 16}) {
    const std::vector<uint64_t> waits = Waits(n, 200);
    for (size_t at = 0; at + n <= waits.size(); ++at) {
      uint64_t round = 0;
      for (size_t k = at; k < at + n; ++k) round += waits[k];
      EXPECT_LE(round, kDialBackoffUsMaxStandby + (n - 1) * kDialBackoffUsMin)
          << n << " addresses, dial " << at;
    }
  }
}

TEST(DialBackoff, NeverBelowTheMinimum) {
  for (size_t n : {1, 2, 5}) {
    const DialRetry r = AfterFailedDial(0, 1, n);
    EXPECT_GE(r.backoff_us, kDialBackoffUsMin);
    EXPECT_GE(r.wait_us, kDialBackoffUsMin);
  }
}

}  // namespace
}  // namespace tern::agent
