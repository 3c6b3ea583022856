// The UCX backend's active-message protocol (docs/format/ucx.md, version
// 1). Every active message carries one fixed-size,
// little-endian header; its data part is the payload (message bytes, chunk
// bytes or ack reason). Decoders validate everything a peer controls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tern/status.h"

namespace tern::ucx {

inline constexpr uint32_t kMagic = 0x58435554;  // bytes "TUCX"
inline constexpr uint16_t kVersion = 1;
inline constexpr uint32_t kMaxReasonBytes = 512;  // ack / hello-ack error text

// Active message ids; UCX dispatches on them, so each has its own handler.
enum AmId : uint16_t {
  kAmHello = 1,     // client -> server, first message: magic, version
  kAmHelloAck = 2,  // server -> client: code (0 = accepted) + reason text
  kAmMessage = 3,   // seq; data = message payload
  kAmChunk = 4,     // op, transfer, offset, length, xxh3; data = chunk bytes
  kAmAck = 5,       // op, code; data = reason text when code != 0
  kAmBye = 6,       // clean close by the sender
};

inline constexpr size_t kHelloBytes = 8;     // magic u32, version u16, flags u16
inline constexpr size_t kStatusBytes = 16;   // op u64, code u16, pad u16 (0), reserved u32 (0)
inline constexpr size_t kMessageBytes = 8;   // seq u64
inline constexpr size_t kChunkBytes = 40;    // op, transfer_id, dst_offset, length, xxh3 (u64 each)

struct Hello {
  uint32_t magic = kMagic;
  uint16_t version = kVersion;
};
struct StatusHeader {  // kAmHelloAck and kAmAck
  uint64_t op = 0;
  uint16_t code = 0;  // tern::Code
};
struct ChunkHeader {
  uint64_t op = 0;
  uint64_t transfer_id = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;
  uint64_t xxh3 = 0;
};

std::string EncodeHello(const Hello& hello);
// kProtocol names the peer's version when it is not ours.
Status DecodeHello(std::string_view bytes, Hello* out);

std::string EncodeStatus(const StatusHeader& header);
// Rejects unknown codes and non-zero reserved bytes.
Status DecodeStatus(std::string_view bytes, StatusHeader* out);

std::string EncodeMessage(uint64_t seq);
Status DecodeMessage(std::string_view bytes, uint64_t* seq);

std::string EncodeChunk(const ChunkHeader& header);
// Validates 1 <= length <= kMaxChunkBytes and that the data part matches it.
Status DecodeChunk(std::string_view bytes, uint64_t data_bytes, ChunkHeader* out);

// A region exported for one-sided writes: base address and size in the
// exporter's address space plus UCX's packed rkey.
struct RemoteKey {
  uint64_t base = 0;
  uint64_t size_bytes = 0;
  std::string rkey;  // ucp_rkey_pack output, 1 .. kMaxRkeyBytes
};
inline constexpr uint32_t kMaxRkeyBytes = 4096;
std::string EncodeRemoteKey(const RemoteKey& key);
Status DecodeRemoteKey(std::string_view bytes, RemoteKey* out);

}  // namespace tern::ucx
