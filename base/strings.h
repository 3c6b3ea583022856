// Small string helpers shared by the CLI and the benchmarks.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tern {

// "a,b,,c" -> {"a", "b", "c"}: the comma-separated items of a flag value,
// empty items dropped (so "" and "," give none).
inline std::vector<std::string> SplitCommas(std::string_view s) {
  std::vector<std::string> out;
  while (!s.empty()) {
    const size_t comma = s.find(',');
    const std::string_view item = s.substr(0, comma);
    if (!item.empty()) out.emplace_back(item);
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  return out;
}

}  // namespace tern
