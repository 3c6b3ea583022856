// Layout of the synthetic decoder-only transformer: shape choice from a
// parameter budget, HF tensor names, and config.json.
#include <algorithm>
#include <string>
#include <vector>

#include "datagen/model_config.h"
#include "tern/datagen.h"

namespace tern {

namespace {

constexpr uint64_t kHeadDim = 64;
constexpr uint64_t kMaxVocab = 32000;
// Below this the search is not meaningful (a single 64-wide layer already
// holds ~50K parameters).
constexpr uint64_t kMinParams = 100'000;
constexpr uint64_t kMaxParams = 1'000'000'000'000;
constexpr uint64_t kMaxExperts = 1024;

uint64_t RoundUp(uint64_t x, uint64_t m) { return (x + m - 1) / m * m; }

uint64_t PerLayerParams(const ModelShape& s) {
  const uint64_t h = s.hidden_size;
  const uint64_t q_out = s.num_attention_heads * s.head_dim;
  const uint64_t kv_out = s.num_key_value_heads * s.head_dim;
  const uint64_t mlp = s.num_local_experts == 0
                           ? 3 * h * s.intermediate_size
                           : s.num_local_experts * (3 * h * s.intermediate_size + h);  // + router
  return h * q_out + 2 * h * kv_out + q_out * h + mlp + 2 * h;
}

uint64_t EmbeddingParams(const ModelShape& s) { return 2 * s.vocab_size * s.hidden_size + s.hidden_size; }

// Everything but the layer count, for hidden size `h` and a budget.
ModelShape WidthFor(uint64_t h, uint64_t params, uint64_t experts) {
  ModelShape s;
  s.num_local_experts = experts;
  s.num_experts_per_tok = experts == 0 ? 0 : std::clamp<uint64_t>(experts / 2, 1, 4);
  s.hidden_size = h;
  s.head_dim = kHeadDim;
  s.num_attention_heads = h / kHeadDim;
  s.num_key_value_heads = s.num_attention_heads % 4 == 0 ? s.num_attention_heads / 4
                                                         : s.num_attention_heads;
  s.intermediate_size = experts == 0 ? RoundUp(8 * h / 3, 64) : h;
  // Small models would be mostly embedding with a real 32K vocabulary; give
  // the embedding and head ~15% of the budget instead.
  const uint64_t vocab = RoundUp(static_cast<uint64_t>(0.15 * static_cast<double>(params)) /
                                     (2 * h),
                                 256);
  s.vocab_size = std::clamp<uint64_t>(vocab, 256, kMaxVocab);
  return s;
}

// max(a/b, b/a): symmetric in log space without calling libm.
double RatioDistance(uint64_t a, uint64_t b) {
  const double r = static_cast<double>(a) / static_cast<double>(b);
  return r >= 1 ? r : 1 / r;
}

}  // namespace

uint64_t ModelShape::parameters() const {
  return EmbeddingParams(*this) + num_hidden_layers * PerLayerParams(*this);
}

Status ModelShape::Validate() const {
  TERN_REQUIRE(hidden_size > 0 && intermediate_size > 0 && num_hidden_layers > 0 &&
                   num_attention_heads > 0 && num_key_value_heads > 0 && head_dim > 0 &&
                   vocab_size > 0,
               kInvalidArgument, "model shape has a zero dimension");
  // Bounds keep every product below 2^64 before the total is checked.
  constexpr uint64_t kDimMax = 1 << 20;
  TERN_REQUIRE(hidden_size <= kDimMax && intermediate_size <= kDimMax &&
                   num_hidden_layers <= 65536 && num_attention_heads <= kDimMax &&
                   head_dim <= kDimMax && vocab_size <= (1u << 24) &&
                   num_local_experts <= kMaxExperts && num_experts_per_tok <= num_local_experts,
               kInvalidArgument, "model shape dimension out of range");
  TERN_REQUIRE((num_local_experts == 0) == (num_experts_per_tok == 0), kInvalidArgument,
               "num_experts_per_tok must be positive exactly when there are experts");
  TERN_REQUIRE(num_attention_heads * head_dim == hidden_size, kInvalidArgument,
               "hidden_size ", hidden_size, " != heads ", num_attention_heads, " x head_dim ",
               head_dim);
  TERN_REQUIRE(num_attention_heads % num_key_value_heads == 0, kInvalidArgument,
               "attention heads ", num_attention_heads, " not a multiple of kv heads ",
               num_key_value_heads);
  // Experts multiply the MLP by up to 1024: bound the layer before the
  // layers multiply it (a layer is below 2^53 with the bounds above).
  TERN_REQUIRE(PerLayerParams(*this) <= (uint64_t{1} << 50) / num_hidden_layers &&
                   parameters() < (uint64_t{1} << 50),
               kInvalidArgument, "model too large");
  return Status::Ok();
}

Result<ModelShape> ChooseModelShape(uint64_t params, uint64_t experts) {
  TERN_REQUIRE(params >= kMinParams && params <= kMaxParams, kOutOfRange, "--params ", params,
               " outside [1e5, 1e12]");
  TERN_REQUIRE(experts <= kMaxExperts, kOutOfRange, "--experts ", experts, " past ", kMaxExperts);
  // Pick the width whose natural depth (~hidden/128 layers, as Llama 7B has
  // 4096/32) lands closest to the budget, then fit the depth, then spend the
  // rounding remainder on the vocabulary. Widths past 256 step by 256 so that
  // the head count is a multiple of 4 and GQA applies.
  ModelShape best;
  double best_distance = 1e300;
  for (uint64_t h = kHeadDim; h <= 32768; h += h < 256 ? kHeadDim : 256) {
    ModelShape s = WidthFor(h, params, experts);
    s.num_hidden_layers = std::max<uint64_t>(2, (h + 64) / 128);
    const double d = RatioDistance(s.parameters(), params);
    if (d < best_distance) {
      best_distance = d;
      best = s;
    }
  }
  // Fit the depth (rounding either way), then spend the remainder on the
  // vocabulary, within a factor of 2 of its rule so the model keeps its look.
  const uint64_t per_layer = PerLayerParams(best);
  const uint64_t fixed = EmbeddingParams(best);
  const uint64_t floor_layers = params > fixed ? (params - fixed) / per_layer : 0;
  const ModelShape width = best;
  best_distance = 1e300;
  for (uint64_t layers : {floor_layers, floor_layers + 1}) {
    if (layers == 0) continue;
    ModelShape s = width;
    s.num_hidden_layers = layers;
    const uint64_t vocab_step = 2 * s.hidden_size * 256;  // parameters per 256 tokens
    const uint64_t lo = std::max<uint64_t>(256, RoundUp(width.vocab_size / 2, 256));
    const uint64_t hi = std::min(kMaxVocab, 2 * width.vocab_size);
    if (params > s.parameters()) {
      const uint64_t more = (params - s.parameters() + vocab_step / 2) / vocab_step * 256;
      s.vocab_size = std::min(hi, s.vocab_size + more);
    } else {
      const uint64_t fewer = (s.parameters() - params + vocab_step / 2) / vocab_step * 256;
      s.vocab_size = s.vocab_size > fewer + lo ? s.vocab_size - fewer : lo;
    }
    const double d = RatioDistance(s.parameters(), params);
    if (d < best_distance) {
      best_distance = d;
      best = s;
    }
  }
  TERN_RETURN_IF_ERROR(best.Validate());
  // The narrowest model with this many experts may not fit a small budget.
  TERN_REQUIRE(experts == 0 || RatioDistance(best.parameters(), params) <= 1.25, kOutOfRange,
               "--experts ", experts, " does not fit --params ", params, " (the nearest model has ",
               best.parameters(), " parameters)");
  return best;
}

std::vector<TensorDesc> ModelTensors(const ModelShape& s, DType dtype) {
  const uint64_t h = s.hidden_size;
  const uint64_t q_out = s.num_attention_heads * s.head_dim;
  const uint64_t kv_out = s.num_key_value_heads * s.head_dim;
  std::vector<TensorDesc> out;
  out.reserve(2 + 9 * s.num_hidden_layers + 2);
  auto add = [&](std::string name, std::vector<uint64_t> shape) {
    out.push_back(TensorDesc{std::move(name), dtype, std::move(shape)});
  };
  add("model.embed_tokens.weight", {s.vocab_size, h});
  for (uint64_t i = 0; i < s.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {h});
    add(p + "self_attn.q_proj.weight", {q_out, h});
    add(p + "self_attn.k_proj.weight", {kv_out, h});
    add(p + "self_attn.v_proj.weight", {kv_out, h});
    add(p + "self_attn.o_proj.weight", {h, q_out});
    add(p + "post_attention_layernorm.weight", {h});
    if (s.num_local_experts == 0) {
      add(p + "mlp.gate_proj.weight", {s.intermediate_size, h});
      add(p + "mlp.up_proj.weight", {s.intermediate_size, h});
      add(p + "mlp.down_proj.weight", {h, s.intermediate_size});
    } else {
      const uint64_t e = s.num_local_experts;
      add(p + "mlp.router.weight", {e, h});
      add(p + "mlp.experts.gate_up_proj.weight", {e, 2 * s.intermediate_size, h});
      add(p + "mlp.experts.down_proj.weight", {e, h, s.intermediate_size});
    }
  }
  add("model.norm.weight", {h});
  add("lm_head.weight", {s.vocab_size, h});
  return out;
}

