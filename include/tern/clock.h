// Monotonic time with sleep, passed in so that tests and simulations control
// it: SteadyClock() is the real one; FakeClock moves only when told to, and
// its sleepers wake when it passes their deadline, so a backoff loop runs
// on it without real sleeping.
//
// Thread safety: every method of both clocks may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <set>

#include "tern/export.h"

namespace tern {

class TERN_EXPORT Clock {
 public:
  virtual ~Clock() = default;
  // Microseconds since an arbitrary, fixed origin; never decreases.
  virtual uint64_t NowUs() const = 0;
  // Returns once NowUs() has advanced by at least duration_us.
  virtual void SleepUs(uint64_t duration_us) = 0;

  template <class Rep, class Period>
  void SleepFor(std::chrono::duration<Rep, Period> d) {
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
    SleepUs(us > 0 ? static_cast<uint64_t>(us) : 0);
  }
};

// std::chrono::steady_clock and std::this_thread::sleep_for. Stateless, so
// sharing one instance is not a hidden dependency.
TERN_EXPORT Clock& SteadyClock();

// A clock that stands still until Advance()/Set(). SleepUs blocks the calling
// thread until another thread advances the clock past its deadline (a test's
// driver thread, or AdvanceWhenSleeping, which jumps straight to the next
// deadline). A sleep of 0 returns at once.
class TERN_EXPORT FakeClock final : public Clock {
 public:
  explicit FakeClock(uint64_t start_us = 0) : now_us_(start_us) {}

  uint64_t NowUs() const override;
  void SleepUs(uint64_t duration_us) override;

  void Advance(uint64_t duration_us);
  // Threads inside SleepUs now.
  uint64_t sleepers() const;
  // Total sleeps that returned (for assertions on a backoff schedule).
  uint64_t sleeps_done() const;
  // If a thread is (or, within real_wait_ms, becomes) asleep, advances the
  // clock to the earliest sleeper's deadline and returns true; false if no
  // one slept in that time. Lets a test step a sleeping loop one wake-up at
  // a time.
  bool AdvanceToNextSleeper(uint64_t real_wait_ms);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t now_us_;
  std::multiset<uint64_t> deadlines_us_;  // one per thread inside SleepUs
  uint64_t sleeps_done_ = 0;
};

}  // namespace tern
