#include "transport/tcp/frame.h"

#include <cstring>

#include <xxhash.h>

#include "base/coding.h"
#include "base/wire_status.h"
#include "tern/transport.h"
#include "transport/internal.h"

namespace tern::tcp {

namespace {
uint32_t HeaderCheck(const uint8_t in[kHeaderBytes]) {
  uint8_t copy[kHeaderBytes];
  std::memcpy(copy, in, kHeaderBytes);
  std::memset(copy + 12, 0, 4);
  return static_cast<uint32_t>(XXH3_64bits(copy, kHeaderBytes));
}
}  // namespace

void EncodeHeader(const FrameHeader& h, uint8_t out[kHeaderBytes]) {
  EncodeFixed32(out, kMagic);
  out[4] = h.version;
  out[5] = static_cast<uint8_t>(h.type);
  out[6] = static_cast<uint8_t>(h.flags);
  out[7] = static_cast<uint8_t>(h.flags >> 8);
  EncodeFixed32(out + 8, h.payload_bytes);
  EncodeFixed32(out + 12, 0);
  for (int i = 0; i < 4; ++i) EncodeFixed64(out + 16 + 8 * i, h.arg[i]);
  EncodeFixed32(out + 12, HeaderCheck(out));
}

Status DecodeHeader(const uint8_t in[kHeaderBytes], FrameHeader* out) {
  const uint32_t magic = DecodeFixed32(in);
  TERN_REQUIRE(magic == kMagic, kProtocol, "bad frame magic 0x", std::hex, magic,
               " (not a tern peer)");
  TERN_REQUIRE(in[4] >= kMinVersion && in[4] <= kMaxVersion, kProtocol,
               "peer speaks wire protocol version ", int{in[4]}, ", this side speaks ",
               int{kMinVersion}, "..", int{kMaxVersion});
  const uint32_t check = DecodeFixed32(in + 12);
  TERN_REQUIRE(check == HeaderCheck(in), kCorrupt, "frame header check mismatch");
  FrameHeader h;
  h.version = in[4];
  const uint8_t type = in[5];
  TERN_REQUIRE(type >= 1 && type <= 6, kProtocol, "unknown frame type ", int{type});
  h.type = static_cast<FrameType>(type);
  h.flags = static_cast<uint16_t>(in[6] | (in[7] << 8));
  TERN_REQUIRE(h.flags == 0, kProtocol, "reserved frame flags 0x", std::hex, h.flags, " set");
  h.payload_bytes = DecodeFixed32(in + 8);
  for (int i = 0; i < 4; ++i) h.arg[i] = DecodeFixed64(in + 16 + 8 * i);
  uint64_t min_bytes = 0, max_bytes = 0;
  switch (h.type) {
    case FrameType::kHelloAck: max_bytes = kMaxReasonBytes; break;
    case FrameType::kMessage: max_bytes = kMaxMessageBytes; break;
    case FrameType::kChunk: min_bytes = 1; max_bytes = kMaxChunkBytes; break;
    default: break;
  }
  TERN_REQUIRE(h.payload_bytes >= min_bytes && h.payload_bytes <= max_bytes, kOutOfRange,
               "frame type ", int{type}, " with ", h.payload_bytes, " payload bytes (allowed ",
               min_bytes, "..", max_bytes, ")");
  // Args a type does not use are reserved: zero, so they can carry meaning in
  // a later version without being mistaken for garbage today.
  unsigned used_args = 0;  // bit i: arg i has a meaning
  switch (h.type) {
    case FrameType::kHello:
    case FrameType::kHelloAck:
    case FrameType::kAck: used_args = 0b0011; break;
    case FrameType::kChunk: used_args = 0b1111; break;
    case FrameType::kMessage: used_args = h.version >= 2 ? 0b0100 : 0; break;
    default: break;
  }
  for (int i = 0; i < 4; ++i) {
    TERN_REQUIRE((used_args >> i & 1) != 0 || h.arg[i] == 0, kProtocol, "frame type ", int{type},
                 " with reserved arg", i, " set (wire version ", int{h.version}, ")");
  }
  *out = h;
  return Status::Ok();
}

uint64_t MessageCheck(std::string_view payload) {
  return XXH3_64bits(payload.data(), payload.size());
}

Result<Hello> ParseHello(const FrameHeader& h, uint32_t max_streams) {
  TERN_REQUIRE(h.type == FrameType::kHello, kProtocol, "first frame has type ", int(h.type),
               ", expected hello");
  Hello hello;
  hello.connection_id = h.arg[0];
  hello.index = static_cast<uint32_t>(h.arg[1]);
  hello.count = static_cast<uint32_t>(h.arg[1] >> 32);
  TERN_REQUIRE(hello.count >= 1 && hello.count <= max_streams && hello.index < hello.count,
               kOutOfRange, "hello for stream ", hello.index, " of ", hello.count, " (max ",
               max_streams, ")");
  return hello;
}

Status ParseHelloAck(const FrameHeader& h, uint64_t connection_id, std::string_view reason) {
  TERN_REQUIRE(h.type == FrameType::kHelloAck, kProtocol, "server answered the hello with frame type ",
               int(h.type));
  TERN_REQUIRE(reason.size() == h.payload_bytes && reason.size() <= kMaxReasonBytes, kInternal,
               "hello-ack reason of ", reason.size(), " bytes, header says ", h.payload_bytes);
  // A refusal ends the connection whatever id it names (a server that could
  // not decode our hello answers with id 0); an acceptance must be for us.
  if (h.arg[1] != 0) {
    return StatusFromWire(h.arg[1], "peer", "refused: " + std::string(reason));
  }
  TERN_REQUIRE(h.arg[0] == connection_id, kProtocol, "server accepted the hello of connection ",
               h.arg[0], ", not ours");
  TERN_REQUIRE(reason.empty(), kProtocol, "server accepted the hello with a reason attached");
  return Status::Ok();
}

}  // namespace tern::tcp
