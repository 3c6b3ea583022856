// What a LockWatch costs a watched Mutex (base/mutex.h): one uncontended
// lock and unlock, unwatched against watched (two getrusage(RUSAGE_THREAD)
// calls and a clock read per hold), beside std::mutex. The agent watches
// its own lock and its relay's, whose worker takes it once per event
// (a chunk's 4-5 ms SHA-256): docs/benchmarks.md "Who holds the agent's lock".
//   build/release/bench/lock_watch_bench
#include <benchmark/benchmark.h>

#include <mutex>

#include "base/mutex.h"

namespace tern {
namespace {

void BM_StdMutex(benchmark::State& state) {
  std::mutex mu;
  for (auto _ : state) {
    mu.lock();
    mu.unlock();
  }
}

void BM_Mutex(benchmark::State& state) {
  Mutex mu;
  for (auto _ : state) MutexLock lock(mu);
}

void BM_WatchedMutex(benchmark::State& state) {
  LockWatch watch(/*slow_us=*/100'000);
  Mutex mu;
  mu.Watch(&watch);
  for (auto _ : state) MutexLock lock(mu);
}

BENCHMARK(BM_StdMutex);
BENCHMARK(BM_Mutex);
BENCHMARK(BM_WatchedMutex);

}  // namespace
}  // namespace tern

BENCHMARK_MAIN();
