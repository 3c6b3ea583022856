// `tern cast`: an FP32/BF16 checkpoint -> the serve view an engine loads, in
// one of the quantized layouts of docs/quantization.md.
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "tern/cast_checkpoint.h"
#include "tern/thread_pool.h"
#include "tools/cli_util.h"
#include "tools/flags.h"

namespace tern::cli {
namespace {

std::vector<std::string> SplitCommas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Flags -> CastOptions; the pipeline is CastCheckpoint (tern/cast_checkpoint.h).
Status Cast(const Flags& flags) {
  CastOptions options;
  TERN_ASSIGN_OR_RETURN(options.spec, ParseQuantFormat(flags.Get("format")));
  const std::string policy_name = flags.Get("scale-policy");
  if (policy_name == "fresh") {
    options.policy.kind = ScalePolicy::Kind::kFresh;
  } else {
    TERN_REQUIRE(policy_name == "band", kInvalidArgument, "--scale-policy must be band or fresh");
  }
  TERN_REQUIRE(flags.positional().size() == 1, kInvalidArgument, "expected one input checkpoint");
  const std::string out_path = flags.Get("o");
  TERN_REQUIRE(!out_path.empty(), kInvalidArgument, "-o OUT is required");
  options.previous_path = flags.Get("previous");
  options.keep = SplitCommas(flags.Get("keep"));
  options.overwrite = flags.Switch("overwrite");
  TERN_ASSIGN_OR_RETURN(unsigned threads, ThreadsFrom(flags));
  ThreadPool pool(threads);
  TERN_ASSIGN_OR_RETURN(CastReport report,
                        CastCheckpoint(flags.positional()[0], out_path, options, pool));
  for (const auto& [tensor, why] : report.kept_unquantized)
    fprintf(stderr, "tern cast: keeping %s unquantized: %s\n", tensor.c_str(), why.c_str());
  printf("cast %s -> %s (%s): %zu tensors, %llu of %llu scale groups re-scaled\n",
         flags.positional()[0].c_str(), out_path.c_str(), options.spec.name.c_str(),
         report.tensors, static_cast<unsigned long long>(report.rescaled_groups),
         static_cast<unsigned long long>(report.scale_groups));
  return Status::Ok();
}

}  // namespace

int RunCast(int argc, char** argv) {
  Flags flags("cast", "quantize an FP32/BF16 checkpoint into a serve layout");
  std::string formats;
  for (const std::string& n : QuantFormatNames()) formats += (formats.empty() ? "" : "|") + n;
  flags.Add("format", formats, "", true);
  flags.Add("o", "output: a .safetensors file or a directory", "", true);
  flags.Add("scale-policy", "band (keep scales within a band of --previous: sparse patches) or fresh", "band");
  flags.Add("previous", "the previous step's output, whose scales band may keep");
  flags.Add("keep", "extra comma-separated name substrings to leave unquantized (always: "
                    "norm, embed, lm_head, mlp.gate.weight, router)");
  flags.AddSwitch("overwrite", "replace OUT if it exists");
  flags.AddPositional("IN", "an FP32 or BF16 checkpoint (file or directory)");
  AddThreadsFlag(flags);
  flags.SetEpilog("Layouts, rounding and the scale policy: docs/quantization.md.");
  Status st = flags.Parse(argc, argv);
  if (!st.ok()) return Report("cast", st);
  return Report("cast", Cast(flags));
}

}  // namespace tern::cli
