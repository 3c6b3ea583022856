// The UCX active-message headers and remote keys: round trips and every
// rejection a peer can provoke.
#include "transport/ucx/wire.h"

#include <gtest/gtest.h>

#include "tern/transport.h"

namespace tern::ucx {
namespace {

TEST(UcxWire, HelloRoundTripAndRejections) {
  Hello out;
  ASSERT_TRUE(DecodeHello(EncodeHello(Hello{}), &out).ok());
  EXPECT_EQ(out.version, kVersion);

  EXPECT_EQ(DecodeHello(EncodeHello(Hello{}).substr(1), &out).code(), Code::kProtocol);
  EXPECT_EQ(DecodeHello(EncodeHello(Hello{0x12345678, kVersion}), &out).code(), Code::kProtocol);
  Status newer = DecodeHello(EncodeHello(Hello{kMagic, kVersion + 1}), &out);
  EXPECT_EQ(newer.code(), Code::kProtocol);
  EXPECT_NE(newer.message().find("v2"), std::string::npos) << newer.ToString();
  std::string flagged = EncodeHello(Hello{});
  flagged[7] = 1;
  EXPECT_EQ(DecodeHello(flagged, &out).code(), Code::kProtocol);
}

TEST(UcxWire, StatusRoundTripAndRejections) {
  StatusHeader out;
  ASSERT_TRUE(DecodeStatus(EncodeStatus({0x0102030405060708ull, 2}), &out).ok());
  EXPECT_EQ(out.op, 0x0102030405060708ull);
  EXPECT_EQ(out.code, 2);
  EXPECT_EQ(DecodeStatus(EncodeStatus({1, 999}), &out).code(), Code::kProtocol);
  std::string reserved = EncodeStatus({1, 0});
  reserved[13] = 1;
  EXPECT_EQ(DecodeStatus(reserved, &out).code(), Code::kProtocol);
  EXPECT_EQ(DecodeStatus(reserved + "x", &out).code(), Code::kProtocol);
}

TEST(UcxWire, ChunkHeaderIsLittleEndianAndBounded) {
  const ChunkHeader h{1, 2, 3, 4096, 0xAABBCCDDEEFF0011ull};
  const std::string bytes = EncodeChunk(h);
  ASSERT_EQ(bytes.size(), kChunkBytes);
  EXPECT_EQ(static_cast<uint8_t>(bytes[0]), 1);  // op, low byte first
  EXPECT_EQ(static_cast<uint8_t>(bytes[32]), 0x11);
  ChunkHeader out;
  ASSERT_TRUE(DecodeChunk(bytes, 4096, &out).ok());
  EXPECT_EQ(out.xxh3, h.xxh3);
  EXPECT_EQ(out.dst_offset, 3u);
  // The data part must match the header, and lengths stay in [1, kMaxChunkBytes].
  EXPECT_EQ(DecodeChunk(bytes, 4095, &out).code(), Code::kProtocol);
  EXPECT_EQ(DecodeChunk(EncodeChunk({1, 2, 3, 0, 0}), 0, &out).code(), Code::kProtocol);
  EXPECT_EQ(DecodeChunk(EncodeChunk({1, 2, 3, kMaxChunkBytes + 1, 0}), kMaxChunkBytes + 1, &out).code(),
            Code::kProtocol);
  EXPECT_EQ(DecodeChunk(bytes.substr(0, 39), 4096, &out).code(), Code::kProtocol);
}

TEST(UcxWire, RemoteKeyRoundTripAndRejections) {
  const RemoteKey key{0x7f0000001000ull, 1 << 20, std::string("\x01\x02\x03", 3)};
  const std::string bytes = EncodeRemoteKey(key);
  RemoteKey out;
  ASSERT_TRUE(DecodeRemoteKey(bytes, &out).ok());
  EXPECT_EQ(out.base, key.base);
  EXPECT_EQ(out.size_bytes, key.size_bytes);
  EXPECT_EQ(out.rkey, key.rkey);

  EXPECT_EQ(DecodeRemoteKey(bytes.substr(0, 10), &out).code(), Code::kCorrupt);
  EXPECT_EQ(DecodeRemoteKey(bytes + "x", &out).code(), Code::kCorrupt);
  EXPECT_EQ(DecodeRemoteKey(bytes.substr(0, bytes.size() - 1), &out).code(), Code::kCorrupt);
  std::string bad_magic = bytes;
  bad_magic[0] ^= 1;
  EXPECT_EQ(DecodeRemoteKey(bad_magic, &out).code(), Code::kCorrupt);
  EXPECT_EQ(DecodeRemoteKey(EncodeRemoteKey({1, 1, ""}), &out).code(), Code::kCorrupt);
  EXPECT_EQ(DecodeRemoteKey(EncodeRemoteKey({1, 1, std::string(kMaxRkeyBytes + 1, 'k')}), &out).code(),
            Code::kCorrupt);
  EXPECT_EQ(DecodeRemoteKey(EncodeRemoteKey({~0ull - 10, 100, "k"}), &out).code(), Code::kCorrupt);
}

}  // namespace
}  // namespace tern::ucx