nlohmann::ordered_json ModelConfig(const ModelShape& s, DType dtype) {
  const char* torch_dtype = dtype == DType::kBF16  ? "bfloat16"
                            : dtype == DType::kF16 ? "float16"
                                                   : "float32";
  // In the order transformers' LlamaConfig writes them. A mixture of experts
  // says what it is (tern's synthetic layout, which no engine loads) rather
  // than pass for a Llama.
  if (s.num_local_experts > 0) {
    ModelShape dense = s;
    dense.num_local_experts = dense.num_experts_per_tok = 0;
    nlohmann::ordered_json moe = ModelConfig(dense, dtype);
    moe["architectures"] = {"TernSyntheticMoeForCausalLM"};
    moe["model_type"] = "tern_synthetic_moe";
    moe["num_local_experts"] = s.num_local_experts;
    moe["num_experts_per_tok"] = s.num_experts_per_tok;
    return moe;
  }
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", s.hidden_size},
          {"intermediate_size", s.intermediate_size},
          {"num_hidden_layers", s.num_hidden_layers},
          {"num_attention_heads", s.num_attention_heads},
          {"num_key_value_heads", s.num_key_value_heads},
          {"head_dim", s.head_dim},
          {"vocab_size", s.vocab_size},
          {"hidden_act", "silu"},
          {"max_position_embeddings", 4096},
          {"rms_norm_eps", 1e-06},
          {"rope_theta", 10000.0},
          {"initializer_range", 0.02},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"tie_word_embeddings", false},
          {"bos_token_id", 1},
          {"eos_token_id", 2},
          {"torch_dtype", torch_dtype}};
}

std::string ModelConfigJson(const ModelShape& s, DType dtype) {
  // ASCII only: dump cannot throw.
  return ModelConfig(s, dtype).dump(2) + "\n";
}

std::string_view ServeFormatName(ServeFormat format) {
  switch (format) {
    case ServeFormat::kBF16:
      return "bf16";
    case ServeFormat::kF16:
      return "fp16";
    case ServeFormat::kQuantized:
      return "quantized";
  }
  return "?";
}

Result<ServeFormat> ServeFormatFromName(std::string_view name) {
  if (name == "bf16") return ServeFormat::kBF16;
  if (name == "fp16" || name == "f16") return ServeFormat::kF16;
  return TERN_ERROR(kInvalidArgument, "unknown serve format '", name, "' (bf16 or fp16)");
}

DType ServeDType(ServeFormat format) {
  return format == ServeFormat::kF16 ? DType::kF16 : DType::kBF16;
}

}  // namespace tern
