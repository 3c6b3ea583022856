#include "tern/clock.h"

#include <thread>

namespace tern {
namespace {

class SteadyClockImpl final : public Clock {
 public:
  uint64_t NowUs() const override {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  }
  void SleepUs(uint64_t duration_us) override {
    if (duration_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(duration_us));
  }
};

}  // namespace

Clock& SteadyClock() {
  static SteadyClockImpl clock;
  return clock;
}

uint64_t FakeClock::NowUs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return now_us_;
}

void FakeClock::SleepUs(uint64_t duration_us) {
  std::unique_lock<std::mutex> lock(mu_);
  if (duration_us == 0) return;
  const uint64_t deadline = now_us_ + duration_us < now_us_ ? UINT64_MAX : now_us_ + duration_us;
  auto it = deadlines_us_.insert(deadline);
  cv_.notify_all();  // AdvanceToNextSleeper may be waiting for a sleeper
  cv_.wait(lock, [&] { return now_us_ >= deadline; });
  deadlines_us_.erase(it);
  ++sleeps_done_;
}

void FakeClock::Advance(uint64_t duration_us) {
  std::lock_guard<std::mutex> lock(mu_);
  now_us_ = now_us_ + duration_us < now_us_ ? UINT64_MAX : now_us_ + duration_us;
  cv_.notify_all();
}

uint64_t FakeClock::sleepers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return deadlines_us_.size();
}

uint64_t FakeClock::sleeps_done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sleeps_done_;
}

bool FakeClock::AdvanceToNextSleeper(uint64_t real_wait_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  // Only sleepers still waiting count: one whose deadline has passed is on
  // its way out.
  auto waiting = [&] { return !deadlines_us_.empty() && *deadlines_us_.rbegin() > now_us_; };
  if (!cv_.wait_for(lock, std::chrono::milliseconds(real_wait_ms), waiting)) return false;
  now_us_ = *deadlines_us_.upper_bound(now_us_);
  cv_.notify_all();
  return true;
}

}  // namespace tern
