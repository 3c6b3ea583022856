#include "transport/tcp/frame.h"

#include <cstring>

#include <xxhash.h>

#include "tern/transport.h"

namespace tern::tcp {

namespace {
void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t Get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{p[i]} << (8 * i);
  return v;
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}
uint32_t HeaderCheck(const uint8_t in[kHeaderBytes]) {
  uint8_t copy[kHeaderBytes];
  std::memcpy(copy, in, kHeaderBytes);
  std::memset(copy + 12, 0, 4);
  return static_cast<uint32_t>(XXH3_64bits(copy, kHeaderBytes));
}
}  // namespace

void EncodeHeader(const FrameHeader& h, uint8_t out[kHeaderBytes]) {
  Put32(out, kMagic);
  out[4] = h.version;
  out[5] = static_cast<uint8_t>(h.type);
  out[6] = static_cast<uint8_t>(h.flags);
  out[7] = static_cast<uint8_t>(h.flags >> 8);
  Put32(out + 8, h.payload_bytes);
  Put32(out + 12, 0);
  for (int i = 0; i < 4; ++i) Put64(out + 16 + 8 * i, h.arg[i]);
  Put32(out + 12, HeaderCheck(out));
}

Status DecodeHeader(const uint8_t in[kHeaderBytes], FrameHeader* out) {
  const uint32_t magic = Get32(in);
  TERN_REQUIRE(magic == kMagic, kProtocol, "bad frame magic 0x", std::hex, magic,
               " (not a tern peer)");
  TERN_REQUIRE(in[4] == kVersion, kProtocol, "peer speaks wire protocol version ", int{in[4]},
               ", this side speaks ", int{kVersion});
  const uint32_t check = Get32(in + 12);
  TERN_REQUIRE(check == HeaderCheck(in), kCorrupt, "frame header check mismatch");
  FrameHeader h;
  h.version = in[4];
  const uint8_t type = in[5];
  TERN_REQUIRE(type >= 1 && type <= 6, kProtocol, "unknown frame type ", int{type});
  h.type = static_cast<FrameType>(type);
  h.flags = static_cast<uint16_t>(in[6] | (in[7] << 8));
  TERN_REQUIRE(h.flags == 0, kProtocol, "reserved frame flags 0x", std::hex, h.flags, " set");
  h.payload_bytes = Get32(in + 8);
  for (int i = 0; i < 4; ++i) h.arg[i] = Get64(in + 16 + 8 * i);
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
  *out = h;
  return Status::Ok();
}

}  // namespace tern::tcp
