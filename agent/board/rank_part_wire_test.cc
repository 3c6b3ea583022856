// The wire form of a RankPart (docs/format/agent.md §11): a rank's real
// part round-trips field for field and byte for byte, and every prefix,
// every trailing byte, every reserved or out-of-rule field is refused with
// kCorrupt naming it; the encoder refuses what the decoder would.
//
// TERN_RANK_PART_SEEDS=DIR writes the fuzzer's seeds
// (tests/fuzz/corpus/rank_part/) into DIR.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "base/coding.h"
#include "tern/rank_publish.h"

namespace tern {
namespace {

std::vector<TensorDesc> Layout() {
  return {{"a.weight", DType::kBF16, {16, 8}}, {"b.bias", DType::kF32, {10}}, {"c.q", DType::kF4, {4, 6}}};
}

// Rank 1 of 2 after one step: rows [8, 16) of a.weight, all of b.bias,
// the second half of c.q.
RankPart RealPart(uint16_t patch_format) {
  auto pub = RankPublisher::Create(1, 2, Layout(),
                                   {{"a.weight", 64, 64}, {"b.bias", 0, 10}, {"c.q", 12, 12}},
                                   {.segment_elements = 16, .format_version = patch_format});
  EXPECT_TRUE(pub.ok()) << pub.status().ToString();
  std::vector<uint8_t> a(128), b(40), c(6);
  std::mt19937 rng(5);
  for (auto& x : a) x = static_cast<uint8_t>(rng() % 3 == 0 ? rng() : 0);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  c[2] = 0x21;
  auto part = (*pub)->Encode(3, {{{"a.weight", 64, 64}, a.data(), a.size()},
                                 {{"b.bias", 0, 10}, b.data(), b.size()},
                                 {{"c.q", 12, 12}, c.data(), c.size()}});
  EXPECT_TRUE(part.ok()) << part.status().ToString();
  EXPECT_GE(part->records.size(), 3u);
  return std::move(part).value();
}

// A rank whose only shard stayed zero: no record (§11.5's example).
RankPart NoChangePart() {
  auto pub = RankPublisher::Create(1, 2, {{"w", DType::kBF16, {4}}}, {{"w", 2, 2}});
  EXPECT_TRUE(pub.ok());
  std::vector<uint8_t> zeros(4, 0);
  auto part = (*pub)->Encode(1, {{{"w", 2, 2}, zeros.data(), zeros.size()}});
  EXPECT_TRUE(part.ok());
  EXPECT_TRUE(part->records.empty());
  return std::move(part).value();
}

void ExpectSame(const RankPart& x, const RankPart& y) {
  EXPECT_EQ(x.rank, y.rank);
  EXPECT_EQ(x.world_size, y.world_size);
  EXPECT_EQ(x.base_version, y.base_version);
  EXPECT_EQ(x.version, y.version);
  EXPECT_EQ(x.format_version, y.format_version);
  EXPECT_EQ(x.base_terms, y.base_terms);
  EXPECT_EQ(x.target_terms, y.target_terms);
  ASSERT_EQ(x.layout.size(), y.layout.size());
  for (size_t i = 0; i < x.layout.size(); ++i) EXPECT_TRUE(x.layout[i].SameLayout(y.layout[i]));
  ASSERT_EQ(x.shards.size(), y.shards.size());
  for (size_t i = 0; i < x.shards.size(); ++i) {
    EXPECT_EQ(x.shards[i].tensor, y.shards[i].tensor);
    EXPECT_EQ(x.shards[i].first_element, y.shards[i].first_element);
    EXPECT_EQ(x.shards[i].element_count, y.shards[i].element_count);
  }
  ASSERT_EQ(x.records.size(), y.records.size());
  for (size_t i = 0; i < x.records.size(); ++i) {
    EXPECT_EQ(x.records[i].tensor_index, y.records[i].tensor_index);
    EXPECT_EQ(x.records[i].first_element, y.records[i].first_element);
    EXPECT_EQ(x.records[i].element_count, y.records[i].element_count);
    EXPECT_EQ(x.records[i].digest_delta, y.records[i].digest_delta);
    EXPECT_EQ(x.records[i].bytes, y.records[i].bytes);
  }
}

Status Decodes(const std::vector<uint8_t>& bytes) { return DecodeRankPart(bytes).status(); }

TEST(RankPartWire, RoundTripsBothPatchFormats) {
  for (uint16_t f : {1, 2}) {
    const RankPart part = RealPart(f);
    auto bytes = EncodeRankPart(part);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    auto back = DecodeRankPart(*bytes);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ExpectSame(part, *back);
    auto again = EncodeRankPart(*back);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *bytes);
  }
}

TEST(RankPartWire, ExampleOfTheSpec) {
  auto bytes = EncodeRankPart(NoChangePart());
  ASSERT_TRUE(bytes.ok());
  ASSERT_EQ(bytes->size(), 161u);
  EXPECT_EQ(std::string(bytes->begin(), bytes->begin() + 8), "TERNRPRT");
  // The tensor entry at 120: name 1 byte, BF16 (9), 1 dimension, shape [4], "w".
  const std::vector<uint8_t> tensor = {1, 0, 9, 1, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 'w'};
  EXPECT_TRUE(std::equal(tensor.begin(), tensor.end(), bytes->begin() + 120));
  EXPECT_EQ(DecodeFixed64(bytes->data() + 137 + 8), 2u);   // first element
  EXPECT_EQ(DecodeFixed64(bytes->data() + 137 + 16), 2u);  // element count
}

TEST(RankPartWire, RefusesEveryPrefixAndTrailingBytes) {
  auto bytes = EncodeRankPart(RealPart(2));
  ASSERT_TRUE(bytes.ok());
  for (size_t n = 0; n < bytes->size(); ++n) {
    std::vector<uint8_t> prefix(bytes->begin(), bytes->begin() + n);
    const Status s = Decodes(prefix);
    ASSERT_EQ(s.code(), Code::kCorrupt) << "prefix of " << n << " bytes: " << s.ToString();
  }
  auto longer = *bytes;
  longer.push_back(0);
  const Status s = Decodes(longer);
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_NE(s.message().find("1 trailing bytes"), std::string::npos) << s.ToString();
}

TEST(RankPartWire, RefusesFieldsOutsideTheirRules) {
  const auto good = EncodeRankPart(RealPart(2)).value();
  struct Case {
    size_t at;
    int width;
    uint64_t value;
    const char* says;
  };
  const size_t tensor0 = 120, shard0 = 120 + (8 + 16 + 8) + (8 + 8 + 6) + (8 + 16 + 3);
  const std::vector<Case> cases = {
      {0, 1, 'X', "bad magic"},
      {8, 2, 2, "format 2"},
      {10, 2, 3, "patch format 3"},
      {12, 4, 2, "rank 2 of world size 2"},
      {16, 4, 0, "world size 0"},
      {20, 4, 0, "tensor_count 0"},
      {20, 4, 1u << 21, "tensor_count"},
      {24, 4, 0, "shard_count 0"},
      {28, 4, 1u << 25, "record_count"},
      {40, 8, 0, "is not above its base version"},
      {112, 8, 1, "reserved header bytes"},
      {tensor0, 2, 0, "name of 0 bytes"},
      {tensor0 + 2, 1, 99, "dtype code 99"},
      {tensor0 + 3, 1, 9, "9 dimensions"},
      {tensor0 + 4, 4, 1, "reserved bytes not zero"},
      {tensor0 + 8, 8, uint64_t{1} << 62, "tensor a.weight"},
      {shard0, 4, 7, "shard 0: tensor 7"},
      {shard0 + 4, 4, 1, "shard 0: reserved"},
      {shard0 + 8, 8, 100, "shard 0: elements"},
      {shard0 + 16, 8, 0, "shard 0: elements"},
      {shard0 + 24, 4, 0, "is not after the one before it"},
  };
  for (const Case& c : cases) {
    auto bad = good;
    EncodeFixed(bad.data() + c.at, c.value, c.width);
    const Status s = Decodes(bad);
    EXPECT_EQ(s.code(), Code::kCorrupt) << "byte " << c.at << ": " << s.ToString();
    EXPECT_NE(s.message().find(c.says), std::string::npos) << "byte " << c.at << ": " << s.ToString();
  }
}

TEST(RankPartWire, EncoderRefusesWhatTheDecoderWould) {
  RankPart p = RealPart(2);
  std::swap(p.layout[0], p.layout[1]);
  EXPECT_EQ(EncodeRankPart(p).status().code(), Code::kInvalidArgument);
  p = RealPart(2);
  p.shards[1] = p.shards[0];  // overlaps
  EXPECT_EQ(EncodeRankPart(p).status().code(), Code::kInvalidArgument);
  p = RealPart(2);
  p.records[0].bytes.clear();
  EXPECT_EQ(EncodeRankPart(p).status().code(), Code::kInvalidArgument);
  p = RealPart(2);
  p.shards[0].tensor = "nope";
  const Status s = EncodeRankPart(p).status();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("nope is not in the layout"), std::string::npos) << s.ToString();
}

