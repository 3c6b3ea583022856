// The LE coding helpers and the wire-code mapping every wire shares.
#include "base/coding.h"

#include <gtest/gtest.h>

#include "base/hash.h"
#include "base/text.h"
#include "base/wire_status.h"

namespace tern {
namespace {

TEST(Coding, FixedWidthsAreLittleEndian) {
  std::string s;
  PutFixed16(&s, 0x0102);
  PutFixed32(&s, 0x03040506);
  PutFixed64(&s, 0x0708090a0b0c0d0eull);
  PutFixed(&s, 0xfffffff, 3);  // the low 3 bytes only
  EXPECT_EQ(s, std::string("\x02\x01\x06\x05\x04\x03\x0e\x0d\x0c\x0b\x0a\x09\x08\x07\xff\xff\xff", 17));
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  EXPECT_EQ(DecodeFixed16(p), 0x0102);
  EXPECT_EQ(DecodeFixed32(p + 2), 0x03040506u);
  EXPECT_EQ(DecodeFixed64(p + 6), 0x0708090a0b0c0d0eull);
  EXPECT_EQ(DecodeFixedAt(s, 14, 3), 0xffffffu);

  std::vector<uint8_t> v;
  PutFixed32(&v, 0xa1b2c3d4);
  EXPECT_EQ(v, (std::vector<uint8_t>{0xd4, 0xc3, 0xb2, 0xa1}));
  uint8_t raw[8];
  EncodeFixed64(raw, 1);
  EXPECT_EQ(raw[0], 1);
  EXPECT_EQ(raw[7], 0);
}

TEST(Coding, GetConsumesOrRefusesWhenShort) {
  std::string s;
  PutFixed16(&s, 7);
  PutFixed32(&s, 9);
  std::string_view in = s;
  uint16_t a = 0;
  uint32_t b = 0;
  uint64_t c = 0;
  ASSERT_TRUE(GetFixed16(&in, &a));
  EXPECT_FALSE(GetFixed64(&in, &c));  // 4 bytes left: refused, nothing consumed
  EXPECT_EQ(in.size(), 4u);
  ASSERT_TRUE(GetFixed32(&in, &b));
  EXPECT_EQ(a, 7);
  EXPECT_EQ(b, 9u);
  EXPECT_TRUE(in.empty());
  EXPECT_FALSE(GetFixed16(&in, &a));
}

TEST(WireStatus, RoundTripsEveryCodeAndRefusesUnknownOnes) {
  for (int c = 1; c <= static_cast<int>(Code::kAuth); ++c) {
    const Status sent(static_cast<Code>(c), "x");
    const Status got = StatusFromWire(WireCode(sent), "peer", "why");
    EXPECT_EQ(got.code(), sent.code());
    EXPECT_EQ(got.message(), "peer: why");
  }
  EXPECT_TRUE(StatusFromWire(0, "peer", "ignored").ok());
  const Status unknown = StatusFromWire(999, "server", "new");
  EXPECT_EQ(unknown.code(), Code::kInternal);
  EXPECT_EQ(unknown.message(), "server: (unknown error code 999) new");
  // The peer's text is untrusted: it reaches the message escaped.
  const Status hostile = StatusFromWire(2, "peer", std::string("a\nb\\\0", 5));
  EXPECT_EQ(hostile.message(), "peer: a\\x0ab\\x5c\\x00");
  EXPECT_TRUE(IsPrintable(hostile.message()));
}

TEST(Hash, Xxh3MatchesTheReferenceValue) {
  EXPECT_EQ(Xxh3("", 0), 0x2D06800538D394C2ull);  // XXH3_64bits of empty input
  EXPECT_NE(Xxh3("a", 1), Xxh3("b", 1));
}

}  // namespace
}  // namespace tern
