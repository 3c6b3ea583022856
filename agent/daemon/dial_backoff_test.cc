#include "agent/daemon/dial_backoff.h"

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

// A parent that refuses every dial, on a fake clock ticking every `tick_us`
// (the member's tick): the dials made within `window_us` of the first
// failure.
std::vector<uint64_t> ParentDials(uint64_t tick_us, uint64_t window_us) {
  ParentRedial r;
  ParentAssigned(r);
  std::vector<uint64_t> dials;
  for (uint64_t now = 0; now <= window_us; now += tick_us) {
    if (!TakeParentRedial(r, now)) continue;
    dials.push_back(now);
    ParentFailed(r, now);  // refused at once
  }
  return dials;
}

// A new parent is dialled on the first tick; a dead one is dialled again
// after 100 ms, 200, 400, ... up to 2 s: within a 3 s --dead-after-ms five
// dials at a 50 ms tick (it was one per tick: 60), and one every 2 s after.
TEST(ParentRedial, BacksOffPerFailureUpToTwoSeconds) {
  const std::vector<uint64_t> expected = {0, 100'000, 300'000, 700'000, 1'500'000, 3'100'000};
  EXPECT_EQ(ParentDials(50'000, 3'100'000), expected);
  const std::vector<uint64_t> long_run = ParentDials(50'000, 60'000'000);
  for (size_t i = 6; i < long_run.size(); ++i)
    EXPECT_EQ(long_run[i] - long_run[i - 1], kParentRedialUsMax) << i;
  EXPECT_LE(long_run.size(), 6u + 60 / 2);
}

// PARENTS from the root (a new parent, or the same one again) is dialled
// at once, however long the backoff had grown.
TEST(ParentRedial, NewParentsAreDialledAtOnce) {
  ParentRedial r;
  ParentAssigned(r);
  uint64_t now = 0;
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(TakeParentRedial(r, r.next_us));
    now = r.next_us;
    ParentFailed(r, now);
  }
  EXPECT_EQ(r.backoff_us, kParentRedialUsMax);
  EXPECT_FALSE(TakeParentRedial(r, now + 1));
  ParentAssigned(r);
  EXPECT_TRUE(TakeParentRedial(r, now + 1));
  EXPECT_EQ(r.failures, 0u);
}

// Only the first failure of a run says so (the one to log); a link that
// held up longer than twice the cap makes the next failure a first again,
// redialled after the minimum.
TEST(ParentRedial, ALinkThatHeldUpStartsAfresh) {
  ParentRedial r;
  ParentAssigned(r);
  ASSERT_TRUE(TakeParentRedial(r, 0));
  EXPECT_TRUE(ParentFailed(r, 10));
  ASSERT_TRUE(TakeParentRedial(r, r.next_us));
  EXPECT_FALSE(ParentFailed(r, r.dialled_us + 10));
  EXPECT_EQ(r.failures, 2u);
  ASSERT_TRUE(TakeParentRedial(r, r.next_us));
  const uint64_t later = r.dialled_us + 2 * kParentRedialUsMax + 1;
  EXPECT_TRUE(ParentFailed(r, later));
  EXPECT_EQ(r.failures, 1u);
  EXPECT_EQ(r.next_us, later + kParentRedialUsMin);
  EXPECT_FALSE(TakeParentRedial(r, later + kParentRedialUsMin - 1));
  EXPECT_TRUE(TakeParentRedial(r, later + kParentRedialUsMin));
}

}  // namespace
}  // namespace tern::agent
