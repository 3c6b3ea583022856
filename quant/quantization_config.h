// The `quantization_config` of config.json for each format, as JSON. Internal
// to tern_quant (the public form is QuantizationConfigJson in
// tern/quantize.h, a string, so that no public header needs nlohmann-json).
#pragma once

#include <nlohmann/json.hpp>

#include "tern/quantize.h"

namespace tern::quant_internal {

// null for plain casts (bf16, fp16), which need no quantization_config.
// ordered_json: keys stay in the order the engines' own writers use.
nlohmann::ordered_json QuantizationConfig(const QuantSpec& spec);

}  // namespace tern::quant_internal
