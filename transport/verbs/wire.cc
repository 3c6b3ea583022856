#include "transport/verbs/wire.h"

#include <cstring>

#include "base/coding.h"
#include "base/wire_status.h"
#include "tern/transport.h"
#include "transport/internal.h"

namespace tern::verbs {

namespace {

constexpr uint16_t kFlagEthernet = 1;

}  // namespace

std::string EncodeEndpoint(const QpEndpoint& ep) {
  std::string out;
  PutFixed(&out, kEndpointMagic, 4);
  PutFixed(&out, kVersion, 2);
  PutFixed(&out, ep.ethernet ? kFlagEthernet : 0, 2);
  PutFixed(&out, ep.qpn, 4);
  PutFixed(&out, ep.psn, 4);
  PutFixed(&out, ep.lid, 2);
  PutFixed(&out, ep.mtu_bytes, 2);
  PutFixed(&out, ep.port, 1);
  PutFixed(&out, ep.gid_index, 1);
  PutFixed(&out, ep.rd_atomic, 1);
  PutFixed(&out, 0, 1);
  out.append(reinterpret_cast<const char*>(ep.gid), 16);
  PutFixed(&out, ep.credits, 4);
  PutFixed(&out, 0, 4);
  return out;
}

Status DecodeEndpoint(std::string_view bytes, QpEndpoint* out) {
  TERN_REQUIRE(bytes.size() == kEndpointBytes, kProtocol, "verbs endpoint of ", bytes.size(),
               " bytes, expected ", kEndpointBytes);
  TERN_REQUIRE(DecodeFixedAt(bytes, 0, 4) == kEndpointMagic, kProtocol, "verbs endpoint with bad magic");
  const uint64_t version = DecodeFixedAt(bytes, 4, 2);
  TERN_REQUIRE(version == kVersion, kProtocol, "peer speaks tern verbs protocol v", version,
               ", this side v", kVersion);
  const uint64_t flags = DecodeFixedAt(bytes, 6, 2);
  TERN_REQUIRE((flags & ~uint64_t{kFlagEthernet}) == 0, kProtocol, "verbs endpoint with unknown flags");
  TERN_REQUIRE(DecodeFixedAt(bytes, 23, 1) == 0 && DecodeFixedAt(bytes, 44, 4) == 0, kProtocol,
               "verbs endpoint with reserved bytes set");
  out->ethernet = flags & kFlagEthernet;
  out->qpn = static_cast<uint32_t>(DecodeFixedAt(bytes, 8, 4));
  out->psn = static_cast<uint32_t>(DecodeFixedAt(bytes, 12, 4));
  out->lid = static_cast<uint16_t>(DecodeFixedAt(bytes, 16, 2));
  out->mtu_bytes = static_cast<uint32_t>(DecodeFixedAt(bytes, 18, 2));
  out->port = static_cast<uint8_t>(DecodeFixedAt(bytes, 20, 1));
  out->gid_index = static_cast<uint8_t>(DecodeFixedAt(bytes, 21, 1));
  std::memcpy(out->gid, bytes.data() + 24, 16);
  out->credits = static_cast<uint32_t>(DecodeFixedAt(bytes, 40, 4));
  out->rd_atomic = static_cast<uint8_t>(DecodeFixedAt(bytes, 22, 1));
  TERN_REQUIRE(out->rd_atomic >= 1, kProtocol, "verbs endpoint accepting no RDMA reads");
  TERN_REQUIRE(out->qpn != 0 && out->qpn < (1u << 24), kProtocol, "verbs QP number ", out->qpn,
               " is not a 24-bit non-zero value");
  TERN_REQUIRE(out->psn < (1u << 24), kProtocol, "verbs PSN ", out->psn, " exceeds 24 bits");
  const uint32_t m = out->mtu_bytes;
  TERN_REQUIRE(m == 256 || m == 512 || m == 1024 || m == 2048 || m == 4096, kProtocol,
               "verbs MTU ", m, " is not an InfiniBand MTU");
  TERN_REQUIRE(out->port >= 1, kProtocol, "verbs port 0 does not exist");
  TERN_REQUIRE(out->credits >= kMinCredits && out->credits <= kMaxCredits, kProtocol, "verbs credits ",
               out->credits, " outside [", kMinCredits, ", ", kMaxCredits, "]");
  TERN_REQUIRE(out->ethernet || out->lid != 0, kProtocol,
               "verbs InfiniBand endpoint without a LID");
  return Status::Ok();
}

std::string EncodeControl(const ControlHeader& header) {
  std::string out;
  out.reserve(kControlBytes);
  PutFixed(&out, static_cast<uint8_t>(header.type), 1);
  PutFixed(&out, kVersion, 1);
  PutFixed(&out, header.credits, 2);
  PutFixed(&out, header.payload_bytes, 4);
  PutFixed(&out, header.rkey, 4);
  PutFixed(&out, 0, 4);
  for (uint64_t v : header.a) PutFixed(&out, v, 8);
  return out;
}

Status DecodeControl(std::string_view bytes, ControlHeader* out) {
  TERN_REQUIRE(bytes.size() == kControlBytes, kProtocol, "verbs control header of ", bytes.size(),
               " bytes, expected ", kControlBytes);
  const uint64_t type = DecodeFixedAt(bytes, 0, 1);
  TERN_REQUIRE(type >= 1 && type <= 5, kProtocol, "verbs control type ", type, " unknown");
  TERN_REQUIRE(DecodeFixedAt(bytes, 1, 1) == kVersion, kProtocol, "verbs control version ", DecodeFixedAt(bytes, 1, 1));
  TERN_REQUIRE(DecodeFixedAt(bytes, 12, 4) == 0, kProtocol, "verbs control header with reserved bytes set");
  out->type = static_cast<ControlType>(type);
  out->credits = static_cast<uint16_t>(DecodeFixedAt(bytes, 2, 2));
  out->payload_bytes = static_cast<uint32_t>(DecodeFixedAt(bytes, 4, 4));
  out->rkey = static_cast<uint32_t>(DecodeFixedAt(bytes, 8, 4));
  for (int i = 0; i < 6; ++i) out->a[i] = DecodeFixedAt(bytes, 16 + 8 * i, 8);
  TERN_REQUIRE(out->payload_bytes <= kMaxControlPayload, kProtocol, "verbs control payload of ",
               out->payload_bytes, " bytes exceeds ", kMaxControlPayload);
  TERN_REQUIRE(out->type == ControlType::kChunk || out->rkey == 0, kProtocol,
               "verbs control header with an rkey outside a chunk");
  auto unused_zero = [&](int from) {
    for (int i = from; i < 6; ++i) {
      if (out->a[i] != 0) return false;
    }
    return true;
  };
  switch (out->type) {
    case ControlType::kMessage:
      TERN_REQUIRE(out->a[1] <= kMaxMessageBytes && out->a[2] <= out->a[1] &&
                       out->payload_bytes <= out->a[1] - out->a[2] && unused_zero(3),
                   kProtocol, "verbs message fragment [", out->a[2], ", +", out->payload_bytes,
                   ") outside a message of ", out->a[1], " bytes (max ", kMaxMessageBytes, ")");
      break;
    case ControlType::kChunk:
      TERN_REQUIRE(out->a[3] >= 1 && out->a[3] <= kMaxChunkBytes && out->payload_bytes == 0, kProtocol,
                   "verbs chunk of ", out->a[3], " bytes outside [1, ", kMaxChunkBytes, "]");
      TERN_REQUIRE(out->a[5] + out->a[3] >= out->a[5], kProtocol, "verbs chunk source range wraps");
      break;
    case ControlType::kAck:
      TERN_REQUIRE(
          out->a[1] <= kMaxWireCode && out->payload_bytes <= kMaxAckReason && unused_zero(2),
          kProtocol, "verbs ack with unknown code ", out->a[1], " or a reason over ", kMaxAckReason,
          " bytes");
      break;
    case ControlType::kCredit:
    case ControlType::kBye:
      TERN_REQUIRE(out->payload_bytes == 0 && unused_zero(0), kProtocol, "verbs ",
                   out->type == ControlType::kBye ? "bye" : "credit", " with arguments");
      break;
  }
  return Status::Ok();
}

std::string EncodeSide(SideKind kind, std::string_view payload) {
  std::string out;
  PutFixed(&out, kSideMagic, 4);
  PutFixed(&out, kVersion, 2);
  PutFixed(&out, static_cast<uint16_t>(kind), 2);
  PutFixed(&out, payload.size(), 4);
  out.append(payload);
  return out;
}

Status DecodeSideHeader(std::string_view bytes, SideKind* kind, uint32_t* payload_bytes) {
  TERN_REQUIRE(bytes.size() == kSideHeaderBytes, kProtocol, "verbs side-channel header of ",
               bytes.size(), " bytes");
  TERN_REQUIRE(DecodeFixedAt(bytes, 0, 4) == kSideMagic, kProtocol,
               "not a tern verbs peer (bad side-channel magic)");
  const uint64_t version = DecodeFixedAt(bytes, 4, 2);
  TERN_REQUIRE(version == kVersion, kProtocol, "peer speaks tern verbs protocol v", version,
               ", this side v", kVersion);
  const uint64_t k = DecodeFixedAt(bytes, 6, 2);
  const uint64_t length = DecodeFixedAt(bytes, 8, 4);
  switch (k) {
    case static_cast<uint16_t>(SideKind::kEndpoint):
      TERN_REQUIRE(length == kEndpointBytes, kProtocol, "verbs endpoint of ", length, " bytes");
      break;
    case static_cast<uint16_t>(SideKind::kRefusal):
      TERN_REQUIRE(length <= kMaxSideReason, kProtocol, "verbs refusal of ", length, " bytes");
      break;
    case static_cast<uint16_t>(SideKind::kReady):
      TERN_REQUIRE(length == 0, kProtocol, "verbs ready with a payload");
      break;
    default:
      return TERN_ERROR(kProtocol, "verbs side-channel message kind ", k, " unknown");
  }
  *kind = static_cast<SideKind>(k);
  *payload_bytes = static_cast<uint32_t>(length);
  return Status::Ok();
}

std::string EncodeRegionKey(const RegionKey& key) {
  std::string out;
  PutFixed(&out, kRegionKeyMagic, 4);
  PutFixed(&out, key.rkey, 4);
  PutFixed(&out, key.address, 8);
  PutFixed(&out, key.size_bytes, 8);
  return out;
}

Status DecodeRegionKey(std::string_view bytes, RegionKey* out) {
  TERN_REQUIRE(bytes.size() == kRegionKeyBytes && DecodeFixedAt(bytes, 0, 4) == kRegionKeyMagic,
               kInvalidArgument, "not a verbs region key (", bytes.size(), " bytes)");
  out->rkey = static_cast<uint32_t>(DecodeFixedAt(bytes, 4, 4));
  out->address = DecodeFixedAt(bytes, 8, 8);
  out->size_bytes = DecodeFixedAt(bytes, 16, 8);
  TERN_REQUIRE(out->address + out->size_bytes >= out->address, kInvalidArgument,
               "verbs region key with a wrapping range");
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
