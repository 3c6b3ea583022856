#include "checkpoint/strict_json.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "checkpoint/safetensors_header.h"
#include "checkpoint/safetensors_index.h"

namespace tern::checkpoint::json {
namespace {

// Accepts any document, skipping every value of the top object, and records
// the u64s and strings it was handed when `collect` is set.
class SkipAll final : public StrictSax {
 public:
  explicit SkipAll(int depth_max = 32, bool collect = false)
      : StrictSax(depth_max), collect_(collect) {}
  std::vector<uint64_t> u64s;
  std::vector<std::string> strings;
  Status u64_error;

 private:
  bool On(Event e, Token t) override {
    if (!collect_) {
      if (++events_ > 1 && e != Event::kKey && e != Event::kEndObject) SkipValue(e);
      return true;
    }
    if (e == Event::kUnsigned) u64s.push_back(t.u64);
    if (e == Event::kString) strings.push_back(*t.text);
    if (e == Event::kNegative || e == Event::kFloat) u64_error = NotU64(e, t);
    return true;
  }
  bool collect_;
  int events_ = 0;
};

Status Parse(std::string_view text, int depth_max = 32) {
  SkipAll sax(depth_max);
  return ParseObject(text, "document", &sax);
}

TEST(StrictJson, AcceptsValidObjects) {
  for (const char* text :
       {"{}", " {\"a\" : [1, -2.5e+3, true, false, null, \"x\"]} ", "{\"\":{}}\n",
        "{\"s\":\"\\u00e9\\ud83d\\ude00\\/\"}", "{\"a\":[[[]]],\"b\":-0.0E-0}"}) {
    EXPECT_TRUE(Parse(text).ok()) << text << ": " << Parse(text).ToString();
  }
}

TEST(StrictJson, RejectsMalformedOrNonObjectDocuments) {
  for (std::string_view text :
       {"", "   ", "[]", "0", "\"x\"", "{", "}", "{\"a\":1,}", "{\"a\" 1}", "{a:1}",
        "{\"a\":01}", "{\"a\":1.}", "{\"a\":.5}", "{\"a\":1e}", "{\"a\":+1}", "{\"a\":tru}",
        "{\"a\":nul}", "{\"a\":\"abc}", "{\"a\":\"\\x\"}", "{\"a\":\"\\u12\"}",
        "{\"a\":\"\\ud800\"}", "{\"a\":\"\\udc00\"}", "{\"a\":\"\\ud800\\u0041\"}",
        "{\"a\":[1 2]}", "{} {}", "{\"a\":\"a\nb\"}", "{\"a\":1]", "{\"a\":[1}", "{\"a\":NaN}",
        "{\"a\":Infinity}", "{\"a\":[1,]}", "{/*c*/}", "{}//c",
        // nlohmann skips a byte order mark by itself; we refuse it, as serde does.
        "\xEF\xBB\xBF{}"}) {
    EXPECT_EQ(Parse(text).code(), Code::kCorrupt) << text;
  }
  EXPECT_NE(Parse("{} x").message().find("trailing bytes"), std::string::npos);
  EXPECT_NE(Parse(std::string_view("{}\0\0", 4)).message().find("trailing bytes"),
            std::string::npos);
  // nlohmann alone would stop at a NUL byte as if the input ended there.
  EXPECT_NE(Parse(std::string_view("{}\0x", 3)).message().find("trailing bytes"),
            std::string::npos);
  for (std::string_view nul : {std::string_view("{\"a\":1\0}", 9),
                               std::string_view("{\"a\":\"x\0\"}", 11),
                               std::string_view("{\"a\":\0", 6)})
    EXPECT_NE(Parse(nul).message().find("NUL byte"), std::string::npos) << Parse(nul).ToString();
  EXPECT_NE(Parse("{\"a\":").message().find("unexpected end"), std::string::npos)
      << Parse("{\"a\":").ToString();
  EXPECT_NE(Parse("[]").message().find("document is not a JSON object"), std::string::npos);
}

TEST(StrictJson, RejectsInvalidUtf8InStrings) {
  for (std::string_view bytes :
       {std::string_view("\xC0\xAF"), std::string_view("\xED\xA0\x80"),
        std::string_view("\xF5\x80\x80\x80"), std::string_view("\xE2\x82"),
        std::string_view("\x80")}) {
    const std::string value = "{\"a\":\"" + std::string(bytes) + "\"}";
    const std::string key = "{\"" + std::string(bytes) + "\":1}";
    EXPECT_NE(Parse(value).message().find("UTF-8"), std::string::npos) << Parse(value).ToString();
    EXPECT_EQ(Parse(key).code(), Code::kCorrupt);
  }
  EXPECT_TRUE(Parse("{\"\xE2\x82\xAC \xF0\x9F\x98\x80 plain\":1}").ok());
}

TEST(StrictJson, BoundsNesting) {
  std::string deep = "{\"a\":" + std::string(40, '[') + std::string(40, ']') + "}";
  EXPECT_NE(Parse(deep, 32).message().find("nested deeper than 32"), std::string::npos);
  EXPECT_TRUE(Parse(deep, 64).ok());
  // Far deeper than a recursive parser's stack could take.
  std::string abyss = "{\"a\":" + std::string(1'000'000, '[');
  EXPECT_EQ(Parse(abyss).code(), Code::kCorrupt);
}

TEST(StrictJson, NumbersAndStringsArriveExactly) {
  SkipAll sax(32, /*collect=*/true);
  ASSERT_TRUE(ParseObject(R"({"s":"a\"b\\c\u0041\n","n":18446744073709551615,"arr":[3,0]})",
                          "doc", &sax)
                  .ok());
  EXPECT_EQ(sax.strings, std::vector<std::string>{"a\"b\\cA\n"});
  EXPECT_EQ(sax.u64s, (std::vector<uint64_t>{UINT64_MAX, 3, 0}));
  EXPECT_TRUE(sax.u64_error.ok());
  const std::vector<std::pair<const char*, const char*>> not_u64 = {
      {"-1", "negative"}, {"-0", "negative"}, {"1.0", "got 1.0"}, {"1e3", "got 1e3"},
      {"18446744073709551616", "does not fit in 64 bits"}};
  for (const auto& [number, message] : not_u64) {
    SkipAll collect(32, true);
    ASSERT_TRUE(ParseObject(std::string("{\"n\":") + number + "}", "doc", &collect).ok());
    EXPECT_NE(collect.u64_error.message().find(message), std::string::npos)
        << number << ": " << collect.u64_error.ToString();
  }
}

