// libFuzzer target: DecodeKeySet on arbitrary bytes must return a key set or
// an error, never crash; a decoded key set re-encodes to the same bytes.
// VerifyKeySet and ApplyKeySet with no trusted key must refuse everything.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tern/key_set.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  static tern::ManifestVerifier nobody;
  if (tern::VerifyKeySet(nobody, in).ok()) std::abort();
  if (tern::ApplyKeySet(nobody, in).ok() || nobody.key_set_seq() != 0) std::abort();
  auto ks = tern::DecodeKeySet(in);
  if (!ks.ok()) return 0;
  auto again = tern::EncodeKeySet(*ks);
  if (!again.ok() || *again != in) std::abort();
  return 0;
}