TEST(RankPartWire, HugeCountsAreRefusedBeforeAllocating) {
  auto bytes = EncodeRankPart(NoChangePart()).value();
  EncodeFixed32(bytes.data() + 28, (1u << 24));  // records the bytes cannot hold
  EXPECT_EQ(Decodes(bytes).code(), Code::kCorrupt);
  EncodeFixed32(bytes.data() + 28, 0);
  EncodeFixed32(bytes.data() + 24, (1u << 20));
  EXPECT_EQ(Decodes(bytes).code(), Code::kCorrupt);
}

TEST(RankPartWire, WritesTheFuzzerSeedsWhenAsked) {
  const char* dir = std::getenv("TERN_RANK_PART_SEEDS");
  if (dir == nullptr) GTEST_SKIP() << "TERN_RANK_PART_SEEDS not set";
  auto write = [&](const char* name, const std::vector<uint8_t>& b) {
    std::ofstream(std::string(dir) + "/" + name, std::ios::binary)
        .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  };
  write("no_change", EncodeRankPart(NoChangePart()).value());
  write("format1_records", EncodeRankPart(RealPart(1)).value());
  write("format2_records", EncodeRankPart(RealPart(2)).value());
  write("garbage", std::vector<uint8_t>{'T', 'E', 'R', 'N', 'R', 'P', 'R', 'T', 1, 0, 2});
}

}  // namespace
}  // namespace tern
