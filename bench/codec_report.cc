// codec_report: the patch-codec benchmark table of docs/benchmarks.md.
//
// For each workload (a synthetic BF16 step at an exact density, or a step of
// the datagen trace generator) it measures, in one run:
//  * size: tern's patch against the entropy bound of the change, PULSE
//    (flat gaps and COO, the smaller counts), zstd -3 of old XOR new,
//    xdelta3, and naive u32 index + raw value;
//  * speed, on 1 thread and on all: diff+encode and decode+apply against a
//    memcpy of the view, PULSE encode/apply for reference.
// Every patch is applied and compared bit for bit with the new view before
// anything is reported.
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/baselines/entropy_bound.h"
#include "bench/baselines/generic.h"
#include "bench/baselines/pulse.h"
#include "bench/harness.h"
#include "tern/digest.h"
#include "tern/patch.h"
#include "tools/cli_args.h"

namespace tern::bench {
namespace {

struct Options {
  int reps = 3;
  bool xdelta = true;
  std::string tmp_dir = "/tmp";
  uint64_t segment_elements = uint64_t{1} << 20;
  unsigned threads = 0;
};

struct SizeRow {
  std::string label;
  uint64_t elements = 0, changed = 0, view_bytes = 0;
  uint64_t tern = 0, pulse_flat = 0, pulse_coo = 0, zstd_xor = 0, naive = 0;
  int64_t xdelta = -1;
  double bound = 0, bound_per_tensor = 0, bound_exponent = 0, value_bits_per_change = 0;
  uint64_t position_bytes = 0, value_bytes = 0, header_bytes = 0;
  uint64_t tern2 = 0;  // format 2 (CONTEXT segments given the base)
};

struct SpeedRow {
  std::string label;
  unsigned threads = 1;
  Timing memcpy, diff, apply, apply_excl;
  Timing diff2, apply2, apply2_excl;  // format 2: diff+encode, decode+apply (default, exclusive)
  double pulse_encode_s = 0, pulse_apply_s = 0;
};

Status Check(bool ok, const char* what) {
  return ok ? Status::Ok() : TERN_ERROR(kInternal, what);
}

Status Measure(const StepPair& p, const std::string& label, const Options& o, ThreadPool& one,
               ThreadPool& all, std::vector<SizeRow>& sizes, std::vector<SpeedRow>& speeds) {
  SizeRow s;
  s.label = label;
  s.view_bytes = p.bytes();
  const ViewDigest base = ComputeDigest(p.old_view, all);

  DiffOptions d;
  d.format_version = 1;
  d.segment_elements = o.segment_elements;
  d.base_version = 0;
  d.target_version = 1;
  TERN_ASSIGN_OR_RETURN(std::vector<uint8_t> patch, Diff(p.old_view, p.new_view, d, all, &base));
  {
    TERN_ASSIGN_OR_RETURN(std::vector<uint8_t> patch1, Diff(p.old_view, p.new_view, d, one, &base));
    TERN_RETURN_IF_ERROR(Check(patch1 == patch, "Diff output depends on the thread count"));
  }
  DiffOptions d2 = d;
  d2.format_version = 2;
  TERN_ASSIGN_OR_RETURN(std::vector<uint8_t> patch2, Diff(p.old_view, p.new_view, d2, all, &base));
  {
    TERN_ASSIGN_OR_RETURN(std::vector<uint8_t> patch2_1, Diff(p.old_view, p.new_view, d2, one, &base));
    TERN_RETURN_IF_ERROR(Check(patch2_1 == patch2, "format-2 Diff output depends on the thread count"));
  }
  s.tern2 = patch2.size();
  TERN_ASSIGN_OR_RETURN(PatchInfo info, Inspect(patch));
  s.tern = patch.size();
  s.elements = info.elements;
  s.changed = info.changed_elements;
  s.position_bytes = info.position_bytes;
  s.value_bytes = info.value_bytes;
  s.header_bytes = info.header_bytes + info.container_bytes;

  std::vector<uint8_t> work(p.bytes());
  MutableServeView wv = p.ViewOver(work);
  auto reset = [&] { ParallelMemcpy(work.data(), p.old_bytes.data(), p.bytes(), all); };
  reset();
  ViewDigest target;
  TERN_RETURN_IF_ERROR(Apply(wv, patch, base, all, &target));
  TERN_RETURN_IF_ERROR(Check(work == p.new_bytes, "tern apply is not bit-exact"));
  TERN_RETURN_IF_ERROR(Check(target == ComputeDigest(p.new_view, all), "target digest differs"));
  reset();
  TERN_RETURN_IF_ERROR(Apply(wv, patch2, base, all));
  TERN_RETURN_IF_ERROR(Check(work == p.new_bytes, "tern format-2 apply is not bit-exact"));

  EntropyCounter global;
  double per_tensor = 0;
  for (size_t t = 0; t < p.descs.size(); ++t) {
    EntropyCounter c;
    const uint64_t b = p.descs[t].bytes();
    TERN_RETURN_IF_ERROR(c.Add({p.old_bytes.data() + p.offsets[t], b},
                               {p.new_bytes.data() + p.offsets[t], b}, ElementBits(p.descs[t].dtype)));
    per_tensor += c.Bound().total_bytes();
    global.Merge(c);
  }
  const EntropyBound eb = global.Bound();
  TERN_RETURN_IF_ERROR(Check(eb.changed == s.changed, "bound and Inspect disagree on changes"));
  s.bound = eb.total_bytes();
  s.bound_per_tensor = per_tensor;
  s.value_bits_per_change = eb.value_bits_per_change();
  ExponentContextCounter ctx;
  TERN_RETURN_IF_ERROR(ctx.AddViews(p.old_view, p.new_view));
  s.bound_exponent = ctx.Bound().total_bytes();

  TERN_ASSIGN_OR_RETURN(auto pulse, PulseEncode(p.old_view, p.new_view, {PulseIndexLayout::kFlatGaps, 1}));
  TERN_ASSIGN_OR_RETURN(auto pulse_coo,
                        PulseEncode(p.old_view, p.new_view, {PulseIndexLayout::kCooRowCol, 1}));
  s.pulse_flat = pulse.size();
  s.pulse_coo = pulse_coo.size();
  reset();
  TERN_RETURN_IF_ERROR(PulseApply(pulse, wv));
  TERN_RETURN_IF_ERROR(Check(work == p.new_bytes, "PULSE apply is not bit-exact"));

  TERN_ASSIGN_OR_RETURN(s.zstd_xor, ZstdXorBytes(p.old_bytes, p.new_bytes, 3));
  s.naive = NaiveSparseBytes(s.changed, 16);
  if (o.xdelta) {
    auto x = Xdelta3Bytes(p.old_bytes, p.new_bytes, o.tmp_dir);
    if (x.ok())
      s.xdelta = int64_t(*x);
    else
      std::fprintf(stderr, "codec_report: xdelta3 skipped: %s\n", x.status().ToString().c_str());
  }
  sizes.push_back(s);
  if (o.reps == 0) return Status::Ok();

  std::vector<uint8_t> dst(p.bytes());
  ParallelMemcpy(dst.data(), p.new_bytes.data(), p.bytes(), all);  // fault the pages in
  for (ThreadPool* pool : {&one, &all}) {
    if (pool == &all && all.size() == 1) break;
    SpeedRow r;
    r.label = label;
    r.threads = pool->size();
    r.memcpy = BestTiming(o.reps, [&] { ParallelMemcpy(dst.data(), p.new_bytes.data(), p.bytes(), *pool); });
    Status st;
    r.diff = BestTiming(o.reps, [&] {
      auto r2 = Diff(p.old_view, p.new_view, d, *pool, &base);
      if (!r2.ok()) st = r2.status();
    });
    TERN_RETURN_IF_ERROR(st);
    r.apply = BestTiming(o.reps, [&] {
      Status a = Apply(wv, patch, base, *pool);
      if (!a.ok()) st = a;
    }, reset);
    TERN_RETURN_IF_ERROR(st);
    // The path `tern apply` takes: the staged copy is private, so it writes
    // while it verifies (ApplyOptions::exclusive_view).
    ApplyOptions excl;
    excl.exclusive_view = true;
    r.apply_excl = BestTiming(o.reps, [&] {
      Status a = Apply(wv, patch, base, *pool, excl);
      if (!a.ok()) st = a;
    }, reset);
    TERN_RETURN_IF_ERROR(st);
    TERN_RETURN_IF_ERROR(Check(work == p.new_bytes, "tern exclusive apply is not bit-exact"));
    r.diff2 = BestTiming(o.reps, [&] {
      auto r2 = Diff(p.old_view, p.new_view, d2, *pool, &base);
      if (!r2.ok()) st = r2.status();
    });
    TERN_RETURN_IF_ERROR(st);
    r.apply2 = BestTiming(o.reps, [&] {
      Status a = Apply(wv, patch2, base, *pool);
      if (!a.ok()) st = a;
    }, reset);
    TERN_RETURN_IF_ERROR(st);
    TERN_RETURN_IF_ERROR(Check(work == p.new_bytes, "tern format-2 apply is not bit-exact"));
    r.apply2_excl = BestTiming(o.reps, [&] {
      Status a = Apply(wv, patch2, base, *pool, excl);
      if (!a.ok()) st = a;
    }, reset);
    TERN_RETURN_IF_ERROR(st);
    TERN_RETURN_IF_ERROR(Check(work == p.new_bytes, "tern format-2 exclusive apply is not bit-exact"));
    if (pool == &one) {
      r.pulse_encode_s = BestSeconds(o.reps, [&] {
        auto r2 = PulseEncode(p.old_view, p.new_view);
        if (!r2.ok()) st = r2.status();
      });
      r.pulse_apply_s = BestSeconds(o.reps, [&] {
        Status a = PulseApply(pulse, wv);
        if (!a.ok()) st = a;
      }, reset);
      TERN_RETURN_IF_ERROR(st);
    }
    speeds.push_back(r);
  }
  return Status::Ok();
}

std::string Mb(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", bytes / 1e6);
  return b;
}
std::string Fx(double x, const char* fmt = "%.2f") {
  char b[32];
  std::snprintf(b, sizeof b, fmt, x);
  return b;
}

void PrintSizes(const std::vector<SizeRow>& rows) {
  std::printf(
      "\n### Size (MB = 1e6 bytes; ratios are baseline / tern, tern / bound)\n\n"
      "| workload | changed | tern MB | bits/chg | bound MB | tern/bound | bound/tensor MB | "
      "PULSE MB | PULSE/tern | zstd-3 XOR MB | XOR/tern | xdelta3 MB | xdelta3/tern | "
      "naive MB | naive/tern |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const SizeRow& r : rows) {
    const double tern = double(r.tern);
    const double pulse = double(std::min(r.pulse_flat, r.pulse_coo));
    std::printf("| %s | %s%% | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
                r.label.c_str(), Fx(100.0 * double(r.changed) / double(r.elements), "%.3f").c_str(),
                Mb(tern).c_str(), Fx(8.0 * tern / double(r.changed)).c_str(), Mb(r.bound).c_str(),
                Fx(tern / r.bound, "%.3f").c_str(), Mb(r.bound_per_tensor).c_str(), Mb(pulse).c_str(),
                Fx(pulse / tern).c_str(), Mb(double(r.zstd_xor)).c_str(),
                Fx(double(r.zstd_xor) / tern).c_str(),
                r.xdelta >= 0 ? Mb(double(r.xdelta)).c_str() : "-",
                r.xdelta >= 0 ? Fx(double(r.xdelta) / tern).c_str() : "-", Mb(double(r.naive)).c_str(),
                Fx(double(r.naive) / tern).c_str());
  }
  std::printf(
      "\n| workload | view MB | elements | tern positions MB | values MB | headers MB | "
      "value entropy bits/chg | PULSE flat MB | PULSE COO MB | bound given base exponent MB | "
      "tern/that | XOR/that |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const SizeRow& r : rows)
    std::printf("| %s | %s | %llu | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.label.c_str(),
                Mb(double(r.view_bytes)).c_str(), static_cast<unsigned long long>(r.elements),
                Mb(double(r.position_bytes)).c_str(), Mb(double(r.value_bytes)).c_str(),
                Mb(double(r.header_bytes)).c_str(), Fx(r.value_bits_per_change, "%.3f").c_str(),
                Mb(double(r.pulse_flat)).c_str(), Mb(double(r.pulse_coo)).c_str(),
                Mb(r.bound_exponent).c_str(), Fx(double(r.tern) / r.bound_exponent).c_str(),
                Fx(double(r.zstd_xor) / r.bound_exponent).c_str());
}

void PrintFormat2Sizes(const std::vector<SizeRow>& rows) {
  std::printf(
      "\n### Format 2 (CONTEXT segments) against format 1 and the bounds\n\n"
      "| workload | changed | format 1 MB | format 2 MB | f2/f1 | order-0 bound MB | f1/bound | f2/bound | "
      "bound given base exponent MB | f2/that | PULSE/f2 |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const SizeRow& r : rows) {
    const double pulse = double(std::min(r.pulse_flat, r.pulse_coo));
    std::printf("| %s | %s%% | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.label.c_str(),
                Fx(100.0 * double(r.changed) / double(r.elements), "%.3f").c_str(), Mb(double(r.tern)).c_str(),
                Mb(double(r.tern2)).c_str(), Fx(double(r.tern2) / double(r.tern), "%.3f").c_str(),
                Mb(r.bound).c_str(), Fx(double(r.tern) / r.bound, "%.3f").c_str(),
                Fx(double(r.tern2) / r.bound, "%.3f").c_str(), Mb(r.bound_exponent).c_str(),
                Fx(double(r.tern2) / r.bound_exponent, "%.3f").c_str(), Fx(pulse / double(r.tern2)).c_str());
  }
}

void PrintFormat2Speeds(const std::vector<SpeedRow>& rows) {
  std::printf(
      "\n### Format 2 speed (same run; ratios against the memcpy above)\n\n"
      "| workload | threads | f1 diff/memcpy | f2 diff/memcpy | f1 apply/memcpy | f2 apply/memcpy | "
      "f2/f1 apply | f1 excl/memcpy | f2 excl/memcpy | cpu f2 diff/memcpy | cpu f2 apply/memcpy |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const SpeedRow& r : rows) {
    const bool one = r.threads == 1;
    std::printf("| f2 %s | %u | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.label.c_str(), r.threads,
                Fx(r.diff.wall_s / r.memcpy.wall_s).c_str(), Fx(r.diff2.wall_s / r.memcpy.wall_s).c_str(),
                Fx(r.apply.wall_s / r.memcpy.wall_s, "%.3f").c_str(),
                Fx(r.apply2.wall_s / r.memcpy.wall_s, "%.3f").c_str(),
                Fx(r.apply2.wall_s / r.apply.wall_s).c_str(),
                Fx(r.apply_excl.wall_s / r.memcpy.wall_s, "%.3f").c_str(),
                Fx(r.apply2_excl.wall_s / r.memcpy.wall_s, "%.3f").c_str(),
                one ? Fx(r.diff2.cpu_s / r.memcpy.cpu_s).c_str() : "-",
                one ? Fx(r.apply2.cpu_s / r.memcpy.cpu_s, "%.3f").c_str() : "-");
  }
}

void PrintSpeeds(const std::vector<SpeedRow>& rows) {
  std::printf(
      "\n### Speed (best of reps, ms; ratios against memcpy of the view on the same threads)\n\n"
      "wall: elapsed time. cpu: process CPU time (all threads), shown for 1 thread, where it\n"
      "is the steadier figure on a shared machine.\n\n"
      "| workload | threads | memcpy ms | diff+encode ms | diff/memcpy | decode+apply ms | "
      "apply/memcpy | exclusive apply ms | excl/memcpy | cpu diff/memcpy | cpu apply/memcpy | "
      "PULSE encode ms | PULSE apply ms |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const SpeedRow& r : rows) {
    const bool one = r.threads == 1;
    std::printf("| %s | %u | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.label.c_str(),
                r.threads, Fx(r.memcpy.wall_s * 1e3, "%.1f").c_str(),
                Fx(r.diff.wall_s * 1e3, "%.1f").c_str(),
                Fx(r.diff.wall_s / r.memcpy.wall_s).c_str(),
                Fx(r.apply.wall_s * 1e3, "%.1f").c_str(),
                Fx(r.apply.wall_s / r.memcpy.wall_s, "%.3f").c_str(),
                Fx(r.apply_excl.wall_s * 1e3, "%.1f").c_str(),
                Fx(r.apply_excl.wall_s / r.memcpy.wall_s, "%.3f").c_str(),
                one ? Fx(r.diff.cpu_s / r.memcpy.cpu_s).c_str() : "-",
                one ? Fx(r.apply.cpu_s / r.memcpy.cpu_s, "%.3f").c_str() : "-",
                r.pulse_encode_s > 0 ? Fx(r.pulse_encode_s * 1e3, "%.1f").c_str() : "-",
                r.pulse_apply_s > 0 ? Fx(r.pulse_apply_s * 1e3, "%.1f").c_str() : "-");
  }
}

Result<std::vector<double>> ParseList(const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    TERN_REQUIRE(end && *end == '\0' && !item.empty(), kInvalidArgument, "not a number: '", item, "'");
    out.push_back(v);
  }
  return out;
}

struct Args {
  // Flags.
  std::string source, densities_text, lrs_text;
  uint64_t elements = 0, params = 0, steps = 0, seed = 0, reps = 0;
  unsigned threads = 0;
  bool no_xdelta = false, no_speed = false;
  Options o;
  // From the flags, by Check.
  std::vector<double> densities, lrs;
};

void AddFlags(CLI::App& app, Args& a) {
  app.add_option("--source", a.source, "synth, trace or both")->default_val("synth");
  cli::AddCount(app, "--elements", a.elements, "synthetic view size in BF16 elements", "200M");
  app.add_option("--densities", a.densities_text, "synthetic change densities, comma-separated")
      ->default_val("0.001,0.01,0.05");
  cli::AddCount(app, "--trace-params", a.params, "trace model size in parameters", "100M");
  app.add_option("--trace-lrs", a.lrs_text, "trace learning rates, comma-separated")->default_val("1e-6");
  cli::AddUnsigned(app, "--trace-steps", a.steps, "trace: measure the step from S-1 to S", "2");
  cli::AddUnsigned(app, "--seed", a.seed, "seed for synthetic data and the trace", "1");
  cli::AddUnsigned(app, "--threads", a.threads,
                   "threads for the all-cores runs (0: hardware concurrency)", "0", 4096);
  cli::AddUnsigned(app, "--reps", a.reps, "timed repetitions (best is reported; 1..100)", "3", 100);
  cli::AddCount(app, "--segment-elements", a.o.segment_elements, "tern DiffOptions::segment_elements",
                "1048576");
  app.add_option("--tmp", a.o.tmp_dir, "directory for xdelta3's temporary files")->default_val("/tmp");
  app.add_flag("--no-xdelta", a.no_xdelta, "skip xdelta3 (slow on large views)");
  app.add_flag("--no-speed", a.no_speed, "sizes only");
}

Status Check(Args& a) {
  TERN_ASSIGN_OR_RETURN(a.densities, ParseList(a.densities_text));
  TERN_ASSIGN_OR_RETURN(a.lrs, ParseList(a.lrs_text));
  TERN_REQUIRE(a.reps >= 1, kInvalidArgument, "--reps must be in 1..100");
  for (double dn : a.densities)
    TERN_REQUIRE(dn >= 0 && dn <= 1, kInvalidArgument, "density ", dn, " outside [0, 1]");
  TERN_REQUIRE(a.source == "synth" || a.source == "trace" || a.source == "both", kInvalidArgument,
               "--source must be synth, trace or both");
  a.o.reps = int(a.reps);
  a.o.xdelta = !a.no_xdelta;
  return Status::Ok();
}

Status Run(const Args& a) {
  Options o = a.o;
  const std::string& source = a.source;
  const auto& densities = a.densities;
  const auto& lrs = a.lrs;
  const uint64_t elements = a.elements, params = a.params, steps = a.steps, seed = a.seed;
  const unsigned threads = a.threads;

  ThreadPool one(1);
  ThreadPool all{unsigned(threads)};
  const double load_start = LoadAverage();
  std::vector<SizeRow> sizes;
  std::vector<SpeedRow> speeds;
  std::vector<std::string> sources;
  const bool speed = !a.no_speed;
  if (!speed) o.reps = 0;

  if (source != "trace") {
    for (double dn : densities) {
      StepPair p = MakeSynthPair(elements, dn, seed, all);
      char label[64];
      std::snprintf(label, sizeof label, "synth %g%%", dn * 100);
      std::fprintf(stderr, "codec_report: %s (%llu elements)\n", label,
                   static_cast<unsigned long long>(elements));
      if (sources.empty() || sources.back() != p.source) sources.push_back(p.source);
      TERN_RETURN_IF_ERROR(Measure(p, label, o, one, all, sizes, speeds).WithContext(label));
    }
  }
  if (source != "synth") {
    for (double lr : lrs) {
      std::fprintf(stderr, "codec_report: trace lr %g\n", lr);
      TERN_ASSIGN_OR_RETURN(StepPair p, MakeTracePair(params, lr, steps, seed, all));
      char label[64];
      std::snprintf(label, sizeof label, "trace lr %g", lr);
      sources.push_back(p.source);
      TERN_RETURN_IF_ERROR(Measure(p, label, o, one, all, sizes, speeds).WithContext(label));
    }
  }

  std::printf("## codec_report\n\nworkloads:\n");
  for (const auto& s : sources) std::printf("- %s\n", s.c_str());
  std::printf("\nthreads: 1 and %u; segment_elements %llu; every patch applied and checked bit for bit.\n"
              "1-minute load average at start %.2f, at end %.2f.\n",
              all.size(), static_cast<unsigned long long>(o.segment_elements), load_start,
              LoadAverage());
  PrintSizes(sizes);
  PrintFormat2Sizes(sizes);
  if (speed) {
    PrintSpeeds(speeds);
    PrintFormat2Speeds(speeds);
  }
  return Status::Ok();
}

}  // namespace
}  // namespace tern::bench

int main(int argc, char** argv) {
  using namespace tern;
  CLI::App app("measure tern patches against baselines (docs/benchmarks.md)", "codec_report");
  cli::Configure(app);
  bench::Args a;
  bench::AddFlags(app, a);
  cli::Dispatch dispatch;
  dispatch.On(&app, {[&] { return bench::Check(a); }, [&] { return bench::Run(a); }});
  return dispatch.Run(app, argc, argv);
}
