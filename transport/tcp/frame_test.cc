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
  h.version = 2;
  uint8_t raw[kHeaderBytes];
  EncodeHeader(h, raw);
  FrameHeader out;
  Status st = DecodeHeader(raw, &out);
  EXPECT_EQ(st.code(), Code::kProtocol);
  EXPECT_NE(st.message().find("version 2"), std::string::npos) << st.ToString();
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

}  // namespace
}  // namespace tern::tcp

namespace tern::tcp {
namespace {

// The worked example in docs/format/wire.md §4.
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
