// config.json of the synthetic model as JSON, for config_json() to extend.
// Internal to tern_datagen; the public form is ModelConfigJson (a string).
#pragma once

#include <nlohmann/json.hpp>

#include "tern/datagen.h"

namespace tern {

nlohmann::ordered_json ModelConfig(const ModelShape& shape, DType dtype);

}  // namespace tern
