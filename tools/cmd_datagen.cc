// `tern datagen`: writes an RL trace, one safetensors checkpoint directory per
// version (DIR/step-000000, step-000001, ...), from TraceGenerator.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <system_error>

#include "tern/thread_pool.h"
#include "tern/checkpoint.h"
#include "tern/quant_plan.h"
#include "tern/quantize.h"
#include "tern/datagen.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace tern::cli {

namespace {

namespace fs = std::filesystem;

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Version directory names sort in version order: zero-padded to a width
// fixed for the whole trace.
std::string VersionName(uint64_t step, int width) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "step-%0*llu", width, static_cast<unsigned long long>(step));
  return buf;
}

bool IsVersionEntry(const std::string& name) {
  // step-<digits>, or a staging leftover step-<digits>.tmp-...
  if (name.rfind("step-", 0) != 0 || name.size() == 5) return false;
  size_t i = 5;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
  return i > 5 && (i == name.size() || name.compare(i, 5, ".tmp-") == 0);
}

// An empty or absent DIR is fine. A non-empty one is refused unless --force,
// which removes only earlier trace versions and leaves anything else alone.
Status PrepareOutput(const std::string& dir, bool force) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    fs::create_directories(dir, ec);
    TERN_REQUIRE(!ec, kIo, "cannot create ", dir, ": ", ec.message());
    return Status::Ok();
  }
  TERN_REQUIRE(fs::is_directory(dir, ec), kAlreadyExists, dir, " exists and is not a directory");
  bool empty = true;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    empty = false;
    if (!force) break;
    if (IsVersionEntry(entry.path().filename().string())) {
      fs::remove_all(entry.path(), ec);
      TERN_REQUIRE(!ec, kIo, "cannot remove ", entry.path().string(), ": ", ec.message());
    }
  }
  TERN_REQUIRE(!ec, kIo, "cannot list ", dir, ": ", ec.message());
  TERN_REQUIRE(empty || force, kAlreadyExists, dir, " is not empty (use --force to replace a trace)");
  return Status::Ok();
}

Status CheckMemory(uint64_t bytes) {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_bytes = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_bytes <= 0) return Status::Ok();  // unknown: let the allocator decide
  const double physical = static_cast<double>(pages) * static_cast<double>(page_bytes);
  TERN_REQUIRE(static_cast<double>(bytes) <= 0.9 * physical, kResourceExhausted, "the trace needs ",
               static_cast<double>(bytes) / 1e9, " GB (12 bytes per parameter plus the view), ",
               "this machine has ", physical / 1e9, " GB");
  return Status::Ok();
}

struct DatagenArgs {
  // Flags.
  std::string out, lr_text, format, scale_policy, dtype;
  uint64_t params = 0, steps = 0, shard_bytes = 0, experts = 0;
  unsigned threads = 0;
  bool force = false, stats_only = false;
  // From the flags, by CheckDatagen.
  TraceConfig config;
  QuantSpec spec;
};

Status CheckDatagen(DatagenArgs& a) {
  TraceConfig& config = a.config;
  TERN_REQUIRE(a.stats_only || !a.out.empty(), kInvalidArgument, "--out is required");
  config.adam.lr = std::strtod(a.lr_text.c_str(), nullptr);  // FiniteArg checked the text
  std::string format_name = a.format;
  if (!a.dtype.empty()) {
    auto alias = ServeFormatFromName(a.dtype);
    TERN_REQUIRE(alias.ok(), kInvalidArgument, "--dtype: ", alias.status().message());
    TERN_REQUIRE(format_name == "bf16" || format_name == ServeFormatName(*alias), kInvalidArgument,
                 "--dtype ", a.dtype, " contradicts --format ", format_name);
    format_name = std::string(ServeFormatName(*alias));
  }
  auto spec = ParseQuantFormat(format_name);
  TERN_REQUIRE(spec.ok(), kInvalidArgument, "--format: ", spec.status().message());
  a.spec = *spec;
  if (spec->scheme == QuantScheme::kBF16) {
    config.format = ServeFormat::kBF16;
  } else if (spec->scheme == QuantScheme::kF16) {
    config.format = ServeFormat::kF16;
  } else {
    config.format = ServeFormat::kQuantized;
    config.quant = *spec;
  }
  if (a.scale_policy == "fresh") {
    config.scale_policy.kind = ScalePolicy::Kind::kFresh;
  } else {
    TERN_REQUIRE(a.scale_policy == "band", kInvalidArgument, "--scale-policy must be band or fresh");
  }
  auto shape = ChooseModelShape(a.params, a.experts);
  TERN_REQUIRE(shape.ok(), kInvalidArgument, "--params: ", shape.status().message());
  config.shape = *shape;
  return config.Validate();
}

