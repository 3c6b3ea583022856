// Quantized traces (ServeFormat::kQuantized): the serve view is `tern cast`'s
// layout, every step diffs and applies back bit for bit, the trace is
// deterministic, and the master trajectory does not depend on the format.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/owned_view.h"
#include "tern/thread_pool.h"
#include "tern/digest.h"
#include "tern/patch.h"
#include "tern/quant_plan.h"
#include "tern/quantize.h"
#include "tern/datagen.h"

namespace tern {
namespace {

TraceConfig Config(const std::string& format, double lr = 1e-5) {
  TraceConfig c;
  c.shape = *ChooseModelShape(400'000);
  c.seed = 7;
  c.adam.lr = lr;
  auto spec = ParseQuantFormat(format);
  EXPECT_TRUE(spec.ok()) << format;
  if (spec->scheme == QuantScheme::kBF16) {
    c.format = ServeFormat::kBF16;
  } else if (spec->scheme == QuantScheme::kF16) {
    c.format = ServeFormat::kF16;
  } else {
    c.format = ServeFormat::kQuantized;
    c.quant = *spec;
  }
  return c;
}

std::unique_ptr<TraceGenerator> Make(const TraceConfig& c, ThreadPool& pool) {
  auto g = TraceGenerator::Create(c, pool);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? std::move(g).value() : nullptr;
}

using testing::OwnedView;

std::vector<uint8_t> Bytes(const ServeView& view) {
  std::vector<uint8_t> out;
  for (const auto& t : view.tensors) out.insert(out.end(), t.data, t.data + t.desc->bytes());
  return out;
}

const TensorDesc* FindDesc(const ServeView& v, const std::string& name) {
  const TensorRef* t = v.Find(name);
  return t ? t->desc : nullptr;
}

TEST(QuantTraceTest, ViewIsTheCastLayout) {
  ThreadPool pool(2);
  for (const std::string& format : QuantFormatNames()) {
    const TraceConfig c = Config(format);
    if (c.format != ServeFormat::kQuantized) continue;
    auto gen = Make(c, pool);
    ASSERT_TRUE(gen) << format;
    const ServeView& v = gen->view();
    // Exactly the tensors PlanQuantTensor gives for each master tensor.
    std::vector<std::string> want;
    for (TensorDesc d : ModelTensors(c.shape, DType::kF32)) {
      auto plan = PlanQuantTensor(c.quant, d, DefaultQuantKeep());
      ASSERT_TRUE(plan.ok());
      for (const TensorDesc& o : plan->outs) {
        want.push_back(o.name);
        const TensorDesc* got = FindDesc(v, o.name);
        ASSERT_NE(got, nullptr) << format << " " << o.name;
        EXPECT_TRUE(got->SameLayout(o)) << format << " " << o.name;
      }
    }
    ASSERT_EQ(v.tensors.size(), want.size()) << format;
    for (size_t i = 1; i < v.tensors.size(); ++i)
      EXPECT_LT(v.tensors[i - 1].desc->name, v.tensors[i].desc->name);
    // Kept tensors are BF16; projections are quantized.
    for (const char* kept : {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"}) {
      const TensorDesc* d = FindDesc(v, kept);
      ASSERT_NE(d, nullptr) << format << " " << kept;
      EXPECT_EQ(d->dtype, DType::kBF16) << format << " " << kept;
    }
    // The projections are quantized (this shape's dims fit every group),
    // except in mxfp4, which quantizes MoE experts only (this model has none).
    uint64_t quantized = 0;
    for (TensorDesc d : ModelTensors(c.shape, DType::kF32))
      quantized += PlanQuantTensor(c.quant, d, DefaultQuantKeep())->quantize;
    EXPECT_EQ(quantized, format == "mxfp4" ? 0 : 7 * c.shape.num_hidden_layers) << format;
    EXPECT_EQ(nlohmann::json::parse(gen->config_json()).at("quantization_config"),
              nlohmann::json::parse(QuantizationConfigJson(c.quant)))
        << format;
  }
}

// An MoE model: mxfp4 quantizes the fused experts (blocks and E8M0 scales)
// and keeps the rest BF16, and each step diffs and applies back bit for bit.
TEST(QuantTraceTest, MixtureOfExpertsTakesMxfp4) {
  ThreadPool pool(2);
  TraceConfig c = Config("mxfp4");
  c.shape = *ChooseModelShape(400'000, 4);
  auto gen = Make(c, pool);
  ASSERT_TRUE(gen);
  uint64_t quantized = 0;
  for (TensorDesc d : ModelTensors(c.shape, DType::kF32)) {
    auto plan = PlanQuantTensor(c.quant, d, DefaultQuantKeep());
    ASSERT_TRUE(plan.ok());
    const bool expert = d.name.find("mlp.experts.") != std::string::npos;
    EXPECT_EQ(plan->quantize, expert) << d.name;
    quantized += plan->quantize;
    for (const TensorDesc& o : plan->outs) {
      const TensorDesc* got = FindDesc(gen->view(), o.name);
      ASSERT_NE(got, nullptr) << o.name;
      EXPECT_EQ(got->dtype, expert ? DType::kU8 : DType::kBF16) << o.name;
    }
  }
  EXPECT_EQ(quantized, 2 * c.shape.num_hidden_layers);
  OwnedView replica(gen->view());
  for (int step = 1; step <= 2; ++step) {
    const OwnedView base(gen->view());
    ASSERT_TRUE(gen->Step().ok());
    EXPECT_GT(gen->last_stats().changed, 0u);
    DiffOptions options;
    options.base_version = step - 1;
    options.target_version = step;
    auto patch = Diff(base.View(), gen->view(), options, pool);
    ASSERT_TRUE(patch.ok()) << patch.status().ToString();
    MutableServeView mv = replica.Mutable();
    ASSERT_TRUE(Apply(mv, *patch, ComputeDigest(replica.View(), pool), pool).ok());
    EXPECT_EQ(Bytes(replica.View()), Bytes(gen->view())) << "step " << step;
  }
}

TEST(QuantTraceTest, EveryStepDiffsAndAppliesBitwise) {
  ThreadPool pool(2);
  for (const std::string& format : QuantFormatNames()) {
    auto gen = Make(Config(format), pool);
    ASSERT_TRUE(gen) << format;
    OwnedView replica(gen->view());
    for (int step = 1; step <= 2; ++step) {
      const OwnedView base(gen->view());
      ASSERT_TRUE(gen->Step().ok()) << format;
      const StepStats& stats = gen->last_stats();
      EXPECT_GT(stats.changed, 0u) << format;
      EXPECT_LT(stats.changed, stats.elements) << format;
      DiffOptions options;
      options.base_version = step - 1;
      options.target_version = step;
      auto patch = Diff(base.View(), gen->view(), options, pool);
      ASSERT_TRUE(patch.ok()) << format << ": " << patch.status().ToString();
      MutableServeView mv = replica.Mutable();
      ASSERT_TRUE(Apply(mv, *patch, ComputeDigest(replica.View(), pool), pool).ok()) << format;
      EXPECT_EQ(Bytes(replica.View()), Bytes(gen->view())) << format << " step " << step;
      // The stats count exactly the elements that differ.
      uint64_t changed = 0;
      for (size_t i = 0; i < base.descs.size(); ++i) {
        const uint64_t n = base.descs[i].elements();
        const uint64_t w = base.data[i].size() / n;
        const uint8_t* now = gen->view().tensors[i].data;
        uint64_t c = 0;
        for (uint64_t e = 0; e < n; ++e) c += std::memcmp(base.data[i].data() + e * w, now + e * w, w) != 0;
        EXPECT_EQ(c, stats.changed_per_tensor[i]) << format << " " << base.descs[i].name;
        changed += c;
      }
      EXPECT_EQ(changed, stats.changed) << format;
    }
  }
}

TEST(QuantTraceTest, DeterministicForAnyThreadCount) {
  ThreadPool one(1), two(2);
  for (const char* format : {"nvfp4", "int4-g128-asym", "fp8-e4m3-block128"}) {
    auto a = Make(Config(format), one);
    auto b = Make(Config(format), two);
    ASSERT_TRUE(a && b);
    for (int s = 0; s < 2; ++s) ASSERT_TRUE(a->Step().ok() && b->Step().ok());
    EXPECT_EQ(Bytes(a->view()), Bytes(b->view())) << format;
    EXPECT_EQ(a->last_stats().changed, b->last_stats().changed) << format;
  }
}

TEST(QuantTraceTest, MasterTrajectoryIsFormatIndependent) {
  ThreadPool pool(2);
  auto ref = Make(Config("bf16"), pool);
  ASSERT_TRUE(ref);
  for (int s = 0; s < 2; ++s) ASSERT_TRUE(ref->Step().ok());
  for (const char* format : {"fp16", "fp8-e4m3-channel", "nvfp4-ct", "mxfp4", "gptq-int4-g128"}) {
    for (auto kind : {ScalePolicy::Kind::kBand, ScalePolicy::Kind::kFresh}) {
      TraceConfig c = Config(format);
      c.scale_policy.kind = kind;
      auto gen = Make(c, pool);
      ASSERT_TRUE(gen);
      for (int s = 0; s < 2; ++s) ASSERT_TRUE(gen->Step().ok());
      for (const TensorDesc& d : ModelTensors(c.shape, DType::kF32)) {
        auto want = ref->master(d.name);
        auto got = gen->master(d.name);
        ASSERT_TRUE(want.ok() && got.ok()) << d.name;
        ASSERT_EQ(want->size(), got->size());
        EXPECT_EQ(std::memcmp(want->data(), got->data(), want->size_bytes()), 0)
            << format << " " << d.name;
      }
    }
  }
  EXPECT_EQ(ref->master("nope").status().code(), Code::kNotFound);
}

TEST(QuantTraceTest, BandPolicyKeepsScalesThatFreshRewrites) {
  ThreadPool pool(2);
  uint64_t rescaled[2] = {0, 0}, changed[2] = {0, 0};
  int k = 0;
  for (auto kind : {ScalePolicy::Kind::kBand, ScalePolicy::Kind::kFresh}) {
    TraceConfig c = Config("int4-g128", 1e-4);
    c.scale_policy.kind = kind;
    auto gen = Make(c, pool);
    ASSERT_TRUE(gen);
    ASSERT_TRUE(gen->Step().ok());
    EXPECT_GT(gen->last_stats().scale_groups, 0u);
    rescaled[k] = gen->last_stats().rescaled_groups;
    changed[k] = gen->last_stats().changed;
    ++k;
  }
  EXPECT_LT(rescaled[0], rescaled[1]);
  EXPECT_LT(changed[0], changed[1]);
}

TEST(QuantTraceTest, RejectsPlainSpecAsQuantized) {
  ThreadPool pool(1);
  TraceConfig c = Config("bf16");
  c.format = ServeFormat::kQuantized;
  c.quant = *ParseQuantFormat("bf16");
  EXPECT_EQ(TraceGenerator::Create(c, pool).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace tern
