// The `quantization_config` of config.json for each format, as JSON. Internal
// to tern_quant (the public form is QuantizationConfigJson in
// tern/quantize.h, a string, so that no public header needs nlohmann-json).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tern/quantize.h"

namespace tern::quant {

// null for plain casts (bf16, fp16), which need no quantization_config.
// ordered_json: keys stay in the order the engines' own writers use.
// `unquantized`: modules (weight names without ".weight") of Linears the
// cast left unquantized, which the config must exclude or engines would
// expect quantized tensors for them (vLLM quantizes every Linear a config
// does not exclude): added to compressed-tensors' and ModelOpt's "ignore",
// fp8's "ignored_layers" and GPTQ's negative "dynamic" patterns. mxfp4
// needs none (engines serve its Linears unquantized).
nlohmann::ordered_json QuantizationConfig(const QuantSpec& spec,
                                          const std::vector<std::string>& unquantized = {});

}  // namespace tern::quant
