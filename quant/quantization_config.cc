#include "quant/quantization_config.h"

namespace tern {
namespace quant {
namespace {

using nlohmann::ordered_json;

// lm_head, which `tern cast` never quantizes, plus what the cast left out.
ordered_json Ignored(const std::vector<std::string>& unquantized) {
  ordered_json ignore = ordered_json::array({"lm_head"});
  for (const std::string& m : unquantized)
    if (m != "lm_head") ignore.push_back(m);
  return ignore;
}

// A Python `re` pattern matching exactly `name` (GPTQ's "dynamic" keys).
std::string ExactRegex(const std::string& name) {
  std::string re;
  for (char c : name) {
    if (std::string_view(".^$*+?()[]{}|\\").find(c) != std::string_view::npos) re += '\\';
    re += c;
  }
  return re + "$";
}

// compressed-tensors: one config group over every Linear, lm_head and the
// unquantized Linears ignored.
ordered_json CompressedTensors(const char* format, ordered_json weights,
                               const std::vector<std::string>& unquantized,
                               ordered_json input_activations = nullptr) {
  ordered_json group = {{"targets", {"Linear"}}, {"weights", std::move(weights)}};
  if (!input_activations.is_null()) group["input_activations"] = std::move(input_activations);
  return {{"quant_method", "compressed-tensors"},
          {"format", format},
          {"quantization_status", "compressed"},
          {"config_groups", {{"group_0", std::move(group)}}},
          {"ignore", Ignored(unquantized)}};
}

}  // namespace

ordered_json QuantizationConfig(const QuantSpec& spec, const std::vector<std::string>& unquantized) {
  switch (spec.scheme) {
    case QuantScheme::kBF16:
    case QuantScheme::kF16:
      return nullptr;
    case QuantScheme::kFp8Block128: {
      ordered_json config = {{"quant_method", "fp8"},
                             {"fmt", "e4m3"},
                             {"activation_scheme", "dynamic"},
                             {"weight_block_size", {128, 128}}};
      // vLLM's Fp8Config never quantizes lm_head (not a LinearBase).
      if (!unquantized.empty()) config["ignored_layers"] = unquantized;
      return config;
    }
    case QuantScheme::kFp8Tensor:
    case QuantScheme::kFp8Channel: {
      const char* strategy = spec.scheme == QuantScheme::kFp8Tensor ? "tensor" : "channel";
      if (spec.code_dtype == DType::kF8E5M2) {
        // No engine loads E5M2 weights: compressed-tensors' 8-bit float is
        // E4M3, and a loader that sizes parameters from such a config would
        // read these bytes as E4M3. A method no engine knows makes it refuse
        // the checkpoint instead of serving wrong weights.
        return {{"quant_method", "tern-fp8-e5m2"},
                {"fmt", "e5m2"},
                {"strategy", strategy},
                {"note", "a tern measurement view; no engine loads E5M2 weights"}};
      }
      return CompressedTensors(
          "float-quantized",
          {{"num_bits", 8}, {"type", "float"}, {"strategy", strategy}, {"symmetric", true},
           {"dynamic", false}},
          unquantized,
          {{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"symmetric", true},
           {"dynamic", true}});
    }
    case QuantScheme::kNvfp4:
      // The flat config.json form ModelOpt's export writes: exclusions under
      // "ignore". "exclude_modules" belongs to the nested hf_quant_config.json
      // form ({"quantization": {...}}); vLLM's ModelOptQuantConfigBase reads
      // each key only in its own form, so a flat "exclude_modules" is never
      // read and lm_head is loaded as FP4 (a size mismatch).
      return {{"quant_method", "modelopt"},
              {"quant_algo", "NVFP4"},
              {"group_size", 16},
              {"ignore", Ignored(unquantized)}};
    case QuantScheme::kNvfp4Ct:
      return CompressedTensors("nvfp4-pack-quantized",
                               {{"num_bits", 4},
                                {"type", "float"},
                                {"strategy", "tensor_group"},
                                {"group_size", 16},
                                {"symmetric", true},
                                {"dynamic", false}},
                               unquantized);
    case QuantScheme::kMxfp4:
      return {{"quant_method", "mxfp4"},
              {"modules_to_not_convert",
               {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                "lm_head"}}};
    case QuantScheme::kInt4Pack:
      return CompressedTensors("pack-quantized", {{"num_bits", 4},
                                                  {"type", "int"},
                                                  {"strategy", "group"},
                                                  {"group_size", spec.group},
                                                  {"symmetric", spec.symmetric},
                                                  {"dynamic", false},
                                                  {"actorder", nullptr}},
                              unquantized);
    case QuantScheme::kGptqInt4: {
      ordered_json config = {{"quant_method", "gptq"},
                             {"bits", 4},
                             {"group_size", spec.group},
                             {"desc_act", false},
                             {"sym", true},
                             {"checkpoint_format", "gptq"}};
      // "-:" patterns: modules vLLM (and GPTQModel) leave unquantized.
      if (!unquantized.empty()) {
        ordered_json dynamic = ordered_json::object();
        for (const std::string& m : unquantized) dynamic["-:" + ExactRegex(m)] = ordered_json::object();
        config["dynamic"] = std::move(dynamic);
      }
      return config;
    }
  }
  return nullptr;
}

}  // namespace quant

std::string QuantizationConfigJson(const QuantSpec& spec) {
  const nlohmann::ordered_json config = quant::QuantizationConfig(spec);
  // Only ASCII literals and numbers: dump cannot throw.
  return config.is_null() ? std::string() : config.dump();
}

}  // namespace tern
