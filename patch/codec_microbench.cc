// Quick single-thread codec micro-benchmark (the benchmark suite proper lives in
// bench/): one BF16 tensor of 2^26 N(0,0.02) values, changes of +-1/+-2 ulp
// at geometric gaps with the given density. Times are CPU time of the calling
// thread (min of repeats), so they hold up on a shared, loaded machine.
//
// Apply is timed both ways in one process, alternately, each rep against a
// freshly restored view: the default (verify, then write) and
// ApplyOptions::exclusive_view (write while verifying), plus an exclusive
// apply of a forged patch (wrong target digest) that must undo everything.
// memcpy of the view is timed between them, so every ratio compares figures
// taken under the same load.
// Usage: patch_microbench [density] [apply_repeats] [threads]
// threads > 1: the pool has that many threads and times are wall-clock
// (for many-core hosts, where the digest nears memory bandwidth); the
// apply figures are then not per core.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <random>

#include "tern/thread_pool.h"
#include "patch/digest_mix.h"
#include "patch/test_util.h"
#include "tern/patch.h"

using namespace tern;

static clockid_t g_clock = CLOCK_THREAD_CPUTIME_ID;

static double Now() {
  timespec ts;
  clock_gettime(g_clock, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double LoadAverage() {
  double l = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

int main(int argc, char** argv) {
  const uint64_t n = uint64_t{1} << 26;
  const double density = argc > 1 ? atof(argv[1]) : 0.01;
  const int apply_reps = argc > 2 ? std::max(1, atoi(argv[2])) : 5;
  const int threads = argc > 3 ? std::clamp(atoi(argv[3]), 1, 256) : 1;
  if (threads > 1) g_clock = CLOCK_MONOTONIC;
  const double load_start = LoadAverage();
  testing::OwnedView a;
  a.Add("w", DType::kBF16, {n});
  std::mt19937_64 rng(1);
  {
    uint16_t* p = reinterpret_cast<uint16_t*>(a.data[0].data());
    std::normal_distribution<float> nd(0, 0.02f);
    for (uint64_t i = 0; i < n; ++i) {
      float f = nd(rng);
      uint32_t u;
      memcpy(&u, &f, 4);
      p[i] = static_cast<uint16_t>(u >> 16);
    }
  }
  testing::OwnedView b = a;
  const uint16_t* old_bits = reinterpret_cast<const uint16_t*>(a.data[0].data());
  uint16_t* q = reinterpret_cast<uint16_t*>(b.data[0].data());
  uint64_t changed = 0;
  std::vector<uint32_t> changed_at;  // for the memory floor below
  std::map<uint64_t, uint64_t> hist;
  std::geometric_distribution<uint64_t> gap(density);
  for (uint64_t i = gap(rng); i < n; i += 1 + gap(rng)) {
    int d = (rng() % 8 == 0) ? 2 : 1;
    if (rng() & 1) d = -d;
    q[i] = static_cast<uint16_t>(q[i] + d);
    changed++;
    changed_at.push_back(static_cast<uint32_t>(i));
    hist[static_cast<uint16_t>(q[i] - old_bits[i])]++;
  }
  ThreadPool pool(threads);
  std::vector<uint8_t> dst(a.data[0].size());
  auto time_memcpy = [&] {
    const double t0 = Now();
    memcpy(dst.data(), b.data[0].data(), dst.size());
    return Now() - t0;
  };
  double t_memcpy = std::min(time_memcpy(), time_memcpy());
  double t0 = Now();
  const ViewDigest base = ComputeDigest(a.View(), pool);
  double t_digest = Now() - t0;
  DiffOptions o;
  t0 = Now();
  auto p = Diff(a.View(), b.View(), o, pool, &base);
  double t_diff = Now() - t0;
  if (!p.ok()) {
    printf("FAIL diff: %s\n", p.status().ToString().c_str());
    return 1;
  }
  // The root's publish: D(old) checked, as a pass of its own before the
  // diff (as it was) and hashed in the diff's pass (Diff's old_digest).
  double t_digest_then_diff = 1e9, t_diff_hashing = 1e9;
  for (int rep = 0; rep < 4; ++rep) {
    t0 = Now();
    auto p2 = Diff(a.View(), b.View(), o, pool, &base);
    t_diff = std::min(t_diff, Now() - t0);
    t0 = Now();
    const bool same = ComputeDigest(a.View(), pool) == base;
    auto p3 = Diff(a.View(), b.View(), o, pool, &base);
    t_digest_then_diff = std::min(t_digest_then_diff, Now() - t0);
    t0 = Now();
    ViewDigest hashed;
    auto p4 = Diff(a.View(), b.View(), o, pool, &base, &hashed);
    t_diff_hashing = std::min(t_diff_hashing, Now() - t0);
    if (!same || hashed != base || !p4.ok() || *p4 != *p2) return printf("FAIL diff hashing the base\n"), 1;
  }

  // The same changes with a forged target digest (one record claims a wrong
  // digest change): the exclusive path writes everything, then must undo it.
  std::vector<uint8_t> forged;
  {
    PatchBuilder builder(a.View(), 0, 0, base);
    bool tampered = false;
    for (uint64_t first = 0; first < n; first += o.segment_elements) {
      auto rec = EncodeSegment(a.View(), b.View(), 0, first, std::min(o.segment_elements, n - first));
      if (!rec.ok()) return printf("FAIL encode: %s\n", rec.status().ToString().c_str()), 1;
      if (rec->bytes.empty()) continue;
      if (!tampered) {
        rec->digest_delta.lanes[0] += 1;
        tampered = true;
      }
      if (Status s = builder.Add(std::move(rec).value()); !s.ok()) return printf("FAIL add\n"), 1;
    }
    auto built = builder.Finish();
    if (!built.ok()) return printf("FAIL finish: %s\n", built.status().ToString().c_str()), 1;
    forged = std::move(built).value();
  }

  const std::vector<uint8_t> orig = a.data[0];
  MutableServeView mv = a.Mutable();
  ApplyOptions exclusive;
  exclusive.exclusive_view = true;
  double t_apply = 1e9, t_exclusive = 1e9, t_failed = 1e9, t_inspect = 1e9, t_touch = 1e9;
  for (int rep = 0; rep < apply_reps; ++rep) {
    // The memory floor: read-modify-write of every changed element from a
    // ready list, prefetched 32 ahead like apply, with no decode and no hash.
    memcpy(a.data[0].data(), orig.data(), orig.size());
    uint16_t* w = reinterpret_cast<uint16_t*>(a.data[0].data());
    t0 = Now();
    for (size_t j = 0; j < changed_at.size(); ++j) {
      if (j + 32 < changed_at.size()) __builtin_prefetch(w + changed_at[j + 32], 1);
      w[changed_at[j]] = static_cast<uint16_t>(w[changed_at[j]] + 1);
    }
    t_touch = std::min(t_touch, Now() - t0);

    // Parse and decode alone (no view): the floor under either apply.
    t0 = Now();
    if (!Inspect(*p).ok()) return printf("FAIL inspect\n"), 1;
    t_inspect = std::min(t_inspect, Now() - t0);

    memcpy(a.data[0].data(), orig.data(), orig.size());
    t0 = Now();
    Status s = Apply(mv, *p, base, pool);
    t_apply = std::min(t_apply, Now() - t0);
    if (!s.ok() || a.data[0] != b.data[0]) return printf("FAIL default apply: %s\n", s.ToString().c_str()), 1;
    t_memcpy = std::min(t_memcpy, time_memcpy());

    memcpy(a.data[0].data(), orig.data(), orig.size());
    t0 = Now();
    s = Apply(mv, *p, base, pool, exclusive);
    t_exclusive = std::min(t_exclusive, Now() - t0);
    if (!s.ok() || a.data[0] != b.data[0]) return printf("FAIL exclusive apply: %s\n", s.ToString().c_str()), 1;
    t_memcpy = std::min(t_memcpy, time_memcpy());

    memcpy(a.data[0].data(), orig.data(), orig.size());
    t0 = Now();
    s = Apply(mv, forged, base, pool, exclusive);
    t_failed = std::min(t_failed, Now() - t0);
    if (s.code() != Code::kCorrupt || a.data[0] != orig) return printf("FAIL forged: %s\n", s.ToString().c_str()), 1;
  }
  for (int rep = 0; rep < 2; ++rep) {
    t0 = Now();
    ComputeDigest(a.View(), pool);
    t_digest = std::min(t_digest, Now() - t0);
  }
  // The build floor's loop (x86-64-v3), one thread, against the one chosen
  // at run time (AVX-512DQ where present) on the same thread.
  double t_floor = 1e9, t_chosen = 1e9;
  bool other_loop = false;
  {
    const TensorRef t = a.View().tensors[0];
    const uint64_t seed = TensorSeed(*t.desc);
    const clockid_t clock = g_clock;
    g_clock = CLOCK_THREAD_CPUTIME_ID;
    for (int rep = 0; rep < 2; ++rep) {
      ViewDigest x, y;
      t0 = Now();
      other_loop = patch::AccumulateElementsPortable(t, seed, 0, n, x.lanes.data());
      t_floor = std::min(t_floor, Now() - t0);
      t0 = Now();
      patch::AccumulateElements(t, seed, 0, n, y.lanes.data());
      t_chosen = std::min(t_chosen, Now() - t0);
      if (x != y) return printf("FAIL the two digest loops disagree\n"), 1;
    }
    g_clock = clock;
  }
  double pr = static_cast<double>(changed) / n, H = -(pr * log2(pr) + (1 - pr) * log2(1 - pr));
  double hv = 0;
  for (auto& [k, c] : hist) {
    double f = static_cast<double>(c) / changed;
    hv -= f * log2(f);
  }
  double bound_bytes = (n * H + changed * hv) / 8;
  auto info = Inspect(*p);
  printf("n=%llu density=%.4f changed=%llu patch=%zu bytes (%.2f bits/change) bound=%.0f ratio=%.3f pos=%llu "
         "val=%llu hdr=%llu\n",
         (unsigned long long)n, pr, (unsigned long long)changed, p->size(), 8.0 * p->size() / changed, bound_bytes,
         p->size() / bound_bytes, (unsigned long long)info->position_bytes, (unsigned long long)info->value_bytes,
         (unsigned long long)info->header_bytes);
  printf("memcpy %.1f ms | digest %.1f ms (%.2f GB/s, %.2f ns/elem) | diff %.1f ms (%.2fx memcpy)\n",
         t_memcpy * 1e3, t_digest * 1e3, dst.size() / t_digest / 1e9, t_digest / n * 1e9, t_diff * 1e3,
         t_diff / t_memcpy);
  printf("D(old) then diff %.1f ms | diff hashing D(old) in its pass %.1f ms (%.2fx the two passes)\n",
         t_digest_then_diff * 1e3, t_diff_hashing * 1e3, t_diff_hashing / t_digest_then_diff);
  printf("memory floor (RMW of each changed element, prefetched) %.1f ms (%.2fx memcpy)\n", t_touch * 1e3,
         t_touch / t_memcpy);
  printf("decode only (Inspect) %.1f ms (%.2fx memcpy) | apply default %.1f ms (%.2fx memcpy, %.1f ns/change) | exclusive %.1f ms (%.2fx memcpy, %.1f ns/change, "
         "%.2fx default) | exclusive forged+undo %.1f ms (%.2fx memcpy)\n",
         t_inspect * 1e3, t_inspect / t_memcpy, t_apply * 1e3, t_apply / t_memcpy, t_apply / changed * 1e9, t_exclusive * 1e3, t_exclusive / t_memcpy,
         t_exclusive / changed * 1e9, t_exclusive / t_apply, t_failed * 1e3, t_failed / t_memcpy);
  printf("digest loop, one thread: build floor %.1f ms, chosen at run time %.1f ms (%s, %.2fx)\n",
         t_floor * 1e3, t_chosen * 1e3, other_loop ? "AVX-512" : "the same loop", t_floor / t_chosen);
  printf("threads %d (%s), reps %d, load average %.2f at start, %.2f at end\n", threads,
         threads > 1 ? "wall clock" : "thread cpu time", apply_reps, load_start, LoadAverage());
}
