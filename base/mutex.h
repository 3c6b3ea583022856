// Mutex, MutexLock, CondVar, SharedMutex: std::mutex, std::lock_guard,
// std::condition_variable and std::shared_mutex with the capability
// attributes Clang's thread-safety analysis needs (base/thread_annotations.h;
// leveldb's port::Mutex and abseil's absl::Mutex do the same). Same
// semantics, same cost: each is the std type inside. A Mutex may also be
// watched (LockWatch): who held it how long, for the one lock whose holders
// others wait on (the agent's).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/thread_annotations.h"

namespace tern {

class CondVar;

// Where a lock was taken: MutexLock's caller, through the default argument
// Here() (the compilers' __builtin_FILE/LINE/FUNCTION, which Debian's clang
// 14 has and its std::source_location does not).
struct LockSite {
  static constexpr LockSite Here(const char* file = __builtin_FILE(), int line = __builtin_LINE(),
                                 const char* function = __builtin_FUNCTION()) {
    return {file, function, line};
  }
  const char* file = "";
  const char* function = "";
  int line = 0;
};

// Hold times of one Mutex (Mutex::Watch): each hold of slow_us or more is
// counted, the longest kept, the newest kSlowHolds kept in order, each with
// where it was taken (MutexLock's caller), how much of it the holder spent on
// a CPU, and how often it left the CPU: blocked (a voluntary switch: I/O,
// another lock, a sleep) or preempted (an involuntary one: the machine was
// busy). Time waiting on a CondVar is not holding. Real time (steady clock),
// not an Env's: a hold is a cost paid by the machine. The holder's
// bookkeeping is two reads each of the steady clock and of its thread's
// rusage (a system call).
class LockWatch {
 public:
  static constexpr size_t kSlowHolds = 16;
  struct Hold {
    std::string site;  // "agent_root.cc:812 PublishViewLocked"
    uint64_t held_us = 0;
    uint64_t cpu_us = 0;  // of held_us, the holder's thread on a CPU
    uint64_t blocked = 0;    // voluntary context switches while held
    uint64_t preempted = 0;  // involuntary ones
    uint64_t seq = 0;  // 1, 2, ...: the slow holds in the order they ended
  };
  struct Stats {
    uint64_t slow_holds = 0;
    Hold longest;              // held_us 0: none yet
    std::vector<Hold> recent;  // oldest first, at most kSlowHolds
  };

  explicit LockWatch(uint64_t slow_us) : slow_us_(slow_us) {}
  LockWatch(const LockWatch&) = delete;
  LockWatch& operator=(const LockWatch&) = delete;

  Stats Read() const;
  // The slow holds after seq `after` (those still kept), oldest first.
  std::vector<Hold> Since(uint64_t after) const;

 private:
  friend class Mutex;
  friend class CondVar;
  // Both with the watched mutex held, so the holder's fields need no lock.
  void Taken(const LockSite& at);
  void Released();

