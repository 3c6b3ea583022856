#include "tern/checkpoint.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "tests/support/files.h"

namespace tern {
namespace {

namespace fs = std::filesystem;

using testing::Slurp;
using testing::TempDir;

int StagingLeftovers(const std::string& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    n += e.path().filename().string().find(".tmp-") != std::string::npos;
  return n;
}

void Spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::vector<TensorDesc> EveryDType() {
  std::vector<TensorDesc> out;
  for (int code = 0; code < kDTypeCount; ++code) {
    const auto d = static_cast<DType>(code);
    out.push_back({"t." + std::string(DTypeName(d)), d, {3, 4}});
  }
  out.push_back({"scalar", DType::kF32, {}});
  out.push_back({"empty", DType::kBF16, {0, 7}});
  return out;
}

// Fills every tensor with bytes derived from the seed and its name.
void Fill(MutableServeView& view, uint32_t seed) {
  for (auto& t : view.tensors) {
    std::mt19937 rng(seed + static_cast<uint32_t>(std::hash<std::string>{}(t.desc->name)));
    for (uint64_t i = 0; i < t.desc->bytes(); ++i) t.data[i] = static_cast<uint8_t>(rng());
  }
}

void ExpectSameView(const ServeView& a, const MutableServeView& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& x = a.tensors[i];
    const auto& y = b.tensors[i];
    EXPECT_TRUE(x.desc->SameLayout(*y.desc)) << x.desc->name << " vs " << y.desc->name;
    ASSERT_EQ(x.desc->bytes(), y.desc->bytes());
    EXPECT_EQ(0, std::memcmp(x.data, y.data, x.desc->bytes())) << x.desc->name;
  }
}

TEST(Checkpoint, SingleFileRoundTripEveryDType) {
  TempDir dir;
  const std::string path = dir / "m.safetensors";
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"step", "12"}};
  auto w = WritableCheckpoint::Create(path, EveryDType(), metadata);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  Fill((*w)->view(), 1);
  ASSERT_TRUE((*w)->Commit().ok());

  auto c = Checkpoint::Open(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE((*c)->sharded());
  ASSERT_EQ((*c)->files(), std::vector<std::string>{"m.safetensors"});
  EXPECT_EQ((*c)->metadata("m.safetensors"), metadata);
  EXPECT_EQ((*c)->tensors().size(), EveryDType().size());
  ExpectSameView((*c)->view(), (*w)->view());
  const auto* f4 = (*c)->view().Find("t.F4");
  ASSERT_NE(f4, nullptr);
  EXPECT_EQ(f4->desc->bytes(), 6u);  // 12 packed 4-bit elements
  // Sorted by name, locations consistent with the view.
  for (size_t i = 0; i < (*c)->tensors().size(); ++i) {
    if (i) {
      EXPECT_LT((*c)->tensors()[i - 1].name, (*c)->tensors()[i].name);
    }
    auto loc = (*c)->Locate((*c)->tensors()[i].name);
    ASSERT_TRUE(loc.ok());
    EXPECT_EQ(loc->size_bytes, (*c)->tensors()[i].bytes());
    EXPECT_EQ((*c)->view().tensors[i].data,
              (*c)->header_bytes(0).data() + loc->offset_bytes);
  }
  EXPECT_EQ((*c)->Locate("nope").status().code(), Code::kNotFound);
}

TEST(Checkpoint, StoresTensorsInTheGivenOrderBackToBack) {
  TempDir dir;
  const std::string path = dir / "m.safetensors";
  std::vector<TensorDesc> tensors = {{"z", DType::kU8, {3}}, {"a", DType::kF32, {2}}};
  auto w = WritableCheckpoint::Create(path, tensors, {});
  ASSERT_TRUE(w.ok() && (*w)->Commit().ok());
  auto c = Checkpoint::Open(path);
  ASSERT_TRUE(c.ok());
  auto z = (*c)->Locate("z"), a = (*c)->Locate("a");
  EXPECT_EQ(a->offset_bytes, z->offset_bytes + 3);
  EXPECT_EQ(z->offset_bytes, (*c)->header_bytes(0).size());
}

