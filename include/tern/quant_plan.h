// Which tensors of a checkpoint a quantized serve format quantizes, and the
// output tensors (names, dtypes, shapes) each one becomes. Shared by
// `tern cast` and the trace generator so both write the same layout.
//
// Contract: a tensor is quantized when the format is not a plain cast, its
// dtype is F32/BF16/F16, it has rank >= 2, its name ends in ".weight" and
// contains none of the keep substrings (DefaultQuantKeep() plus the caller's).
// A tensor whose shape the format cannot take (Quantize says
// kInvalidArgument, e.g. `in` not divisible by the group) stays unquantized,
// with the reason in `note`; so does a fused MoE weight (rank > 2) in the
// compressed-tensors per-Linear layouts (fp8-*-tensor/-channel, nvfp4-ct),
// whose loaders take 2-D [out, in] weights, one per expert; and a 2-D weight
// in mxfp4, gpt-oss's layout for fused MoE experts [experts, out, in], the
// only MXFP4 weights engines load (vLLM and transformers serve every Linear
// of an mxfp4 checkpoint unquantized, as its modules_to_not_convert says). Unquantized float tensors are served as F16 for
// fp16 and BF16 otherwise (a BF16/F16 input keeps its dtype except for fp16).
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "tern/export.h"
#include "tern/quantize.h"
#include "tern/status.h"
#include "tern/view.h"

namespace tern {

// Name substrings engines keep in high precision: norms, embeddings, lm_head
// and MoE routers ("mlp.gate.weight", not "gate_proj").
TERN_EXPORT std::vector<std::string> DefaultQuantKeep();

struct QuantTensorPlan {
  bool quantize = false;
  std::string prefix;            // output name = prefix + QuantTensor::suffix
  std::vector<TensorDesc> outs;  // in Quantize's tensor order
  std::string note;              // why a candidate stayed unquantized
};

// The fused layer an engine loads weight `weight_name` into (vLLM's
// packed_modules_mapping: q/k/v -> qkv_proj, gate/up -> gate_up_proj, and
// the rarer sets in quant_plan.cc), as a key that exactly the parts of one
// fused layer share, e.g. "model.layers.0.self_attn.{q,k,v}_proj" for each
// of q_proj/k_proj/v_proj; "" for a weight engines load on its own. Formats
// with a per-tensor scale (HasTensorScale) give the parts one shared scale.
TERN_EXPORT std::string FusedLayerKey(const std::string& weight_name);

// Plans one input tensor. `keep` is the full list of substrings (pass
// DefaultQuantKeep() plus any extras). Errors other than a shape the format
// cannot take are returned.
TERN_EXPORT Result<QuantTensorPlan> PlanQuantTensor(const QuantSpec& spec, const TensorDesc& in,
                                                    const std::vector<std::string>& keep);

}  // namespace tern