Status Run(const DatagenArgs& a) {
  const TraceConfig& config = a.config;
  const QuantSpec* spec = &a.spec;
  const bool stats_only = a.stats_only;
  const std::string& out = a.out;
  const uint64_t steps = a.steps;
  const std::string& policy_name = a.scale_policy;
  const ModelShape& s = config.shape;
  const uint64_t memory_bytes = TraceGenerator::MemoryBytesFor(s, config.format);
  TERN_RETURN_IF_ERROR(CheckMemory(memory_bytes));
  if (!stats_only) TERN_RETURN_IF_ERROR(PrepareOutput(out, a.force));
  std::printf(
      "model: hidden %llu, intermediate %llu, layers %llu, heads %llu (kv %llu), head_dim %llu, "
      "vocab %llu: %llu parameters, %.2f GB in memory\n",
      static_cast<unsigned long long>(s.hidden_size),
      static_cast<unsigned long long>(s.intermediate_size),
      static_cast<unsigned long long>(s.num_hidden_layers),
      static_cast<unsigned long long>(s.num_attention_heads),
      static_cast<unsigned long long>(s.num_key_value_heads),
      static_cast<unsigned long long>(s.head_dim), static_cast<unsigned long long>(s.vocab_size),
      static_cast<unsigned long long>(s.parameters()), static_cast<double>(memory_bytes) / 1e9);
  if (s.num_local_experts > 0)
    std::printf("experts: %llu per layer (intermediate is each expert's), %llu per token\n",
                static_cast<unsigned long long>(s.num_local_experts),
                static_cast<unsigned long long>(s.num_experts_per_tok));
  std::printf("adam: lr %g, beta1 %g, beta2 %g, eps %g, weight decay %g, signal %g, seed %llu\n",
              config.adam.lr, config.adam.beta1, config.adam.beta2, config.adam.eps,
              config.adam.weight_decay, config.signal_to_noise,
              static_cast<unsigned long long>(config.seed));
  std::fflush(stdout);

  if (config.format == ServeFormat::kQuantized) {
    // The generator serves these as BF16, as `tern cast` would; say so.
    uint64_t candidates = 0, refused = 0;
    std::string why;
    for (const TensorDesc& d : ModelTensors(s, DType::kF32)) {
      TERN_ASSIGN_OR_RETURN(QuantTensorPlan plan, PlanQuantTensor(*spec, d, DefaultQuantKeep()));
      candidates += plan.quantize || !plan.note.empty();
      if (!plan.note.empty()) {
        ++refused;
        if (why.empty()) why = d.name + ": " + plan.note;
      }
    }
    if (refused > 0)
      std::fprintf(stderr, "tern datagen: %llu of %llu projection tensors kept unquantized (BF16), "
                   "e.g. %s\n", static_cast<unsigned long long>(refused),
                   static_cast<unsigned long long>(candidates), why.c_str());
  }

  ThreadPool pool(a.threads);
  std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"tern.trace.seed", std::to_string(config.seed)},
      {"tern.trace.lr", a.lr_text},
      {"tern.trace.dtype", spec->name},
  };
  if (config.format == ServeFormat::kQuantized) metadata["tern.trace.scale_policy"] = policy_name;
  CreateOptions create_options;
  create_options.shard_bytes_max = a.shard_bytes;
  int width = 6;
  for (uint64_t n = steps; n >= 1'000'000; n /= 10) ++width;

  std::printf("initializing %s with %u threads ...\n", stats_only ? "(stats only)" : out.c_str(),
              pool.size());
  std::fflush(stdout);
  const auto start = Clock::now();
  auto t0 = Clock::now();
  TERN_ASSIGN_OR_RETURN(auto gen, TraceGenerator::Create(config, pool));
  double compute_s = SecondsSince(t0);
  const char* dtype = spec->name.c_str();
  for (uint64_t step = 0;; ++step) {
    double write_s = 0;
    if (!stats_only) {
      t0 = Clock::now();
      const std::string path = (fs::path(out) / VersionName(step, width)).string();
      Status st = WriteTraceCheckpoint(*gen, path, metadata, create_options, pool);
      TERN_RETURN_IF_ERROR(st.WithContext("writing " + path));
      write_s = SecondsSince(t0);
    }
    const StepStats& stats = gen->last_stats();
    const double elapsed = SecondsSince(start);
    const double eta = step == 0 ? 0.0 : elapsed / static_cast<double>(step + 1) *
                                             static_cast<double>(steps - step);
    if (step == 0)
      std::printf("step 0: initial view, %.4g values (%s)  [init %.2f s, write %.2f s]\n",
                  static_cast<double>(stats.elements), dtype, compute_s, write_s);
    else if (stats.scale_groups > 0)
      std::printf("step %llu: %.2f%% of %.4g values changed (%s), %.2f%% of %.4g scale groups "
                  "re-scaled  [step %.2f s, write %.2f s, %llu/%llu]\n",
                  static_cast<unsigned long long>(step), 100.0 * stats.changed_fraction(),
                  static_cast<double>(stats.elements), dtype,
                  100.0 * static_cast<double>(stats.rescaled_groups) /
                      static_cast<double>(stats.scale_groups),
                  static_cast<double>(stats.scale_groups), compute_s, write_s,
                  static_cast<unsigned long long>(step), static_cast<unsigned long long>(steps));
    else
      std::printf("step %llu: %.2f%% of %.4g values changed (%s)  [step %.2f s, write %.2f s, "
                  "%llu/%llu, eta %.0f s]\n",
                  static_cast<unsigned long long>(step), 100.0 * stats.changed_fraction(),
                  static_cast<double>(stats.elements), dtype, compute_s, write_s,
                  static_cast<unsigned long long>(step), static_cast<unsigned long long>(steps),
                  eta);
    std::fflush(stdout);
    if (step == steps) break;
    t0 = Clock::now();
    TERN_RETURN_IF_ERROR(gen->Step());
    compute_s = SecondsSince(t0);
  }
  return Status::Ok();
}

}  // namespace