TEST(StrictJson, QuotedIsBoundedAndAlwaysValid) {
  EXPECT_EQ(Quoted("a\"b\n"), "\"a\\\"b\\n\"");
  EXPECT_EQ(Quoted(std::string(500, 'x')).size(), 202u);
  EXPECT_EQ(Quoted("\xff"), "\"\xEF\xBF\xBD\"");  // U+FFFD
}

// The writers quote as the reference writers do: serde_json for headers
// (UTF-8 kept, DEL kept), Python's json.dumps for the index (ASCII only).
TEST(StrictJson, WritersQuoteLikeSerdeAndPython) {
  const std::string name = "q\"b\\\n\x01\x7f/\xC3\xA9\xF0\x9F\x98\x80";
  TensorDesc t{name, DType::kU8, {1}};
  checkpoint::PlacedTensor placed{&t, 0, 1};
  auto header = checkpoint::SerializeHeader({}, {&placed, 1});
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_NE(header->find("{\"q\\\"b\\\\\\n\\u0001\x7f/\xC3\xA9\xF0\x9F\x98\x80\":{\"dtype\":"),
            std::string::npos)
      << *header;
  auto index = checkpoint::SerializeIndex(1, {{name, "model-00001-of-00001.safetensors"}});
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(*index,
            "{\n  \"metadata\": {\n    \"total_size\": 1\n  },\n  \"weight_map\": {\n"
            "    \"q\\\"b\\\\\\n\\u0001\\u007f/\\u00e9\\ud83d\\ude00\": "
            "\"model-00001-of-00001.safetensors\"\n  }\n}\n");
  // Both read back to the original name.
  std::vector<uint8_t> file(header->begin(), header->end());
  file.push_back(0);
  auto parsed = checkpoint::ParseHeader(file, file.size());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->tensors[0].desc.name, name);
  auto map = checkpoint::ParseIndex(*index);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  EXPECT_EQ(map->at(0).first, name);
  // Invalid UTF-8 is refused, not written.
  TensorDesc bad{"\xff", DType::kU8, {1}};
  checkpoint::PlacedTensor placed_bad{&bad, 0, 1};
  EXPECT_EQ(checkpoint::SerializeHeader({}, {&placed_bad, 1}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(checkpoint::SerializeHeader({{"k", "\xC0\xAF"}}, {}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(checkpoint::SerializeIndex(0, {{"\xff", "f"}}).status().code(), Code::kInvalidArgument);
}

TEST(SafetensorsIndex, ParsesAndRejects) {
  auto map = checkpoint::ParseIndex(
      R"({"metadata":{"total_size":3,"x":[1.5,{"y":null}]},"weight_map":{"b":"s2","a":"s1"},"z":"w"})");
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  EXPECT_EQ(*map, (checkpoint::WeightMap{{"a", "s1"}, {"b", "s2"}}));
  const std::vector<std::pair<const char*, const char*>> bad = {
      {R"({"weight_map":{"a":"s","a":"s"}})", "twice"},
      {R"({"weight_map":{},"weight_map":{}})", "duplicate \"weight_map\""},
      {R"({"metadata":{}})", "no \"weight_map\""},
      {R"({"weight_map":[]})", "not an object"},
      {R"({"weight_map":{"a":1}})", "entry \"a\" is not a string"},
      {R"({"weight_map":{"a":"../s"}})", "not a plain file name"},
      {R"({"weight_map":{"a":".."}})", "not a plain file name"},
      {R"({"weight_map":{"a":""}})", "not a plain file name"},
      {R"({"x":[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]],"weight_map":{}})", "nested deeper"},
      {R"([])", "index is not a JSON object"},
  };
  for (const auto& [text, message] : bad) {
    auto r = checkpoint::ParseIndex(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), Code::kCorrupt) << text;
    EXPECT_NE(r.status().message().find(message), std::string::npos)
        << text << ": " << r.status().ToString();
  }
}

// Keeps the fuzz seed corpus honest: valid_* seeds parse, bad_* seeds do
// not. Inputs a fuzzing run found (merged in, named by their SHA-1) may be
// either; the replay test runs them.
TEST(SafetensorsIndex, SeedCorpusMeansWhatItsNamesSay) {
  namespace fs = std::filesystem;
  int seen = 0;
  for (const auto& e : fs::directory_iterator(TERN_INDEX_CORPUS_DIR)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("valid_") && !name.starts_with("bad_")) continue;
    std::ifstream in(e.path(), std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    auto map = checkpoint::ParseIndex(text);
    if (name.starts_with("valid_")) {
      EXPECT_TRUE(map.ok()) << name << ": " << map.status().ToString();
    } else {
      EXPECT_FALSE(map.ok()) << name;
    }
    ++seen;
  }
  EXPECT_GE(seen, 8);
}

}  // namespace
}  // namespace tern::checkpoint::json
