// libFuzzer target: DecodeControl on arbitrary bytes must return a message or
// an error, never crash; a decoded message re-encodes to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "agent/control/control_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  auto m = tern::agent::DecodeControl(in);
  if (!m.ok()) return 0;
  auto again = tern::agent::EncodeControl(*m);
  if (!again.ok() || *again != in) std::abort();
  return 0;
}