void AddDatagen(CLI::App& tern, Dispatch& dispatch) {
  auto a = std::make_shared<DatagenArgs>();
  TraceConfig& config = a->config;
  CLI::App* cmd = tern.add_subcommand("datagen", "write an RL trace of serve-view checkpoints");
  cmd->footer(
      "Writes consecutive serve-view checkpoints of a transformer whose FP32 master weights\n"
      "follow Adam at RL learning rates. Each version is a Hugging Face checkpoint directory\n"
      "(model.safetensors or shards, plus config.json of a LlamaForCausalLM, or of tern's\n"
      "synthetic MoE with --experts, which no engine loads). Output is\n"
      "identical for any --threads and machine. Memory: ~14 bytes per parameter (FP32\n"
      "weights and Adam moments, plus the view).");
  cmd->add_option("-o,--out", a->out,
                  "output directory; versions go to OUT/step-NNNNNN/ (required unless "
                  "--stats-only)")
      ->type_name("DIR");
  AddCount(*cmd, "--params", a->params, "model size in parameters (10M, 1G, ...)", "10M");
  AddUnsigned(*cmd, "--experts", a->experts,
              "MoE experts per layer, fused [experts, out, in] as mxfp4 quantizes them (0: dense)",
              "0", 1024);
  AddUnsigned(*cmd, "--steps", a->steps, "optimizer steps; writes versions 0 (initial) .. STEPS",
              "3", 100'000'000);
  cmd->add_option("--lr", a->lr_text, "Adam learning rate")->check(FiniteArg())->default_val("1e-6");
  AddUnsigned(*cmd, "--seed", config.seed, "random seed; the trace is a pure function of the flags",
              "0");
  std::string formats;
  for (const std::string& n : QuantFormatNames()) formats += (formats.empty() ? "" : "|") + n;
  cmd->add_option("--format", a->format, "serve layout (as `tern cast` writes it): " + formats)
      ->default_val("bf16");
  cmd->add_option("--scale-policy", a->scale_policy,
                  "band (keep the previous step's scales within a band: sparse patches) or "
                  "fresh (re-quantize from scratch)")
      ->default_val("band");
  cmd->add_option("--dtype", a->dtype, "alias of --format for bf16 / fp16");
  AddDouble(*cmd, "--beta1", config.adam.beta1, "Adam beta1", "0.9");
  AddDouble(*cmd, "--beta2", config.adam.beta2, "Adam beta2", "0.999");
  AddDouble(*cmd, "--eps", config.adam.eps, "Adam epsilon", "1e-8");
  AddDouble(*cmd, "--weight-decay", config.adam.weight_decay,
            "decoupled weight decay (AdamW); 0 = plain Adam", "0");
  AddDouble(*cmd, "--signal", config.signal_to_noise,
            "gradient signal-to-noise ratio (fixed direction vs fresh noise)", "1");
  AddCount(*cmd, "--shard-bytes", a->shard_bytes,
           "start a new safetensors shard past this many bytes (0 = one file)", "0");
  AddUnsigned(*cmd, "--threads", a->threads, "worker threads (0 = all cores)", "0", 4096);
  AddForceFlag(*cmd, a->force, "replace the step-* versions of an earlier trace in OUT");
  cmd->add_flag("--stats-only", a->stats_only, "print the per-step changed fraction, write nothing");
  dispatch.On(cmd, {[a] { return CheckDatagen(*a); }, [a] { return Run(*a); }});
}

}  // namespace tern::cli
