#include "tern/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

#include "quant/minifloat.h"

namespace tern {
namespace {

using quant::DecodeMini;
using quant::kE4M3;
using quant::kE5M2;

std::vector<float> Random(uint64_t n, uint32_t seed, float stddev = 0.02f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// The reference quantizers' arithmetic (no kept scales, no headroom).
const ScalePolicy kFreshPolicy{ScalePolicy::Kind::kFresh};

QuantSpec Spec(const char* name) {
  auto s = ParseQuantFormat(name);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return *s;
}

float F32At(const QuantTensor& t, uint64_t i) {
  float f;
  std::memcpy(&f, t.data.data() + 4 * i, 4);
  return f;
}

TEST(QuantFormatTest, ParsesEveryListedNameAndRejectsOthers) {
  for (const std::string& name : QuantFormatNames()) {
    auto s = ParseQuantFormat(name);
    ASSERT_TRUE(s.ok()) << name;
    EXPECT_EQ(s->name, name);
  }
  EXPECT_EQ(Spec("int4-g64-asym").group, 64u);
  EXPECT_FALSE(Spec("int4-g64-asym").symmetric);
  EXPECT_EQ(Spec("gptq-int4-g32").scheme, QuantScheme::kGptqInt4);
  for (const char* bad : {"", "fp8", "int4-g100", "gptq-int4-g128-asym", "nvfp5", "BF16"}) {
    auto s = ParseQuantFormat(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
    EXPECT_NE(s.status().message().find("unknown quantization format"), std::string::npos);
  }
}

TEST(QuantizeTest, RejectsNonFiniteMasterAndBadShapes) {
  std::vector<float> w = Random(64, 1);
  w[37] = NAN;
  auto q = Quantize(Spec("fp8-e4m3-tensor"), w.data(), {8, 8}, nullptr, {});
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), Code::kInvalidArgument);
  EXPECT_NE(q.status().message().find("element 37"), std::string::npos) << q.status().ToString();
  w[37] = -INFINITY;
  EXPECT_FALSE(Quantize(Spec("bf16"), w.data(), {8, 8}, nullptr, {}).ok());
  w[37] = 0;
  EXPECT_EQ(Quantize(Spec("fp8-e4m3-tensor"), w.data(), {64}, nullptr, {}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(Quantize(Spec("fp8-e4m3-tensor"), w.data(), {0, 8}, nullptr, {}).status().code(),
            Code::kInvalidArgument);
  ScalePolicy bad;
  bad.band_low = 0;
  EXPECT_FALSE(Quantize(Spec("fp8-e4m3-tensor"), w.data(), {8, 8}, nullptr, bad).ok());
}

// DeepSeek-V3 layout on an unaligned shape: scales [ceil(out/128),
// ceil(in/128)], each the block's amax / 448, and each block's largest
// element lands exactly on +-448.
TEST(QuantizeFp8Test, Block128UnalignedMatchesDefinition) {
  const uint64_t out = 200, in = 300;
  std::vector<float> w = Random(out * in, 2);
  auto q = Quantize(Spec("fp8-e4m3-block128"), w.data(), {out, in}, nullptr, kFreshPolicy);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  const QuantTensor* codes = q->Find(".weight");
  const QuantTensor* scales = q->Find(".weight_scale_inv");
  ASSERT_NE(codes, nullptr);
  ASSERT_NE(scales, nullptr);
  EXPECT_EQ(codes->dtype, DType::kF8E4M3);
  EXPECT_EQ(codes->shape, (std::vector<uint64_t>{out, in}));
  EXPECT_EQ(scales->dtype, DType::kF32);
  EXPECT_EQ(scales->shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(q->scale_groups, 6u);
  for (uint64_t bo = 0; bo < 2; ++bo) {
    for (uint64_t bi = 0; bi < 3; ++bi) {
      float amax = 0;
      uint64_t arg = 0;
      for (uint64_t o = bo * 128; o < std::min(out, bo * 128 + 128); ++o)
        for (uint64_t i = bi * 128; i < std::min(in, bi * 128 + 128); ++i)
          if (std::fabs(w[o * in + i]) > amax) amax = std::fabs(w[o * in + i]), arg = o * in + i;
      const float s = F32At(*scales, bo * 3 + bi);
      EXPECT_EQ(s, amax / 448.0f);
      EXPECT_EQ(std::fabs(DecodeMini(codes->data[arg], kE4M3)), 448.0f);
    }
  }
  auto back = Dequantize(Spec("fp8-e4m3-block128"), *q, {out, in});
  ASSERT_TRUE(back.ok());
  for (uint64_t k = 0; k < w.size(); ++k) {
    const float s = F32At(*scales, (k / in / 128) * 3 + (k % in) / 128);
    // E4M3 keeps 3 mantissa bits: error <= 2^-4 relative, or half the
    // smallest subnormal step (2^-10 * s) near zero.
    EXPECT_LE(std::fabs((*back)[k] - w[k]), std::fmax(std::fabs(w[k]) / 16, s / 1024)) << k;
  }
}

TEST(QuantizeFp8Test, TensorAndChannelScales) {
  const uint64_t out = 5, in = 33;
  std::vector<float> w = Random(out * in, 3);
  for (uint64_t i = 0; i < in; ++i) w[2 * in + i] *= 100;  // one loud channel
  auto t = Quantize(Spec("fp8-e4m3-tensor"), w.data(), {out, in}, nullptr, kFreshPolicy);
  auto c = Quantize(Spec("fp8-e4m3-channel"), w.data(), {out, in}, nullptr, kFreshPolicy);
  auto e = Quantize(Spec("fp8-e5m2-tensor"), w.data(), {out, in}, nullptr, kFreshPolicy);
  ASSERT_TRUE(t.ok() && c.ok() && e.ok());
  EXPECT_EQ(t->Find(".weight_scale")->shape, (std::vector<uint64_t>{1}));
  EXPECT_EQ(c->Find(".weight_scale")->shape, (std::vector<uint64_t>{out, 1}));
  EXPECT_EQ(e->Find(".weight")->dtype, DType::kF8E5M2);
  float amax = 0;
  for (float x : w) amax = std::fmax(amax, std::fabs(x));
  EXPECT_EQ(F32At(*t->Find(".weight_scale"), 0), amax / 448.0f);
  EXPECT_EQ(F32At(*e->Find(".weight_scale"), 0), amax / 57344.0f);
  for (uint64_t o = 0; o < out; ++o) {
    float row_max = 0;
    for (uint64_t i = 0; i < in; ++i) row_max = std::fmax(row_max, std::fabs(w[o * in + i]));
    EXPECT_EQ(F32At(*c->Find(".weight_scale"), o), row_max / 448.0f);
  }
  // Per-channel scales keep the quiet rows precise; one tensor scale cannot.
  auto bt = Dequantize(Spec("fp8-e4m3-tensor"), *t, {out, in});
  auto bc = Dequantize(Spec("fp8-e4m3-channel"), *c, {out, in});
  ASSERT_TRUE(bt.ok() && bc.ok());
  double et = 0, ec = 0;
  for (uint64_t i = 0; i < in; ++i) {
    et += std::fabs((*bt)[i] - w[i]);
    ec += std::fabs((*bc)[i] - w[i]);
  }
  EXPECT_LT(ec, et);
}

TEST(QuantizeFp8Test, ExpertsAreIndependentMatrices) {
  const uint64_t e = 2, out = 130, in = 129;
  std::vector<float> w = Random(e * out * in, 4);
  auto a = Quantize(Spec("fp8-e4m3-block128"), w.data(), {e, out, in}, nullptr, kFreshPolicy);
  for (uint64_t k = out * in; k < w.size(); ++k) w[k] *= 1000;
  auto b = Quantize(Spec("fp8-e4m3-block128"), w.data(), {e, out, in}, nullptr, kFreshPolicy);
  ASSERT_TRUE(a.ok() && b.ok());
  const QuantTensor* sa = a->Find(".weight_scale_inv");
  const QuantTensor* sb = b->Find(".weight_scale_inv");
  EXPECT_EQ(sa->shape, (std::vector<uint64_t>{e, 2, 2}));
  for (uint64_t k = 0; k < 4; ++k) EXPECT_EQ(F32At(*sa, k), F32At(*sb, k));
  for (uint64_t k = 4; k < 8; ++k) EXPECT_NE(F32At(*sa, k), F32At(*sb, k));
}

// The band policy keeps every block scale whose block max did not grow or
// shrink past the band, so a small update changes few codes and no scales.
TEST(ScalePolicyTest, BandKeepsScalesAndRescalesOnlyBlocksThatOutgrowThem) {
  const uint64_t out = 256, in = 256;
  const QuantSpec spec = Spec("fp8-e4m3-block128");
  std::vector<float> w = Random(out * in, 5);
  auto q0 = Quantize(spec, w.data(), {out, in}, nullptr, {});
  ASSERT_TRUE(q0.ok());
  // Every weight moves a little; block (0,0) grows by 2x.
  std::vector<float> w1 = w;
  std::mt19937 rng(6);
  std::normal_distribution<float> step(0.0f, 1e-4f);
  for (float& x : w1) x += step(rng);
  for (uint64_t o = 0; o < 128; ++o)
    for (uint64_t i = 0; i < 128; ++i) w1[o * in + i] *= 2;
  ScalePolicy band;
  auto kept = Quantize(spec, w1.data(), {out, in}, &*q0, band);
  ScalePolicy fresh_policy;
  fresh_policy.kind = ScalePolicy::Kind::kFresh;
  auto fresh = Quantize(spec, w1.data(), {out, in}, &*q0, fresh_policy);
  ASSERT_TRUE(kept.ok() && fresh.ok());
  EXPECT_EQ(kept->scale_groups, 4u);
  EXPECT_EQ(kept->rescaled_groups, 1u);
  EXPECT_EQ(fresh->rescaled_groups, 4u);
  const QuantTensor* s0 = q0->Find(".weight_scale_inv");
  const QuantTensor* sk = kept->Find(".weight_scale_inv");
  EXPECT_NE(F32At(*s0, 0), F32At(*sk, 0));
  for (uint64_t k = 1; k < 4; ++k) EXPECT_EQ(F32At(*s0, k), F32At(*sk, k)) << k;
  // Without the band, a block whose max shrinks changes scale, so nearly
  // every code of it changes; with it, most codes stay.
  uint64_t changed_kept = 0, changed_fresh = 0;
  const QuantTensor* c0 = q0->Find(".weight");
  for (uint64_t o = 128; o < 256; ++o)
    for (uint64_t i = 0; i < 256; ++i) {
      changed_kept += c0->data[o * in + i] != kept->Find(".weight")->data[o * in + i];
      changed_fresh += c0->data[o * in + i] != fresh->Find(".weight")->data[o * in + i];
    }
  EXPECT_LE(changed_kept, changed_fresh);
  // A kept scale still bounds the error: no clipping.
  auto back = Dequantize(spec, *kept, {out, in});
  ASSERT_TRUE(back.ok());
  for (uint64_t k = 0; k < w1.size(); ++k)
    ASSERT_LE(std::fabs((*back)[k] - w1[k]), std::fabs(w1[k]) / 16 + 1e-6f) << k;
}

TEST(ScalePolicyTest, PreviousStateOfAnotherShapeIsAMismatch) {
  std::vector<float> w = Random(128 * 256, 7);
  const QuantSpec spec = Spec("fp8-e4m3-block128");
  auto q0 = Quantize(spec, w.data(), {256, 128}, nullptr, {});
  ASSERT_TRUE(q0.ok());
  auto q1 = Quantize(spec, w.data(), {128, 256}, &*q0, {});
  ASSERT_FALSE(q1.ok());
  EXPECT_EQ(q1.status().code(), Code::kMismatch);
}

TEST(QuantizeTest, PlainCastsAndConfig) {
  std::vector<float> w = Random(12, 8);
  auto q = Quantize(Spec("bf16"), w.data(), {3, 4}, nullptr, {});
  ASSERT_TRUE(q.ok());
  auto back = Dequantize(Spec("bf16"), *q, {3, 4});
  ASSERT_TRUE(back.ok());
  for (size_t i = 0; i < w.size(); ++i) EXPECT_LE(std::fabs((*back)[i] - w[i]), std::fabs(w[i]) / 256);
  EXPECT_EQ(QuantizationConfigJson(Spec("bf16")), "");
  EXPECT_EQ(nlohmann::json::parse(QuantizationConfigJson(Spec("fp8-e4m3-block128")))
                .at("weight_block_size"),
            nlohmann::json::parse("[128, 128]"));
  // E5M2 must not claim a config an engine would load as E4M3.
  for (const char* e5m2 : {"fp8-e5m2-tensor", "fp8-e5m2-channel"}) {
    const auto json = nlohmann::json::parse(QuantizationConfigJson(Spec(e5m2)));
    EXPECT_EQ(json.at("quant_method"), "tern-fp8-e5m2") << e5m2;
  }
  const auto int4 = nlohmann::json::parse(QuantizationConfigJson(Spec("int4-g64-asym")));
  EXPECT_EQ(int4.at("quant_method"), "compressed-tensors");
  EXPECT_EQ(int4.at("config_groups").at("group_0").at("weights").at("group_size"), 64);
  EXPECT_EQ(int4.at("config_groups").at("group_0").at("weights").at("symmetric"), false);
  EXPECT_EQ(int4.at("config_groups").at("group_0").at("targets"), nlohmann::json::parse(R"(["Linear"])"));
  // ModelOpt's flat config.json form: vLLM reads exclusions from "ignore"
  // here ("exclude_modules" only inside a nested {"quantization": ...}); with
  // the wrong key lm_head is loaded as FP4 and loading fails.
  const auto nvfp4 = nlohmann::json::parse(QuantizationConfigJson(Spec("nvfp4")));
  EXPECT_EQ(nvfp4.at("quant_method"), "modelopt");
  EXPECT_EQ(nvfp4.at("quant_algo"), "NVFP4");
  EXPECT_FALSE(nvfp4.contains("quantization"));
  EXPECT_FALSE(nvfp4.contains("exclude_modules"));
  EXPECT_EQ(nvfp4.value("ignore", nlohmann::json()), nlohmann::json::parse(R"(["lm_head"])"));
  for (const std::string& name : QuantFormatNames()) {
    const std::string json = QuantizationConfigJson(Spec(name.c_str()));
    if (name == "bf16" || name == "fp16") continue;
    EXPECT_TRUE(nlohmann::json::parse(json).is_object()) << name;
  }
}

TEST(QuantizeTest, DequantizeRejectsWrongLayouts) {
  std::vector<float> w = Random(256, 9);
  auto q = Quantize(Spec("fp8-e4m3-channel"), w.data(), {16, 16}, nullptr, {});
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(Dequantize(Spec("fp8-e4m3-channel"), *q, {8, 32}).status().code(), Code::kCorrupt);
  EXPECT_EQ(Dequantize(Spec("fp8-e4m3-block128"), *q, {16, 16}).status().code(), Code::kCorrupt);
  Quantized truncated = *q;
  truncated.tensors[0].data.pop_back();
  EXPECT_EQ(Dequantize(Spec("fp8-e4m3-channel"), truncated, {16, 16}).status().code(),
            Code::kCorrupt);
}

}  // namespace
}  // namespace tern
