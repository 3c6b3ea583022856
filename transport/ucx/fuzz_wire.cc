// Fuzzer: arbitrary bytes as the UCX backend's active-message headers,
// remote keys and addresses (transport/ucx/wire.h). Input: one selector
// byte, then the bytes for that decoder (for chunk headers, a u32 data
// length first). Whatever decodes must re-encode to the same bytes and stay
// inside its documented bounds.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/text.h"
#include "tern/status.h"
#include "tern/transport.h"
#include "transport/ucx/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tern;
  using namespace tern::ucx;
  if (size < 1) return 0;
  std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 6) {
    case 0: {
      Hello h;
      if (DecodeHello(in, &h).ok()) {
        TERN_ASSERT(EncodeHello(h) == in && h.magic == kMagic && h.version == kVersion);
      }
      break;
    }
    case 1: {
      StatusHeader h;
      if (DecodeStatus(in, &h).ok()) {
        TERN_ASSERT(EncodeStatus(h) == in && h.code <= static_cast<uint16_t>(Code::kAuth));
      }
      break;
    }
    case 2: {
      uint64_t seq = 0;
      if (DecodeMessage(in, &seq).ok()) TERN_ASSERT(EncodeMessage(seq) == in);
      break;
    }
    case 3: {
      if (in.size() < 4) return 0;
      uint64_t data_bytes = 0;
      for (int i = 0; i < 4; ++i) data_bytes |= uint64_t{static_cast<uint8_t>(in[i])} << (8 * i);
      ChunkHeader h;
      if (DecodeChunk(in.substr(4), data_bytes, &h).ok()) {
        TERN_ASSERT(EncodeChunk(h) == in.substr(4) && h.length == data_bytes && h.length >= 1 &&
                    h.length <= kMaxChunkBytes);
      }
      break;
    }
    case 4: {
      RemoteKey key;
      if (DecodeRemoteKey(in, &key).ok()) {
        TERN_ASSERT(EncodeRemoteKey(key) == in && !key.rkey.empty() &&
                    key.rkey.size() <= kMaxRkeyBytes && key.base + key.size_bytes >= key.base);
      }
      break;
    }
    case 5: {
      // The address parser ucx dials and listens with (base/text.h).
      if (Result<HostPort> hp = ParseHostPort(in); hp.ok()) {
        // Non-empty, and parsing its canonical spelling gives it back.
        TERN_ASSERT(!hp->host.empty(), "empty host accepted from '", std::string(in), "'");
        const std::string again = FormatHostPort(*hp);
        Result<HostPort> back = ParseHostPort(again);
        TERN_ASSERT(back.ok() && back->host == hp->host && back->port == hp->port, "'", again,
                    "' does not parse back");
      }
      break;
    }
  }
  return 0;
}
