#include "checkpoint/json_reader.h"

#include <gtest/gtest.h>

namespace tern::json {
namespace {

Status SkipAll(std::string_view text, int depth = 32) {
  Reader r(text, depth);
  TERN_RETURN_IF_ERROR(r.SkipValue());
  return r.Finish();
}

TEST(JsonReader, AcceptsValidDocuments) {
  for (const char* text : {"{}", "[]", " {\"a\" : [1, -2.5e+3, true, false, null, \"x\"]} ",
                           "0", "-0.0E-0", "\"\\u00e9\\ud83d\\ude00\\/\"", "[[[]]]", "{\"\":{}}"}) {
    EXPECT_TRUE(SkipAll(text).ok()) << text;
  }
}

TEST(JsonReader, RejectsMalformedDocuments) {
  for (const char* text :
       {"", "{", "}", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "{a:1}", "01", "1.", ".5", "1e", "+1",
        "tru", "nul", "\"abc", "\"\\x\"", "\"\\u12\"", "\"\\ud800\"", "\"\\udc00\"",
        "\"\\ud800\\u0041\"", "[1 2]", "{} {}", "\"a\nb\"", "{\"a\":1]", "[1}", "NaN"}) {
    Status s = SkipAll(text);
    EXPECT_EQ(s.code(), Code::kCorrupt) << text;
  }
}

TEST(JsonReader, RejectsInvalidUtf8InStrings) {
  for (std::string_view bytes : {std::string_view("\"\xC0\xAF\""), std::string_view("\"\xED\xA0\x80\""),
                                 std::string_view("\"\xF5\x80\x80\x80\""), std::string_view("\"\xE2\x82\""),
                                 std::string_view("\"\x80\"")}) {
    EXPECT_EQ(SkipAll(bytes).code(), Code::kCorrupt);
    EXPECT_FALSE(ValidUtf8(bytes.substr(1, bytes.size() - 2)));
  }
  EXPECT_TRUE(ValidUtf8("\xE2\x82\xAC \xF0\x9F\x98\x80 plain"));
}

TEST(JsonReader, BoundsNesting) {
  std::string deep(40, '[');
  deep += std::string(40, ']');
  EXPECT_EQ(SkipAll(deep, 32).code(), Code::kCorrupt);
  EXPECT_TRUE(SkipAll(deep, 64).ok());
  // Far deeper than the stack could take if the bound were missing.
  std::string abyss(1'000'000, '[');
  EXPECT_EQ(SkipAll(abyss).code(), Code::kCorrupt);
}

TEST(JsonReader, ReadsTypedValues) {
  Reader r(R"({"s":"a\"b\\c\u0041\n","n":18446744073709551615,"arr":[3,4]})");
  ASSERT_TRUE(r.BeginObject().ok());
  std::string key;
  ASSERT_TRUE(*r.NextKey(&key));
  EXPECT_EQ(key, "s");
  EXPECT_EQ(*r.ReadString(), "a\"b\\cA\n");
  ASSERT_TRUE(*r.NextKey(&key));
  EXPECT_EQ(*r.ReadU64(), UINT64_MAX);
  ASSERT_TRUE(*r.NextKey(&key));
  ASSERT_TRUE(r.BeginArray().ok());
  std::vector<uint64_t> items;
  while (*r.NextItem()) items.push_back(*r.ReadU64());
  EXPECT_EQ(items, (std::vector<uint64_t>{3, 4}));
  EXPECT_FALSE(*r.NextKey(&key));
  EXPECT_TRUE(r.Finish().ok());
}

TEST(JsonReader, ReadU64RejectsNonIntegers) {
  for (const char* text : {"-1", "1.0", "1e3", "18446744073709551616", "\"1\"", "true"}) {
    Reader r(text);
    EXPECT_EQ(r.ReadU64().status().code(), Code::kCorrupt) << text;
  }
}

TEST(JsonWriter, QuotesLikeSerdeAndPython) {
  std::string serde, python;
  const std::string s = std::string("q\"b\\\n\x01\x7f/\xC3\xA9\xF0\x9F\x98\x80");
  AppendQuoted(s, &serde);
  AppendQuotedAscii(s, &python);
  EXPECT_EQ(serde, "\"q\\\"b\\\\\\n\\u0001\x7f/\xC3\xA9\xF0\x9F\x98\x80\"");
  EXPECT_EQ(python, "\"q\\\"b\\\\\\n\\u0001\\u007f/\\u00e9\\ud83d\\ude00\"");
  // Both read back to the original string.
  for (const std::string& quoted : {serde, python}) {
    Reader r(quoted);
    EXPECT_EQ(*r.ReadString(), s);
  }
}

}  // namespace
}  // namespace tern::json