TEST(Checkpoint, SortLikeReferenceWriterPutsWideTypesFirst) {
  std::vector<TensorDesc> t = {{"b", DType::kU8, {1}}, {"a", DType::kU8, {1}},
                               {"c", DType::kBF16, {1}}, {"d", DType::kF4, {2}},
                               {"e", DType::kU64, {1}}, {"f", DType::kBool, {1}}};
  SortLikeReferenceWriter(t);
  std::vector<std::string> names;
  for (const auto& d : t) names.push_back(d.name);
  EXPECT_EQ(names, (std::vector<std::string>{"e", "c", "a", "b", "d", "f"}));
}

TEST(Checkpoint, ShardedRoundTrip) {
  TempDir dir;
  const std::string path = dir / "ckpt";
  std::vector<TensorDesc> tensors;
  for (int i = 0; i < 10; ++i)
    tensors.push_back({"layers." + std::to_string(i) + ".w", DType::kBF16, {16, 8}});  // 256 B
  CreateOptions options;
  options.shard_bytes_max = 600;  // two tensors per shard
  auto w = WritableCheckpoint::Create(path, tensors, {{"format", "pt"}}, options);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  Fill((*w)->view(), 2);
  ASSERT_TRUE((*w)->AddFile("config.json", {reinterpret_cast<const uint8_t*>("{}"), 2}).ok());
  ASSERT_TRUE((*w)->Commit().ok());

  EXPECT_TRUE(fs::exists(path + "/" + kSafetensorsIndexName));
  EXPECT_EQ(Slurp(path + "/config.json"), "{}");
  auto c = Checkpoint::Open(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE((*c)->sharded());
  ASSERT_EQ((*c)->files().size(), 5u);
  EXPECT_EQ((*c)->files()[0], "model-00001-of-00005.safetensors");
  EXPECT_EQ((*c)->files()[4], "model-00005-of-00005.safetensors");
  for (const auto& f : (*c)->files()) EXPECT_EQ((*c)->metadata(f).at("format"), "pt");
  ExpectSameView((*c)->view(), (*w)->view());
  // Given order is kept across shards: layers.0 and .1 in shard 1, .8 and .9 in shard 5.
  EXPECT_EQ((*c)->Locate("layers.1.w")->file_index, 0u);
  EXPECT_EQ((*c)->Locate("layers.9.w")->file_index, 4u);
  const std::string index = Slurp(path + "/" + kSafetensorsIndexName);
  EXPECT_NE(index.find("\"total_size\": 2560"), std::string::npos) << index;
  EXPECT_NE(index.find("\"layers.0.w\": \"model-00001-of-00005.safetensors\""), std::string::npos);
}

TEST(Checkpoint, DirectoryWithOneFileNeedsNoIndex) {
  TempDir dir;
  const std::string path = dir / "ckpt";
  auto w = WritableCheckpoint::Create(path, {{"w", DType::kF16, {4}}}, {});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Commit().ok());
  EXPECT_TRUE(fs::exists(path + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(path + "/" + kSafetensorsIndexName));
  auto c = Checkpoint::Open(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE((*c)->sharded());
  EXPECT_EQ((*c)->files(), std::vector<std::string>{"model.safetensors"});

  // A second .safetensors file makes the choice ambiguous.
  fs::copy_file(path + "/model.safetensors", path + "/other.safetensors");
  EXPECT_EQ(Checkpoint::Open(path).status().code(), Code::kInvalidArgument);
}

TEST(Checkpoint, CommitIsAtomicAndAbortLeavesNothing) {
  TempDir dir;
  for (const std::string name : {"m.safetensors", "ckpt"}) {
    const std::string path = dir / name;
    std::string staging;
    {
      auto w = WritableCheckpoint::Create(path, {{"w", DType::kF32, {4}}}, {});
      ASSERT_TRUE(w.ok());
      staging = (*w)->staging_path();
      EXPECT_TRUE(fs::exists(staging));
      EXPECT_FALSE(fs::exists(path));
      EXPECT_EQ(Checkpoint::Open(path).status().code(), Code::kNotFound);
    }  // abandoned
    EXPECT_FALSE(fs::exists(staging));
    EXPECT_FALSE(fs::exists(path));
    EXPECT_EQ(StagingLeftovers(dir.path()), 0);

    auto w = WritableCheckpoint::Create(path, {{"w", DType::kF32, {4}}}, {});
    ASSERT_TRUE(w.ok());
    Fill((*w)->view(), 3);
    ASSERT_TRUE((*w)->Commit().ok());
    EXPECT_TRUE((*w)->committed());
    EXPECT_FALSE(fs::exists((*w)->staging_path()));
    EXPECT_EQ((*w)->Commit().code(), Code::kInvalidArgument);

    // No silent replacement...
    EXPECT_EQ(WritableCheckpoint::Create(path, {{"w", DType::kF32, {4}}}, {}).status().code(),
              Code::kAlreadyExists);
    // ...not even when the path appears between Create and Commit.
    const std::string late = dir / ("late-" + name);
    auto w2 = WritableCheckpoint::Create(late, {{"x", DType::kU8, {1}}}, {});
    ASSERT_TRUE(w2.ok());
    ASSERT_TRUE(fs::create_directory(late));
    EXPECT_EQ((*w2)->Commit().code(), Code::kAlreadyExists);
    fs::remove(late);

    // With overwrite the new checkpoint replaces the old one whole.
    CreateOptions options;
    options.overwrite = true;
    auto w3 = WritableCheckpoint::Create(path, {{"v", DType::kU8, {2}}}, {}, options);
    ASSERT_TRUE(w3.ok());
    ASSERT_TRUE((*w3)->Commit().ok());
    auto c = Checkpoint::Open(path);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ASSERT_EQ((*c)->tensors().size(), 1u);
    EXPECT_EQ((*c)->tensors()[0].name, "v");
  }
  // Only the two committed checkpoints remain: no staging leftovers.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 2);
}

TEST(Checkpoint, CloneForWriteIsByteIdenticalAndIndependent) {
  TempDir dir;
  const std::string base_path = dir / "base";
  std::vector<TensorDesc> tensors;
  for (int i = 0; i < 6; ++i)
    tensors.push_back({"w" + std::to_string(i), i % 2 ? DType::kF32 : DType::kBF16, {8, 4}});
  CreateOptions options;
  options.shard_bytes_max = 200;
  auto w = WritableCheckpoint::Create(base_path, tensors, {{"format", "pt"}, {"b", "é"}}, options);
  ASSERT_TRUE(w.ok());
  Fill((*w)->view(), 4);
  const std::string config = R"({"model_type": "llama"})";
  ASSERT_TRUE((*w)->AddFile("config.json", {reinterpret_cast<const uint8_t*>(config.data()), config.size()}).ok());
  ASSERT_TRUE((*w)->CopyFileFrom(base_path + ".tmp-nonexistent", "x").code() != Code::kOk);
  ASSERT_TRUE((*w)->Commit().ok());
  fs::create_directory(base_path + "/tokenizer");
  Spit(base_path + "/tokenizer/vocab.txt", "a b c");

  auto base = Checkpoint::Open(base_path);
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  ASSERT_TRUE((*base)->sharded());
  const std::string clone_path = dir / "clone";
  auto clone = WritableCheckpoint::CloneForWrite(**base, clone_path);
  ASSERT_TRUE(clone.ok()) << clone.status().ToString();
  EXPECT_FALSE(fs::exists(clone_path));
  ExpectSameView((*base)->view(), (*clone)->view());
  MutableTensorRef& t = (*clone)->view().tensors[2];
  t.data[0] ^= 0xFF;
  const std::string changed_name = t.desc->name;
  ASSERT_TRUE((*clone)->Commit().ok());

  // Same files; byte-identical except for the one byte written.
  std::vector<std::string> base_files, clone_files;
  for (const auto& e : fs::recursive_directory_iterator(base_path))
    base_files.push_back(fs::relative(e.path(), base_path).string());
  for (const auto& e : fs::recursive_directory_iterator(clone_path))
    clone_files.push_back(fs::relative(e.path(), clone_path).string());
  std::sort(base_files.begin(), base_files.end());
  std::sort(clone_files.begin(), clone_files.end());
  EXPECT_EQ(base_files, clone_files);
  int differing = 0;
  for (const auto& f : base_files) {
    if (fs::is_directory(base_path + "/" + f)) continue;
    const std::string a = Slurp(base_path + "/" + f), b = Slurp(clone_path + "/" + f);
    ASSERT_EQ(a.size(), b.size()) << f;
    for (size_t i = 0; i < a.size(); ++i) differing += a[i] != b[i];
  }
  EXPECT_EQ(differing, 1);

  auto reopened = Checkpoint::Open(clone_path);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  EXPECT_EQ((*reopened)->files(), (*base)->files());
  for (size_t i = 0; i < (*base)->files().size(); ++i) {
    const auto a = (*base)->header_bytes(i), b = (*reopened)->header_bytes(i);
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end()));
    EXPECT_EQ((*reopened)->metadata((*base)->files()[i]).at("b"), "é");
  }
  EXPECT_EQ((*reopened)->view().Find(changed_name)->data[0],
            static_cast<uint8_t>((*base)->view().Find(changed_name)->data[0] ^ 0xFF));

  // A single file clones to a single file.
  const std::string single = dir / "one.safetensors";
  auto ws = WritableCheckpoint::Create(single, tensors, {});
  ASSERT_TRUE(ws.ok());
  Fill((*ws)->view(), 5);
  ASSERT_TRUE((*ws)->Commit().ok());
  auto one = Checkpoint::Open(single);
  ASSERT_TRUE(one.ok());
  auto one_clone = WritableCheckpoint::CloneForWrite(**one, dir / "two.safetensors");
  ASSERT_TRUE(one_clone.ok()) << one_clone.status().ToString();
  EXPECT_EQ((*one_clone)->AddFile("config.json", {}).code(), Code::kInvalidArgument);
  ASSERT_TRUE((*one_clone)->Commit().ok());
  EXPECT_EQ(Slurp(single), Slurp(dir / "two.safetensors"));
  EXPECT_EQ(WritableCheckpoint::CloneForWrite(**one, single).status().code(), Code::kAlreadyExists);
}

