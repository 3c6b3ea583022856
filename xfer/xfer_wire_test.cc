// The xfer messages and resume-state file: round trips, the documented
// layout, and every rejection a peer (or a damaged file) can provoke.
#include "xfer/xfer_wire.h"

#include <gtest/gtest.h>

#include "tern/transport.h"

namespace tern::xfer {
namespace {

GetRequest Fresh(uint64_t chunk_bytes, std::string name) {
  return GetRequest{chunk_bytes, 1, std::move(name), 0, 0, {}};
}

TEST(XferWire, GetIsLittleEndianAndRoundTrips) {
  const std::string m = EncodeGet(Fresh(65536, "a/b.bin"));
  ASSERT_EQ(m.size(), 1u + 4 + 8 + 8 + 4 + 7 + 8 + 8 + 4 + 8 + 4);
  EXPECT_EQ(m[0], 'G');
  EXPECT_EQ(m[1], 3);          // version, low byte first, right after the type in every version
  EXPECT_EQ(m[1 + 4 + 2], 1);  // 65536 = 0x10000: third byte
  auto get = DecodeGet(m);
  ASSERT_TRUE(get.ok()) << get.status().ToString();
  EXPECT_EQ(get->chunk_bytes, 65536u);
  EXPECT_EQ(get->transfer_id, 1u);
  EXPECT_EQ(get->name, "a/b.bin");
  EXPECT_EQ(get->have_tag, 0u);
  EXPECT_EQ(get->head_bytes, 0u);
  GetRequest head = Fresh(65536, "f");
  head.head_bytes = 64 << 20;
  auto with_head = DecodeGet(EncodeGet(head));
  ASSERT_TRUE(with_head.ok()) << with_head.status().ToString();
  EXPECT_EQ(with_head->head_bytes, uint64_t{64} << 20);

  // A resuming GET: 10 chunks of 4 KiB, chunks 0, 2 and 9 present.
  const GetRequest resume{4096, 7, "f", 10 * 4096 - 5, 0xfeed, std::string("\x05\x02", 2)};
  auto back = DecodeGet(EncodeGet(resume));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->transfer_id, 7u);
  EXPECT_EQ(back->have_size, resume.have_size);
  EXPECT_EQ(back->have_tag, 0xfeedu);
  EXPECT_EQ(back->have_bitmap, resume.have_bitmap);
  EXPECT_EQ(EncodeGet(*back), EncodeGet(resume));

