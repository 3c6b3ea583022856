// `tern cast`: an FP32/BF16 checkpoint -> the serve view an engine loads, in
// one of the quantized layouts of docs/quantization.md.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "tern/cast_checkpoint.h"
#include "tern/thread_pool.h"
#include "tools/cli_args.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace tern::cli {
namespace {

struct CastArgs {
  // Flags.
  std::string in_path, out_path, format, scale_policy, previous, keep;
  bool force = false;
  unsigned threads = 0;
  // From the flags, by CheckCast.
  CastOptions options;
};

// Flags -> CastOptions; the pipeline is CastCheckpoint (tern/cast_checkpoint.h).
Status CheckCast(CastArgs& a) {
  CastOptions& options = a.options;
  TERN_ASSIGN_OR_RETURN(options.spec, ParseQuantFormat(a.format));
  if (a.scale_policy == "fresh") {
    options.policy.kind = ScalePolicy::Kind::kFresh;
  } else {
    TERN_REQUIRE(a.scale_policy == "band", kInvalidArgument, "--scale-policy must be band or fresh");
  }
  TERN_REQUIRE(!a.out_path.empty(), kInvalidArgument, "-o OUT is empty");
  options.previous_path = a.previous;
  options.keep = SplitCommas(a.keep);
  options.overwrite = a.force;
  return Status::Ok();
}

Status Cast(const CastArgs& a) {
  const CastOptions& options = a.options;
  ThreadPool pool(a.threads);
  TERN_ASSIGN_OR_RETURN(CastReport report, CastCheckpoint(a.in_path, a.out_path, options, pool));
  for (const auto& [tensor, why] : report.kept_unquantized)
    fprintf(stderr, "tern cast: keeping %s unquantized: %s\n", tensor.c_str(), why.c_str());
  printf("cast %s -> %s (%s): %zu tensors, %llu of %llu scale groups re-scaled\n",
         a.in_path.c_str(), a.out_path.c_str(), options.spec.name.c_str(), report.tensors,
         static_cast<unsigned long long>(report.rescaled_groups),
         static_cast<unsigned long long>(report.scale_groups));
  return Status::Ok();
}

}  // namespace

void AddCast(CLI::App& tern, Dispatch& dispatch) {
  auto a = std::make_shared<CastArgs>();
  CLI::App* cmd = tern.add_subcommand(
      "cast", "quantize a checkpoint into a serve layout (fp8, nvfp4, mxfp4, int4)");
  cmd->footer("Layouts, rounding and the scale policy: docs/quantization.md.");
  std::string formats;
  for (const std::string& n : QuantFormatNames()) formats += (formats.empty() ? "" : "|") + n;
  cmd->add_option("--format", a->format, formats)->required();
  AddOutputFlag(*cmd, a->out_path, "output: a .safetensors file or a directory");
  cmd->add_option("--scale-policy", a->scale_policy,
                  "band (keep scales within a band of --previous: sparse patches) or fresh")
      ->default_val("band");
  cmd->add_option("--previous", a->previous, "the previous step's output, whose scales band may keep");
  cmd->add_option("--keep", a->keep,
                  "extra comma-separated name substrings to leave unquantized (always: norm, "
                  "embed, lm_head, mlp.gate.weight, router)");
  cmd->add_flag("--force,--overwrite", a->force,
                "replace OUT if it exists (--overwrite: its older name)");
  cmd->add_option("IN", a->in_path, "an FP32 or BF16 checkpoint (file or directory)")->required();
  AddThreadsFlag(*cmd, a->threads);
  dispatch.On(cmd, {[a] { return CheckCast(*a); }, [a] { return Cast(*a); }});
}

}  // namespace tern::cli