TEST(Checkpoint, CreateRejectsBadTensors) {
  TempDir dir;
  const std::string path = dir / "m.safetensors";
  const std::vector<std::vector<TensorDesc>> bad = {
      {{"a", DType::kU8, {1}}, {"a", DType::kU8, {1}}},
      {{"__metadata__", DType::kU8, {1}}},
      {{"odd", DType::kF4, {3}}},
      {{"huge", DType::kF32, {uint64_t{1} << 40, uint64_t{1} << 40}}},
      {{std::string("\xff"), DType::kU8, {1}}},
  };
  for (const auto& tensors : bad)
    EXPECT_EQ(WritableCheckpoint::Create(path, tensors, {}).status().code(), Code::kInvalidArgument)
        << tensors[0].name;
  EXPECT_EQ(WritableCheckpoint::Create(dir / "no/such/dir.safetensors", {}, {}).status().code(),
            Code::kNotFound);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 0);
}

TEST(Checkpoint, OpenReportsMissingAndCorruptFiles) {
  TempDir dir;
  EXPECT_EQ(Checkpoint::Open(dir / "absent").status().code(), Code::kNotFound);
  EXPECT_EQ(Checkpoint::Open(dir.path()).status().code(), Code::kNotFound);  // empty directory
  Spit(dir / "bad.safetensors", std::string("\x02\0\0\0\0\0\0\0{}x", 11));
  auto c = Checkpoint::Open(dir / "bad.safetensors");
  EXPECT_EQ(c.status().code(), Code::kCorrupt);
  EXPECT_NE(c.status().message().find("bad.safetensors"), std::string::npos) << c.status().ToString();
}

