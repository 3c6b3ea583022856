#include "tern/cast_checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "tern/checkpoint.h"
#include "tern/quant_plan.h"

namespace tern {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/tern_cast_test_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void Spit(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

// A tiny FP32 master: two quantizable weights (one whose `in` of 40 no
// 16-group format takes), a norm and an embedding.
void WriteMaster(const std::string& dir) {
  std::vector<TensorDesc> tensors = {
      {"model.layers.0.mlp.down_proj.weight", DType::kF32, {32, 64}},
      {"model.layers.0.self_attn.q_proj.weight", DType::kF32, {16, 40}},
      {"model.layers.0.input_layernorm.weight", DType::kF32, {64}},
      {"model.embed_tokens.weight", DType::kF32, {8, 64}},
  };
  auto w = WritableCheckpoint::Create(dir, tensors, {{"format", "pt"}});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  uint32_t state = 12345;
  for (auto& t : (*w)->view().tensors) {
    auto* f = reinterpret_cast<float*>(t.data);
    for (uint64_t i = 0; i < t.desc->elements(); ++i) {
      state = state * 1664525u + 1013904223u;
      f[i] = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 0.04f;
    }
  }
  ASSERT_TRUE((*w)->Commit().ok());
}

CastOptions Options(const char* format) {
  CastOptions o;
  o.spec = *ParseQuantFormat(format);
  o.policy.kind = ScalePolicy::Kind::kFresh;
  return o;
}

TEST(CastCheckpoint, WritesTheLayoutAndSetsQuantizationConfig) {
  TempDir dir;
  const std::string master = dir / "master";
  WriteMaster(master);
  // Numbers an engine reads back must keep their values; key order is kept.
  Spit(master + "/config.json",
       R"({"model_type": "llama", "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
           "initializer_range": 0.02, "big": 18446744073709551615, "name": "\u00e9",
           "nested": {"a": [1, 2.5, null]}})");
  ThreadPool pool(2);
  auto report = CastCheckpoint(master, dir / "out", Options("nvfp4"), pool);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->kept_unquantized.size(), 1u);
  EXPECT_EQ(report->kept_unquantized[0].first, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_GT(report->scale_groups, 0u);

  auto out = Checkpoint::Open(dir / "out");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->get()->tensors().size(), report->tensors);
  auto scale = out->get()->Locate("model.layers.0.mlp.down_proj.weight_scale");
  EXPECT_TRUE(scale.ok()) << scale.status().ToString();

  const auto config = nlohmann::ordered_json::parse(Slurp(dir / "out/config.json"));
  const auto input = nlohmann::ordered_json::parse(Slurp(master + "/config.json"));
  std::vector<std::string> keys;
  for (const auto& [k, v] : config.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"model_type", "rms_norm_eps", "rope_theta",
                                            "initializer_range", "big", "name", "nested",
                                            "quantization_config"}));
  for (const auto& [k, v] : input.items()) EXPECT_EQ(config.at(k), v) << k;
  EXPECT_EQ(config.at("rms_norm_eps").get<double>(), 1e-06);
  EXPECT_EQ(config.at("big").get<uint64_t>(), UINT64_MAX);
  // q_proj (in 40) stays unquantized, so the config excludes it: vLLM would
  // otherwise expect NVFP4 tensors for it.
  auto want = nlohmann::ordered_json::parse(QuantizationConfigJson(Options("nvfp4").spec));
  want["ignore"].push_back("model.layers.0.self_attn.q_proj");
  EXPECT_EQ(config.at("quantization_config"), want);
  EXPECT_EQ(config.at("quantization_config").at("quant_algo"), "NVFP4");
}

TEST(CastCheckpoint, OutputDoesNotDependOnThePool) {
  TempDir dir;
  const std::string master = dir / "master";
  WriteMaster(master);
  ThreadPool one(1), four(4);
  ASSERT_TRUE(CastCheckpoint(master, dir / "a.safetensors", Options("int4-g32-asym"), one).ok());
  ASSERT_TRUE(CastCheckpoint(master, dir / "b.safetensors", Options("int4-g32-asym"), four).ok());
  EXPECT_EQ(Slurp(dir / "a.safetensors"), Slurp(dir / "b.safetensors"));
}

