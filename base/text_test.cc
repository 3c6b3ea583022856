#include "base/text.h"

#include <gtest/gtest.h>

#include <array>

namespace tern {
namespace {

TEST(TextTest, HexRoundTripsAndRefusesMalformedInput) {
  const std::array<uint8_t, 3> bytes{0x0a, 0xff, 0x00};
  EXPECT_EQ(Hex(bytes), "0aff00");
  std::array<uint8_t, 3> back{};
  ASSERT_TRUE(ParseHex("0AfF00", back));
  EXPECT_EQ(back, bytes);
  EXPECT_FALSE(ParseHex("0aff0", back));    // odd length
  EXPECT_FALSE(ParseHex("0aff0000", back)); // too long
  EXPECT_FALSE(ParseHex("0aff0g", back));   // not a digit
}

TEST(TextTest, SecretEqualsComparesEveryByteAndTheLength) {
  EXPECT_TRUE(SecretEquals("s3cret-token", "s3cret-token"));
  EXPECT_TRUE(SecretEquals("", ""));
  EXPECT_FALSE(SecretEquals("s3cret-token", "s3cret-tokeN"));  // last byte
  EXPECT_FALSE(SecretEquals("s3cret-token", "S3cret-token"));  // first byte
  EXPECT_FALSE(SecretEquals("s3cret-token", "s3cret-toke"));   // a prefix
  EXPECT_FALSE(SecretEquals("s3cret-token", "s3cret-token!"));
  EXPECT_FALSE(SecretEquals("x", ""));
}

}  // namespace
}  // namespace tern