  const uint64_t slow_us_;
  uint64_t since_ns_ = 0;
  uint64_t since_cpu_us_ = 0, since_blocked_ = 0, since_preempted_ = 0;
  LockSite at_;
  mutable std::mutex stats_mu_;  // taken only on a slow hold and by readers
  Stats stats_;
};

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  // `at` names the holder for a LockWatch; MutexLock passes its caller's.
  void Lock(LockSite at = LockSite::Here()) ACQUIRE() {
    mu_.lock();
    if (watch_) watch_->Taken(at);
  }
  // Takes the mutex only if no one holds it (a handler that must answer
  // promptly rather than wait out a long hold).
  bool TryLock(LockSite at = LockSite::Here()) TRY_ACQUIRE(true) {
    if (!mu_.try_lock()) return false;
    if (watch_) watch_->Taken(at);
    return true;
  }
  // TryLock, asked again every 5 ms until `wait` has passed. Hold the
  // taken mutex with MutexLock(mu, AdoptLock{}) so that an exception
  // releases it.
  bool TryLockFor(std::chrono::milliseconds wait, LockSite at = LockSite::Here())
      TRY_ACQUIRE(true) NO_THREAD_SAFETY_ANALYSIS {
    const auto give_up = std::chrono::steady_clock::now() + wait;
    while (!TryLock(at)) {
      if (std::chrono::steady_clock::now() >= give_up) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }
  void Unlock() RELEASE() {
    if (watch_) watch_->Released();
    mu_.unlock();
  }
  // For the analysis only: states that the caller holds this mutex (a
  // callback that its caller runs with the mutex held).
  void AssertHeld() const ASSERT_CAPABILITY(this) {}
  // Before any thread takes this mutex; `w` outlives it.
  void Watch(LockWatch* w) { watch_ = w; }

 private:
  friend class CondVar;
  std::mutex mu_;
  LockWatch* watch_ = nullptr;
};

// Holds a Mutex for its scope. Unlock/Lock in between release and retake it
// (the analysis follows both).
// MutexLock's tag for a mutex the caller holds already (a TryLock that
// succeeded): the lock releases it at the end of its scope.
struct AdoptLock {};

class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu, LockSite at = LockSite::Here()) ACQUIRE(mu) : mu_(mu) {
    mu_.Lock(at);
  }
  MutexLock(Mutex& mu, AdoptLock) REQUIRES(mu) : mu_(mu) {}
  ~MutexLock() RELEASE() {
    if (held_) mu_.Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    mu_.Unlock();
    held_ = false;
  }
  void Lock(LockSite at = LockSite::Here()) ACQUIRE() {
    mu_.Lock(at);
    held_ = true;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

// A condition variable over a Mutex the caller holds. The waits carry no
// REQUIRES: the analysis cannot tell that the caller's mutex is the one
// named at construction (leveldb's port::CondVar makes the same choice).
class CondVar {
 public:
  explicit CondVar(Mutex* mu) : mu_(mu) {}
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Releases the mutex while waiting; holds it again on return.
  void Wait() {
    Pause pause(mu_);
    std::unique_lock<std::mutex> lock(mu_->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // Waits until pred() (evaluated with the mutex held) is true. A lambda
  // that reads guarded members says REQUIRES(mu) (its body is checked so).
  template <typename Pred>
  void Wait(Pred pred) NO_THREAD_SAFETY_ANALYSIS {
    while (!pred()) Wait();
  }
  // Waits until pred() or the deadline; returns pred().
  template <typename Clock, typename Duration, typename Pred>
  bool WaitUntil(const std::chrono::time_point<Clock, Duration>& deadline, Pred pred)
      NO_THREAD_SAFETY_ANALYSIS {
    if (pred()) return true;  // no wait: the hold goes on unbroken
    Pause pause(mu_);
    std::unique_lock<std::mutex> lock(mu_->mu_, std::adopt_lock);
    const bool ok = cv_.wait_until(lock, deadline, pred);
    lock.release();
    return ok;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  // A watched mutex's hold ends while its holder waits and begins again,
  // at the same site, when the wait returns. (pred() runs inside the wait,
  // with the mutex held, and is not counted: it is a few loads.)
  struct Pause {
    explicit Pause(Mutex* mu) : watch(mu->watch_) {
      if (watch) {
        at = watch->at_;
        watch->Released();
      }
    }
    ~Pause() {
      if (watch) watch->Taken(at);
    }
    LockWatch* watch;
    LockSite at;
  };
  Mutex* const mu_;
  std::condition_variable cv_;
};

class CAPABILITY("shared_mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  void LockShared() ACQUIRE_SHARED() { mu_.lock_shared(); }
  void UnlockShared() RELEASE_SHARED() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

class SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(SharedMutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~WriterLock() RELEASE() { mu_.Unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  SharedMutex& mu_;
};

class SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex& mu) ACQUIRE_SHARED(mu) : mu_(mu) { mu_.LockShared(); }
  ~ReaderLock() RELEASE() { mu_.UnlockShared(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  SharedMutex& mu_;
};

}  // namespace tern
