// context_apply_bench: decode + apply of a format-2 patch of one datagen
// step against a memcpy of the view, with the decode split into its phases
// (docs/benchmarks.md "Format 2 decode + apply").
//
// One trace step (bench/harness.h MakeTracePair), diffed once in format 1 and
// once in format 2; then, `reps` times and interleaved so that load hits each
// alike, on one thread and on all:
//  * memcpy of the view;
//  * format 2 apply (verify, then write) and exclusive apply, and format 1's;
//  * one thread only, the phases of the format-2 decode over every CONTEXT
//    record: the class masks alone (BaseClassMasks), the substreams alone
//    without the base (gaps and values: ValidateContextStreams), and the whole
//    decode with a no-op consumer (masks, the walk over them, gaps, values).
// Best of the repetitions; one-thread figures are process CPU time, the
// others wall time. Every apply is checked bit for bit.
//
// Usage: context_apply_bench [--params 100M] [--lr 1.6e-7] [--steps 2] [--reps 5]
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "bench/harness.h"
#include "patch/container.h"
#include "patch/context_codec.h"
#include "tern/digest.h"
#include "tern/patch.h"
#include "tools/cli_args.h"

namespace tern::bench {
namespace {

struct Clock {
  double wall, cpu;
  static Clock Now() {
    timespec w, c;
    clock_gettime(CLOCK_MONOTONIC, &w);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c);
    return {w.tv_sec + w.tv_nsec * 1e-9, c.tv_sec + c.tv_nsec * 1e-9};
  }
};

// Best time of one measured thing across the interleaved repetitions.
struct Best {
  double s = 1e30;
  void Add(const Clock& a, const Clock& b, bool cpu) { s = std::min(s, cpu ? b.cpu - a.cpu : b.wall - a.wall); }
};

// The three phases of a CONTEXT decode over every CONTEXT record of `p`.
enum class Phase { kMasks, kStreams, kDecode };
uint64_t RunPhase(Phase phase, const patch::ParsedPatch& p, const ServeView& base) {
  uint64_t sink = 0;
  alignas(64) static uint8_t cls[patch::kContextBlock];
  alignas(64) static uint64_t masks[patch::kMaxClasses][patch::kContextBlockWords];
  for (const patch::RecordView& r : p.records) {
    if (r.h.encoding != patch::kContext) continue;
    const patch::ManifestTensor& mt = p.tensors[r.h.tensor_index];
    const uint8_t* data = base.tensors[r.h.tensor_index].data;
    Status s;
    if (phase == Phase::kMasks) {
      patch::ContextTable t;
      s = patch::ParseContextTable(r, &t);
      patch::DispatchWidth(mt.width_bits, [&]<int W>() {
        for (uint64_t b = 0; b < r.h.element_count; b += patch::kContextBlock) {
          const uint64_t n = std::min(patch::kContextBlock, r.h.element_count - b);
          patch::BaseClassMasks<W>(data, r.h.first_element + b, n, mt.context, t.e0, t.classes, cls, masks);
          sink += masks[b / patch::kContextBlock % t.classes][0];
        }
      });
    } else if (phase == Phase::kStreams) {
      s = patch::ValidateContextStreams(r, mt.width_bits);
    } else {
      s = patch::DecodeRecordOnBase(r, mt.width_bits, data, mt.context,
                                    [&](uint64_t pos, uint64_t delta) { sink += pos ^ delta; });
    }
    if (!s.ok()) std::fprintf(stderr, "phase failed: %s\n", s.ToString().c_str()), std::exit(1);
  }
  return sink;
}

Status Run(uint64_t params, double lr, uint64_t steps, int reps) {
  ThreadPool one(1), all(std::max(2u, std::thread::hardware_concurrency()));
  TERN_ASSIGN_OR_RETURN(StepPair p, MakeTracePair(params, lr, steps, 1, all));
  const ViewDigest base = ComputeDigest(p.old_view, all);
  DiffOptions d1;
  d1.format_version = 1;
  DiffOptions d2 = d1;
  d2.format_version = 2;
  TERN_ASSIGN_OR_RETURN(std::vector<uint8_t> f1, Diff(p.old_view, p.new_view, d1, all, &base));
  TERN_ASSIGN_OR_RETURN(std::vector<uint8_t> f2, Diff(p.old_view, p.new_view, d2, all, &base));
  TERN_ASSIGN_OR_RETURN(patch::ParsedPatch parsed2, patch::ParsePatch(f2));
  uint64_t context_records = 0;
  for (const patch::RecordView& r : parsed2.records) context_records += r.h.encoding == patch::kContext;

  std::vector<uint8_t> work(p.bytes()), dst(p.bytes());
  MutableServeView wv = p.ViewOver(work);
  ParallelMemcpy(dst.data(), p.new_bytes.data(), p.bytes(), all);  // fault the pages in
  auto reset = [&] { ParallelMemcpy(work.data(), p.old_bytes.data(), p.bytes(), all); };
  ApplyOptions excl;
  excl.exclusive_view = true;
  auto apply = [&](ThreadPool& pool, const std::vector<uint8_t>& patch, const ApplyOptions& o) {
    reset();
    const Clock a = Clock::Now();
    const Status s = Apply(wv, patch, base, pool, o);
    const Clock b = Clock::Now();
    if (!s.ok() || work != p.new_bytes)
      std::fprintf(stderr, "apply failed or not bit-exact: %s\n", s.ToString().c_str()), std::exit(1);
    return std::pair{a, b};
  };

  std::printf("trace %s: %.1f MB view, %.3f%% changed, format 1 %.3f MB, format 2 %.3f MB (%llu of %zu records "
              "CONTEXT), load %.1f\n",
              p.source.c_str(), p.bytes() / 1e6, 100.0 * p.changed / (p.bytes() / 2.0), f1.size() / 1e6,
              f2.size() / 1e6, static_cast<unsigned long long>(context_records), parsed2.records.size(),
              LoadAverage());
  uint64_t sink = 0;
  for (ThreadPool* pool : {&one, &all}) {
    const bool cpu = pool == &one;
    Best memcpy_s, a2, x2, a1, x1, masks, streams, decode;
    for (int rep = 0; rep < reps; ++rep) {
      {
        const Clock a = Clock::Now();
        ParallelMemcpy(dst.data(), p.new_bytes.data(), p.bytes(), *pool);
        memcpy_s.Add(a, Clock::Now(), cpu);
      }
      auto [a, b] = apply(*pool, f2, {});
      a2.Add(a, b, cpu);
      std::tie(a, b) = apply(*pool, f2, excl);
      x2.Add(a, b, cpu);
      std::tie(a, b) = apply(*pool, f1, {});
      a1.Add(a, b, cpu);
      std::tie(a, b) = apply(*pool, f1, excl);
      x1.Add(a, b, cpu);
      if (!cpu) continue;
      for (auto [phase, best] : {std::pair{Phase::kMasks, &masks}, std::pair{Phase::kStreams, &streams},
                                 std::pair{Phase::kDecode, &decode}}) {
        const Clock t0 = Clock::Now();
        sink += RunPhase(phase, parsed2, p.old_view);
        best->Add(t0, Clock::Now(), true);
      }
    }
    const double m = memcpy_s.s;
    std::printf("%u thread(s), best of %d, %s: memcpy %.1f ms | f2 apply %.3fx | f2 exclusive %.3fx | "
                "f1 apply %.3fx | f1 exclusive %.3fx (x memcpy)\n",
                pool->size(), reps, cpu ? "CPU time" : "wall time", m * 1e3, a2.s / m, x2.s / m, a1.s / m, x1.s / m);
    if (cpu)
      std::printf("  f2 phases (x memcpy): masks %.3f | gaps+values without base %.3f | decode, no-op apply %.3f "
                  "(walk ~ %.3f)\n",
                  masks.s / m, streams.s / m, decode.s / m, (decode.s - masks.s - streams.s) / m);
  }
  std::printf("load %.1f [%llu]\n", LoadAverage(), static_cast<unsigned long long>(sink % 10));
  return Status::Ok();
}

}  // namespace
}  // namespace tern::bench

int main(int argc, char** argv) {
  CLI::App app{"format-2 decode + apply against memcpy, with the decode's phases"};
  uint64_t params = 0, steps = 0;
  unsigned reps = 0;
  double lr = 0;
  tern::cli::AddCount(app, "--params", params, "trace model size in parameters", "100M");
  tern::cli::AddDouble(app, "--lr", lr, "trace learning rate", "1.6e-7");
  tern::cli::AddUnsigned(app, "--steps", steps, "measure the step from S-1 to S", "2");
  tern::cli::AddUnsigned(app, "--reps", reps, "interleaved repetitions (best is reported)", "5", 100);
  CLI11_PARSE(app, argc, argv);
  const tern::Status s = tern::bench::Run(params, lr, steps, static_cast<int>(reps));
  if (!s.ok()) {
    std::fprintf(stderr, "context_apply_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
