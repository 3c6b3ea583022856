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
#include "tools/flags.h"

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
};

struct SpeedRow {
  std::string label;
  unsigned threads = 1;
  Timing memcpy, diff, apply, apply_excl;
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
  d.segment_elements = o.segment_elements;
  d.base_version = 0;
  d.target_version = 1;
  TERN_ASSIGN_OR_RETURN(std::vector<uint8_t> patch, Diff(p.old_view, p.new_view, d, all, &base));
  {
    TERN_ASSIGN_OR_RETURN(std::vector<uint8_t> patch1, Diff(p.old_view, p.new_view, d, one, &base));
    TERN_RETURN_IF_ERROR(Check(patch1 == patch, "Diff output depends on the thread count"));
  }
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

Status Run(int argc, char** argv) {
  cli::Flags flags("codec_report", "measure tern patches against baselines (docs/benchmarks.md)");
  flags.Add("source", "synth, trace or both", "synth");
  flags.Add("elements", "synthetic view size in BF16 elements", "200M");
  flags.Add("densities", "synthetic change densities, comma-separated", "0.001,0.01,0.05");
  flags.Add("trace-params", "trace model size in parameters", "100M");
  flags.Add("trace-lrs", "trace learning rates, comma-separated", "1e-6");
  flags.Add("trace-steps", "trace: measure the step from S-1 to S", "2");
  flags.Add("seed", "seed for synthetic data and the trace", "1");
  flags.Add("threads", "threads for the all-cores runs (0: hardware concurrency)", "0");
  flags.Add("reps", "timed repetitions (best is reported)", "3");
  flags.Add("segment-elements", "tern DiffOptions::segment_elements", "1048576");
  flags.Add("tmp", "directory for xdelta3's temporary files", "/tmp");
  flags.AddSwitch("no-xdelta", "skip xdelta3 (slow on large views)");
  flags.AddSwitch("no-speed", "sizes only");
  TERN_RETURN_IF_ERROR(flags.Parse(argc, argv));

  Options o;
  TERN_ASSIGN_OR_RETURN(uint64_t reps, flags.GetU64("reps"));
  TERN_ASSIGN_OR_RETURN(uint64_t threads, flags.GetU64("threads"));
  TERN_ASSIGN_OR_RETURN(o.segment_elements, flags.GetU64("segment-elements"));
  TERN_ASSIGN_OR_RETURN(uint64_t elements, cli::ParseCount(flags.Get("elements")));
  TERN_ASSIGN_OR_RETURN(uint64_t params, cli::ParseCount(flags.Get("trace-params")));
  TERN_ASSIGN_OR_RETURN(uint64_t steps, flags.GetU64("trace-steps"));
  TERN_ASSIGN_OR_RETURN(uint64_t seed, flags.GetU64("seed"));
  TERN_ASSIGN_OR_RETURN(std::vector<double> densities, ParseList(flags.Get("densities")));
  TERN_ASSIGN_OR_RETURN(std::vector<double> lrs, ParseList(flags.Get("trace-lrs")));
  TERN_REQUIRE(reps >= 1 && reps <= 100, kInvalidArgument, "--reps must be in 1..100");
  for (double dn : densities)
    TERN_REQUIRE(dn >= 0 && dn <= 1, kInvalidArgument, "density ", dn, " outside [0, 1]");
  o.reps = int(reps);
  o.xdelta = !flags.Switch("no-xdelta");
  o.tmp_dir = flags.Get("tmp");
  const std::string source = flags.Get("source");
  TERN_REQUIRE(source == "synth" || source == "trace" || source == "both", kInvalidArgument,
               "--source must be synth, trace or both");

  ThreadPool one(1);
  ThreadPool all{unsigned(threads)};
  const double load_start = LoadAverage();
  std::vector<SizeRow> sizes;
  std::vector<SpeedRow> speeds;
  std::vector<std::string> sources;
  const bool speed = !flags.Switch("no-speed");
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
  if (speed) PrintSpeeds(speeds);
  return Status::Ok();
}

}  // namespace
}  // namespace tern::bench

int main(int argc, char** argv) {
  const tern::Status s = tern::bench::Run(argc, argv);
  if (s.code() == tern::Code::kCancelled) return 0;  // --help
  return tern::cli::Report("codec_report", s);
}