  GetRequest with_token = Fresh(65536, "f");
  with_token.access_token = "tok";
  auto tok = DecodeGet(EncodeGet(with_token));
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ(tok->access_token, "tok");
  with_token.access_token.assign(kMaxAccessTokenBytes + 1, 't');
  EXPECT_EQ(DecodeGet(EncodeGet(with_token)).status().code(), Code::kCorrupt);
}

TEST(XferWire, GetRejections) {
  // A version 1 client (or any other version) is told so, not misread.
  std::string v1 = EncodeGet(Fresh(65536, "f"));
  v1[1] = 1;
  auto old = DecodeGet(v1);
  EXPECT_EQ(old.status().code(), Code::kProtocol);
  EXPECT_NE(old.status().message().find("version 1, this side 3"), std::string::npos)
      << old.status().ToString();
  EXPECT_EQ(DecodeGet(EncodeGet(Fresh(4095, "f"))).status().code(), Code::kOutOfRange);
  EXPECT_EQ(DecodeGet(EncodeGet(Fresh(kMaxChunkBytes + 1, "f"))).status().code(), Code::kOutOfRange);
  EXPECT_EQ(DecodeGet(EncodeGet(Fresh(65536, ""))).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(DecodeGet(EncodeGet(Fresh(65536, std::string("a\0b", 3)))).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(DecodeGet(EncodeGet(Fresh(65536, std::string(kMaxNameBytes + 1, 'n')))).status().code(),
            Code::kCorrupt);
  EXPECT_TRUE(DecodeGet(EncodeGet(Fresh(65536, std::string(kMaxNameBytes, 'n')))).ok());
  GetRequest zero_id = Fresh(65536, "f");
  zero_id.transfer_id = 0;
  EXPECT_EQ(DecodeGet(EncodeGet(zero_id)).status().code(), Code::kCorrupt);
  // The have part is all or nothing, and its bitmap fits exactly.
  EXPECT_EQ(DecodeGet(EncodeGet({4096, 1, "f", 4096, 0, {}})).status().code(), Code::kCorrupt);
  EXPECT_EQ(DecodeGet(EncodeGet({4096, 1, "f", 0, 0, "\x01"})).status().code(), Code::kCorrupt);
  EXPECT_EQ(DecodeGet(EncodeGet({4096, 1, "f", 4096 * 3, 9, ""})).status().code(), Code::kCorrupt);
  EXPECT_EQ(DecodeGet(EncodeGet({4096, 1, "f", 4096 * 3, 9, std::string("\x07\x00", 2)})).status().code(),
            Code::kCorrupt);
  EXPECT_EQ(DecodeGet(EncodeGet({4096, 1, "f", 4096 * 3, 9, "\x08"})).status().code(),
            Code::kCorrupt);  // chunk 3 of 3
  EXPECT_TRUE(DecodeGet(EncodeGet({4096, 1, "f", 4096 * 3, 9, "\x07"})).ok());
  EXPECT_TRUE(DecodeGet(EncodeGet({4096, 1, "f", 0, 9, ""})).ok());  // an empty file held
  // A head window: only for a fresh copy, whole chunks, bounded.
  EXPECT_TRUE(DecodeGet(EncodeGet({4096, 1, "f", 0, 0, "", 8192})).ok());
  EXPECT_TRUE(DecodeGet(EncodeGet({4096, 1, "f", 0, 0, "", kMaxHeadBytes})).ok());
  EXPECT_EQ(DecodeGet(EncodeGet({4096, 1, "f", 0, 0, "", 8191})).status().code(), Code::kCorrupt);
  EXPECT_EQ(DecodeGet(EncodeGet({4096, 1, "f", 0, 0, "", kMaxHeadBytes + 4096})).status().code(),
            Code::kCorrupt);
  EXPECT_EQ(DecodeGet(EncodeGet({4096, 1, "f", 4096, 9, "\x01", 4096})).status().code(),
            Code::kCorrupt);
  // A claimed size past the chunk bound is refused before the bitmap is looked at.
  EXPECT_EQ(DecodeGet(EncodeGet({4096, 1, "f", kMaxChunks * 4096 + 1, 9, ""})).status().code(),
            Code::kOutOfRange);
  const std::string good = EncodeGet({4096, 1, "file", 4096, 9, "\x01"});
  for (size_t cut = 0; cut < good.size(); ++cut) {
    EXPECT_FALSE(DecodeGet(good.substr(0, cut)).ok()) << cut;
  }
  EXPECT_EQ(DecodeGet(good + "x").status().code(), Code::kCorrupt);
  EXPECT_EQ(DecodeGet(EncodeInfo({})).status().code(), Code::kProtocol);
}

TEST(XferWire, InfoRoundTripsAndRefusesWhatItMayNotSay) {
  auto info = DecodeInfo(EncodeInfo({1, 2, 3, kInfoHashKnown | kInfoSending, 4}));
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->size_bytes, 1u);
  EXPECT_EQ(info->tag, 2u);
  EXPECT_EQ(info->transfer_id, 3u);
  EXPECT_TRUE(info->hash_known());
  EXPECT_TRUE(info->sending());
  EXPECT_EQ(info->xxh3, 4u);
  auto plain = DecodeInfo(EncodeInfo({1, 2, 3, 0, 0}));
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->hash_known() || plain->sending());
  EXPECT_EQ(EncodeInfo({1, 2, 3, 0, 0}).size(), 1u + 8 + 8 + 8 + 1 + 8);
  EXPECT_EQ(DecodeInfo(EncodeInfo({1, 0, 3, 0, 0})).status().code(), Code::kCorrupt);  // no tag
  EXPECT_EQ(DecodeInfo(EncodeInfo({1, 2, 0, 0, 0})).status().code(), Code::kCorrupt);  // no id
  auto head = DecodeInfo(EncodeInfo({1, 2, 3, kInfoHead, 0}));
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_TRUE(head->head());
  EXPECT_EQ(DecodeInfo(EncodeInfo({1, 2, 3, 8, 0})).status().code(), Code::kCorrupt);  // flag bit 3
  EXPECT_EQ(DecodeInfo(EncodeInfo({1, 2, 3, kInfoSending | kInfoHead, 0})).status().code(),
            Code::kCorrupt);
  EXPECT_EQ(DecodeInfo(EncodeInfo({1, 2, 3, 0x80, 0})).status().code(), Code::kCorrupt);
  EXPECT_EQ(DecodeInfo(EncodeInfo({1, 2, 3, 0, 5})).status().code(), Code::kCorrupt);  // unflagged hash
  const std::string good = EncodeInfo({1, 2, 3, 1, 4});
  for (size_t cut = 0; cut < good.size(); ++cut) {
    EXPECT_FALSE(DecodeInfo(good.substr(0, cut)).ok()) << cut;
  }
  EXPECT_EQ(DecodeInfo(good + "x").status().code(), Code::kCorrupt);
}

TEST(XferWire, HashMatchesTheSpecExample) {
  // docs/format/xfer.md, worked example.
  const std::string m = EncodeHash({1, 0x9555e8555c62dcfdull});
  const std::string spec("\x48\x01\x00\x00\x00\x00\x00\x00\x00\xfd\xdc\x62\x5c\x55\xe8\x55\x95", 17);
  EXPECT_EQ(m, spec);
  auto h = DecodeHash(spec);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->transfer_id, 1u);
  EXPECT_EQ(h->xxh3, 0x9555e8555c62dcfdull);
  for (size_t cut = 0; cut < spec.size(); ++cut) {
    EXPECT_FALSE(DecodeHash(spec.substr(0, cut)).ok()) << cut;
  }
  EXPECT_EQ(DecodeHash(spec + "x").status().code(), Code::kCorrupt);
  EXPECT_EQ(DecodeHash(EncodeStatus(kDone, Status::Ok())).status().code(), Code::kProtocol);
}