// A committed two-shard checkpoint whose index each case then rewrites.
class ShardedIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_ / "ckpt";
    CreateOptions options;
    options.shard_bytes_max = 8;  // shard 1: a; shard 2: b, c
    auto w = WritableCheckpoint::Create(
        path_, {{"a", DType::kF32, {2}}, {"b", DType::kF32, {1}}, {"c", DType::kF32, {1}}}, {},
        options);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Commit().ok());
    auto c = Checkpoint::Open(path_);
    ASSERT_TRUE(c.ok());
    ASSERT_EQ((*c)->files(), (std::vector<std::string>{s1_, s2_}));
  }
  Status OpenWithIndex(const std::string& index) {
    Spit(path_ + "/" + kSafetensorsIndexName, index);
    return Checkpoint::Open(path_).status();
  }
  TempDir dir_;
  std::string path_;
  const std::string s1_ = "model-00001-of-00002.safetensors";
  const std::string s2_ = "model-00002-of-00002.safetensors";
};

TEST_F(ShardedIndex, AcceptsExtraMetadataAndKeys) {
  EXPECT_TRUE(OpenWithIndex(R"({"metadata":{"total_size":16,"x":[1,{"y":null}]},"extra":true,
                               "weight_map":{"a":")" + s1_ + R"(","b":")" + s2_ + R"(","c":")" + s2_ + R"("}})")
                  .ok());
}

