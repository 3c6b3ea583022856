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

TEST(TextTest, ParseDecimalTakesDigitsOnly) {
  EXPECT_EQ(*ParseDecimal("0"), 0u);
  EXPECT_EQ(*ParseDecimal("007"), 7u);
  EXPECT_EQ(*ParseDecimal("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(*ParseDecimal("65535", 65535), 65535u);
  for (const char* bad : {"", "-1", "+1", " 1", "1 ", "0x10", "1e3", "1.0", "1,000", "\xff"})
    EXPECT_EQ(ParseDecimal(bad).status().code(), Code::kInvalidArgument) << bad;
  EXPECT_EQ(ParseDecimal("18446744073709551616").status().code(), Code::kOutOfRange);
  EXPECT_EQ(ParseDecimal("99999999999999999999999").status().code(), Code::kOutOfRange);
  EXPECT_EQ(ParseDecimal("65536", 65535).status().code(), Code::kOutOfRange);
  // Not digits wins over too large, and the message quotes the text safely.
  const Status s = ParseDecimal("99999999999999999999999x\n").status();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("is not an unsigned decimal integer"), std::string::npos);
  EXPECT_TRUE(IsPrintable(ParseDecimal(std::string(100, '\n')).status().message()));
}

TEST(TextTest, ParseCanonicalDecimalRefusesLeadingZeros) {
  EXPECT_EQ(*ParseCanonicalDecimal("0"), 0u);
  EXPECT_EQ(*ParseCanonicalDecimal("70"), 70u);
  EXPECT_EQ(ParseCanonicalDecimal("07").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseCanonicalDecimal("00").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseCanonicalDecimal("").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseCanonicalDecimal("8", 7).status().code(), Code::kOutOfRange);
}

TEST(TextTest, ParseHostPortAndBack) {
  auto a = ParseHostPort("127.0.0.1:8080");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 8080);
  auto b = ParseHostPort("[::1]:0");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->port, 0);
  EXPECT_EQ(FormatHostPort(*a), "127.0.0.1:8080");
  EXPECT_EQ(FormatHostPort(*b), "[::1]:0");
  EXPECT_EQ(ParseHostPort("h:00080")->port, 80);
  // "[[]:80" would split into host "[", which does not spell back.
  for (const char* bad :
       {"", "host", "127.0.0.1", ":80", "h:", "host:", "h:65536", "h:8a", "h:123456", "h:-1",
        "h: 1", "::1:80", "a b:1", "a/b:1", "[]:1", "[::1]80", "[::1", "[[]:80", "[[::1]:80",
        "a]:80", "a\x01:1"}) {
    EXPECT_EQ(ParseHostPort(bad).status().code(), Code::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ParseHostPort(std::string(400, 'a') + ":1").status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(IsPrintable(ParseHostPort("\xff\n:1").status().message()));
}

TEST(TextTest, IsLoopbackHost) {
  for (const char* yes : {"localhost", "127.0.0.1", "127.1.2.3", "::1"}) {
    EXPECT_TRUE(IsLoopbackHost(yes)) << yes;
  }
  // Names other than localhost are not resolved: "127.0.0.1.example" may be anywhere.
  for (const char* no : {"", "10.0.0.1", "128.0.0.1", "::2", "0.0.0.0", "::", "etcd.example",
                         "127.0.0.1.example", "localhost.example"}) {
    EXPECT_FALSE(IsLoopbackHost(no)) << no;
  }
}

// The texts OpenSSL 3 gives (SSL_R_* reason strings after "TLS: " or an
// error-queue prefix), as the transport and the admin client see them.
TEST(TextTest, IsTlsCertificateAlert) {
  for (const char* yes : {"TLS: error:0A00045C:SSL routines::tlsv13 alert certificate required",
                          "TLS: error:0A000418:SSL routines::tlsv1 alert unknown ca",
                          "TLS: error:0A000412:SSL routines::sslv3 alert bad certificate",
                          "error:0A000416:SSL routines::sslv3 alert certificate unknown",
                          "error:0A000413:SSL routines::sslv3 alert unsupported certificate",
                          "TLS: error:0A000419:SSL routines::tlsv1 alert access denied",
                          "TLS: error:0A000410:SSL routines::sslv3 alert handshake failure"}) {
    EXPECT_TRUE(IsTlsCertificateAlert(yes)) << yes;
  }
  for (const char* no :
       {"", "TLS: error:0A000119:SSL routines::decryption failed or bad record mac",
        "TLS: error:0A000414:SSL routines::sslv3 alert bad record mac",
        "TLS: error:0A00010B:SSL routines::wrong version number", "connection closed by peer",
        "TLS: error:0A000086:SSL routines::certificate verify failed",  // ours, not an alert
        "TLS: error:0A000126:SSL routines::unexpected eof while reading"}) {
    EXPECT_FALSE(IsTlsCertificateAlert(no)) << no;
  }
}

}  // namespace
}  // namespace tern
