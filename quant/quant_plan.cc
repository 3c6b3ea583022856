// PlanQuantTensor: the keep rules and output layouts of `tern cast`, shared
// with the trace generator (include/tern/quant_plan.h).
#include "tern/quant_plan.h"

namespace tern {

namespace {

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Sibling Linears that engines fuse into one matrix, from vLLM 0.32's
// packed_modules_mapping (every model file) and FusedMoE's expert mapping
// (gate/up or w1/w3 -> w13). A set that is a superset of an engine's fusion
// (k/v fused alone in some models) is harmless: sharing a per-tensor scale
// costs the smaller parts a little range, never correctness.
constexpr const char* kFusedSets[][4] = {
    {"q_proj", "k_proj", "v_proj", nullptr},
    {"gate_proj", "up_proj", nullptr, nullptr},
    {"query", "key", "value", nullptr},
    {"wq", "wk", "wv", nullptr},
    {"w1", "w3", nullptr, nullptr},
    {"c_fc_0", "c_fc_1", nullptr, nullptr},
    {"q_a_proj", "kv_a_proj_with_mqa", nullptr, nullptr},
};

}  // namespace

std::string FusedLayerKey(const std::string& weight_name) {
  if (!EndsWith(weight_name, ".weight")) return "";
  const std::string module = weight_name.substr(0, weight_name.size() - 7);
  const size_t dot = module.rfind('.');
  const std::string parent = dot == std::string::npos ? "" : module.substr(0, dot + 1);
  const std::string leaf = dot == std::string::npos ? module : module.substr(dot + 1);
  for (const auto& set : kFusedSets) {
    std::string key;
    bool member = false;
    for (const char* part : set) {
      if (part == nullptr) break;
      member |= leaf == part;
      key += (key.empty() ? "{" : ",") + std::string(part);
    }
    if (member) return parent + key + "}";
  }
  return "";
}

std::vector<std::string> DefaultQuantKeep() {
  return {"norm", "embed", "lm_head", "mlp.gate.weight", "router"};
}

Result<QuantTensorPlan> PlanQuantTensor(const QuantSpec& spec, const TensorDesc& d,
                                        const std::vector<std::string>& keep) {
  QuantTensorPlan p;
  const bool plain = spec.scheme == QuantScheme::kBF16 || spec.scheme == QuantScheme::kF16;
  const bool floaty = d.dtype == DType::kF32 || d.dtype == DType::kBF16 || d.dtype == DType::kF16;
  bool kept = false;
  for (const std::string& k : keep) kept |= d.name.find(k) != std::string::npos;
  p.quantize = !plain && floaty && d.shape.size() >= 2 && EndsWith(d.name, ".weight") && !kept;
  // The compressed-tensors layouts are per Linear: its loader decompresses
  // 2-D weights only ("too many values to unpack" / "could not infer a
  // quantization strategy" on a 3-D one) and engines load MoE experts one
  // Linear at a time, each with its own scales. A fused [experts, out, in]
  // tensor therefore stays unquantized (INT4's Quantize refuses it itself).
  const bool per_linear = spec.scheme == QuantScheme::kFp8Tensor ||
                          spec.scheme == QuantScheme::kFp8Channel ||
                          spec.scheme == QuantScheme::kNvfp4Ct;
  if (p.quantize && per_linear && d.shape.size() > 2) {
    p.quantize = false;
    p.note = spec.name +
             " is a compressed-tensors per-Linear layout: expects a 2-D [out, in] weight, one per "
             "expert";
  }
  if (p.quantize && spec.scheme == QuantScheme::kMxfp4 && d.shape.size() == 2) {
    p.quantize = false;
    p.note = "mxfp4 is gpt-oss's layout for fused MoE experts [experts, out, in]; engines serve "
             "2-D Linears of an mxfp4 checkpoint unquantized";
  }
  if (p.quantize) {
    p.prefix = d.name.substr(0, d.name.size() - 7);
    // Layouts come from quantizing zeros of the same shape.
    // TODO(perf): derive shapes from the spec instead of a full-size dry run.
    std::vector<float> zeros(d.elements(), 0.0f);
    auto probe = Quantize(spec, zeros.data(), d.shape, nullptr, ScalePolicy{});
    if (!probe.ok()) {
      if (probe.status().code() != Code::kInvalidArgument) return probe.status();
      p.note = probe.status().message();
      p.quantize = false;
      p.prefix.clear();
    } else {
      for (const QuantTensor& qt : probe->tensors)
        p.outs.push_back({p.prefix + qt.suffix, qt.dtype, qt.shape});
    }
  }
  if (!p.quantize) {
    const DType to = !floaty ? d.dtype
                     : spec.scheme == QuantScheme::kF16 ? DType::kF16
                     : d.dtype == DType::kF32 ? DType::kBF16
                                              : d.dtype;
    p.prefix = d.name;
    p.outs.push_back({d.name, to, d.shape});
  }
  return p;
}

}  // namespace tern
