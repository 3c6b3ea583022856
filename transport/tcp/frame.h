// The TCP wire protocol's frame header (docs/format/tcp.md, versions 1 and
// 2). Every frame starts with this fixed 48-byte little-endian header;
// payloads follow it directly. Decoding validates everything a peer controls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tern/status.h"

namespace tern::tcp {

inline constexpr uint32_t kMagic = 0x4E524554;  // bytes "TERN"
// The wire versions this code speaks. Version 2 adds the XXH3-64 of a
// MESSAGE's payload (arg2); the HELLO exchange settles one version per
// connection (TcpOptions::min_wire_version / max_wire_version).
inline constexpr uint8_t kMinVersion = 1;
inline constexpr uint8_t kMaxVersion = 2;
inline constexpr size_t kHeaderBytes = 48;
inline constexpr uint32_t kMaxReasonBytes = 1024;  // HELLO_ACK error text

enum class FrameType : uint8_t {
  kHello = 1,     // client -> server, first frame of every stream
  kHelloAck = 2,  // server -> client, answer to kHello
  kMessage = 3,   // stream 0 only
  kChunk = 4,
  kAck = 5,       // answer to kChunk, on the stream that carried it
  kPing = 6,      // keepalive
};

struct FrameHeader {
  uint8_t version = kMinVersion;  // the connection's; senders always set it
  FrameType type = FrameType::kPing;
  uint16_t flags = 0;  // reserved, must be zero
  uint32_t payload_bytes = 0;
  uint64_t arg[4] = {0, 0, 0, 0};
};

// Writes magic, version, type, flags, length, args and the header check.
void EncodeHeader(const FrameHeader& header, uint8_t out[kHeaderBytes]);

// Validates magic, version (kMinVersion..kMaxVersion; kProtocol names the
// peer's), header check, type, reserved flags, the payload bound of the type
// and that the args the type does not use in that version are zero. Whether
// the version is the connection's is the caller's check. A header that
// decodes re-encodes to the same bytes.
Status DecodeHeader(const uint8_t in[kHeaderBytes], FrameHeader* out);

// The XXH3-64 a version-2 MESSAGE carries in arg2 for `payload`.
uint64_t MessageCheck(std::string_view payload);

// HELLO arg1 packs the stream index (low 32 bits) and count (high 32 bits).
inline uint64_t PackStream(uint32_t index, uint32_t count) {
  return uint64_t{index} | (uint64_t{count} << 32);
}

// The fields of a HELLO (the first frame of every stream).
struct Hello {
  uint64_t connection_id = 0;
  uint32_t index = 0;
  uint32_t count = 0;
};
// Checks a decoded header is a HELLO for stream index < count, 1 <= count <=
// max_streams (kProtocol for another frame type, kOutOfRange for the counts).
Result<Hello> ParseHello(const FrameHeader& header, uint32_t max_streams);

// Checks a decoded header answers our HELLO and turns it into the server's
// verdict: OK when it accepted `connection_id` (no payload allowed), else the
// status the server sent with its reason (`reason` is the frame's payload,
// <= kMaxReasonBytes, made printable). kProtocol for a malformed answer.
Status ParseHelloAck(const FrameHeader& header, uint64_t connection_id, std::string_view reason);

}  // namespace tern::tcp
