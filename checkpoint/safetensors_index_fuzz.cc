// Fuzzes the model.safetensors.index.json parser. On success, the weight map
// must be sorted, unique and made of plain file names, and must survive a
// write/parse round trip unchanged.
#include <cstdint>
#include <string_view>

#include "checkpoint/safetensors_index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tern;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = checkpoint::ParseIndex(text);
  if (!parsed.ok()) {
    TERN_ASSERT(parsed.status().code() == Code::kCorrupt, parsed.status().ToString());
    return 0;
  }
  for (size_t i = 0; i < parsed->size(); ++i) {
    const auto& [tensor, file] = (*parsed)[i];
    TERN_ASSERT(i == 0 || (*parsed)[i - 1].first < tensor);
    TERN_ASSERT(!file.empty() && file != "." && file != ".." &&
                file.find('/') == std::string::npos);
  }
  auto written = checkpoint::SerializeIndex(size, *parsed);
  TERN_ASSERT(written.ok(), written.status().ToString());
  auto again = checkpoint::ParseIndex(*written);
  TERN_ASSERT(again.ok(), again.status().ToString());
  TERN_ASSERT(*again == *parsed);
  return 0;
}
