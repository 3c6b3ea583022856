// Casting a checkpoint: an FP32/BF16/F16 checkpoint -> the quantized serve
// view a rollout engine loads (the layouts of docs/quantization.md), written
// as a new checkpoint with its config.json. `tern cast` is this plus flags;
// the agent calls it to refresh a serve view.
//
// Contract:
//  * Reads `in_path` (Checkpoint::Open: a .safetensors file or a checkpoint
//    directory), plans every tensor with PlanQuantTensor (DefaultQuantKeep()
//    plus `keep`), quantizes on `pool`, and writes `out_path` (a
//    .safetensors file, else a directory) through a WritableCheckpoint:
//    on any error nothing is left at out_path (or the old checkpoint, with
//    overwrite). Tensors are stored in SortLikeReferenceWriter order with
//    __metadata__ {"format": "pt"}.
//  * A directory output gets config.json: the input directory's config.json
//    (a JSON object of at most 16 MiB) with "quantization_config" added, or
//    {"quantization_config": ...} alone when the input has none; plain casts
//    (bf16, fp16) copy it unchanged or write none. An input config that
//    already has a quantization_config is kInvalidArgument (cast from the
//    unquantized master); one that is not a JSON object is kCorrupt.
//  * With `previous_path` (the previous step's output of the same spec) and
//    ScalePolicy::kBand, scales are kept where the band allows; a previous
//    checkpoint lacking a tensor of the same layout is kMismatch.
//  * The output bytes are a pure function of the inputs and options, for any
//    pool size.
//
// Thread safety: reentrant; the per-tensor work runs on `pool`.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tern/export.h"
#include "tern/quantize.h"
#include "tern/status.h"
#include "tern/thread_pool.h"

namespace tern {

struct CastOptions {
  QuantSpec spec;
  ScalePolicy policy;
  // Name substrings to leave unquantized, on top of DefaultQuantKeep().
  std::vector<std::string> keep;
  // The previous step's output, whose scales ScalePolicy::kBand may keep;
  // empty for none.
  std::string previous_path;
  // Replace out_path if it exists.
  bool overwrite = false;
};

struct CastReport {
  size_t tensors = 0;  // written to the output
  // Scale groups recomputed (the rest kept --previous' scale), of all.
  uint64_t rescaled_groups = 0;
  uint64_t scale_groups = 0;
  // (tensor, why): weights the format would quantize that stay unquantized
  // because their shape does not fit it (QuantTensorPlan::note).
  std::vector<std::pair<std::string, std::string>> kept_unquantized;
};

TERN_EXPORT Result<CastReport> CastCheckpoint(const std::string& in_path,
                                              const std::string& out_path,
                                              const CastOptions& options, ThreadPool& pool);

}  // namespace tern