TEST(XferWire, WantRoundTripsAndIsBounded) {
  auto want = DecodeWant(EncodeWant(7, "\x05\x01"), 2);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(want->transfer_id, 7u);
  EXPECT_EQ(want->bitmap, "\x05\x01");
  // A bitmap longer than the caller's map is refused before it is copied.
  EXPECT_EQ(DecodeWant(EncodeWant(7, "\x05\x01"), 1).status().code(), Code::kCorrupt);
  std::string lying = EncodeWant(7, "ab");
  lying[9] = 100;  // claims 100 bitmap bytes, carries 2
  EXPECT_EQ(DecodeWant(lying, 1000).status().code(), Code::kCorrupt);
  EXPECT_EQ(DecodeWant(EncodeWant(0, ""), 0).status().code(), Code::kCorrupt);  // window 0
  EXPECT_TRUE(CheckBitmap("\x1f", 5).ok());
  EXPECT_EQ(CheckBitmap("\x20", 5).code(), Code::kCorrupt);
  EXPECT_EQ(CheckBitmap(std::string_view("\x01\x00", 2), 5).code(), Code::kCorrupt);
  EXPECT_TRUE(CheckBitmap("", 0).ok());
  EXPECT_TRUE(CheckBitmap("\xff", 8).ok());
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

TEST(XferWire, PartStateRoundTrips) {
  const PartState st{10000, 0xfeed, true, 0xabc, 4096, std::string("\x07", 1)};
  const std::string text = FormatPartState(st);
  EXPECT_EQ(text, "tern-part 2 10000 000000000000feed 0000000000000abc 4096 07\n");
  auto back = ParsePartState(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->size_bytes, 10000u);
  EXPECT_EQ(back->tag, 0xfeedu);
  EXPECT_TRUE(back->hash_known);
  EXPECT_EQ(back->xxh3, 0xabcu);
  EXPECT_EQ(back->chunk_bytes, 4096u);
  EXPECT_EQ(back->bitmap, st.bitmap);
  // The hash may not be known yet (the server sends it during the transfer).
  const std::string pending = FormatPartState({10000, 0xfeed, false, 0, 4096, "\x01"});
  EXPECT_EQ(pending, "tern-part 2 10000 000000000000feed - 4096 01\n");
  auto p = ParsePartState(pending);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_FALSE(p->hash_known);
  auto empty = ParsePartState(FormatPartState({0, 1, true, 1, 4096, ""}));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->bitmap.empty());
}

TEST(XferWire, DamagedOrOldPartStateIsCorruptNotACrash) {
  for (const char* bad : {
           "",
           // version 1 lines lack the tag: ignored, the fetch starts over
           "tern-part 1 10000 0000000000000abc 4096 07\n",
           "tern-part 2 10000 000000000000feed 0000000000000abc 4096 zz\n",    // not hex
           "tern-part 2 10000 000000000000feed 0000000000000abc 4096 0\n",     // odd hex length
           "tern-part 2 10000 000000000000feed 0000000000000abc 4096 0707\n",  // too long
           "tern-part 2 10000 000000000000feed 0000000000000abc 4096 08\n",    // chunk 3 of 3
           "tern-part 3 10000 000000000000feed 0000000000000abc 4096 07\n",    // another version
           "tern-part 2 -5 000000000000feed 0000000000000abc 4096 07\n",
           "tern-part 2 10000 0000000000000000 0000000000000abc 4096 07\n",  // zero tag
           "tern-part 2 10000 feed 0000000000000abc 4096 07\n",              // short tag
           "tern-part 2 10000 000000000000feed abc 4096 07\n",               // short hash
           "tern-part 2 10000 000000000000feed 000000000000abcx 4096 07\n",
           "tern-part 2 10000 000000000000feed 11112222333344445 4096 07\n",  // 17 hex digits
           "tern-part 2 99999999999999999999 000000000000feed - 4096 07\n",   // overflows u64
           "tern-part 2 10000 000000000000feed - 100 07\n",  // chunk below the minimum
           "tern-part 2 10000 000000000000feed - 4096 07 extra\n",
           "tern-part  2 10000 000000000000feed - 4096 07\n",
       }) {
    auto st = ParsePartState(bad);
    EXPECT_EQ(st.status().code(), Code::kCorrupt) << bad;
  }
  EXPECT_EQ(ParsePartState(std::string(200 + 2 * (kMaxChunks / 8), '0')).status().code(),
            Code::kCorrupt);
}

}  // namespace
}  // namespace tern::xfer
