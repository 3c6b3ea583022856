// CastCheckpoint and the engines' fused layers: the parts of q/k/v and
// gate/up share one per-tensor scale (engines load them as one matrix with
// one), and MXFP4 quantizes only what its config says it does (an engine
// loads the rest unquantized).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include <nlohmann/json.hpp>

#include "tern/cast_checkpoint.h"
#include "tern/checkpoint.h"
#include "tern/quant_plan.h"

namespace tern {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/tern_cast_fused_test_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

constexpr const char* kLayer = "model.layers.0.";

// One decoder layer; the parts of each fused layer get different ranges, so
// per-part scales would differ (gain = a part's largest |x| relative to 1).
const std::map<std::string, std::pair<std::vector<uint64_t>, float>>& Parts() {
  static const std::map<std::string, std::pair<std::vector<uint64_t>, float>> parts = {
      {"self_attn.q_proj", {{32, 64}, 1.0f}},  {"self_attn.k_proj", {{16, 64}, 3.0f}},
      {"self_attn.v_proj", {{16, 64}, 0.5f}},  {"self_attn.o_proj", {{64, 32}, 2.0f}},
      {"mlp.gate_proj", {{48, 64}, 0.7f}},     {"mlp.up_proj", {{48, 64}, 1.9f}},
      {"mlp.down_proj", {{64, 48}, 1.3f}},
  };
  return parts;
}

// `gains` overrides a part's gain (a training step that moves one part).
void WriteMaster(const std::string& dir, const std::map<std::string, float>& gains = {}) {
  std::vector<TensorDesc> tensors;
  for (const auto& [name, part] : Parts())
    tensors.push_back({kLayer + name + ".weight", DType::kF32, part.first});
  auto w = WritableCheckpoint::Create(dir, tensors, {{"format", "pt"}});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  uint32_t state = 777;
  for (auto& t : (*w)->view().tensors) {
    const std::string part = t.desc->name.substr(std::strlen(kLayer), t.desc->name.size() -
                                                                          std::strlen(kLayer) - 7);
    const float gain = gains.count(part) ? gains.at(part) : Parts().at(part).second;
    auto* f = reinterpret_cast<float*>(t.data);
    for (uint64_t i = 0; i < t.desc->elements(); ++i) {
      state = state * 1664525u + 1013904223u;
      f[i] = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 2.0f * gain;
    }
  }
  ASSERT_TRUE((*w)->Commit().ok());
}

float StoredScale(const std::string& dir, const std::string& name) {
  auto ckpt = Checkpoint::Open(dir);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  const TensorRef* t = (*ckpt)->view().Find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return NAN;
  EXPECT_EQ(t->desc->dtype, DType::kF32);
  float v;
  std::memcpy(&v, t->data, 4);
  return v;
}

struct Format {
  const char* name;
  const char* scale;  // the per-tensor scale's suffix
};
constexpr Format kFormats[] = {{"nvfp4", ".weight_scale_2"},
                               {"nvfp4-ct", ".weight_global_scale"},
                               {"fp8-e4m3-tensor", ".weight_scale"}};

// Every fused layer's parts store one scale, bit for bit, and it is the scale
// of the fused matrix (TensorScale over the largest |x| of all parts).
void ExpectShared(const std::string& dir, const Format& f, float q_scale_want) {
  auto scale = [&](const char* part) { return StoredScale(dir, kLayer + std::string(part) + f.scale); };
  const float q = scale("self_attn.q_proj");
  EXPECT_EQ(q, q_scale_want) << f.name;
  EXPECT_EQ(scale("self_attn.k_proj"), q) << f.name;
  EXPECT_EQ(scale("self_attn.v_proj"), q) << f.name;
  EXPECT_EQ(scale("mlp.gate_proj"), scale("mlp.up_proj")) << f.name;
  // Unfused layers keep their own.
  EXPECT_NE(scale("self_attn.o_proj"), q) << f.name;
  EXPECT_NE(scale("mlp.down_proj"), scale("mlp.up_proj")) << f.name;
}

TEST(CastFused, PartsOfAFusedLayerShareThePerTensorScale) {
  EXPECT_EQ(FusedLayerKey("model.layers.3.self_attn.k_proj.weight"),
            "model.layers.3.self_attn.{q_proj,k_proj,v_proj}");
  EXPECT_EQ(FusedLayerKey("model.layers.3.self_attn.q_proj.weight"),
            FusedLayerKey("model.layers.3.self_attn.v_proj.weight"));
  EXPECT_NE(FusedLayerKey("model.layers.3.self_attn.q_proj.weight"),
            FusedLayerKey("model.layers.4.self_attn.q_proj.weight"));
  EXPECT_EQ(FusedLayerKey("model.layers.0.mlp.experts.5.up_proj.weight"),
            "model.layers.0.mlp.experts.5.{gate_proj,up_proj}");
  EXPECT_EQ(FusedLayerKey("model.layers.3.self_attn.o_proj.weight"), "");
  EXPECT_EQ(FusedLayerKey("model.layers.3.mlp.down_proj.weight"), "");
  EXPECT_EQ(FusedLayerKey("model.layers.3.self_attn.q_proj.bias"), "");

  TempDir dir;
  WriteMaster(dir / "m0");
  ThreadPool pool(2);
  for (const Format& f : kFormats) {
    for (auto kind : {ScalePolicy::Kind::kFresh, ScalePolicy::Kind::kBand}) {
      CastOptions o;
      o.spec = *ParseQuantFormat(f.name);
      o.policy.kind = kind;
      o.overwrite = true;
      const std::string out = dir / "out.safetensors";
      ASSERT_TRUE(CastCheckpoint(dir / "m0", out, o, pool).ok()) << f.name;
      // k_proj holds the layer's largest |x| (gain 3).
      auto m = Checkpoint::Open(dir / "m0");
      ASSERT_TRUE(m.ok());
      const TensorRef* k = (*m)->view().Find("model.layers.0.self_attn.k_proj.weight");
      float amax = 0;
      for (uint64_t i = 0; i < k->desc->elements(); ++i)
        amax = std::fmax(amax, std::fabs(reinterpret_cast<const float*>(k->data)[i]));
      ExpectShared(out, f, TensorScale(o.spec, amax, nullptr, o.policy));
    }
  }
}

TEST(CastFused, TheScalePolicyKeepsTheSharedScaleSharedFromStepToStep) {
  TempDir dir;
  WriteMaster(dir / "m0");
  // Step 1: v_proj grows a little (inside the band); step 2: k_proj, the
  // part with the layer's largest |x|, grows out of the band.
  WriteMaster(dir / "m1", {{"self_attn.v_proj", 0.55f}, {"mlp.gate_proj", 0.72f}});
  WriteMaster(dir / "m2", {{"self_attn.v_proj", 0.55f}, {"self_attn.k_proj", 3.6f}});
  ThreadPool pool(2);
  for (const Format& f : kFormats) {
    CastOptions o;
    o.spec = *ParseQuantFormat(f.name);
    o.policy.kind = ScalePolicy::Kind::kBand;
    const std::string s0 = dir / (std::string(f.name) + "-0.safetensors");
    const std::string s1 = dir / (std::string(f.name) + "-1.safetensors");
    const std::string s2 = dir / (std::string(f.name) + "-2.safetensors");
    ASSERT_TRUE(CastCheckpoint(dir / "m0", s0, o, pool).ok()) << f.name;
    o.previous_path = s0;
    ASSERT_TRUE(CastCheckpoint(dir / "m1", s1, o, pool).ok()) << f.name;
    o.previous_path = s1;
    ASSERT_TRUE(CastCheckpoint(dir / "m2", s2, o, pool).ok()) << f.name;
    const std::string q = kLayer + std::string("self_attn.q_proj") + f.scale;
    const float scale0 = StoredScale(s0, q);
    ExpectShared(s1, f, scale0);  // kept, for all three parts
    const float scale2 = StoredScale(s2, q);
    EXPECT_NE(scale2, scale0) << f.name;
    ExpectShared(s2, f, scale2);  // re-derived, for all three parts
    // A previous cast whose parts did not share (an older tern) is re-derived
    // into a shared scale, never kept per part.
  }
}

TEST(CastFused, QuantizeChecksASharedScaleCoversTheTensor) {
  const std::vector<float> w = {0.5f, -4.0f, 1.0f, 2.0f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  ScalePolicy fresh;
  fresh.kind = ScalePolicy::Kind::kFresh;
  for (const Format& f : kFormats) {
    const QuantSpec spec = *ParseQuantFormat(f.name);
    const float own = TensorScale(spec, 4.0f, nullptr, fresh);
    const float coarser = TensorScale(spec, 8.0f, nullptr, fresh);
    const float finer = TensorScale(spec, 2.0f, nullptr, fresh);
    auto q = Quantize(spec, w.data(), {1, 16}, nullptr, fresh, &coarser);
    ASSERT_TRUE(q.ok()) << f.name << q.status().ToString();
    float stored;
    std::memcpy(&stored, q->Find(f.scale)->data.data(), 4);
    EXPECT_EQ(stored, coarser) << f.name;
    auto alone = Quantize(spec, w.data(), {1, 16}, nullptr, fresh);
    std::memcpy(&stored, alone->Find(f.scale)->data.data(), 4);
    EXPECT_EQ(stored, own) << f.name;
    EXPECT_EQ(Quantize(spec, w.data(), {1, 16}, nullptr, fresh, &finer).status().code(),
              Code::kInvalidArgument)
        << f.name;
    // Dequantized with the shared scale: still within a code of the value.
    auto deq = Dequantize(spec, *q, {1, 16});
    ASSERT_TRUE(deq.ok());
    EXPECT_NEAR((*deq)[1], -4.0f, 4.0f * 0.25f) << f.name;
  }
  const QuantSpec channel = *ParseQuantFormat("fp8-e4m3-channel");
  const float one = 1.0f;
  EXPECT_FALSE(HasTensorScale(channel));
  EXPECT_EQ(Quantize(channel, w.data(), {1, 16}, nullptr, fresh, &one).status().code(),
            Code::kInvalidArgument);
}

// modules_to_not_convert must describe the file: nothing under a listed
// module is quantized, and engines load MXFP4 for MoE experts only.
TEST(CastFused, Mxfp4QuantizesExactlyWhatItsConfigSays) {
  TempDir dir;
  const std::string master = dir / "master";
  {
    std::vector<TensorDesc> tensors = {
        {"model.layers.0.self_attn.q_proj.weight", DType::kF32, {32, 64}},
        {"model.layers.0.mlp.router.weight", DType::kF32, {4, 64}},
        {"model.layers.0.mlp.experts.gate_up_proj.weight", DType::kF32, {4, 32, 64}},
        {"model.layers.0.mlp.experts.down_proj.weight", DType::kF32, {4, 64, 32}},
        {"model.embed_tokens.weight", DType::kF32, {16, 64}},
    };
    auto w = WritableCheckpoint::Create(master, tensors, {{"format", "pt"}});
    ASSERT_TRUE(w.ok());
    for (auto& t : (*w)->view().tensors) {
      auto* f = reinterpret_cast<float*>(t.data);
      for (uint64_t i = 0; i < t.desc->elements(); ++i) f[i] = std::sin(0.1f * i) * 0.05f;
    }
    ASSERT_TRUE((*w)->Commit().ok());
  }
  ThreadPool pool(1);
  CastOptions o;
  o.spec = *ParseQuantFormat("mxfp4");
  ASSERT_TRUE(CastCheckpoint(master, dir / "out", o, pool).ok());
  const auto config = nlohmann::json::parse(QuantizationConfigJson(o.spec));
  auto out = Checkpoint::Open(dir / "out");
  ASSERT_TRUE(out.ok());
  // `*` matches one name component, as transformers' and vLLM's patterns do here.
  auto listed = [&](const std::string& module) {
    for (const nlohmann::json& entry : config.at("modules_to_not_convert")) {
      const std::string pattern = entry.get<std::string>();
      size_t m = 0, p = 0;
      bool ok = true;
      while (ok && p < pattern.size()) {
        if (pattern[p] == '*') {
          while (m < module.size() && module[m] != '.') ++m;
          ++p;
        } else {
          ok = m < module.size() && module[m++] == pattern[p++];
        }
      }
      if (ok && (m == module.size() || module[m] == '.')) return true;
    }
    return false;
  };
  int quantized = 0;
  for (const TensorRef& t : (*out)->view().tensors) {
    const std::string& n = t.desc->name;
    const bool q = n.size() > 7 && (n.substr(n.size() - 7) == "_blocks" || n.substr(n.size() - 7) == "_scales");
    quantized += q;
    if (q) {
      EXPECT_FALSE(listed(n)) << n << " is quantized but under modules_to_not_convert";
    }
  }
  EXPECT_EQ(quantized, 4);  // the two expert tensors, blocks and scales
  const TensorRef* q_proj = (*out)->view().Find("model.layers.0.self_attn.q_proj.weight");
  ASSERT_NE(q_proj, nullptr) << "self_attn is listed as not converted, so it must stay a .weight";
  EXPECT_EQ(q_proj->desc->dtype, DType::kBF16);
  EXPECT_TRUE(listed("model.layers.0.self_attn.q_proj"));
}

// Engines quantize every Linear a config does not exclude, so a Linear the
// cast leaves unquantized (--keep, or a shape the format cannot take) must
// be excluded in each format's own words.
TEST(CastFused, ConfigsExcludeTheLinearsLeftUnquantized) {
  TempDir dir;
  WriteMaster(dir / "m0");
  ThreadPool pool(1);
  const std::string down = "model.layers.0.mlp.down_proj";
  auto cast = [&](const char* format) {
    CastOptions o;
    o.spec = *ParseQuantFormat(format);
    o.keep = {"down_proj"};
    o.overwrite = true;
    EXPECT_TRUE(CastCheckpoint(dir / "m0", dir / "out", o, pool).ok()) << format;
    std::ifstream f(dir / "out/config.json");
    return nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(f), {}))
        .at("quantization_config");
  };
  const nlohmann::json listed = {"lm_head", down};
  for (const char* ct : {"int4-g32", "int4-g32-asym", "fp8-e4m3-channel", "nvfp4-ct", "nvfp4"})
    EXPECT_EQ(cast(ct).at("ignore"), listed) << ct;
  EXPECT_EQ(cast("fp8-e4m3-block128").at("ignored_layers"), nlohmann::json({down}));
  // vLLM's GPTQ: a "-:" key is a Python regex (re.match) on the module name.
  EXPECT_EQ(cast("gptq-int4-g32").at("dynamic"),
            nlohmann::json({{"-:model\\.layers\\.0\\.mlp\\.down_proj$", nlohmann::json::object()}}));
  // Nothing left out (every `in` here divides by 16): lm_head only.
  CastOptions o;
  o.spec = *ParseQuantFormat("nvfp4-ct");
  o.overwrite = true;
  ASSERT_TRUE(CastCheckpoint(dir / "m0", dir / "out", o, pool).ok());
  std::ifstream f(dir / "out/config.json");
  EXPECT_EQ(nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(f), {}))
                .at("quantization_config")
                .at("ignore"),
            nlohmann::json({"lm_head"}));
}

}  // namespace
}  // namespace tern
