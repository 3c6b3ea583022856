// TCP super-packets (GSO) as the TUN device hands them over with
// IFF_VNET_HDR: one IPv4/TCP header and up to 64 KiB of payload standing for
// several wire segments of gso_size payload bytes each. The forwarder keeps
// them whole (one read and one write instead of ~44) unless random loss hits
// some of their segments; then Segment() cuts out the survivors, as the
// kernel's TSO would have, with complete checksums.
//
// All functions validate the untrusted packet and never read past `bytes`.
#pragma once

#include <cstdint>
#include <vector>

namespace tern::wan {

// struct virtio_net_hdr (native endian on the TUN device).
struct VnetHdr {
  uint8_t flags;
  uint8_t gso_type;
  uint16_t hdr_len;
  uint16_t gso_size;
  uint16_t csum_start;
  uint16_t csum_offset;
};
static_assert(sizeof(VnetHdr) == 10);

constexpr uint8_t kGsoNone = 0;
constexpr uint8_t kGsoTcpV4 = 1;
constexpr uint8_t kGsoEcn = 0x80;
constexpr uint8_t kNeedsCsum = 1;  // VIRTIO_NET_HDR_F_NEEDS_CSUM in VnetHdr::flags

// The shape of a valid IPv4 packet; segments == 1 unless it is a TCPv4
// super-packet. wire_bytes counts every segment's headers.
struct PacketShape {
  uint32_t ip_header_bytes = 0;
  uint32_t tcp_header_bytes = 0;  // 0 unless a super-packet
  uint32_t payload_bytes = 0;
  uint32_t segments = 1;
  uint64_t wire_bytes = 0;
};

// Parses vnet header + IPv4 packet; false for anything malformed.
bool ParseShape(const uint8_t* pkt, uint64_t bytes, PacketShape* shape);

// Builds segment k (0-based) of a super-packet as a stand-alone packet with
// an all-zero VnetHdr in front and full IP and TCP checksums. The caller has
// validated the packet with ParseShape and k < shape.segments.
std::vector<uint8_t> Segment(const uint8_t* pkt, const PacketShape& shape, uint32_t k);

// Flips bit (r >> 32) % 8 of TCP payload byte (r mod 2^32) % payload_bytes of a valid
// IPv4/TCP packet whose checksum the kernel has not computed yet
// (kNeedsCsum): the receiving kernel trusts such a packet's checksum (it
// never left the machine), so the flipped bit reaches the application, as a
// corruption that TCP's 16-bit checksum missed would on a real path; a
// super-packet cut by Segment() afterwards gets checksums over the flipped
// bit and carries it too. Returns false and changes nothing for anything
// else (not TCP, no payload, a complete checksum the receiver would verify:
// that would be a loss, not a corruption).
bool CorruptTcpPayload(uint8_t* pkt, uint64_t bytes, uint64_t r);

}  // namespace tern::wan
