// Cutting TCP super-packets into wire segments, and rejecting malformed ones.
#include "tools/wan/gso.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace tern::wan {
namespace {

uint16_t Be16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }

// Folded one's-complement sum; 0xFFFF over data that includes a valid checksum.
uint16_t Sum(const uint8_t* p, size_t n, uint32_t sum = 0) {
  for (size_t i = 0; i + 1 < n; i += 2) sum += Be16(p + i);
  if (n & 1) sum += uint32_t{p[n - 1]} << 8;
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(sum);
}

// VnetHdr + IPv4 (20) + TCP (32, with options) + payload of `payload` bytes.
std::vector<uint8_t> SuperPacket(uint32_t payload, uint16_t gso_size, uint8_t tcp_flags) {
  std::vector<uint8_t> p(sizeof(VnetHdr) + 52 + payload);
  VnetHdr h{1, kGsoTcpV4, 52, gso_size, 20, 16};
  std::memcpy(p.data(), &h, sizeof h);
  uint8_t* ip = p.data() + sizeof h;
  const uint32_t total = 52 + payload;
  const uint8_t ip_hdr[20] = {0x45, 0, uint8_t(total >> 8), uint8_t(total), 0x12, 0x34, 0x40, 0,
                              64, 6, 0, 0, 10, 1, 1, 2, 10, 2, 1, 2};
  std::memcpy(ip, ip_hdr, 20);
  uint8_t* tcp = ip + 20;
  tcp[0] = 0x9c; tcp[1] = 0x40; tcp[2] = 0x14; tcp[3] = 0x51;  // ports
  tcp[4] = 0xFF; tcp[5] = 0xFF; tcp[6] = 0xF0; tcp[7] = 0x00;  // seq near wrap-around
  tcp[12] = 8 << 4;
  tcp[13] = tcp_flags;
  for (uint32_t i = 0; i < payload; ++i) tcp[32 + i] = static_cast<uint8_t>(i * 7 + 3);
  return p;
}

TEST(WanGso, ShapeCountsWireSegments) {
  const auto p = SuperPacket(10000, 1448, 0x18);
  PacketShape s;
  ASSERT_TRUE(ParseShape(p.data(), p.size(), &s));
  EXPECT_EQ(s.segments, 7u);  // ceil(10000 / 1448)
  EXPECT_EQ(s.payload_bytes, 10000u);
  EXPECT_EQ(s.wire_bytes, 7u * 52 + 10000);
}

TEST(WanGso, SegmentsAreValidWirePackets) {
  const uint32_t payload = 10000;
  const auto p = SuperPacket(payload, 1448, 0x80 | 0x18 | 0x01);  // CWR PSH ACK FIN
  PacketShape s;
  ASSERT_TRUE(ParseShape(p.data(), p.size(), &s));
  uint32_t seen = 0;
  for (uint32_t k = 0; k < s.segments; ++k) {
    const std::vector<uint8_t> seg = Segment(p.data(), s, k);
    const uint8_t* ip = seg.data() + sizeof(VnetHdr);
    const uint8_t* tcp = ip + 20;
    const uint32_t len = k + 1 < s.segments ? 1448 : payload - 1448 * k;
    ASSERT_EQ(seg.size(), sizeof(VnetHdr) + 52 + len);
    VnetHdr h;
    std::memcpy(&h, seg.data(), sizeof h);
    EXPECT_EQ(h.gso_type, kGsoNone);
    EXPECT_EQ(h.flags, 0);
    EXPECT_EQ(Be16(ip + 2), 52 + len);
    EXPECT_EQ(Be16(ip + 4), 0x1234 + k);
    EXPECT_EQ(Sum(ip, 20), 0xFFFF) << "IP checksum of segment " << k;
    uint32_t pseudo = Be16(ip + 12) + Be16(ip + 14) + Be16(ip + 16) + Be16(ip + 18) + 6 + 32 + len;
    EXPECT_EQ(Sum(tcp, 32 + len, pseudo), 0xFFFF) << "TCP checksum of segment " << k;
    const uint32_t seq = uint32_t{tcp[4]} << 24 | tcp[5] << 16 | tcp[6] << 8 | tcp[7];
    EXPECT_EQ(seq, 0xFFFFF000u + 1448 * k);  // wraps past 2^32
    EXPECT_EQ((tcp[13] & 0x80) != 0, k == 0) << "CWR only on the first";
    EXPECT_EQ((tcp[13] & 0x09) != 0, k + 1 == s.segments) << "FIN/PSH only on the last";
    EXPECT_EQ(0, std::memcmp(tcp + 32, p.data() + sizeof(VnetHdr) + 52 + 1448 * k, len));
    seen += len;
  }
  EXPECT_EQ(seen, payload);
}

