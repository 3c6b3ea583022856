// A fixed-size thread pool with a bounded parallel-for. Passed in (never a
// global) so callers choose the core budget: tests use 1-2 threads, the CLI
// uses --threads (default: hardware concurrency).
//
// Thread safety: ParallelFor may be called from one thread at a time.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tern {

class ThreadPool {
 public:
  // threads == 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(unsigned threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned size() const { return static_cast<unsigned>(workers_.size()) + 1; }

  // Runs fn(i) for i in [0, n), spread over the pool and the calling thread,
  // and returns when all calls are done. Items are claimed in order.
  void ParallelFor(uint64_t n, const std::function<void(uint64_t)>& fn);

 private:
  void WorkerLoop();
  void RunItems();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(uint64_t)>* fn_ = nullptr;  // guarded by mu_
  uint64_t n_ = 0;
  uint64_t next_ = 0;
  uint64_t finished_ = 0;
  uint64_t generation_ = 0;
  unsigned busy_ = 0;
  bool stop_ = false;
};

}  // namespace tern
