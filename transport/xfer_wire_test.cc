// The xfer messages and resume-state file: round trips, the documented
// layout, and every rejection a peer (or a damaged file) can provoke.
#include "transport/xfer_wire.h"

#include <gtest/gtest.h>

#include "tern/transport.h"

namespace tern::xfer {
namespace {

TEST(XferWire, GetIsLittleEndianAndRoundTrips) {
  const std::string m = EncodeGet({65536, "a/b.bin"});
  ASSERT_EQ(m.size(), 1u + 4 + 8 + 4 + 7);
  EXPECT_EQ(m[0], 'G');
  EXPECT_EQ(m[1], 1);          // version, low byte first
  EXPECT_EQ(m[1 + 4 + 2], 1);  // 65536 = 0x10000: third byte
  auto get = DecodeGet(m);
  ASSERT_TRUE(get.ok()) << get.status().ToString();
  EXPECT_EQ(get->chunk_bytes, 65536u);
  EXPECT_EQ(get->name, "a/b.bin");
}

TEST(XferWire, GetRejections) {
  std::string v2 = EncodeGet({65536, "f"});
  v2[1] = 2;
  EXPECT_EQ(DecodeGet(v2).status().code(), Code::kProtocol);
  EXPECT_EQ(DecodeGet(EncodeGet({4095, "f"})).status().code(), Code::kOutOfRange);
  EXPECT_EQ(DecodeGet(EncodeGet({kMaxChunkBytes + 1, "f"})).status().code(), Code::kOutOfRange);
  EXPECT_EQ(DecodeGet(EncodeGet({65536, ""})).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(DecodeGet(EncodeGet({65536, std::string("a\0b", 3)})).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(DecodeGet(EncodeGet({65536, std::string(kMaxNameBytes + 1, 'n')})).status().code(),
            Code::kCorrupt);
  EXPECT_TRUE(DecodeGet(EncodeGet({65536, std::string(kMaxNameBytes, 'n')})).ok());
  const std::string good = EncodeGet({65536, "file"});
  for (size_t cut = 0; cut < good.size(); ++cut) {
    EXPECT_FALSE(DecodeGet(good.substr(0, cut)).ok()) << cut;
  }
  EXPECT_EQ(DecodeGet(good + "x").status().code(), Code::kCorrupt);
  EXPECT_EQ(DecodeGet(EncodeInfo({})).status().code(), Code::kProtocol);
}

TEST(XferWire, InfoAndWantRoundTrip) {
  auto info = DecodeInfo(EncodeInfo({1, 2, 3}));
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->size_bytes, 1u);
  EXPECT_EQ(info->xxh3, 2u);
  EXPECT_EQ(info->transfer_id, 3u);
  EXPECT_EQ(DecodeInfo(EncodeInfo({}).substr(0, 24)).status().code(), Code::kCorrupt);
  EXPECT_EQ(DecodeInfo(EncodeInfo({}) + "x").status().code(), Code::kCorrupt);

  auto want = DecodeWant(EncodeWant(7, "\x05\x01"), 2);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(want->transfer_id, 7u);
  EXPECT_EQ(want->bitmap, "\x05\x01");
  // A bitmap longer than the caller's map is refused before it is copied.
  EXPECT_EQ(DecodeWant(EncodeWant(7, "\x05\x01"), 1).status().code(), Code::kCorrupt);
  std::string lying = EncodeWant(7, "ab");
  lying[9] = 100;  // claims 100 bitmap bytes, carries 2
  EXPECT_EQ(DecodeWant(lying, 1000).status().code(), Code::kCorrupt);
}

TEST(XferWire, StatusCarriesCodeAndAnEscapedReason) {
  Status verdict(Code::kIo, "not yet");
  ASSERT_TRUE(DecodeStatus(EncodeStatus(kDone, Status::Ok()), kDone, &verdict).ok());
  EXPECT_TRUE(verdict.ok());
  ASSERT_TRUE(DecodeStatus(EncodeStatus(kError, Status(Code::kNotFound, "no\nfile\x1b[31m")),
                           kError, &verdict)
                  .ok());
  EXPECT_EQ(verdict.code(), Code::kNotFound);
  EXPECT_EQ(verdict.message(), "server: no\\x0afile\\x1b[31m");
  EXPECT_EQ(DecodeStatus(EncodeStatus(kError, Status::Ok()), kDone, &verdict).code(),
            Code::kProtocol);
  std::string unknown = EncodeStatus(kDone, Status(Code::kIo, "x"));
  unknown[1] = 99;
  ASSERT_TRUE(DecodeStatus(unknown, kDone, &verdict).ok());
  EXPECT_EQ(verdict.code(), Code::kInternal);
  // The reason is cut to kMaxReasonBytes when encoded, refused beyond it when decoded.
  EXPECT_EQ(EncodeStatus(kDone, Status(Code::kIo, std::string(10000, 'r'))).size(),
            1u + 2 + 4 + kMaxReasonBytes);
  std::string big(1, kDone);
  big += std::string("\x05\x00", 2);
  big += std::string("\x01\x10\x00\x00", 4);  // 4097
  big += std::string(kMaxReasonBytes + 1, 'r');
  EXPECT_EQ(DecodeStatus(big, kDone, &verdict).code(), Code::kCorrupt);
}

TEST(XferWire, ChunkCountIsBounded) {
  EXPECT_EQ(*ChunkCount(0, 4096), 0u);
  EXPECT_EQ(*ChunkCount(4097, 4096), 2u);
  EXPECT_EQ(*ChunkCount(kMaxChunks * 4096, 4096), kMaxChunks);
  // A server claiming an absurd size must not make the client allocate a
  // chunk map for it (2^63 bytes in 4 KiB chunks would be a 256 TiB bitmap).
  EXPECT_EQ(ChunkCount(kMaxChunks * 4096 + 1, 4096).status().code(), Code::kOutOfRange);
  EXPECT_EQ(ChunkCount(uint64_t{1} << 63, 4096).status().code(), Code::kOutOfRange);
  EXPECT_EQ(ChunkCount(100, 100).status().code(), Code::kOutOfRange);
}

TEST(XferWire, PartStateRoundTripsAndReadsTheOldSpelling) {
  const PartState st{10000, 0xabc, 4096, std::string("\x07", 1)};
  const std::string text = FormatPartState(st);
  EXPECT_EQ(text, "tern-part 1 10000 0000000000000abc 4096 07\n");
  auto back = ParsePartState(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->size_bytes, 10000u);
  EXPECT_EQ(back->xxh3, 0xabcu);
  EXPECT_EQ(back->chunk_bytes, 4096u);
  EXPECT_EQ(back->bitmap, st.bitmap);
  // Earlier versions wrote the checksum without zero padding.
  ASSERT_TRUE(ParsePartState("tern-part 1 10000 abc 4096 07\n").ok());
  auto empty = ParsePartState(FormatPartState({0, 1, 4096, ""}));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->bitmap.empty());
}

TEST(XferWire, DamagedPartStateIsCorruptNotACrash) {
  for (const char* bad : {
           "",
           "tern-part 1 10000 abc 4096 zz\n",    // not hex (threw from std::stoul before)
           "tern-part 1 10000 abc 4096 0\n",     // odd hex length
           "tern-part 1 10000 abc 4096 0707\n",  // bitmap longer than the chunk map
           "tern-part 2 10000 abc 4096 07\n",    // another version
           "tern-part 1 -5 abc 4096 07\n",
           "tern-part 1 10000 abcx 4096 07\n",
           "tern-part 1 10000 11112222333344445 4096 07\n",   // 17 hex digits
           "tern-part 1 99999999999999999999 abc 4096 07\n",  // overflows u64
           "tern-part 1 10000 abc 100 07\n",                  // chunk below the minimum
           "tern-part 1 10000 abc 4096 07 extra\n",
           "tern-part  1 10000 abc 4096 07\n",
       }) {
    auto st = ParsePartState(bad);
    EXPECT_EQ(st.status().code(), Code::kCorrupt) << bad;
  }
  EXPECT_EQ(ParsePartState(std::string(200 + 2 * (kMaxChunks / 8), '0')).status().code(),
            Code::kCorrupt);
}

}  // namespace
}  // namespace tern::xfer
