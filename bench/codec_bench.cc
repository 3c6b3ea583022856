// Google Benchmark microbenchmarks of the patch codec and its baselines on a
// synthetic BF16 step (64 MiB views: past the caches, quick to repeat).
// Arguments: density in units of 0.1% (1 = 0.1%, 10 = 1%, 50 = 5%), threads.
// The per-density report with ratios is codec_report; this is for profiling
// and regression tracking (--benchmark_format=json).
#include <benchmark/benchmark.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "bench/baselines/generic.h"
#include "bench/baselines/pulse.h"
#include "bench/harness.h"
#include "tern/digest.h"
#include "tern/patch.h"

namespace tern::bench {
namespace {

constexpr uint64_t kElements = uint64_t{32} << 20;

struct Case {
  StepPair pair;
  ViewDigest base;
  std::vector<uint8_t> patch, pulse;
};

// Workloads are built once per density and shared by the benchmarks of this
// process (building one costs more than timing it).
Case& GetCase(int64_t per_mille) {
  static std::mutex mu;
  static std::map<int64_t, std::unique_ptr<Case>> cases;
  std::lock_guard<std::mutex> lock(mu);
  auto& c = cases[per_mille];
  if (!c) {
    ThreadPool pool(0);
    c = std::make_unique<Case>();
    c->pair = MakeSynthPair(kElements, double(per_mille) / 1000.0, 1, pool);
    c->base = ComputeDigest(c->pair.old_view, pool);
    auto patch = Diff(c->pair.old_view, c->pair.new_view, {}, pool, &c->base);
    TERN_ASSERT(patch.ok(), patch.status().ToString());
    c->patch = std::move(*patch);
    auto pulse = PulseEncode(c->pair.old_view, c->pair.new_view);
    TERN_ASSERT(pulse.ok(), pulse.status().ToString());
    c->pulse = std::move(*pulse);
  }
  return *c;
}

void SetCounters(benchmark::State& state, const Case& c, uint64_t patch_bytes) {
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(c.pair.bytes()));
  state.counters["patch_bytes"] = double(patch_bytes);
  state.counters["bits_per_change"] = 8.0 * double(patch_bytes) / double(c.pair.changed);
}

void BM_Memcpy(benchmark::State& state) {
  Case& c = GetCase(state.range(0));
  ThreadPool pool(unsigned(state.range(1)));
  std::vector<uint8_t> dst(c.pair.bytes(), 1);
  for (auto _ : state) {
    ParallelMemcpy(dst.data(), c.pair.new_bytes.data(), c.pair.bytes(), pool);
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(c.pair.bytes()));
}

void BM_TernDiff(benchmark::State& state) {
  Case& c = GetCase(state.range(0));
  ThreadPool pool(unsigned(state.range(1)));
  for (auto _ : state) {
    auto patch = Diff(c.pair.old_view, c.pair.new_view, {}, pool, &c.base);
    if (!patch.ok()) state.SkipWithError(patch.status().ToString().c_str());
    benchmark::DoNotOptimize(patch);
  }
  SetCounters(state, c, c.patch.size());
}

void BM_TernApply(benchmark::State& state) {
  Case& c = GetCase(state.range(0));
  ThreadPool pool(unsigned(state.range(1)));
  std::vector<uint8_t> work(c.pair.bytes());
  MutableServeView view = c.pair.ViewOver(work);
  for (auto _ : state) {
    state.PauseTiming();
    ParallelMemcpy(work.data(), c.pair.old_bytes.data(), c.pair.bytes(), pool);
    state.ResumeTiming();
    Status s = Apply(view, c.patch, c.base, pool);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
  }
  SetCounters(state, c, c.patch.size());
}

void BM_PulseEncode(benchmark::State& state) {
  Case& c = GetCase(state.range(0));
  for (auto _ : state) {
    auto patch = PulseEncode(c.pair.old_view, c.pair.new_view);
    benchmark::DoNotOptimize(patch);
  }
  SetCounters(state, c, c.pulse.size());
}

void BM_PulseApply(benchmark::State& state) {
  Case& c = GetCase(state.range(0));
  std::vector<uint8_t> work(c.pair.bytes());
  MutableServeView view = c.pair.ViewOver(work);
  for (auto _ : state) {
    state.PauseTiming();
    std::memcpy(work.data(), c.pair.old_bytes.data(), c.pair.bytes());
    state.ResumeTiming();
    Status s = PulseApply(c.pulse, view);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
  }
  SetCounters(state, c, c.pulse.size());
}

void BM_ZstdXor3(benchmark::State& state) {
  Case& c = GetCase(state.range(0));
  uint64_t bytes = 0;
  for (auto _ : state) {
    auto n = ZstdXorBytes(c.pair.old_bytes, c.pair.new_bytes, 3);
    bytes = n.ok() ? *n : 0;
  }
  SetCounters(state, c, bytes);
}

void ThreadedArgs(benchmark::internal::Benchmark* b) {
  const int64_t hw = std::max(1u, std::thread::hardware_concurrency());
  for (int64_t d : {1, 10, 50}) {
    b->Args({d, 1});
    if (hw > 1) b->Args({d, hw});
  }
}
void SingleArgs(benchmark::internal::Benchmark* b) {
  for (int64_t d : {1, 10, 50}) b->Args({d, 1});
}

BENCHMARK(BM_Memcpy)->Apply(ThreadedArgs)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TernDiff)->Apply(ThreadedArgs)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TernApply)->Apply(ThreadedArgs)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PulseEncode)->Apply(SingleArgs)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PulseApply)->Apply(SingleArgs)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ZstdXor3)->Apply(SingleArgs)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tern::bench

BENCHMARK_MAIN();
