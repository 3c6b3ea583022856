#include "tern/clock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace tern {
namespace {

TEST(SteadyClock, SleepsAtLeastTheDuration) {
  Clock& c = SteadyClock();
  const uint64_t t0 = c.NowUs();
  c.SleepFor(std::chrono::milliseconds(5));
  EXPECT_GE(c.NowUs() - t0, 5000u);
}

TEST(FakeClock, SleepersWakeOnlyWhenTimePasses) {
  FakeClock clock(100);
  clock.SleepUs(0);  // returns at once
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    clock.SleepFor(std::chrono::seconds(3600));
    woke = true;
  });
  for (int i = 0; i < 5000 && clock.sleepers() == 0; ++i)  // bounded wait for it to sleep
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(clock.sleepers(), 1u);
  clock.Advance(1'000'000);  // one second of an hour
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(woke);
  EXPECT_TRUE(clock.AdvanceToNextSleeper(5000));
  sleeper.join();
  EXPECT_TRUE(woke);
  EXPECT_EQ(clock.NowUs(), 100 + 3'600'000'000u);
  EXPECT_EQ(clock.sleeps_done(), 1u);
  EXPECT_FALSE(clock.AdvanceToNextSleeper(0));  // nobody asleep
}

// A backoff loop written against Clock runs its whole schedule on a
// FakeClock at once: what ConnectWait and the fetch retries rely on.
TEST(FakeClock, BackoffLoopRunsWithoutRealSleeping) {
  FakeClock clock;
  std::vector<uint64_t> attempts_at_us;
  std::atomic<bool> done{false};
  std::thread loop([&] {
    uint64_t backoff_ms = 100;
    for (int attempt = 0; attempt < 6; ++attempt) {
      if (attempt > 0) {
        clock.SleepFor(std::chrono::milliseconds(backoff_ms));
        backoff_ms = std::min<uint64_t>(backoff_ms * 2, 1000);
      }
      attempts_at_us.push_back(clock.NowUs());
    }
    done = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  int steps = 0;
  while (!done) steps += clock.AdvanceToNextSleeper(/*real_wait_ms=*/10);
  loop.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  EXPECT_EQ(steps, 5);
  EXPECT_EQ(attempts_at_us,
            (std::vector<uint64_t>{0, 100'000, 300'000, 700'000, 1'500'000, 2'500'000}));
}

}  // namespace
}  // namespace tern
