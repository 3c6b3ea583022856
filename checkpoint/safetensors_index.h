// model.safetensors.index.json, the table of a sharded checkpoint: parse
// (strict, untrusted) and write (as transformers does). See docs/checkpoint.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tern/status.h"

namespace tern::checkpoint {

// The reader's limit on the index file (bytes); real indexes are well under
// 10 MB even for 100k tensors.
inline constexpr uint64_t kIndexBytesMax = 100'000'000;

// (tensor, file) pairs.
using WeightMap = std::vector<std::pair<std::string, std::string>>;

// The weight_map of an index, sorted by tensor name. kCorrupt unless `text`
// is one JSON object with exactly one "weight_map", an object of unique
// tensor names to plain file names (no '/', not "." or ".."). Other keys
// ("metadata" with total_size, anything else) are validated as JSON, nested
// at most 16 deep, and otherwise ignored.
Result<WeightMap> ParseIndex(std::string_view text);

// The index as transformers writes it: json.dumps(indent=2, sort_keys=True)
// (ASCII only: other characters as \uXXXX) and a newline, with
// metadata.total_size. kInvalidArgument for a name that is not valid UTF-8.
Result<std::string> SerializeIndex(uint64_t total_size, const WeightMap& weight_map);

}  // namespace tern::checkpoint
