#include "tern/thread_pool.h"

namespace tern {

ThreadPool::ThreadPool(unsigned threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  workers_.reserve(threads - 1);
  for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunItems() {
  std::unique_lock<std::mutex> lock(mu_);
  while (next_ < n_) {
    const uint64_t i = next_++;
    const auto* fn = fn_;
    lock.unlock();
    (*fn)(i);
    lock.lock();
    if (++finished_ == n_) done_.notify_all();
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    ++busy_;
    lock.unlock();
    RunItems();
    lock.lock();
    if (--busy_ == 0) done_.notify_all();
  }
}

void ThreadPool::ParallelFor(uint64_t n, const std::function<void(uint64_t)>& fn) {
  if (n == 0) return;
  if (workers_.empty() || n == 1) {
    for (uint64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    next_ = 0;
    finished_ = 0;
    ++generation_;
  }
  wake_.notify_all();
  RunItems();
  std::unique_lock<std::mutex> lock(mu_);
  // Wait for all items and for every worker to leave RunItems, so fn_ is not
  // touched after we return.
  done_.wait(lock, [&] { return finished_ == n_ && busy_ == 0; });
  fn_ = nullptr;
}

}  // namespace tern
