// libFuzzer target: DecodeBeacon on arbitrary bytes must return a beacon or
// an error, never crash; a decoded beacon re-encodes to the same bytes.
// VerifyBeacon with no trusted key must refuse everything.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "agent/freshness/beacon.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  static const tern::ManifestVerifier kNobody;
  if (tern::agent::VerifyBeacon(kNobody, in).ok()) std::abort();
  auto b = tern::agent::DecodeBeacon(in);
  if (!b.ok()) return 0;
  auto again = tern::agent::EncodeBeacon(*b);
  if (!again.ok() || *again != in) std::abort();
  return 0;
}
