// Workloads and timing helpers shared by the codec benchmarks
// (codec_report, codec_bench): one optimizer step as an (old, new) pair of
// serve views over contiguous buffers this struct owns.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tern/thread_pool.h"
#include "tern/status.h"
#include "tern/view.h"

namespace tern::bench {

struct StepPair {
  std::string source;  // how it was made, for the report
  std::vector<TensorDesc> descs;
  std::vector<uint8_t> old_bytes, new_bytes;  // tensors back to back, in descs order
  std::vector<uint64_t> offsets;              // byte offset of each tensor
  ServeView old_view, new_view;
  uint64_t changed = 0;

  uint64_t bytes() const { return old_bytes.size(); }
  // A mutable view with this layout over `buffer` (bytes() long).
  MutableServeView ViewOver(std::vector<uint8_t>& buffer) const;
  void BuildViews();
};

// Synthetic BF16 step (bench/baselines/synth.h) at an exact density, cut into
// [rows, 4096] tensors of at most 16M elements like a model's linear layers.
StepPair MakeSynthPair(uint64_t elements, double density, uint64_t seed, ThreadPool& pool);

// The datagen trace generator (include/tern/datagen.h): a model of ~params
// parameters served as BF16, stepped `steps` times at `lr`; the pair is the
// last step (old = view after steps-1, new = view after steps).
Result<StepPair> MakeTracePair(uint64_t params, double lr, uint64_t steps, uint64_t seed,
                               ThreadPool& pool);

// memcpy of `bytes` split over the pool in 8 MiB slices.
void ParallelMemcpy(uint8_t* dst, const uint8_t* src, uint64_t bytes, ThreadPool& pool);

// Best (minimum) times of `reps` runs of fn, in seconds; `prepare` runs
// untimed before each. cpu is the process's CPU time (all threads): on a
// shared, overloaded machine the 1-thread cpu time is the steadier figure.
struct Timing {
  double wall_s = 0;
  double cpu_s = 0;
};
Timing BestTiming(int reps, const std::function<void()>& fn,
                  const std::function<void()>& prepare = nullptr);
inline double BestSeconds(int reps, const std::function<void()>& fn,
                          const std::function<void()>& prepare = nullptr) {
  return BestTiming(reps, fn, prepare).wall_s;
}

// The 1-minute load average (/proc/loadavg), or -1.
double LoadAverage();

}  // namespace tern::bench
