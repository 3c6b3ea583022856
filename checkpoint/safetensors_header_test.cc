#include "checkpoint/safetensors_header.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "tern/checkpoint.h"

namespace tern::checkpoint {
namespace {

std::vector<uint8_t> FileWithLength(uint64_t n, std::string_view json, uint64_t data_bytes) {
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  out.insert(out.end(), json.begin(), json.end());
  out.resize(out.size() + data_bytes, 0);
  return out;
}

std::vector<uint8_t> File(std::string_view json, uint64_t data_bytes) {
  return FileWithLength(json.size(), json, data_bytes);
}

Result<ParsedHeader> Parse(const std::vector<uint8_t>& file) { return ParseHeader(file, file.size()); }

TEST(SafetensorsHeader, ParsesValidHeader) {
  auto file = File(
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
      R"("a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"e":{"dtype":"U8","shape":[0],"data_offsets":[12,12]}}  )",
      12);
  auto h = Parse(file);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_TRUE(h->has_metadata);
  EXPECT_EQ(h->metadata.at("format"), "pt");
  ASSERT_EQ(h->tensors.size(), 3u);
  EXPECT_EQ(h->tensors[0].desc.name, "a");  // data order
  EXPECT_EQ(h->tensors[1].desc.name, "b");
  EXPECT_EQ(h->tensors[1].desc.dtype, DType::kF32);
  EXPECT_EQ(h->tensors[2].desc.shape, std::vector<uint64_t>{0});
  EXPECT_EQ(h->data_offset_bytes(), file.size() - 12);
}

TEST(SafetensorsHeader, PackedF4CountsElements) {
  // F4 shape counts elements, two per byte; an odd count is not whole bytes.
  EXPECT_TRUE(Parse(File(R"({"x":{"dtype":"F4","shape":[2,3],"data_offsets":[0,3]}})", 3)).ok());
  EXPECT_EQ(Parse(File(R"({"x":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2)).status().code(),
            Code::kCorrupt);
}

TEST(SafetensorsHeader, EmptyHeaderAndScalars) {
  EXPECT_TRUE(Parse(File("{}", 0)).ok());
  auto h = Parse(File(R"({"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}})", 8));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->tensors[0].desc.elements(), 1u);
}

TEST(SafetensorsHeader, ReferenceOnlyDTypesAreUnsupportedNotCorrupt) {
  auto h = Parse(File(R"({"c":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", 8));
  EXPECT_EQ(h.status().code(), Code::kUnsupported);
}

struct CorruptCase {
  const char* what;
  std::vector<uint8_t> file;
  const char* message_part;
};

TEST(SafetensorsHeader, RejectsCorruptHeaders) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::vector<uint8_t> truncated = File(ok, 8);
  truncated.resize(20);
  const std::vector<CorruptCase> cases = {
      {"empty file", {}, "too small"},
      {"short length", {1, 0, 0}, "too small"},
      {"truncated header", truncated, "truncated"},
      {"absurd length", FileWithLength(uint64_t{1} << 62, "{}", 0), "exceeds the limit"},
      {"length just over the limit", FileWithLength(100'000'001, "{}", 0), "exceeds the limit"},
      {"length 2^64-1", FileWithLength(UINT64_MAX, "{}", 0), "exceeds the limit"},
      {"not json", File("hello", 0), "not a JSON object"},
      {"array header", File("[]", 0), "not a JSON object"},
      {"trailing garbage", File("{} x", 0), "trailing"},
      {"nul padding", File(std::string("{}\0\0", 4), 0), "trailing"},
      {"unterminated", File(R"({"a":{"dtype":"F32")", 0), "unexpected end"},
      {"bad dtype", File(R"({"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", 8), "unknown dtype"},
      {"dtype not string", File(R"({"a":{"dtype":3,"shape":[2],"data_offsets":[0,8]}})", 8), "expected a string"},
      {"negative dim", File(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "non-negative"},
      {"fractional dim", File(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8), "non-negative"},
      {"dim too big for u64", File(R"({"a":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,8]}})", 8), "64 bits"},
      {"shape overflow", File(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8), "overflows"},
      {"shape too large in bytes", File(R"({"a":{"dtype":"F64","shape":[1152921504606846976],"data_offsets":[0,8]}})", 8), "too large"},
      {"size mismatch", File(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "needs 12 bytes"},
      {"offsets reversed", File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "end before"},
      {"out of bounds", File(ok, 4), "out of bounds"},
      {"offset near 2^64", File(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,0]}})", 1), "end before"},
      {"trailing data", File(ok, 9), "not covered"},
      {"gap", File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "gap"},
      {"overlap",
       File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
       "overlaps"},
      {"duplicate tensor",
       File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
       "duplicate tensor"},
      {"duplicate key", File(R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8), "duplicate key"},
      {"missing key", File(R"({"a":{"dtype":"F32","shape":[2]}})", 8), "needs"},
      {"unknown key", File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8), "unknown key"},
      {"three offsets", File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}})", 8), "more than two"},
      {"one offset", File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8), "two integers"},
      {"tensor not object", File(R"({"a":[1]})", 0), "expected '{'"},
      {"non-string metadata", File(R"({"__metadata__":{"step":3}})", 0), "not a string"},
      {"metadata not object", File(R"({"__metadata__":"x"})", 0), "not an object of strings"},
      {"duplicate metadata key", File(R"({"__metadata__":{"k":"a","k":"b"}})", 0), "duplicate __metadata__ key"},
      {"duplicate metadata", File(R"({"__metadata__":{},"__metadata__":{}})", 0), "duplicate __metadata__"},
      {"invalid utf-8 name", File("{\"\xff\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0), "UTF-8"},
      {"nested metadata value", File(R"({"__metadata__":{"a":[[[[[[[[[[]]]]]]]]]]}})", 0), "not a string"},
      {"rank too large", File("{\"a\":{\"dtype\":\"U8\",\"shape\":[" + [] {
                                std::string s = "1";
                                for (int i = 0; i < 70; ++i) s += ",1";
                                return s;
                              }() + "],\"data_offsets\":[0,1]}}", 1),
       "dimensions"},
  };
  for (const auto& c : cases) {
    auto h = Parse(c.file);
    ASSERT_FALSE(h.ok()) << c.what;
    EXPECT_EQ(h.status().code(), Code::kCorrupt) << c.what << ": " << h.status().ToString();
    EXPECT_NE(h.status().message().find(c.message_part), std::string::npos)
        << c.what << ": " << h.status().ToString();
  }
}

