// ThreadTracker: detached threads that an owner waits for in its destructor.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace tern {

// Backend threads run detached (a connection may be released from its own
// callback, where a join would deadlock); the owner waits for all of them in
// its destructor instead. The function must not touch the owner after it
// returns: the count drops after it.
class ThreadTracker {
 public:
  ~ThreadTracker() { WaitAll(); }
  void Spawn(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++live_;
    }
    std::thread([this, fn = std::move(fn)]() mutable {
      fn();
      fn = nullptr;  // release captures before we signal
      std::lock_guard<std::mutex> lock(mu_);
      if (--live_ == 0) cv_.notify_all();
    }).detach();
  }
  void WaitAll() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return live_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t live_ = 0;
};

}  // namespace tern
