// The raw-verbs backend's wire pieces (docs/format/verbs.md, version 1),
// none of which needs a device:
//  * the side channel's framing (endpoint, refusal, ready) over TCP;
//  * QpEndpoint: what each side sends to bring an RC queue pair up (QP
//    number, PSN, LID/GID, MTU, receive credits);
//  * ControlHeader: the header of every SEND (message fragments, chunk
//    announcements, acks, credit returns, bye);
//  * the region key ExportRegion hands out for one-sided writes.
// All integers little-endian; decoders validate everything a peer controls.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tern/status.h"

namespace tern::verbs {

inline constexpr uint32_t kEndpointMagic = 0x42525654;  // bytes "TVRB"
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kEndpointBytes = 48;
inline constexpr uint32_t kMaxCredits = 1u << 16;

struct QpEndpoint {
  uint32_t qpn = 0;  // 24 bits, non-zero
  uint32_t psn = 0;  // 24 bits
  uint16_t lid = 0;  // InfiniBand; 0 on RoCE
  uint32_t mtu_bytes = 4096;
  uint8_t port = 1;
  uint8_t gid_index = 0;
  bool ethernet = false;  // RoCE: route by gid
  uint8_t gid[16] = {};
  uint32_t credits = 0;  // receives posted for the peer's SENDs (>= kMinCredits)
  // RDMA READs this side accepts in flight against it (its
  // max_dest_rd_atomic); the peer's max_rd_atomic must not exceed it.
  uint8_t rd_atomic = 1;
};
inline constexpr uint32_t kMinCredits = 4;

std::string EncodeEndpoint(const QpEndpoint& ep);
Status DecodeEndpoint(std::string_view bytes, QpEndpoint* out);

enum class ControlType : uint8_t {
  kMessage = 1,  // a[0] seq, a[1] total bytes, a[2] fragment offset; payload follows
  kChunk = 2,    // a[0] op, a[1] transfer, a[2] dst offset, a[3] length, a[4] xxh3,
                 // a[5] source address; rkey = the source's rkey
  kAck = 3,      // a[0] op, a[1] tern::Code; reason text follows
  kCredit = 4,   // returns credits only
  kBye = 5,
};
// type u8, version u8, credits u16, payload u32, rkey u32, reserved u32, 6 x u64
inline constexpr size_t kControlBytes = 64;
inline constexpr uint32_t kMaxControlPayload = 64 * 1024;
inline constexpr size_t kControlBufferBytes = kControlBytes + kMaxControlPayload;
inline constexpr uint32_t kMaxAckReason = 4096;

struct ControlHeader {
  ControlType type = ControlType::kBye;
  // Receives the sender of this header re-posted since its last report: the
  // reader may post that many more SENDs.
  uint16_t credits = 0;
  uint32_t payload_bytes = 0;
  uint32_t rkey = 0;  // kChunk only
  uint64_t a[6] = {};
};

std::string EncodeControl(const ControlHeader& header);
// Validates version, type, reserved bytes, payload bound and type-specific
// fields (chunk length in [1, kMaxChunkBytes] with a source range that does
// not wrap, ack code registered, unused fields zero).
Status DecodeControl(std::string_view bytes, ControlHeader* out);

// The side channel: each message is a 12-byte header (magic "TVSC", version
// u16, kind u16, length u32) and `length` payload bytes.
enum class SideKind : uint16_t {
  kEndpoint = 1,  // payload: QpEndpoint (kEndpointBytes)
  kRefusal = 2,   // payload: reason text (<= kMaxSideReason)
  kReady = 3,     // empty: the dialler's queue pair is ready to send
};
inline constexpr uint32_t kSideMagic = 0x43535654;  // bytes "TVSC"
inline constexpr size_t kSideHeaderBytes = 12;
inline constexpr uint32_t kMaxSideReason = 1024;
std::string EncodeSide(SideKind kind, std::string_view payload);
// Validates the header; *payload_bytes is the length to read next (bounded
// per kind).
Status DecodeSideHeader(std::string_view bytes, SideKind* kind, uint32_t* payload_bytes);

// ExportRegion's key: magic "TVRK" u32, rkey u32, address u64, size u64.
inline constexpr uint32_t kRegionKeyMagic = 0x4b525654;  // bytes "TVRK"
inline constexpr size_t kRegionKeyBytes = 24;
struct RegionKey {
  uint32_t rkey = 0;
  uint64_t address = 0;
  uint64_t size_bytes = 0;
};
std::string EncodeRegionKey(const RegionKey& key);
Status DecodeRegionKey(std::string_view bytes, RegionKey* out);

// Reassembles a message sent as ordered fragments (RC delivers in order).
// Bounded by kMaxMessageBytes; a fragment out of place is kProtocol.
class MessageAssembler {
 public:
  // Returns true when `header` completed a message, which `take()` yields.
  Result<bool> Add(const ControlHeader& header, std::string_view payload);
  std::string take() { return std::move(buffer_); }

 private:
  uint64_t seq_ = 0;
  uint64_t total_ = 0;
  bool active_ = false;
  std::string buffer_;
};

}  // namespace tern::verbs