TEST(SafetensorsHeader, ErrorsNameTheTensor) {
  auto h = Parse(File(R"({"layers.0.w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8));
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("layers.0.w"), std::string::npos) << h.status().ToString();
}

TEST(SafetensorsHeader, SerializeMatchesReferenceLayoutAndParsesBack) {
  TensorDesc a{"a", DType::kBF16, {3}};
  TensorDesc b{"b\"q", DType::kF32, {1, 2}};
  std::vector<PlacedTensor> placed = {{&b, 0, 8}, {&a, 8, 14}};
  auto serialized = SerializeHeader({{"k", "v"}}, placed);
  ASSERT_TRUE(serialized.ok()) << serialized.status().ToString();
  const std::string& header = *serialized;
  const std::string json =
      R"({"__metadata__":{"k":"v"},"b\"q":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"BF16","shape":[3],"data_offsets":[8,14]}})";
  ASSERT_EQ(header.size() % 8, 0u);
  EXPECT_EQ(header.substr(8, json.size()), json);
  EXPECT_EQ(header.substr(8 + json.size()), std::string(header.size() - 8 - json.size(), ' '));
  std::vector<uint8_t> file(header.begin(), header.end());
  file.resize(file.size() + 14);
  auto h = Parse(file);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_TRUE(h->tensors[0].desc.SameLayout(b));
  EXPECT_TRUE(h->tensors[1].desc.SameLayout(a));
  // No metadata: the key is omitted, as the reference writer does.
  EXPECT_EQ(SerializeHeader({}, {})->substr(8), "{}      ");
}

}  // namespace
}  // namespace tern::checkpoint

namespace tern::checkpoint {
namespace {

// Keeps the fuzz seed corpus honest: valid_* seeds parse, bad_* seeds do not.
TEST(SafetensorsHeader, SeedCorpusMeansWhatItsNamesSay) {
  namespace fs = std::filesystem;
  int seen = 0;
  for (const auto& e : fs::directory_iterator(TERN_HEADER_CORPUS_DIR)) {
    std::ifstream in(e.path(), std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
    const std::string name = e.path().filename().string();
    auto h = ParseHeader(bytes, bytes.size());
    if (name.starts_with("valid_")) {
      EXPECT_TRUE(h.ok()) << name << ": " << h.status().ToString();
    } else if (name.starts_with("bad_")) {
      EXPECT_FALSE(h.ok()) << name;
    }
    ++seen;
  }
  EXPECT_GE(seen, 10);
}

}  // namespace
}  // namespace tern::checkpoint
