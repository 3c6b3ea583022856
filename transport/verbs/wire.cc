#include "transport/verbs/wire.h"

#include <cstring>

#include "tern/transport.h"
#include "transport/internal.h"

namespace tern::verbs {

namespace {

constexpr auto& Put = transport_internal::PutLe;
constexpr auto& Get = transport_internal::GetLe;

constexpr uint16_t kFlagEthernet = 1;
constexpr uint64_t kMaxCode = 15;  // Code::kAuth, the last registered code

}  // namespace

std::string EncodeEndpoint(const QpEndpoint& ep) {
  std::string out;
  Put(out, kEndpointMagic, 4);
  Put(out, kVersion, 2);
  Put(out, ep.ethernet ? kFlagEthernet : 0, 2);
  Put(out, ep.qpn, 4);
  Put(out, ep.psn, 4);
  Put(out, ep.lid, 2);
  Put(out, ep.mtu_bytes, 2);
  Put(out, ep.port, 1);
  Put(out, ep.gid_index, 1);
  Put(out, 0, 2);
  out.append(reinterpret_cast<const char*>(ep.gid), 16);
  Put(out, ep.credits, 4);
  Put(out, 0, 4);
  return out;
}

Status DecodeEndpoint(std::string_view bytes, QpEndpoint* out) {
  TERN_REQUIRE(bytes.size() == kEndpointBytes, kProtocol, "verbs endpoint of ", bytes.size(),
               " bytes, expected ", kEndpointBytes);
  TERN_REQUIRE(Get(bytes, 0, 4) == kEndpointMagic, kProtocol, "verbs endpoint with bad magic");
  const uint64_t version = Get(bytes, 4, 2);
  TERN_REQUIRE(version == kVersion, kProtocol, "peer speaks tern verbs protocol v", version,
               ", this side v", kVersion);
  const uint64_t flags = Get(bytes, 6, 2);
  TERN_REQUIRE((flags & ~uint64_t{kFlagEthernet}) == 0, kProtocol, "verbs endpoint with unknown flags");
  TERN_REQUIRE(Get(bytes, 22, 2) == 0 && Get(bytes, 44, 4) == 0, kProtocol,
               "verbs endpoint with reserved bytes set");
  out->ethernet = flags & kFlagEthernet;
  out->qpn = static_cast<uint32_t>(Get(bytes, 8, 4));
  out->psn = static_cast<uint32_t>(Get(bytes, 12, 4));
  out->lid = static_cast<uint16_t>(Get(bytes, 16, 2));
  out->mtu_bytes = static_cast<uint32_t>(Get(bytes, 18, 2));
  out->port = static_cast<uint8_t>(Get(bytes, 20, 1));
  out->gid_index = static_cast<uint8_t>(Get(bytes, 21, 1));
  std::memcpy(out->gid, bytes.data() + 24, 16);
  out->credits = static_cast<uint32_t>(Get(bytes, 40, 4));
  TERN_REQUIRE(out->qpn != 0 && out->qpn < (1u << 24), kProtocol, "verbs QP number ", out->qpn,
               " is not a 24-bit non-zero value");
  TERN_REQUIRE(out->psn < (1u << 24), kProtocol, "verbs PSN ", out->psn, " exceeds 24 bits");
  const uint32_t m = out->mtu_bytes;
  TERN_REQUIRE(m == 256 || m == 512 || m == 1024 || m == 2048 || m == 4096, kProtocol,
               "verbs MTU ", m, " is not an InfiniBand MTU");
  TERN_REQUIRE(out->port >= 1, kProtocol, "verbs port 0 does not exist");
  TERN_REQUIRE(out->credits >= 1 && out->credits <= kMaxCredits, kProtocol, "verbs credits ",
               out->credits, " outside [1, ", kMaxCredits, "]");
  TERN_REQUIRE(out->ethernet || out->lid != 0, kProtocol,
               "verbs InfiniBand endpoint without a LID");
  return Status::Ok();
}

ImmSlots::ImmSlots(uint16_t capacity) : slots_(capacity) {
  for (uint32_t i = capacity; i-- > 0;) free_.push_back(static_cast<uint16_t>(i));
}

Status ImmSlots::Claim(uint32_t imm, const Chunk& chunk) {
  const uint16_t s = ImmSlot(imm);
  TERN_REQUIRE(s < slots_.size(), kProtocol, "verbs chunk slot ", s, " beyond ", slots_.size());
  Slot& slot = slots_[s];
  TERN_REQUIRE(!slot.used, kProtocol, "verbs chunk slot ", s, " already in flight");
  TERN_REQUIRE(ImmGeneration(imm) == slot.generation, kProtocol, "verbs chunk slot ", s,
               " generation ", ImmGeneration(imm), ", expected ", slot.generation);
  slot.used = true;
  slot.chunk = chunk;
  ++live_;
  return Status::Ok();
}

Result<ImmSlots::Chunk> ImmSlots::Take(uint32_t imm) {
  const uint16_t s = ImmSlot(imm);
  TERN_REQUIRE(s < slots_.size() && slots_[s].used && slots_[s].generation == ImmGeneration(imm),
               kProtocol, "verbs write-with-imm 0x", std::hex, imm, " names no chunk in flight");
  Slot& slot = slots_[s];
  slot.used = false;
  ++slot.generation;
  --live_;
  return slot.chunk;
}

Result<uint32_t> ImmSlots::Allocate() {
  TERN_REQUIRE(!free_.empty(), kResourceExhausted, "verbs: all ", slots_.size(),
               " chunk slots in flight");
  const uint16_t s = free_.back();
  free_.pop_back();
  slots_[s].used = true;
  ++live_;
  return EncodeImm(s, slots_[s].generation);
}

void ImmSlots::Free(uint32_t imm) {
  const uint16_t s = ImmSlot(imm);
  if (s >= slots_.size() || !slots_[s].used || slots_[s].generation != ImmGeneration(imm)) return;
  slots_[s].used = false;
  ++slots_[s].generation;
  --live_;
  free_.push_back(s);
}

std::string EncodeControl(const ControlHeader& header) {
  std::string out;
  Put(out, static_cast<uint8_t>(header.type), 1);
  Put(out, kVersion, 1);
  Put(out, 0, 2);
  Put(out, header.payload_bytes, 4);
  for (uint64_t v : header.a) Put(out, v, 8);
  return out;
}

Status DecodeControl(std::string_view bytes, ControlHeader* out) {
  TERN_REQUIRE(bytes.size() == kControlBytes, kProtocol, "verbs control header of ", bytes.size(),
               " bytes, expected ", kControlBytes);
  const uint64_t type = Get(bytes, 0, 1);
  TERN_REQUIRE(type >= 1 && type <= 6, kProtocol, "verbs control type ", type, " unknown");
  TERN_REQUIRE(Get(bytes, 1, 1) == kVersion, kProtocol, "verbs control version ", Get(bytes, 1, 1));
  TERN_REQUIRE(Get(bytes, 2, 2) == 0, kProtocol, "verbs control header with reserved bytes set");
  out->type = static_cast<ControlType>(type);
  out->payload_bytes = static_cast<uint32_t>(Get(bytes, 4, 4));
  for (int i = 0; i < 6; ++i) out->a[i] = Get(bytes, 8 + 8 * i, 8);
  TERN_REQUIRE(out->payload_bytes <= kMaxControlPayload, kProtocol, "verbs control payload of ",
               out->payload_bytes, " bytes exceeds ", kMaxControlPayload);
  switch (out->type) {
    case ControlType::kMessage:
      TERN_REQUIRE(out->a[1] <= kMaxMessageBytes && out->a[2] <= out->a[1] &&
                       out->payload_bytes <= out->a[1] - out->a[2],
                   kProtocol, "verbs message fragment [", out->a[2], ", +", out->payload_bytes,
                   ") outside a message of ", out->a[1], " bytes (max ", kMaxMessageBytes, ")");
      break;
    case ControlType::kChunk:
      TERN_REQUIRE(out->a[3] >= 1 && out->a[3] <= kMaxChunkBytes && out->a[5] <= 0xffffffffu &&
                       out->payload_bytes == 0,
                   kProtocol, "verbs chunk of ", out->a[3], " bytes outside [1, ", kMaxChunkBytes, "]");
      break;
    case ControlType::kAck:
      TERN_REQUIRE(out->a[1] <= kMaxCode, kProtocol, "verbs ack with unknown code ", out->a[1]);
      break;
    case ControlType::kWindow:
      TERN_REQUIRE(out->a[3] <= 0xffffffffu && out->a[1] + out->a[2] >= out->a[1], kProtocol,
                   "verbs window advert with a bad rkey or a wrapping range");
      break;
    case ControlType::kWindowClosed:
    case ControlType::kBye:
      break;
  }
  return Status::Ok();
}

Result<bool> MessageAssembler::Add(const ControlHeader& h, std::string_view payload) {
  TERN_REQUIRE(h.type == ControlType::kMessage && payload.size() == h.payload_bytes, kProtocol,
               "verbs message fragment with ", payload.size(), " payload bytes, header says ",
               h.payload_bytes);
  if (!active_) {
    TERN_REQUIRE(h.a[0] == seq_ && h.a[2] == 0, kProtocol, "verbs message ", h.a[0], " at offset ",
                 h.a[2], ", expected message ", seq_, " at 0");
    active_ = true;
    total_ = h.a[1];
    buffer_.clear();
    buffer_.reserve(total_);
  }
  TERN_REQUIRE(h.a[0] == seq_ && h.a[1] == total_ && h.a[2] == buffer_.size(), kProtocol,
               "verbs message fragment out of place (seq ", h.a[0], ", offset ", h.a[2], ")");
  TERN_REQUIRE(payload.size() > 0 || total_ == 0, kProtocol, "verbs empty message fragment");
  buffer_.append(payload);
  if (buffer_.size() < total_) return false;
  active_ = false;
  ++seq_;
  return true;
}

}  // namespace tern::verbs
