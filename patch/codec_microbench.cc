// Quick single-thread codec micro-benchmark (the benchmark suite proper lives in
// bench/): one BF16 tensor of 2^26 N(0,0.02) values, changes of +-1/+-2 ulp
// at geometric gaps with the given density. Times are CPU time of the calling
// thread (min of repeats), so they hold up on a shared, loaded machine.
// Usage: patch_microbench [density] [apply_repeats]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include "common/thread_pool.h"
#include "patch/test_util.h"
#include "tern/patch.h"
using namespace tern;
#include <ctime>
static double Now() { timespec ts; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); return ts.tv_sec + ts.tv_nsec * 1e-9; }
int main(int argc, char** argv) {
  const uint64_t n = uint64_t{1} << 26;
  const double density = argc > 1 ? atof(argv[1]) : 0.01;
  const int apply_reps = argc > 2 ? std::max(1, atoi(argv[2])) : 5;
  testing::OwnedView a;
  a.Add("w", DType::kBF16, {n});
  std::mt19937_64 rng(1);
  { uint16_t* p = (uint16_t*)a.data[0].data(); std::normal_distribution<float> nd(0, 0.02f);
    for (uint64_t i = 0; i < n; ++i) { float f = nd(rng); uint32_t u; memcpy(&u, &f, 4); p[i] = u >> 16; } }
  testing::OwnedView b = a;
  uint16_t* q = (uint16_t*)b.data[0].data();
  std::bernoulli_distribution pick(density);
  uint64_t changed = 0; std::map<uint64_t,uint64_t> hist;
  std::geometric_distribution<uint64_t> gap(density);
  for (uint64_t i = gap(rng); i < n; i += 1 + gap(rng)) { int d = (rng() % 8 == 0) ? 2 : 1; if (rng() & 1) d = -d; q[i] = (uint16_t)(q[i] + d); changed++; hist[(uint16_t)(q[i]-((uint16_t*)a.data[0].data())[i])]++; }
  ThreadPool pool(1);
  std::vector<uint8_t> dst(a.data[0].size());
  double t0 = Now(); memcpy(dst.data(), b.data[0].data(), dst.size()); double t_memcpy = Now() - t0;
  t0 = Now(); memcpy(dst.data(), b.data[0].data(), dst.size()); t_memcpy = std::min(t_memcpy, Now() - t0);
  t0 = Now(); ViewDigest base = ComputeDigest(a.View(), pool); double t_digest = Now() - t0;
  DiffOptions o;
  t0 = Now(); auto p = Diff(a.View(), b.View(), o, pool, &base); double t_diff = Now() - t0;
  for (int rep = 0; rep < 4; ++rep) { t0 = Now(); auto p2 = Diff(a.View(), b.View(), o, pool, &base); t_diff = std::min(t_diff, Now() - t0); }
  std::vector<uint8_t> orig = a.data[0];
  MutableServeView mv = a.Mutable();
  double t_apply = 1e9; Status s;
  for (int rep = 0; rep < apply_reps; ++rep) { memcpy(a.data[0].data(), orig.data(), orig.size()); t0 = Now(); s = Apply(mv, *p, base, pool); t_apply = std::min(t_apply, Now() - t0); }
  for (int rep = 0; rep < 3; ++rep) { t0 = Now(); memcpy(dst.data(), b.data[0].data(), dst.size()); t_memcpy = std::min(t_memcpy, Now() - t0); }
  for (int rep = 0; rep < 2; ++rep) { t0 = Now(); ComputeDigest(a.View(), pool); t_digest = std::min(t_digest, Now() - t0); }
  if (!s.ok() || a.data[0] != b.data[0]) { printf("FAIL %s\n", s.ToString().c_str()); return 1; }
  double pr = (double)changed / n, H = -(pr*log2(pr) + (1-pr)*log2(1-pr));
  double hv = 0; for (auto& [k,c] : hist) { double f = (double)c / changed; hv -= f * log2(f); }
  double bound_bytes = (n * H + changed * hv) / 8;
  double ti0 = Now(); auto info = Inspect(*p); double t_inspect = Now() - ti0; printf("inspect (decode only) %.1f ms = %.1f ns/change\n", t_inspect*1e3, t_inspect/changed*1e9);
  printf("n=%llu density=%.4f changed=%llu patch=%zu bytes (%.2f bits/change) bound=%.0f ratio=%.3f pos=%llu val=%llu hdr=%llu\n",
    (unsigned long long)n, pr, (unsigned long long)changed, p->size(), 8.0*p->size()/changed, bound_bytes, p->size()/bound_bytes,
    (unsigned long long)info->position_bytes, (unsigned long long)info->value_bytes, (unsigned long long)info->header_bytes);
  printf("memcpy %.1f ms | digest %.1f ms (%.2f GB/s, %.2f ns/elem) | diff %.1f ms (%.2fx memcpy) | apply %.1f ms (%.2fx memcpy, %.1f ns/change)\n",
    t_memcpy*1e3, t_digest*1e3, dst.size()/t_digest/1e9, t_digest/n*1e9, t_diff*1e3, t_diff/t_memcpy, t_apply*1e3, t_apply/t_memcpy, t_apply/changed*1e9);
}
