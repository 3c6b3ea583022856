#include "bench/harness.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <limits>

#include "bench/baselines/synth.h"
#include "tern/datagen.h"

namespace tern::bench {

void StepPair::BuildViews() {
  old_view = {};
  new_view = {};
  for (size_t t = 0; t < descs.size(); ++t) {
    old_view.tensors.push_back({&descs[t], old_bytes.data() + offsets[t]});
    new_view.tensors.push_back({&descs[t], new_bytes.data() + offsets[t]});
  }
}

MutableServeView StepPair::ViewOver(std::vector<uint8_t>& buffer) const {
  TERN_ASSERT(buffer.size() == bytes());
  MutableServeView v;
  for (size_t t = 0; t < descs.size(); ++t) v.tensors.push_back({&descs[t], buffer.data() + offsets[t]});
  return v;
}

StepPair MakeSynthPair(uint64_t elements, double density, uint64_t seed, ThreadPool& pool) {
  SynthOptions o;
  o.elements = elements;
  o.density = density;
  o.seed = seed;
  SynthStep s = SynthesizeBf16Step(o, pool);
  StepPair p;
  p.source = "synthetic BF16 N(0,0.02), uniform positions, +-1..4 ulp (90/7/2/1%)";
  p.changed = s.changed;
  p.old_bytes.resize(elements * 2);
  p.new_bytes.resize(elements * 2);
  std::memcpy(p.old_bytes.data(), s.old_bits.data(), elements * 2);
  std::memcpy(p.new_bytes.data(), s.new_bits.data(), elements * 2);
  constexpr uint64_t kCols = 4096, kMaxRows = 4096;
  uint64_t at = 0;
  for (int t = 0; at < elements; ++t) {
    const uint64_t left = elements - at;
    TensorDesc d;
    char name[64];
    std::snprintf(name, sizeof name, "model.layers.%03d.weight", t);
    d.name = name;
    d.dtype = DType::kBF16;
    if (left >= kCols)
      d.shape = {std::min(kMaxRows, left / kCols), kCols};
    else
      d.shape = {left};
    p.offsets.push_back(at * 2);
    at += d.elements();
    p.descs.push_back(std::move(d));
  }
  p.BuildViews();
  return p;
}

Result<StepPair> MakeTracePair(uint64_t params, double lr, uint64_t steps, uint64_t seed,
                               ThreadPool& pool) {
  TERN_REQUIRE(steps >= 1, kInvalidArgument, "trace: need at least one step");
  TraceConfig config;
  TERN_ASSIGN_OR_RETURN(config.shape, ChooseModelShape(params));
  config.seed = seed;
  config.adam.lr = lr;
  config.format = ServeFormat::kBF16;
  TERN_ASSIGN_OR_RETURN(auto gen, TraceGenerator::Create(config, pool));
  for (uint64_t s = 1; s < steps; ++s) TERN_RETURN_IF_ERROR(gen->Step());

  StepPair p;
  char src[160];
  std::snprintf(src, sizeof src, "datagen trace: %llu params, BF16, Adam lr %g, step %llu->%llu, seed %llu",
                static_cast<unsigned long long>(config.shape.parameters()), lr,
                static_cast<unsigned long long>(steps - 1), static_cast<unsigned long long>(steps),
                static_cast<unsigned long long>(seed));
  p.source = src;
  uint64_t total = 0;
  for (const auto& t : gen->view().tensors) {
    p.descs.push_back(*t.desc);
    p.offsets.push_back(total);
    total += t.desc->bytes();
  }
  p.old_bytes.resize(total);
  p.new_bytes.resize(total);
  for (size_t t = 0; t < p.descs.size(); ++t)
    std::memcpy(p.old_bytes.data() + p.offsets[t], gen->view().tensors[t].data, p.descs[t].bytes());
  TERN_RETURN_IF_ERROR(gen->Step());
  for (size_t t = 0; t < p.descs.size(); ++t)
    std::memcpy(p.new_bytes.data() + p.offsets[t], gen->view().tensors[t].data, p.descs[t].bytes());
  p.changed = gen->last_stats().changed;
  p.BuildViews();
  return p;
}

void ParallelMemcpy(uint8_t* dst, const uint8_t* src, uint64_t bytes, ThreadPool& pool) {
  constexpr uint64_t kSlice = uint64_t{8} << 20;
  const uint64_t slices = (bytes + kSlice - 1) / kSlice;
  if (pool.size() == 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
  pool.ParallelFor(slices, [&](uint64_t i) {
    const uint64_t off = i * kSlice;
    std::memcpy(dst + off, src + off, std::min(kSlice, bytes - off));
  });
}

namespace {
double CpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}
}  // namespace

Timing BestTiming(int reps, const std::function<void()>& fn, const std::function<void()>& prepare) {
  Timing best{std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
  for (int r = 0; r < reps; ++r) {
    if (prepare) prepare();
    const double c0 = CpuSeconds();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const auto t1 = std::chrono::steady_clock::now();
    const double c1 = CpuSeconds();
    best.wall_s = std::min(best.wall_s, std::chrono::duration<double>(t1 - t0).count());
    best.cpu_s = std::min(best.cpu_s, c1 - c0);
  }
  return best;
}

double LoadAverage() {
  FILE* f = std::fopen("/proc/loadavg", "r");
  if (!f) return -1;
  double l = -1;
  if (std::fscanf(f, "%lf", &l) != 1) l = -1;
  std::fclose(f);
  return l;
}

}  // namespace tern::bench
