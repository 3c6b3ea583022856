// quant_trace_report: per-step patch statistics of quantized datagen traces
// next to BF16 (docs/benchmarks-journal.md, "Quantized traces").
//
// For every (lr, format, scale policy) it runs the trace generator for
// --steps steps and, per step, measures on the serve view: the changed
// fraction of code values (one per FP8 byte / FP4 or INT4 nibble / BF16
// element) of the quantized tensors, the changed fraction of their scale
// tensors, tern's patch bytes (Diff) against the full view, the fraction of
// scale groups whose scale changed, the fraction of changed code values that
// sit in such groups, and how much of a re-scaled group is rewritten. For
// BF16/FP16 the "code" tensors are the ones the quantized formats quantize
// (the same projections), so the columns compare like with like.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "tern/datagen.h"
#include "tern/patch.h"
#include "tern/quant_plan.h"
#include "tern/quantize.h"
#include "tern/thread_pool.h"
#include "tests/support/owned_view.h"
#include "tools/cli_args.h"

namespace tern {
namespace {

using testing::OwnedView;

// Code values per stored element, and the value at index k of an element.
unsigned ValuesPerElement(DType d, bool quantized) {
  if (!quantized) return 1;
  if (d == DType::kU8) return 2;    // packed E2M1
  if (d == DType::kI32) return 8;   // packed INT4
  return 1;                         // FP8
}

// Which group (index into the primary scale tensor) holds code value v of a
// quantized [out, in] weight (out: all rows of a fused [experts, out, in] one).
uint64_t GroupOf(const QuantSpec& spec, uint64_t out, uint64_t in, uint64_t v) {
  switch (spec.scheme) {
    case QuantScheme::kFp8Tensor:
      return 0;
    case QuantScheme::kFp8Channel:
      return v / in;
    case QuantScheme::kFp8Block128: {
      const uint64_t r = v / in, c = v % in;
      return (r / 128) * ((in + 127) / 128) + c / 128;
    }
    case QuantScheme::kNvfp4:
    case QuantScheme::kNvfp4Ct:
      return v / 16;  // row-major, 16 values per scale, in % 16 == 0
    case QuantScheme::kMxfp4:
      return v / 32;
    case QuantScheme::kInt4Pack:
      return v / spec.group;
    case QuantScheme::kGptqInt4: {
      // qweight [in/8, out]: word (w, r) holds rows 8w..8w+7 of column r.
      const uint64_t word = v / 8, w = word / out, r = word % out;
      return (w * 8 / spec.group) * out + r;
    }
    default:
      return 0;
  }
}

// Entropy bounds of one packed 4-bit code tensor's changes (positions as
// n·H(p), values (new - old) mod 16 by their histogram), with the values
// split into contexts known to the receiver: none (order 0), the base nibble,
// or the base nibble and whether the value's group changed its scale.
struct NibbleBounds {
  static constexpr int kContexts = 32;
  uint64_t n[kContexts] = {}, changed[kContexts] = {}, delta[kContexts][16] = {};
  void Add(int context, unsigned old_nibble, unsigned new_nibble) {
    ++n[context];
    if (old_nibble == new_nibble) return;
    ++changed[context];
    ++delta[context][(new_nibble - old_nibble) & 15];
  }
  // Bits for the contexts merged by `key` (context -> class).
  template <class Key>
  double Bits(Key key) const {
    uint64_t cn[kContexts] = {}, cc[kContexts] = {}, cd[kContexts][16] = {};
    for (int c = 0; c < kContexts; ++c) {
      const int k = key(c);
      cn[k] += n[c];
      cc[k] += changed[c];
      for (int d = 0; d < 16; ++d) cd[k][d] += delta[c][d];
    }
    double bits = 0;
    for (int k = 0; k < kContexts; ++k) {
      if (cc[k] == 0 || cc[k] == cn[k]) continue;
      const double p = static_cast<double>(cc[k]) / static_cast<double>(cn[k]);
      bits += static_cast<double>(cn[k]) * -(p * std::log2(p) + (1 - p) * std::log2(1 - p));
      for (int d = 0; d < 16; ++d)
        if (cd[k][d])
          bits += static_cast<double>(cd[k][d]) * std::log2(static_cast<double>(cc[k]) / cd[k][d]);
    }
    return bits;
  }
};

struct StepRow {
  double code_changed = 0, scale_changed = 0, kept_changed = 0;
  double groups_rescaled = 0, changed_in_rescaled = 0, rewrite = 0;
  double patch_bytes = 0, view_bytes = 0;
  double patch2_bytes = 0;  // the same step in format 2
  double patch_q_bytes = 0, view_q_bytes = 0;  // quantized tensors only
  // Packed 4-bit code tensors only: format 1 and 2 patches of them, and
  // the bounds of NibbleBounds summed per tensor (bytes).
  double codes_f1_bytes = 0, codes_f2_bytes = 0;
  double codes_f2_stream_bytes = 0;  // its positions and values streams alone (no container, headers, tables)
  double bound0_bytes = 0, bound_nibble_bytes = 0, bound_nibble_rescaled_bytes = 0;
  // The scale tensors (and zero points) alone: their format 2 patch, and its
  // position and value streams (what conditioning the scales could shrink).
  double scales_f2_bytes = 0, scales_f2_stream_bytes = 0;
};

struct Tally {
  uint64_t code_values = 0, code_changed = 0;
  uint64_t scale_elems = 0, scale_changed = 0;
  uint64_t kept_elems = 0, kept_changed = 0;
  uint64_t groups = 0, groups_changed = 0;
  uint64_t changed_in_rescaled = 0, values_in_rescaled = 0;
};

Status Measure(const TraceConfig& config, const QuantSpec& spec, uint64_t steps, ThreadPool& pool,
               std::vector<StepRow>& rows, double& rel_rmse) {
  TERN_ASSIGN_OR_RETURN(auto gen, TraceGenerator::Create(config, pool));
  const bool quantized = config.format == ServeFormat::kQuantized;
  // Classify view tensors by the cast plan of each master tensor.
  struct Role {
    int kind = 0;  // 0 kept, 1 codes, 2 scale (incl. zero points), 3 static metadata
    const QuantSpec* spec = nullptr;
    uint64_t out = 0, in = 0;
    std::string scale_name;  // codes: the primary scale tensor (quantized)
  };
  std::vector<Role> roles(gen->view().tensors.size());
  const std::vector<std::string> keep = DefaultQuantKeep();
  const QuantSpec any_spec = *ParseQuantFormat("fp8-e4m3-tensor");
  for (TensorDesc d : ModelTensors(config.shape, DType::kF32)) {
    TERN_ASSIGN_OR_RETURN(QuantTensorPlan plan, PlanQuantTensor(quantized ? spec : any_spec, d, keep));
    for (size_t j = 0; j < (quantized ? plan.outs.size() : 1); ++j) {
      const std::string name = quantized ? plan.outs[j].name : d.name;
      const std::string suffix = name.substr(plan.quantize ? plan.prefix.size() : name.size());
      Role r;
      r.kind = !plan.quantize                                               ? 0
               : j == 0                                                     ? 1
               : suffix.find("scale") != std::string::npos ||
                       suffix.find("zero") != std::string::npos
                   ? (suffix == ".input_scale" ? 3 : 2)
                   : 3;
      r.spec = &spec;
      r.in = d.shape.back();  // a fused [experts, out, in] tensor: experts x out rows
      r.out = d.elements() / r.in;
      if (plan.quantize && quantized) r.scale_name = plan.outs[1].name;
      bool found = false;
      for (size_t k = 0; k < gen->view().tensors.size(); ++k)
        if (gen->view().tensors[k].desc->name == name) {
          roles[k] = r;
          found = true;
        }
      TERN_REQUIRE(found, kInternal, "no view tensor ", name);
    }
  }
  for (uint64_t step = 1; step <= steps; ++step) {
    const OwnedView base(gen->view());
    TERN_RETURN_IF_ERROR(gen->Step());
    const ServeView& now = gen->view();
    DiffOptions options;  // format 1
    options.format_version = 1;
    options.base_version = step - 1;
    options.target_version = step;
    TERN_ASSIGN_OR_RETURN(auto patch, Diff(base.View(), now, options, pool));
    DiffOptions options2 = options;  // format 2: CONTEXT segments for float codes, scales and kept tensors
    options2.format_version = 2;
    TERN_ASSIGN_OR_RETURN(auto patch2, Diff(base.View(), now, options2, pool));
    // The same step restricted to some of the tensors: the base and new
    // views of the tensors whose role `keep` accepts.
    auto restricted = [&](auto keep) {
      std::pair<ServeView, ServeView> views;
      for (size_t k = 0; k < now.tensors.size(); ++k)
        if (keep(k)) {
          views.first.tensors.push_back(base.View().tensors[k]);
          views.second.tensors.push_back(now.tensors[k]);
        }
      return views;
    };
    // A format-2 patch's bytes and its position and value streams' bytes.
    struct Sizes {
      double bytes = 0, streams = 0;
    };
    auto format2 = [&](const std::pair<ServeView, ServeView>& views) -> Result<Sizes> {
      TERN_ASSIGN_OR_RETURN(auto p2, Diff(views.first, views.second, options2, pool));
      TERN_ASSIGN_OR_RETURN(PatchInfo i2, Inspect(p2));
      return Sizes{static_cast<double>(p2.size()),
                   static_cast<double>(i2.position_bytes + i2.value_bytes)};
    };
    // The quantized tensors (the projections).
    const auto q = restricted([&](size_t k) { return roles[k].kind != 0; });
    TERN_ASSIGN_OR_RETURN(auto patch_q, Diff(q.first, q.second, options, pool));
    const auto c = restricted([&](size_t k) {  // packed 4-bit code tensors
      return quantized && roles[k].kind == 1 && ValuesPerElement(base.descs[k].dtype, true) > 1;
    });
    double codes_f1 = 0, codes_f2 = 0, codes_f2_streams = 0, bound0 = 0, bound_nibble = 0,
           bound_nibble_rescaled = 0;
    if (!c.first.tensors.empty()) {
      TERN_ASSIGN_OR_RETURN(auto c1, Diff(c.first, c.second, options, pool));
      codes_f1 = static_cast<double>(c1.size());
      TERN_ASSIGN_OR_RETURN(Sizes c2, format2(c));
      codes_f2 = c2.bytes;
      codes_f2_streams = c2.streams;
    }
    const auto sc = restricted([&](size_t k) { return quantized && roles[k].kind == 2; });
    Sizes scales;  // scale tensors
    if (!sc.first.tensors.empty()) {
      TERN_ASSIGN_OR_RETURN(scales, format2(sc));
    }
    Tally t;
    for (size_t k = 0; k < now.tensors.size(); ++k) {
      const TensorDesc& d = base.descs[k];
      const uint8_t* a = base.data[k].data();
      const uint8_t* b = now.tensors[k].data;
      const uint64_t n = d.elements();
      const uint64_t w = n ? base.data[k].size() / n : 1;
      const Role& r = roles[k];
      if (r.kind == 0) {
        for (uint64_t e = 0; e < n; ++e) t.kept_changed += std::memcmp(a + e * w, b + e * w, w) != 0;
        t.kept_elems += n;
      } else if (r.kind == 1 && !quantized) {
        for (uint64_t e = 0; e < n; ++e) t.code_changed += std::memcmp(a + e * w, b + e * w, w) != 0;
        t.code_values += n;
      } else if (r.kind == 2) {
        for (uint64_t e = 0; e < n; ++e) t.scale_changed += std::memcmp(a + e * w, b + e * w, w) != 0;
        t.scale_elems += n;
      } else if (r.kind == 1) {
        // Per code value, with its group's scale changed or not.
        const size_t si = [&] {
          for (size_t m = 0; m < now.tensors.size(); ++m)
            if (base.descs[m].name == r.scale_name) return m;
          return size_t{0};
        }();
        const uint64_t sw = base.data[si].size() / base.descs[si].elements();
        const uint64_t groups = base.descs[si].elements();
        std::vector<uint8_t> rescaled(groups);
        for (uint64_t g = 0; g < groups; ++g)
          rescaled[g] = std::memcmp(base.data[si].data() + g * sw, now.tensors[si].data + g * sw, sw) != 0;
        t.groups += groups;
        for (uint8_t x : rescaled) t.groups_changed += x;
        const unsigned per = ValuesPerElement(d.dtype, true);
        const unsigned bits = per == 1 ? 0 : 4;
        NibbleBounds nb;
        for (uint64_t e = 0; e < n; ++e) {
          uint64_t va = 0, vb = 0;
          std::memcpy(&va, a + e * w, w);
          std::memcpy(&vb, b + e * w, w);
          for (unsigned k2 = 0; k2 < per; ++k2) {
            const bool changed = bits ? ((va >> (bits * k2)) & 15) != ((vb >> (bits * k2)) & 15) : va != vb;
            const uint64_t g = GroupOf(*r.spec, r.out, r.in, e * per + k2);
            if (bits) {
              const unsigned old_nibble = (va >> (bits * k2)) & 15,
                             new_nibble = (vb >> (bits * k2)) & 15;
              nb.Add(static_cast<int>(old_nibble + 16 * rescaled[g]), old_nibble, new_nibble);
            }
            t.code_changed += changed;
            if (rescaled[g]) {
              t.changed_in_rescaled += changed;
              ++t.values_in_rescaled;
            }
          }
        }
        t.code_values += n * per;
        if (bits) {
          bound0 += nb.Bits([](int) { return 0; }) / 8;
          bound_nibble += nb.Bits([](int c) { return c % 16; }) / 8;
          bound_nibble_rescaled += nb.Bits([](int c) { return c; }) / 8;
        }
      }
    }
    auto frac = [](uint64_t a, uint64_t b) { return b ? static_cast<double>(a) / static_cast<double>(b) : 0.0; };
    StepRow row;
    row.code_changed = frac(t.code_changed, t.code_values);
    row.scale_changed = frac(t.scale_changed, t.scale_elems);
    row.kept_changed = frac(t.kept_changed, t.kept_elems);
    row.groups_rescaled = frac(t.groups_changed, t.groups);
    row.changed_in_rescaled = frac(t.changed_in_rescaled, t.code_changed);
    row.rewrite = frac(t.changed_in_rescaled, t.values_in_rescaled);
    row.patch_bytes = static_cast<double>(patch.size());
    row.patch2_bytes = static_cast<double>(patch2.size());
    row.view_bytes = static_cast<double>(now.total_bytes());
    row.patch_q_bytes = static_cast<double>(patch_q.size());
    row.view_q_bytes = static_cast<double>(q.second.total_bytes());
    row.codes_f1_bytes = codes_f1;
    row.codes_f2_bytes = codes_f2;
    row.codes_f2_stream_bytes = codes_f2_streams;
    row.bound0_bytes = bound0;
    row.bound_nibble_bytes = bound_nibble;
    row.bound_nibble_rescaled_bytes = bound_nibble_rescaled;
    row.scales_f2_bytes = scales.bytes;
    row.scales_f2_stream_bytes = scales.streams;
    rows.push_back(row);
  }
  // Quantization error of the last view against the master, over the
  // quantized tensors: ||deq - master|| / ||master||.
  rel_rmse = 0;
  if (quantized) {
    double err = 0, norm = 0;
    for (TensorDesc d : ModelTensors(config.shape, DType::kF32)) {
      TERN_ASSIGN_OR_RETURN(QuantTensorPlan plan, PlanQuantTensor(spec, d, keep));
      if (!plan.quantize) continue;
      Quantized q;
      for (const TensorDesc& o : plan.outs) {
        const TensorRef* ref = gen->view().Find(o.name);
        q.tensors.push_back({o.name.substr(plan.prefix.size()), o.dtype, o.shape,
                             std::vector<uint8_t>(ref->data, ref->data + o.bytes())});
      }
      TERN_ASSIGN_OR_RETURN(std::vector<float> deq, Dequantize(spec, q, d.shape));
      TERN_ASSIGN_OR_RETURN(auto master, gen->master(d.name));
      for (size_t e = 0; e < deq.size(); ++e) {
        const double x = master[e], y = deq[e];
        err += (x - y) * (x - y);
        norm += x * x;
      }
    }
    rel_rmse = norm > 0 ? std::sqrt(err / norm) : 0;
  }
  return Status::Ok();
}

struct Args {
  uint64_t params = 0, steps = 0, seed = 0, experts = 0;
  unsigned threads = 0;
  std::string lrs, formats, policies;
  ModelShape shape;  // from --params, by Check
};

void AddFlags(CLI::App& app, Args& a) {
  cli::AddCount(app, "--params", a.params, "model size", "20M");
  cli::AddUnsigned(app, "--experts", a.experts,
                   "MoE experts per layer (0: dense; mxfp4 quantizes only experts)", "0", 1024);
  cli::AddUnsigned(app, "--steps", a.steps, "optimizer steps per trace (1..1000)", "3", 1000)
      ->check(CLI::Range(uint64_t{1}, uint64_t{1000}).description(""));
  app.add_option("--lrs", a.lrs, "comma-separated learning rates")->default_val("1e-6,1e-5");
  std::string all;
  for (const char* f : {"bf16", "fp16", "fp8-e4m3-tensor", "fp8-e4m3-channel", "fp8-e4m3-block128",
                        "fp8-e5m2-tensor", "nvfp4", "nvfp4-ct", "mxfp4", "int4-g128",
                        "int4-g128-asym", "gptq-int4-g128"})
    all += (all.empty() ? "" : ",") + std::string(f);
  app.add_option("--formats", a.formats, "comma-separated formats")->default_val(all);
  app.add_option("--policies", a.policies, "scale policies for quantized formats")
      ->default_val("band,fresh");
  cli::AddUnsigned(app, "--seed", a.seed, "trace seed", "0");
  cli::AddUnsigned(app, "--threads", a.threads, "worker threads (1..256)", "2", 256)
      ->check(CLI::Range(1u, 256u).description(""));
}

Status Check(Args& a) {
  TERN_ASSIGN_OR_RETURN(a.shape, ChooseModelShape(a.params, a.experts));
  for (const std::string& lr_text : cli::SplitCommas(a.lrs)) {
    char* end = nullptr;
    const double lr = std::strtod(lr_text.c_str(), &end);
    TERN_REQUIRE(!lr_text.empty() && *end == '\0' && std::isfinite(lr), kInvalidArgument,
                 "--lrs: '", lr_text, "' is not a number");
  }
  return Status::Ok();
}

Status Run(const Args& a) {
  const ModelShape& shape = a.shape;
  const uint64_t steps = a.steps, seed = a.seed;
  const unsigned threads = a.threads;
  ThreadPool pool(static_cast<unsigned>(threads));
  std::printf("model: %" PRIu64 " parameters (hidden %" PRIu64 ", intermediate %" PRIu64
              ", layers %" PRIu64 ", vocab %" PRIu64 ", experts %" PRIu64 "), %" PRIu64
              " steps, seed %" PRIu64 "\n\n",
              shape.parameters(), shape.hidden_size, shape.intermediate_size,
              shape.num_hidden_layers, shape.vocab_size, shape.num_local_experts, steps, seed);
  std::printf("| lr | format | policy | codes changed | scales changed | kept BF16 changed | "
              "groups whose scale changed | changed codes in those groups | codes rewritten in those groups | "
              "patch MB/step | view MB | patch/view | proj. patch/proj. view | rel. RMSE | "
              "format 2 MB/step | f2/f1 |\n");
  std::printf("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::string nibble_table;  // printed after the main table
  for (const std::string& lr_text : cli::SplitCommas(a.lrs)) {
    for (const std::string& format : cli::SplitCommas(a.formats)) {
      TERN_ASSIGN_OR_RETURN(const QuantSpec spec, ParseQuantFormat(format));
      const bool plain = spec.scheme == QuantScheme::kBF16 || spec.scheme == QuantScheme::kF16;
      for (const std::string& policy : cli::SplitCommas(a.policies)) {
        if (plain && policy != "band") continue;
        TraceConfig config;
        config.shape = shape;
        config.seed = seed;
        config.adam.lr = std::strtod(lr_text.c_str(), nullptr);  // Check parsed it
        config.format = spec.scheme == QuantScheme::kBF16  ? ServeFormat::kBF16
                        : spec.scheme == QuantScheme::kF16 ? ServeFormat::kF16
                                                           : ServeFormat::kQuantized;
        if (!plain) config.quant = spec;
        if (policy == "fresh") config.scale_policy.kind = ScalePolicy::Kind::kFresh;
        std::vector<StepRow> rows;
        double rmse = 0;
        TERN_RETURN_IF_ERROR(Measure(config, spec, steps, pool, rows, rmse).WithContext(format));
        StepRow m;
        for (const StepRow& r : rows) {
          m.code_changed += r.code_changed / rows.size();
          m.scale_changed += r.scale_changed / rows.size();
          m.kept_changed += r.kept_changed / rows.size();
          m.groups_rescaled += r.groups_rescaled / rows.size();
          m.changed_in_rescaled += r.changed_in_rescaled / rows.size();
          m.rewrite += r.rewrite / rows.size();
          m.patch_bytes += r.patch_bytes / rows.size();
          m.patch2_bytes += r.patch2_bytes / rows.size();
          m.view_bytes = r.view_bytes;
          m.patch_q_bytes += r.patch_q_bytes / rows.size();
          m.view_q_bytes = r.view_q_bytes;
          m.codes_f1_bytes += r.codes_f1_bytes / rows.size();
          m.codes_f2_bytes += r.codes_f2_bytes / rows.size();
          m.codes_f2_stream_bytes += r.codes_f2_stream_bytes / rows.size();
          m.bound0_bytes += r.bound0_bytes / rows.size();
          m.bound_nibble_bytes += r.bound_nibble_bytes / rows.size();
          m.bound_nibble_rescaled_bytes += r.bound_nibble_rescaled_bytes / rows.size();
          m.scales_f2_bytes += r.scales_f2_bytes / rows.size();
          m.scales_f2_stream_bytes += r.scales_f2_stream_bytes / rows.size();
        }
        if (m.bound0_bytes > 0) {
          char line[512];
          std::snprintf(line, sizeof line,
                        "| %s | %s | %s | %.4f | %.4f | %.3f | %.3f | %.3f | %.4f | %.3f | %.4f | "
                        "%.3f | %.4f | %.3f | %.0f | %.0f | %.3f%% |\n",
                        lr_text.c_str(), format.c_str(), policy.c_str(), m.codes_f1_bytes / 1e6,
                        m.codes_f2_bytes / 1e6, m.codes_f1_bytes / m.bound0_bytes,
                        m.codes_f2_bytes / m.bound0_bytes, m.codes_f2_stream_bytes / m.bound0_bytes,
                        m.bound0_bytes / 1e6, m.bound_nibble_bytes / m.bound0_bytes,
                        m.bound_nibble_bytes / 1e6, m.bound_nibble_rescaled_bytes / m.bound0_bytes,
                        m.bound_nibble_rescaled_bytes / 1e6,
                        m.bound_nibble_rescaled_bytes / m.codes_f1_bytes, m.scales_f2_bytes,
                        m.scales_f2_stream_bytes, 100 * m.scales_f2_bytes / m.patch2_bytes);
          nibble_table += line;
        }
        auto pct = [](double x) {
          char buf[32];
          std::snprintf(buf, sizeof buf, "%.3g%%", 100 * x);
          return std::string(buf);
        };
        std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %.3f | %.2f | %s | %s | %s | %.3f | %.3f |\n",
                    lr_text.c_str(), format.c_str(), plain ? "-" : policy.c_str(),
                    pct(m.code_changed).c_str(), plain ? "-" : pct(m.scale_changed).c_str(),
                    pct(m.kept_changed).c_str(), plain ? "-" : pct(m.groups_rescaled).c_str(),
                    plain ? "-" : pct(m.changed_in_rescaled).c_str(),
                    plain ? "-" : pct(m.rewrite).c_str(), m.patch_bytes / 1e6, m.view_bytes / 1e6,
                    pct(m.patch_bytes / m.view_bytes).c_str(),
                    pct(m.patch_q_bytes / m.view_q_bytes).c_str(), plain ? "-" : pct(rmse).c_str(),
                    m.patch2_bytes / 1e6, m.patch2_bytes / m.patch_bytes);
        std::fflush(stdout);
        // Per-step detail on stderr, for the record.
        for (size_t s = 0; s < rows.size(); ++s)
          std::fprintf(stderr, "%s %s %s step %zu: codes %.4g scales %.4g patch %.0f B\n",
                       lr_text.c_str(), format.c_str(), policy.c_str(), s + 1, rows[s].code_changed,
                       rows[s].scale_changed, rows[s].patch_bytes);
      }
    }
  }
  if (!nibble_table.empty()) {
    std::printf(
        "\nPacked 4-bit code tensors only (MB per step; bounds per tensor, values (new - old) mod "
        "16):\n\n"
        "| lr | format | policy | format 1 MB | format 2 MB | f1/order-0 | f2/order-0 | "
        "f2 streams only/order-0 | order-0 bound MB | "
        "given base nibble / order-0 | MB | given nibble + group rescaled / order-0 | MB | "
        "that / format 1 | scale tensors, format 2 B | their streams B | of the whole format 2 "
        "patch |\n"
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n%s",
        nibble_table.c_str());
  }
  return Status::Ok();
}

}  // namespace
}  // namespace tern

int main(int argc, char** argv) {
  using namespace tern;
  CLI::App app("patch statistics of quantized datagen traces", "quant_trace_report");
  cli::Configure(app);
  Args a;
  AddFlags(app, a);
  cli::Dispatch dispatch;
  dispatch.On(&app, {[&] { return Check(a); }, [&] { return Run(a); }});
  return dispatch.Run(app, argc, argv);
}
