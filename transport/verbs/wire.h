// The raw-verbs backend's wire pieces (docs/transport-rdma.md, "Verbs
// wire", version 1), none of which needs a device:
//  * QpEndpoint: what each side sends over the TCP side channel to bring an
//    RC queue pair up (QP number, PSN, LID/GID, MTU, receive credits);
//  * the 32-bit immediate of RDMA WRITE WITH IMM that names a chunk slot;
//  * ImmSlots: the bounded table of chunk slots behind those immediates;
//  * ControlHeader: the header of every SEND (messages, chunk metadata,
//    acks, window adverts, bye).
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
  uint32_t credits = 0;  // receives the sender may consume before an ack
};

std::string EncodeEndpoint(const QpEndpoint& ep);
Status DecodeEndpoint(std::string_view bytes, QpEndpoint* out);

// imm = slot (low 16 bits) | generation (high 16 bits): a stale or forged
// immediate names a generation that is no longer live.
inline uint32_t EncodeImm(uint16_t slot, uint16_t generation) {
  return uint32_t{slot} | (uint32_t{generation} << 16);
}
inline uint16_t ImmSlot(uint32_t imm) { return static_cast<uint16_t>(imm & 0xffff); }
inline uint16_t ImmGeneration(uint32_t imm) { return static_cast<uint16_t>(imm >> 16); }

// Chunk slots on the receiving side: a CHUNK control message claims one
// (by imm), the WRITE WITH IMM completion finds it, the ack frees it.
// Capacity is fixed at construction. Not thread-safe (one CQ thread).
class ImmSlots {
 public:
  struct Chunk {
    uint64_t op = 0, transfer_id = 0, dst_offset = 0, length = 0, xxh3 = 0;
  };
  explicit ImmSlots(uint16_t capacity);
  // The sender picks imm values; this checks the slot is in range and free,
  // and that the generation is the one this table expects next for it.
  Status Claim(uint32_t imm, const Chunk& chunk);
  // The chunk a completion's imm names; kProtocol for unknown or stale.
  Result<Chunk> Take(uint32_t imm);
  uint16_t live() const { return live_; }

  // Sender side: the next imm to use for a free slot; kResourceExhausted
  // when every slot is in flight.
  Result<uint32_t> Allocate();
  void Free(uint32_t imm);

 private:
  struct Slot {
    bool used = false;
    uint16_t generation = 0;
    Chunk chunk;
  };
  std::vector<Slot> slots_;
  std::vector<uint16_t> free_;
  uint16_t live_ = 0;
};

enum class ControlType : uint8_t {
  kMessage = 1,  // a[0] seq, a[1] total bytes, a[2] fragment offset; payload follows
  kChunk = 2,    // a[0] op, a[1] transfer, a[2] dst offset, a[3] length, a[4] xxh3, a[5] imm
  kAck = 3,      // a[0] op, a[1] tern::Code; reason text follows
  kWindow = 4,   // a[0] transfer, a[1] remote address, a[2] length, a[3] rkey
  kWindowClosed = 5,  // a[0] transfer
  kBye = 6,
};
inline constexpr size_t kControlBytes = 56;  // type u8, version u8, reserved u16, payload u32, 6 x u64
inline constexpr uint32_t kMaxControlPayload = 64 * 1024;  // one receive buffer minus the header

struct ControlHeader {
  ControlType type = ControlType::kBye;
  uint32_t payload_bytes = 0;
  uint64_t a[6] = {};
};

std::string EncodeControl(const ControlHeader& header);
// Validates version, type, reserved bytes, payload bound and type-specific
// fields (chunk length in [1, kMaxChunkBytes], ack code registered).
Status DecodeControl(std::string_view bytes, ControlHeader* out);

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
