// The gateway JSON decoders on hostile input (no etcd needed).
#include "agent/etcd/etcd_json.h"

#include <gtest/gtest.h>

#include <random>

namespace tern::agent {
namespace {

using nlohmann::json;

TEST(EtcdJson, Base64KnownVectors) {
  EXPECT_EQ(Base64Encode(""), "");
  EXPECT_EQ(Base64Encode("f"), "Zg==");
  EXPECT_EQ(Base64Encode("fo"), "Zm8=");
  EXPECT_EQ(Base64Encode("foo"), "Zm9v");
  EXPECT_EQ(Base64Encode("foob"), "Zm9vYg==");
  EXPECT_EQ(Base64Encode(std::string("\xff\xfe\x00", 3)), "//4A");
  auto d = Base64Decode("Zm9vYg==");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(*d, "foob");
  auto url = Base64Decode("__4A");  // URL-safe alphabet
  ASSERT_TRUE(url.ok());
  EXPECT_EQ(*url, std::string("\xff\xfe\x00", 3));
}

TEST(EtcdJson, Base64RoundTripsEveryLength) {
  std::mt19937 rng(7);
  for (size_t n = 0; n < 64; ++n) {
    std::string bytes(n, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    auto back = Base64Decode(Base64Encode(bytes));
    ASSERT_TRUE(back.ok()) << n;
    EXPECT_EQ(*back, bytes) << n;
  }
}

TEST(EtcdJson, Base64RefusesMalformed) {
  for (const char* bad :
       {"Zg=", "Zm9", "Zm9v!A==", "=Zm9", "Z===", "Zh==", "Zm9=", "Zm=v", "Zg==Zg==", "Zm 9"}) {
    auto d = Base64Decode(bad);
    EXPECT_FALSE(d.ok()) << bad;
    if (!d.ok()) {
      EXPECT_EQ(d.status().code(), Code::kProtocol) << bad;
    }
  }
}

TEST(EtcdJson, Int64Fields) {
  const json j = {{"s", "123"},
                  {"n", 45},
                  {"neg", "-5"},
                  {"max", "9223372036854775807"},
                  {"min", "-9223372036854775808"}};
  EXPECT_EQ(*Int64Field(j, "s"), 123);
  EXPECT_EQ(*Int64Field(j, "n"), 45);
  EXPECT_EQ(*Int64Field(j, "neg"), -5);
  EXPECT_EQ(*Int64Field(j, "max"), INT64_MAX);
  EXPECT_EQ(*Int64Field(j, "min"), INT64_MIN);
  EXPECT_EQ(*Int64Field(j, "absent"), 0);
  const json bad = {{"a", "9223372036854775808"},
                    {"b", ""},
                    {"c", "12a"},
                    {"d", 1.5},
                    {"e", true},
                    {"f", "-"},
                    {"g", "-9223372036854775809"},
                    {"h", "99999999999999999999"}};
  for (const char* name : {"a", "b", "c", "d", "e", "f", "g", "h"}) {
    auto r = Int64Field(bad, name);
    EXPECT_FALSE(r.ok()) << name;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), Code::kProtocol) << name;
    }
  }
  EXPECT_FALSE(Int64Field(json::array(), "x").ok());
}

TEST(EtcdJson, ParseRangeChecksEveryField) {
  const json good =
      json::parse(R"({"header":{"revision":"9"},"kvs":[{"key":"Zm9v","create_revision":"2",)"
                  R"("mod_revision":"3","version":"2","value":"YmFy","lease":"77"}],"count":"1"})");
  auto r = ParseRange(good, 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->revision, 9);
  ASSERT_EQ(r->kvs.size(), 1u);
  EXPECT_EQ(r->kvs[0].key, "foo");
  EXPECT_EQ(r->kvs[0].value, "bar");
  EXPECT_EQ(r->kvs[0].create_revision, 2);
  EXPECT_EQ(r->kvs[0].mod_revision, 3);
  EXPECT_EQ(r->kvs[0].lease, 77);
  EXPECT_FALSE(r->more);

  EXPECT_FALSE(ParseRange(good, 0).ok());  // more entries than asked for
  for (const char* bad : {
           R"({"kvs":{}})",
           R"({"kvs":[1]})",
           R"({"kvs":[{"key":"Zm9"}]})",
           R"({"kvs":[{"value":"YmFy"}]})",
           R"({"kvs":[{"key":"Zm9v","value":7}]})",
           R"({"kvs":[{"key":"Zm9v","mod_revision":"x"}]})",
           R"({"more":"yes"})",
           R"({"header":[]})",
           R"([])",
       }) {
    auto p = ParseRange(json::parse(bad), 10);
    EXPECT_FALSE(p.ok()) << bad;
    if (!p.ok()) {
      EXPECT_EQ(p.status().code(), Code::kProtocol) << bad;
    }
  }
}

}  // namespace
}  // namespace tern::agent
