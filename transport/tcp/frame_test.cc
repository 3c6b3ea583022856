#include "transport/tcp/frame.h"

#include <gtest/gtest.h>

#include <cstring>

#include "tern/transport.h"

namespace tern::tcp {
namespace {

TEST(Frame, RoundTrips) {
  FrameHeader h;
  h.type = FrameType::kChunk;
  h.payload_bytes = 4096;
  h.arg[0] = 7;
  h.arg[1] = uint64_t{5} << 40;
  h.arg[2] = 0xDEADBEEFCAFEF00Dull;
  h.arg[3] = 42;
  uint8_t raw[kHeaderBytes];
  EncodeHeader(h, raw);
  EXPECT_EQ(raw[0], 'T');
  EXPECT_EQ(raw[3], 'N');
  FrameHeader back;
  ASSERT_TRUE(DecodeHeader(raw, &back).ok());
  EXPECT_EQ(back.type, FrameType::kChunk);
  EXPECT_EQ(back.payload_bytes, 4096u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back.arg[i], h.arg[i]);
}

TEST(Frame, EveryFlippedBitIsRejected) {
  FrameHeader h;
  h.type = FrameType::kMessage;
  h.payload_bytes = 10;
  uint8_t raw[kHeaderBytes];
  EncodeHeader(h, raw);
  for (size_t byte = 0; byte < kHeaderBytes; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      uint8_t bad[kHeaderBytes];
      std::copy(raw, raw + kHeaderBytes, bad);
      bad[byte] ^= static_cast<uint8_t>(1 << bit);
      FrameHeader out;
      EXPECT_FALSE(DecodeHeader(bad, &out).ok()) << "byte " << byte << " bit " << bit;
    }
  }
}

TEST(Frame, NamesTheOtherVersion) {
  FrameHeader h;
  h.version = kMaxVersion + 1;
  uint8_t raw[kHeaderBytes];
  EncodeHeader(h, raw);
  FrameHeader out;
  Status st = DecodeHeader(raw, &out);
  EXPECT_EQ(st.code(), Code::kProtocol);
  EXPECT_NE(st.message().find("version 3"), std::string::npos) << st.ToString();
  h.version = 0;
  EncodeHeader(h, raw);
  EXPECT_EQ(DecodeHeader(raw, &out).code(), Code::kProtocol);
}

TEST(Frame, PayloadBoundsPerType) {
  auto check = [](FrameType t, uint64_t n) {
    FrameHeader h;
    h.type = t;
    h.payload_bytes = static_cast<uint32_t>(n);
    uint8_t raw[kHeaderBytes];
    EncodeHeader(h, raw);
    FrameHeader out;
    return DecodeHeader(raw, &out).ok();
  };
  EXPECT_TRUE(check(FrameType::kMessage, kMaxMessageBytes));
  EXPECT_FALSE(check(FrameType::kMessage, kMaxMessageBytes + 1));
  EXPECT_TRUE(check(FrameType::kChunk, kMaxChunkBytes));
  EXPECT_FALSE(check(FrameType::kChunk, kMaxChunkBytes + 1));
  EXPECT_FALSE(check(FrameType::kChunk, 0));
  EXPECT_FALSE(check(FrameType::kAck, 1));
  EXPECT_FALSE(check(FrameType::kPing, 8));
  EXPECT_FALSE(check(FrameType::kHello, 1));
}

TEST(Frame, ReservedArgsMustBeZero) {
  auto decodes = [](FrameType t, int arg, uint32_t payload_bytes) {
    FrameHeader h;
    h.type = t;
    h.payload_bytes = payload_bytes;
    h.arg[arg] = 1;
    uint8_t raw[kHeaderBytes];
    EncodeHeader(h, raw);
    FrameHeader out;
    return DecodeHeader(raw, &out);
  };
  EXPECT_EQ(decodes(FrameType::kHello, 2, 0).code(), Code::kProtocol);
  EXPECT_EQ(decodes(FrameType::kHelloAck, 3, 0).code(), Code::kProtocol);
  EXPECT_EQ(decodes(FrameType::kMessage, 0, 1).code(), Code::kProtocol);
  EXPECT_EQ(decodes(FrameType::kAck, 2, 0).code(), Code::kProtocol);
  EXPECT_EQ(decodes(FrameType::kPing, 3, 0).code(), Code::kProtocol);
  EXPECT_TRUE(decodes(FrameType::kAck, 1, 0).ok());
  EXPECT_TRUE(decodes(FrameType::kChunk, 3, 1).ok());
}

TEST(Frame, HelloBounds) {
  FrameHeader h;
  h.type = FrameType::kHello;
  h.arg[0] = 99;
  h.arg[1] = PackStream(3, 4);
  auto hello = ParseHello(h, 4);
  ASSERT_TRUE(hello.ok()) << hello.status().ToString();
  EXPECT_EQ(hello->connection_id, 99u);
  EXPECT_EQ(hello->index, 3u);
  EXPECT_EQ(hello->count, 4u);
  EXPECT_EQ(ParseHello(h, 3).status().code(), Code::kOutOfRange);  // more streams than allowed
  h.arg[1] = PackStream(4, 4);
  EXPECT_EQ(ParseHello(h, 64).status().code(), Code::kOutOfRange);
  h.arg[1] = PackStream(0, 0);
  EXPECT_EQ(ParseHello(h, 64).status().code(), Code::kOutOfRange);
  h.type = FrameType::kPing;
  EXPECT_EQ(ParseHello(h, 64).status().code(), Code::kProtocol);
}

TEST(Frame, HelloAckVerdicts) {
  FrameHeader h;
  h.type = FrameType::kHelloAck;
  h.arg[0] = 7;
  EXPECT_TRUE(ParseHelloAck(h, 7, "").ok());
  EXPECT_EQ(ParseHelloAck(h, 8, "").code(), Code::kProtocol);  // not our connection
  h.payload_bytes = 2;
  EXPECT_EQ(ParseHelloAck(h, 7, "hi").code(), Code::kProtocol);  // accepted, yet a reason
  h.arg[1] = static_cast<uint64_t>(Code::kOutOfRange);
  h.payload_bytes = 10;
  Status refused = ParseHelloAck(h, 7, "bad\r\n\x1b[2Jx");
  EXPECT_EQ(refused.code(), Code::kOutOfRange);
  EXPECT_EQ(refused.message(), "peer: refused: bad\\x0d\\x0a\\x1b[2Jx");
  h.arg[1] = 1000;  // a code we do not know
  h.payload_bytes = 9;
  EXPECT_EQ(ParseHelloAck(h, 7, "whatever!").code(), Code::kInternal);
  h.type = FrameType::kAck;
  EXPECT_EQ(ParseHelloAck(h, 7, "whatever!").code(), Code::kProtocol);
}

}  // namespace
}  // namespace tern::tcp

namespace tern::tcp {
namespace {

// The worked example in docs/format/tcp.md §4.
TEST(Frame, MatchesTheSpecExample) {
  FrameHeader h;
  h.type = FrameType::kHello;
  h.arg[0] = 0x0123456789abcdefull;
  h.arg[1] = PackStream(2, 8);
  uint8_t raw[kHeaderBytes];
  EncodeHeader(h, raw);
  const uint8_t spec[kHeaderBytes] = {
      0x54, 0x45, 0x52, 0x4e, 0x01, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x5d, 0x91, 0x35, 0xce,
      0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01, 0x02, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(std::memcmp(raw, spec, kHeaderBytes), 0);
}

}  // namespace
}  // namespace tern::tcp