TEST_F(ShardedIndex, RejectsInconsistentOrHostileIndexes) {
  const std::vector<std::pair<const char*, std::string>> cases = {
      {"not json", "{"},
      {"not an object", "[]"},
      {"no weight_map", R"({"metadata":{}})"},
      {"weight_map not object", R"({"weight_map":[]})"},
      {"file not string", R"({"weight_map":{"a":1}})"},
      {"parent traversal", R"({"weight_map":{"a":"../)" + s1_ + R"(","b":")" + s2_ + R"(","c":")" + s2_ + R"("}})"},
      {"subdirectory", R"({"weight_map":{"a":"x/)" + s1_ + R"(","b":")" + s2_ + R"(","c":")" + s2_ + R"("}})"},
      {"absolute path", R"({"weight_map":{"a":"/etc/passwd","b":")" + s2_ + R"(","c":")" + s2_ + R"("}})"},
      {"dot dot", R"({"weight_map":{"a":"..","b":")" + s2_ + R"(","c":")" + s2_ + R"("}})"},
      {"empty name", R"({"weight_map":{"a":"","b":")" + s2_ + R"(","c":")" + s2_ + R"("}})"},
      {"missing shard file",
       R"({"weight_map":{"a":")" + s1_ + R"(","b":")" + s2_ + R"(","c":"gone.safetensors"}})"},
      {"tensor absent from shard",
       R"({"weight_map":{"a":")" + s1_ + R"(","b":")" + s2_ + R"(","c":")" + s2_ + R"(","d":")" + s2_ + R"("}})"},
      {"tensor absent from index", R"({"weight_map":{"a":")" + s1_ + R"(","b":")" + s2_ + R"("}})"},
      {"wrong shard",
       R"({"weight_map":{"a":")" + s2_ + R"(","b":")" + s1_ + R"(","c":")" + s2_ + R"("}})"},
      {"duplicate entry",
       R"({"weight_map":{"a":")" + s1_ + R"(","a":")" + s1_ + R"(","b":")" + s2_ + R"(","c":")" + s2_ + R"("}})"},
      {"duplicate weight_map", R"({"weight_map":{},"weight_map":{}})"},
  };
  for (const auto& [what, index] : cases) {
    Status s = OpenWithIndex(index);
    EXPECT_EQ(s.code(), Code::kCorrupt) << what << ": " << s.ToString();
  }
}

TEST_F(ShardedIndex, CorruptShardIsNamed) {
  Spit(path_ + "/" + s2_, std::string(16, '\xff'));
  Status s = Checkpoint::Open(path_).status();
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_NE(s.message().find(s2_), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace tern
