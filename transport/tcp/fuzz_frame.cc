// Fuzzer: arbitrary bytes as TCP wire frames (docs/format/tcp.md §2-3) and
// the handshake frames built on them. Input: one mode byte, the 48 header
// bytes, then payload bytes (the HELLO_ACK reason).
//   mode bit 0: recompute the header check, so mutations reach the checks
//               behind it (type, flags, payload bound, reserved args);
//   mode bits 1-6: max_streams - 1 for ParseHello;
//   mode bit 7: expect a different connection id in ParseHelloAck.
// A header that decodes must re-encode to the same bytes and respect its
// type's payload bound; hello and hello-ack parsing must keep their bounds
// and turn peer text into printable error messages.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include <xxhash.h>

#include "tern/status.h"
#include "tern/transport.h"
#include "transport/internal.h"
#include "transport/tcp/frame.h"

namespace {

using namespace tern;
using namespace tern::tcp;

void FixCheck(uint8_t raw[kHeaderBytes]) {
  std::memset(raw + 12, 0, 4);
  const auto check = static_cast<uint32_t>(XXH3_64bits(raw, kHeaderBytes));
  for (int i = 0; i < 4; ++i) raw[12 + i] = static_cast<uint8_t>(check >> (8 * i));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 + kHeaderBytes) return 0;
  const uint8_t mode = data[0];
  uint8_t raw[kHeaderBytes];
  std::memcpy(raw, data + 1, kHeaderBytes);
  if (mode & 1) FixCheck(raw);
  const std::string_view payload(reinterpret_cast<const char*>(data + 1 + kHeaderBytes),
                                 size - 1 - kHeaderBytes);

  FrameHeader h;
  Status st = DecodeHeader(raw, &h);
  if (!st.ok()) {
    TERN_ASSERT(st.code() == Code::kProtocol || st.code() == Code::kCorrupt ||
                    st.code() == Code::kOutOfRange,
                "unexpected rejection code: ", st.ToString());
    return 0;
  }
  uint8_t again[kHeaderBytes];
  EncodeHeader(h, again);
  TERN_ASSERT(std::memcmp(again, raw, kHeaderBytes) == 0,
              "a decoded header re-encodes differently");
  const uint8_t type = static_cast<uint8_t>(h.type);
  TERN_ASSERT(type >= 1 && type <= 6 && h.flags == 0 && h.version >= kMinVersion &&
              h.version <= kMaxVersion);
  // Version 1 gives a MESSAGE no args; version 2 only its payload check.
  if (h.type == FrameType::kMessage) {
    TERN_ASSERT(h.arg[0] == 0 && h.arg[1] == 0 && h.arg[3] == 0 && (h.version >= 2 || h.arg[2] == 0));
  }
  switch (h.type) {
    case FrameType::kHelloAck:
      TERN_ASSERT(h.payload_bytes <= kMaxReasonBytes);
      break;
    case FrameType::kMessage:
      TERN_ASSERT(h.payload_bytes <= kMaxMessageBytes);
      break;
    case FrameType::kChunk:
      TERN_ASSERT(h.payload_bytes >= 1 && h.payload_bytes <= kMaxChunkBytes);
      break;
    default:
      TERN_ASSERT(h.payload_bytes == 0);
      break;
  }

  const uint32_t max_streams = ((mode >> 1) & 63) + 1;
  auto hello = ParseHello(h, max_streams);
  if (hello.ok()) {
    TERN_ASSERT(h.type == FrameType::kHello && hello->count >= 1 && hello->count <= max_streams &&
                hello->index < hello->count && hello->connection_id == h.arg[0]);
  }

  if (payload.size() < h.payload_bytes) return 0;
  const std::string_view reason = payload.substr(0, h.payload_bytes);
  const uint64_t ours = h.arg[0] ^ ((mode & 0x80) ? 1 : 0);
  Status ack = ParseHelloAck(h, ours, reason);
  if (ack.ok()) {
    TERN_ASSERT(h.type == FrameType::kHelloAck && h.arg[0] == ours && h.arg[1] == 0 &&
                reason.empty());
  } else {
    TERN_ASSERT(tern::transport::IsPrintable(ack.message()),
                "peer text reached an error message unescaped");
    TERN_ASSERT(ack.message().size() <= 4 * kMaxReasonBytes + 256, "unbounded error message");
  }
  return 0;
}
