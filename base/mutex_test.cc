#include "base/mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace tern {
namespace {

using std::chrono::milliseconds;

void HoldFor(Mutex& mu, milliseconds d) {
  MutexLock lock(mu);
  std::this_thread::sleep_for(d);
}

TEST(LockWatch, ASlowHoldIsCountedWithWhereItWasTaken) {
  LockWatch watch(/*slow_us=*/20'000);
  Mutex mu;
  mu.Watch(&watch);
  HoldFor(mu, milliseconds(30));
  const LockWatch::Stats s = watch.Read();
  ASSERT_EQ(s.slow_holds, 1u);
  EXPECT_GE(s.longest.held_us, 30'000u);
  // It slept: off a CPU for nearly all of it, having given the CPU up.
  EXPECT_LT(s.longest.cpu_us, s.longest.held_us / 2);
  EXPECT_GE(s.longest.blocked, 1u);
  // The site is MutexLock's caller: this file, the function holding it.
  EXPECT_NE(s.longest.site.find("mutex_test.cc:"), std::string::npos) << s.longest.site;
  EXPECT_NE(s.longest.site.find("HoldFor"), std::string::npos) << s.longest.site;
  ASSERT_EQ(s.recent.size(), 1u);
  EXPECT_EQ(s.recent[0].seq, 1u);
}

TEST(LockWatch, AHolderThatComputesIsOnACpu) {
  LockWatch watch(/*slow_us=*/20'000);
  Mutex mu;
  mu.Watch(&watch);
  {
    MutexLock lock(mu);
    const auto end = std::chrono::steady_clock::now() + milliseconds(40);
    while (std::chrono::steady_clock::now() < end) {
    }
  }
  const LockWatch::Stats s = watch.Read();
  ASSERT_EQ(s.slow_holds, 1u);
  EXPECT_LE(s.longest.cpu_us, s.longest.held_us);
  // Spinning: on a CPU unless the machine preempted it (counted as such);
  // a fraction that survives a busy 2-core CI machine.
  EXPECT_GT(s.longest.cpu_us, 0u);
}

// TryLock and TryLockFor fail while another thread holds the mutex (the
// latter after its wait), take it once free, and a watched hold taken by
// them and adopted by a MutexLock is counted like Lock's and released.
TEST(LockWatch, TryLockTakesOnlyAFreeMutexAndItsAdoptedHoldIsWatched) {
  LockWatch watch(/*slow_us=*/20'000);
  Mutex mu;
  mu.Watch(&watch);
  std::atomic<bool> held{false}, release{false};
  std::thread holder([&] {
    MutexLock lock(mu);
    held = true;
    while (!release) std::this_thread::sleep_for(milliseconds(1));
  });
  while (!held) std::this_thread::sleep_for(milliseconds(1));
  EXPECT_FALSE(mu.TryLock());
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(mu.TryLockFor(milliseconds(30)));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(30));
  release = true;
  holder.join();
  ASSERT_TRUE(mu.TryLockFor(milliseconds(30)));
  {
    MutexLock adopted(mu, AdoptLock{});  // releases it
    std::this_thread::sleep_for(milliseconds(30));
  }
  ASSERT_TRUE(mu.TryLock());
  mu.Unlock();
  const LockWatch::Stats s = watch.Read();
  ASSERT_GE(s.slow_holds, 1u);
  EXPECT_NE(s.recent.back().site.find("mutex_test.cc:"), std::string::npos) << s.recent.back().site;
  EXPECT_GE(s.recent.back().held_us, 30'000u);
}

TEST(LockWatch, ShortHoldsAndUnwatchedMutexesAreNotCounted) {
  LockWatch watch(/*slow_us=*/10'000'000);
  Mutex mu;
  mu.Watch(&watch);
  for (int i = 0; i < 100; ++i) MutexLock lock(mu);
  Mutex other;  // not watched
  HoldFor(other, milliseconds(5));
  EXPECT_EQ(watch.Read().slow_holds, 0u);
  EXPECT_EQ(watch.Read().longest.held_us, 0u);
}

TEST(LockWatch, WaitingOnACondVarIsNotHolding) {
  LockWatch watch(/*slow_us=*/250'000);
  Mutex mu;
  mu.Watch(&watch);
  CondVar cv(&mu);
  {
    MutexLock lock(mu);
    const bool woke = cv.WaitUntil(std::chrono::steady_clock::now() + milliseconds(400),
                                   [] { return false; });
    EXPECT_FALSE(woke);
  }
  EXPECT_EQ(watch.Read().slow_holds, 0u);
  // The hold after the wait still counts, at the site that took the lock.
  {
    MutexLock lock(mu);
    cv.WaitUntil(std::chrono::steady_clock::now() + milliseconds(1), [] { return false; });
    std::this_thread::sleep_for(milliseconds(300));
  }
  const LockWatch::Stats s = watch.Read();
  ASSERT_EQ(s.slow_holds, 1u);
  EXPECT_NE(s.longest.site.find("mutex_test.cc:"), std::string::npos) << s.longest.site;
}

TEST(LockWatch, AWaitWhosePredicateHoldsDoesNotSplitTheHold) {
  LockWatch watch(/*slow_us=*/100'000);
  Mutex mu;
  mu.Watch(&watch);
  CondVar cv(&mu);
  {
    MutexLock lock(mu);
    std::this_thread::sleep_for(milliseconds(60));
    EXPECT_TRUE(
        cv.WaitUntil(std::chrono::steady_clock::now() + milliseconds(500), [] { return true; }));
    std::this_thread::sleep_for(milliseconds(60));
  }
  const LockWatch::Stats s = watch.Read();
  ASSERT_EQ(s.slow_holds, 1u);  // one hold of 120 ms, not two of 60
  EXPECT_GE(s.longest.held_us, 120'000u);
}

TEST(LockWatch, KeepsTheNewestHoldsAndTheLongest) {
  LockWatch watch(/*slow_us=*/1);
  Mutex mu;
  mu.Watch(&watch);
  HoldFor(mu, milliseconds(150));  // the longest, soon out of `recent`
  for (size_t i = 0; i < LockWatch::kSlowHolds + 4; ++i) HoldFor(mu, milliseconds(1));
  const LockWatch::Stats s = watch.Read();
  EXPECT_EQ(s.slow_holds, LockWatch::kSlowHolds + 5);
  ASSERT_EQ(s.recent.size(), LockWatch::kSlowHolds);
  EXPECT_EQ(s.recent.front().seq, 6u);
  EXPECT_EQ(s.recent.back().seq, LockWatch::kSlowHolds + 5);
  EXPECT_EQ(s.longest.seq, 1u);
  EXPECT_GE(s.longest.held_us, 150'000u);
  const auto since = watch.Since(LockWatch::kSlowHolds + 3);
  ASSERT_EQ(since.size(), 2u);
  EXPECT_EQ(since[0].seq, LockWatch::kSlowHolds + 4);
}

}  // namespace
}  // namespace tern
