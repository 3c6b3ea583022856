#include "agent/sidecar/commit_point.h"

#include <chrono>

namespace tern::agent {

CommitPoint::~CommitPoint() {
  std::thread t;
  {
    MutexLock lock(mu_);
    ended_ = true;
    loaded_ = false;
    cv_.SignalAll();
    t = std::move(thread_);
  }
  if (t.joinable()) t.join();
}

void CommitPoint::JoinFinishedLocked() {
  // Only a finished commit's thread is joined here: it has nothing left to
  // do but return, so holding mu_ across the join cannot deadlock.
  if (done_ && thread_.joinable()) {
    std::thread t = std::move(thread_);
    mu_.Unlock();
    t.join();
    mu_.Lock();
  }
}

void CommitPoint::Run(uint64_t version, uint32_t hold_ms) {
  Status s = gate_.Commit(
      version,
      [&]() -> Status {
        MutexLock lock(mu_);
        held_ = true;
        cv_.SignalAll();
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(hold_ms);
        if (!cv_.WaitUntil(deadline, [&]() REQUIRES(mu_) { return ended_; })) {
          ended_ = true;  // a late End finds the commit gone
          return TERN_ERROR(kTimeout, "sidecar: the commit of version ", version,
                            " was not ended within ", hold_ms, " ms; the served version stays");
        }
        if (!loaded_)
          return TERN_ERROR(kCancelled, "sidecar: the engine did not load version ", version);
        return Status::Ok();
      },
      drain_timeout_ms_);
  MutexLock lock(mu_);
  result_ = s;
  done_ = true;
  held_ = false;
  cv_.SignalAll();
}

Status CommitPoint::Begin(uint64_t version, uint32_t hold_ms) {
  TERN_REQUIRE(version > 0, kInvalidArgument, "sidecar: commit version must be > 0");
  TERN_REQUIRE(hold_ms >= 1 && hold_ms <= hold_ms_max_, kInvalidArgument,
               "sidecar: commit hold_ms must be in 1..", hold_ms_max_);
  MutexLock lock(mu_);
  if (!done_ && ended_) {
    // Ended (by End or by its hold time) but its thread has not yet closed
    // the gate's commit: that takes no longer than the gate's wake-up, so
    // wait for it rather than refuse a driver that saw the end.
    const auto closing = std::chrono::steady_clock::now() + std::chrono::milliseconds(kBeginSlackMs);
    cv_.WaitUntil(closing, [&]() REQUIRES(mu_) { return done_; });
  }
  JoinFinishedLocked();
  TERN_REQUIRE(done_, kUnavailable, "sidecar: a commit of version ", version_,
               " is open");
  version_ = version;
  held_ = ended_ = loaded_ = done_ = false;
  result_ = Status::Ok();
  thread_ = std::thread([this, version, hold_ms] { Run(version, hold_ms); });
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(uint64_t{drain_timeout_ms_} + kBeginSlackMs);
  if (!cv_.WaitUntil(deadline, [&]() REQUIRES(mu_) { return held_ || done_; })) {
    ended_ = true;  // the commit ends as not loaded as soon as it drains
    cv_.SignalAll();
    return TERN_ERROR(kTimeout, "sidecar: the commit of version ", version, " did not drain within ",
                      drain_timeout_ms_ + kBeginSlackMs, " ms");
  }
  if (done_) return result_;  // the drain timed out (admission reopened)
  return Status::Ok();
}

Status CommitPoint::End(uint64_t version, bool loaded) {
  MutexLock lock(mu_);
  TERN_REQUIRE(version_ == version && held_ && !ended_, kNotFound,
               "sidecar: no commit of version ", version, " is open");
  ended_ = true;
  loaded_ = loaded;
  cv_.SignalAll();
  // The gate flips and reopens at once: apply returns as soon as it wakes.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kBeginSlackMs);
  cv_.WaitUntil(deadline, [&]() REQUIRES(mu_) { return done_; });
  if (!done_) return TERN_ERROR(kTimeout, "sidecar: the commit of version ", version, " did not close");
  return loaded ? result_ : Status::Ok();
}

bool CommitPoint::open() const {
  MutexLock lock(mu_);
  return !done_;
}

}  // namespace tern::agent
