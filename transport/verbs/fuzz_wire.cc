// Fuzzer: arbitrary bytes as the verbs backend's peer-controlled encodings
// (transport/verbs/wire.h): QP endpoints, control headers, side-channel
// headers, region keys, and message fragments fed to the reassembler.
// Input: one selector byte, then the bytes for that decoder. Whatever
// decodes must re-encode to the same bytes and stay inside its bounds.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tern/status.h"
#include "tern/transport.h"
#include "transport/verbs/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tern;
  using namespace tern::verbs;
  if (size < 1) return 0;
  std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 5) {
    case 0: {
      QpEndpoint ep;
      if (DecodeEndpoint(in, &ep).ok()) {
        TERN_ASSERT(EncodeEndpoint(ep) == in && ep.qpn != 0 && ep.qpn < (1u << 24) &&
                    ep.credits >= 1 && ep.credits <= kMaxCredits);
      }
      break;
    }
    case 1: {
      ControlHeader h;
      if (DecodeControl(in, &h).ok()) {
        TERN_ASSERT(EncodeControl(h) == in && h.payload_bytes <= kMaxControlPayload);
        if (h.type == ControlType::kChunk) TERN_ASSERT(h.a[3] >= 1 && h.a[3] <= kMaxChunkBytes);
      }
      break;
    }
    case 2: {
      SideKind kind;
      uint32_t length = 0;
      if (DecodeSideHeader(in, &kind, &length).ok()) {
        TERN_ASSERT(length <= kMaxSideReason || length == kEndpointBytes);
        TERN_ASSERT(EncodeSide(kind, std::string(length, '\0')).substr(0, kSideHeaderBytes) == in);
      }
      break;
    }
    case 3: {
      RegionKey key;
      if (DecodeRegionKey(in, &key).ok()) {
        TERN_ASSERT(EncodeRegionKey(key) == in && key.address + key.size_bytes >= key.address);
      }
      break;
    }
    case 4: {
      // A stream of (header, payload) fragments as a peer would send them.
      MessageAssembler m;
      while (in.size() >= kControlBytes) {
        ControlHeader h;
        if (!DecodeControl(in.substr(0, kControlBytes), &h).ok()) break;
        in.remove_prefix(kControlBytes);
        if (h.type != ControlType::kMessage || h.payload_bytes > in.size()) break;
        auto done = m.Add(h, in.substr(0, h.payload_bytes));
        in.remove_prefix(h.payload_bytes);
        if (!done.ok()) break;
        if (*done) TERN_ASSERT(m.take().size() == h.a[1]);
      }
      break;
    }
  }
  return 0;
}