TEST(WanGso, CorruptFlipsOnePayloadBitOfAPacketWithoutItsChecksum) {
  const auto good = SuperPacket(3000, 1448, 0x18);
  auto p = good;
  const uint64_t r = (uint64_t{5} << 32) | 1234;  // bit 5 of payload byte 1234
  ASSERT_TRUE(CorruptTcpPayload(p.data(), p.size(), r));
  size_t diffs = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == good[i]) continue;
    ++diffs;
    EXPECT_EQ(i, sizeof(VnetHdr) + 52 + 1234);
    EXPECT_EQ(p[i] ^ good[i], 1 << 5);
  }
  EXPECT_EQ(diffs, 1u);
  // The flipped bit survives a later cut into wire segments, under their
  // new checksums: the receiver cannot tell.
  PacketShape s;
  ASSERT_TRUE(ParseShape(p.data(), p.size(), &s));
  const std::vector<uint8_t> seg = Segment(p.data(), s, 0);
  EXPECT_EQ(seg[sizeof(VnetHdr) + 52 + 1234], good[sizeof(VnetHdr) + 52 + 1234] ^ (1 << 5));

  // A packet with a complete checksum (the receiver would drop it: a loss),
  // one without payload, and a UDP one are left alone.
  auto full = good;
  VnetHdr h;
  std::memcpy(&h, full.data(), sizeof h);
  h.flags = 0;
  std::memcpy(full.data(), &h, sizeof h);
  EXPECT_FALSE(CorruptTcpPayload(full.data(), full.size(), r));
  auto ack = SuperPacket(0, 1448, 0x10);
  std::memcpy(&h, ack.data(), sizeof h);
  h.gso_type = kGsoNone;
  std::memcpy(ack.data(), &h, sizeof h);
  const auto ack0 = ack;
  EXPECT_FALSE(CorruptTcpPayload(ack.data(), ack.size(), r));
  EXPECT_EQ(ack, ack0);
  auto udp = good;
  std::memcpy(&h, udp.data(), sizeof h);
  h.gso_type = kGsoNone;
  std::memcpy(udp.data(), &h, sizeof h);
  udp[sizeof(VnetHdr) + 9] = 17;
  EXPECT_FALSE(CorruptTcpPayload(udp.data(), udp.size(), r));
  // Truncations never read past the end, nor change anything.
  for (size_t n = 0; n < 60; ++n) {
    auto t = good;
    EXPECT_FALSE(CorruptTcpPayload(t.data(), n, r)) << n;
    EXPECT_EQ(t, good);
  }
}

TEST(WanGso, RejectsMalformedPackets) {
  const auto good = SuperPacket(3000, 1448, 0x10);
  PacketShape s;
  for (size_t n = 0; n < good.size(); ++n)
    EXPECT_FALSE(ParseShape(good.data(), n, &s)) << "truncated to " << n;
  auto bad = good;
  bad[sizeof(VnetHdr)] = 0x65;  // IPv6 version nibble
  EXPECT_FALSE(ParseShape(bad.data(), bad.size(), &s));
  bad = good;
  bad[sizeof(VnetHdr)] = 0x44;  // IHL below 5
  EXPECT_FALSE(ParseShape(bad.data(), bad.size(), &s));
  bad = good;
  bad[sizeof(VnetHdr) + 20 + 12] = 0x40;  // TCP data offset below 5 words
  EXPECT_FALSE(ParseShape(bad.data(), bad.size(), &s));
  bad = good;
  VnetHdr h;
  std::memcpy(&h, bad.data(), sizeof h);
  h.gso_size = 0;
  std::memcpy(bad.data(), &h, sizeof h);
  EXPECT_FALSE(ParseShape(bad.data(), bad.size(), &s));
  bad = good;
  bad[sizeof(VnetHdr) + 9] = 17;  // a UDP packet claiming TCP segmentation
  EXPECT_FALSE(ParseShape(bad.data(), bad.size(), &s));
}

}  // namespace
}  // namespace tern::wan
