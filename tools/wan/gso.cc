#include "tools/wan/gso.h"

#include <cstring>

namespace tern::wan {

namespace {
uint16_t Be16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }
void PutBe16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
uint32_t Be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3];
}
void PutBe32(uint8_t* p, uint32_t v) {
  PutBe16(p, static_cast<uint16_t>(v >> 16));
  PutBe16(p + 2, static_cast<uint16_t>(v));
}
// One's-complement sum of big-endian 16-bit words, not yet folded.
uint64_t Sum16(const uint8_t* p, size_t n, uint64_t sum) {
  for (size_t i = 0; i + 1 < n; i += 2) sum += Be16(p + i);
  if (n & 1) sum += uint32_t{p[n - 1]} << 8;
  return sum;
}
uint16_t Fold(uint64_t sum) {
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}
constexpr uint8_t kTcpFin = 0x01, kTcpPsh = 0x08, kTcpCwr = 0x80;
}  // namespace

bool ParseShape(const uint8_t* pkt, uint64_t bytes, PacketShape* shape) {
  if (bytes < sizeof(VnetHdr) + 20) return false;
  VnetHdr h;
  std::memcpy(&h, pkt, sizeof h);
  const uint8_t* ip = pkt + sizeof(VnetHdr);
  const uint64_t ip_bytes = bytes - sizeof(VnetHdr);
  const uint32_t ihl = (ip[0] & 0xFu) * 4u;
  if ((ip[0] >> 4) != 4 || ihl < 20 || ihl > ip_bytes || Be16(ip + 2) != ip_bytes) return false;
  *shape = PacketShape{};
  shape->ip_header_bytes = ihl;
  shape->payload_bytes = static_cast<uint32_t>(ip_bytes - ihl);
  shape->wire_bytes = ip_bytes;
  const uint8_t gso = h.gso_type & static_cast<uint8_t>(~kGsoEcn);
  if (gso == kGsoNone) return true;
  if (gso != kGsoTcpV4 || ip[9] != 6 || ip_bytes < ihl + 20u || h.gso_size == 0) return false;
  const uint32_t doff = (ip[ihl + 12] >> 4) * 4u;
  if (doff < 20 || ihl + doff > ip_bytes) return false;
  shape->tcp_header_bytes = doff;
  shape->payload_bytes = static_cast<uint32_t>(ip_bytes - ihl - doff);
  shape->segments = (shape->payload_bytes + h.gso_size - 1u) / h.gso_size;
  if (shape->segments == 0) shape->segments = 1;
  shape->wire_bytes = uint64_t{shape->segments} * (ihl + doff) + shape->payload_bytes;
  return true;
}

std::vector<uint8_t> Segment(const uint8_t* pkt, const PacketShape& shape, uint32_t k) {
  VnetHdr h;
  std::memcpy(&h, pkt, sizeof h);
  const uint8_t* ip = pkt + sizeof(VnetHdr);
  const uint32_t ihl = shape.ip_header_bytes, doff = shape.tcp_header_bytes;
  const uint32_t offset = k * uint32_t{h.gso_size};
  const uint32_t len = std::min<uint32_t>(h.gso_size, shape.payload_bytes - offset);
  const bool last = k + 1 == shape.segments;

  std::vector<uint8_t> out(sizeof(VnetHdr) + ihl + doff + len, 0);
  uint8_t* oip = out.data() + sizeof(VnetHdr);
  uint8_t* tcp = oip + ihl;
  std::memcpy(oip, ip, ihl + doff);
  std::memcpy(tcp + doff, ip + ihl + doff + offset, len);

  PutBe16(oip + 2, static_cast<uint16_t>(ihl + doff + len));
  PutBe16(oip + 4, static_cast<uint16_t>(Be16(ip + 4) + k));  // as TSO numbers IP ids
  PutBe16(oip + 10, 0);
  PutBe16(oip + 10, Fold(Sum16(oip, ihl, 0)));

  PutBe32(tcp + 4, Be32(ip + ihl + 4) + offset);
  if (!last) tcp[13] &= static_cast<uint8_t>(~(kTcpFin | kTcpPsh));
  if (k != 0) tcp[13] &= static_cast<uint8_t>(~kTcpCwr);
  PutBe16(tcp + 16, 0);
  uint64_t sum = Sum16(oip + 12, 8, 0);  // pseudo header: addresses,
  sum += 6 + doff + len;                 // protocol and TCP length
  PutBe16(tcp + 16, Fold(Sum16(tcp, doff + len, sum)));
  return out;
}

bool CorruptTcpPayload(uint8_t* pkt, uint64_t bytes, uint64_t r) {
  PacketShape shape;
  if (!ParseShape(pkt, bytes, &shape)) return false;
  VnetHdr h;
  std::memcpy(&h, pkt, sizeof h);
  uint8_t* ip = pkt + sizeof(VnetHdr);
  const uint32_t ihl = shape.ip_header_bytes;
  const uint64_t ip_bytes = bytes - sizeof(VnetHdr);
  if (!(h.flags & kNeedsCsum) || ip[9] != 6 || ip_bytes < ihl + 20u) return false;
  const uint32_t doff = (ip[ihl + 12] >> 4) * 4u;  // ParseShape checks it only for super-packets
  if (doff < 20 || ihl + doff >= ip_bytes) return false;  // no payload: nothing to flip
  const uint64_t payload = ip_bytes - ihl - doff;
  ip[ihl + doff + (r & 0xFFFFFFFFu) % payload] ^= static_cast<uint8_t>(1u << ((r >> 32) % 8));
  return true;
}

}  // namespace tern::wan