TEST(CastCheckpoint, ConfigWithoutInputConfigAndPlainCasts) {
  TempDir dir;
  const std::string master = dir / "master";
  WriteMaster(master);
  ThreadPool pool(1);
  ASSERT_TRUE(CastCheckpoint(master, dir / "fp8", Options("fp8-e4m3-block128"), pool).ok());
  const auto config = nlohmann::json::parse(Slurp(dir / "fp8/config.json"));
  EXPECT_EQ(config, nlohmann::json::parse(
                        R"({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                            "activation_scheme": "dynamic", "weight_block_size": [128, 128]}})"));
  // A plain cast needs no quantization_config: none written, or the input's
  // copied byte for byte.
  ASSERT_TRUE(CastCheckpoint(master, dir / "bf16", Options("bf16"), pool).ok());
  EXPECT_FALSE(fs::exists(dir / "bf16/config.json"));
  const std::string odd = "{\"b\": 1,   \"a\": 1.50}\n";
  Spit(master + "/config.json", odd);
  ASSERT_TRUE(CastCheckpoint(master, dir / "bf16b", Options("bf16"), pool).ok());
  EXPECT_EQ(Slurp(dir / "bf16b/config.json"), odd);
}

TEST(CastCheckpoint, RefusesConfigsItCannotExtendAndLeavesNothing) {
  TempDir dir;
  const std::string master = dir / "master";
  WriteMaster(master);
  ThreadPool pool(1);
  const std::vector<std::tuple<const char*, std::string, Code>> cases = {
      {"already quantized", R"({"quantization_config": {"quant_method": "fp8"}})",
       Code::kInvalidArgument},
      // The old text splice inserted the key after the first '{' it found,
      // inside the array, and wrote what no engine could read.
      {"array", R"([{"model_type": "llama"}])", Code::kCorrupt},
      {"not json", "{model_type: llama}", Code::kCorrupt},
      {"truncated", R"({"model_type": )", Code::kCorrupt},
  };
  for (const auto& [what, text, code] : cases) {
    Spit(master + "/config.json", text);
    auto r = CastCheckpoint(master, dir / "out", Options("nvfp4"), pool);
    EXPECT_EQ(r.status().code(), code) << what << ": " << r.status().ToString();
    EXPECT_FALSE(fs::exists(dir / "out")) << what;
  }
  // A mention of the key elsewhere is no quantization_config (the old text
  // search refused this).
  Spit(master + "/config.json", R"({"notes": "no \"quantization_config\" here"})");
  EXPECT_TRUE(CastCheckpoint(master, dir / "out", Options("nvfp4"), pool).ok());
}

TEST(CastCheckpoint, PreviousMustMatchTheLayout) {
  TempDir dir;
  const std::string master = dir / "master";
  WriteMaster(master);
  ThreadPool pool(1);
  ASSERT_TRUE(CastCheckpoint(master, dir / "fp8.safetensors", Options("fp8-e4m3-channel"), pool).ok());
  CastOptions band = Options("nvfp4");
  band.policy.kind = ScalePolicy::Kind::kBand;
  band.previous_path = dir / "fp8.safetensors";
  auto r = CastCheckpoint(master, dir / "out.safetensors", band, pool);
  EXPECT_EQ(r.status().code(), Code::kMismatch) << r.status().ToString();
  EXPECT_FALSE(fs::exists(dir / "out.safetensors"));
  // The same format as previous: every group within the band keeps its scale.
  band = Options("fp8-e4m3-channel");
  band.policy.kind = ScalePolicy::Kind::kBand;
  band.previous_path = dir / "fp8.safetensors";
  auto same = CastCheckpoint(master, dir / "again.safetensors", band, pool);
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_EQ(same->rescaled_groups, 0u);
}

}  // namespace
}  // namespace tern
