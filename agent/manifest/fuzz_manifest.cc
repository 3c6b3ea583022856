// Fuzzer: arbitrary bytes as a manifest, a signed manifest and a chunk hash
// list. Decode must refuse or return a manifest that re-encodes to exactly
// the input (the encoding is canonical); Verify must refuse anything not
// signed by the trusted key; nothing may crash or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tern/version_manifest.h"

namespace {

const tern::ManifestVerifier& FixedVerifier() {
  static const tern::ManifestVerifier* v = [] {
    auto signer = tern::ManifestSigner::FromSeed(std::array<uint8_t, 32>{7});
    TERN_ASSERT(signer.ok());
    auto* out = new tern::ManifestVerifier;
    TERN_ASSERT(out->AddTrustedKey(signer->public_key()).ok());
    return out;
  }();
  return *v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tern;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  auto m = DecodeManifest(in);
  if (m.ok()) {
    auto again = EncodeManifest(*m);
    TERN_ASSERT(again.ok() && *again == in, "decoded manifest does not re-encode to its bytes");
  }
  auto v = FixedVerifier().Verify(in);
  if (v.ok()) {
    auto again = EncodeManifest(*v);
    TERN_ASSERT(again.ok() && in.substr(0, again->size()) == *again);
  }
  // The first 32 bytes as a root, the rest as a hash list.
  if (size >= 32 && (size - 32) % 32 == 0 && size - 32 <= 32 * 1024) {
    Sha256Hash root;
    std::copy(data, data + 32, root.begin());
    auto list = VerifyChunkHashList(in.substr(32), root, static_cast<uint32_t>((size - 32) / 32));
    if (list.ok()) TERN_ASSERT(ChunkHashRoot(*list) == root);
  }
  return 0;
}
