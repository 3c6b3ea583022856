// The RL trace generator: consecutive serve views of a small decoder-only
// transformer whose FP32 master weights follow Adam at RL learning rates.
// It is the workload of tests, benchmarks and `tern datagen`.
//
// Contract:
//  * Deterministic: a (TraceConfig, step) pair gives the same view bytes on
//    every machine and for any thread count. Every random number is a pure
//    function of (seed, tensor name, step, element index) drawn from a
//    counter-based generator, and the arithmetic avoids libm and FMA
//    contraction, so no result depends on scheduling or on the math library.
//  * Two halves kept apart: the master trajectory (FP32 weights, Adam moments,
//    synthetic dense gradients) and the serve-view cast (ServeFormat). Issue 3's
//    quantized formats add a ServeFormat and its cast, nothing else.
//  * Memory: 12 bytes per parameter (weights, first and second moments) plus
//    the view; gradients are regenerated, never stored, and the previous view
//    is compared block by block while it is overwritten.
//
// Thread safety: one thread drives a TraceGenerator; it fans work out over the
// ThreadPool it was given. view() stays valid, and its bytes unchanged, until
// the next Step().
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tern/dtype.h"
#include "tern/export.h"
#include "tern/quantize.h"
#include "tern/status.h"
#include "tern/view.h"

namespace tern {

class ThreadPool;

// A Llama/Qwen-style layout: untied embeddings and LM head, grouped-query
// attention without biases, SwiGLU MLP (or fused experts:
// num_local_experts), RMSNorm. Field names follow HF's config.json.
struct ModelShape {
  uint64_t hidden_size = 0;
  uint64_t intermediate_size = 0;
  uint64_t num_hidden_layers = 0;
  uint64_t num_attention_heads = 0;
  uint64_t num_key_value_heads = 0;
  uint64_t head_dim = 0;
  uint64_t vocab_size = 0;
  // 0: a dense SwiGLU MLP. Otherwise each layer's MLP is this many experts
  // of intermediate_size, fused as [experts, out, in] tensors
  // (mlp.experts.gate_up_proj.weight [E, 2I, H], mlp.experts.down_proj.weight
  // [E, H, I], the layout `tern cast`'s mxfp4 quantizes) with a router
  // (mlp.router.weight [E, H]). Synthetic: no engine loads this model; it is
  // the workload for measuring MoE serve views.
  uint64_t num_local_experts = 0;
  uint64_t num_experts_per_tok = 0;  // config.json only (how many experts a token uses)

  TERN_EXPORT uint64_t parameters() const;
  // kInvalidArgument unless every field but the two expert ones is positive
  // and all are consistent (hidden_size == heads * head_dim, heads a multiple
  // of kv heads, 0 < num_experts_per_tok <= num_local_experts <= 1024 or
  // both 0) and the parameter count stays below 2^50.
  TERN_EXPORT Status Validate() const;
};

// A shape with about `params` parameters (within a few percent for 1e6 and
// more): head_dim 64, ~128 hidden units per layer, 4:1 GQA, intermediate
// ~8/3 hidden, a vocabulary of up to 32000 taking ~15% of small models.
// With `experts` > 0 the MLPs are that many experts each (intermediate =
// hidden, as gpt-oss; clamp(experts / 2, 1, 4) of them per token) and the
// budget includes all of them. kOutOfRange outside [1e5, 1e12] parameters,
// past 1024 experts, or for more experts than the budget holds (the
// narrowest such model would be over 1.25x the budget).
TERN_EXPORT Result<ModelShape> ChooseModelShape(uint64_t params, uint64_t experts = 0);

// The tensors of `shape` in HF names (model.embed_tokens.weight,
// model.layers.{i}.self_attn.q_proj.weight, ..., lm_head.weight), in
// layer order (not sorted), all of `dtype`. Linear weights are [out, in].
TERN_EXPORT std::vector<TensorDesc> ModelTensors(const ModelShape& shape, DType dtype);

// An HF-style config.json ("architectures": ["LlamaForCausalLM"], ...; with
// experts, tern's synthetic "TernSyntheticMoeForCausalLM", which no engine
// loads) for `shape` served as `dtype` (torch_dtype), newline-terminated.
TERN_EXPORT std::string ModelConfigJson(const ModelShape& shape, DType dtype);

// How the serve view is cast from the master weights.
enum class ServeFormat : uint8_t {
  kBF16 = 0,  // round-to-nearest-even, as torch .to(torch.bfloat16)
  kF16 = 1,   // round-to-nearest-even, as torch .to(torch.float16)
  // TraceConfig::quant, laid out as `tern cast` writes it (PlanQuantTensor:
  // codes + scales under the cast's names; norms, embeddings and lm_head
  // BF16). Each step quantizes with the previous step's output as `previous`,
  // so TraceConfig::scale_policy applies across steps.
  kQuantized = 2,
};
TERN_EXPORT std::string_view ServeFormatName(ServeFormat format);  // "bf16"
// bf16 or fp16 (kQuantized needs a QuantSpec: see ParseQuantFormat).
TERN_EXPORT Result<ServeFormat> ServeFormatFromName(std::string_view name);
// The dtype of the view's float tensors (BF16 for kQuantized: the unquantized
// tensors and config.json's torch_dtype).
TERN_EXPORT DType ServeDType(ServeFormat format);

// Adam with decoupled weight decay (AdamW when weight_decay > 0), PyTorch's
// update formula, FP32 arithmetic.
struct AdamConfig {
  double lr = 1e-6;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

struct TraceConfig {
  ModelShape shape;
  uint64_t seed = 0;
  AdamConfig adam;
  // Gradient of element e at step t: scale(tensor) * (signal_to_noise * d_e +
  // n_{e,t}), with d_e a fixed per-element direction and n fresh noise, both
  // unit-variance. High values make Adam push every weight by ~lr per step;
  // 0 makes the master a random walk with shrinking steps.
  double signal_to_noise = 1.0;
  ServeFormat format = ServeFormat::kBF16;
  QuantSpec quant;           // kQuantized only; a plain bf16/fp16 spec is refused
  ScalePolicy scale_policy;  // kQuantized only

  // kInvalidArgument for a bad shape or optimizer setting (what Create checks).
  TERN_EXPORT Status Validate() const;
};

struct StepStats {
  uint64_t step = 0;      // the version the view now holds (0 = initial)
  uint64_t changed = 0;   // elements whose bits differ from the previous view
  uint64_t elements = 0;  // elements in the view
  std::vector<uint64_t> changed_per_tensor;  // in view().tensors order
  // kQuantized: scale groups re-scaled by this step's Quantize calls, out of
  // all (Quantized::rescaled_groups / scale_groups summed); 0 otherwise.
  uint64_t rescaled_groups = 0;
  uint64_t scale_groups = 0;
  double changed_fraction() const {
    return elements ? static_cast<double>(changed) / static_cast<double>(elements) : 0.0;
  }
};

class TERN_EXPORT TraceGenerator {
 public:
  // Allocates and initializes step 0 (weights ~N(0, 0.02), output
  // projections scaled by 1/sqrt(2 layers), norms ~1.0, zero moments).
  // kInvalidArgument for a bad shape or optimizer setting,
  // kResourceExhausted when memory cannot be had.
  static Result<std::unique_ptr<TraceGenerator>> Create(const TraceConfig& config,
                                                        ThreadPool& pool);
  ~TraceGenerator();
  TraceGenerator(const TraceGenerator&) = delete;
  TraceGenerator& operator=(const TraceGenerator&) = delete;

  // One optimizer step: new gradients, Adam, recast the view; last_stats()
  // then counts the elements that changed against the previous view. The
  // master trajectory does not depend on the serve format. An error
  // (a quantizer refusing the master) leaves the generator unusable.
  Status Step();

  uint64_t step() const;
  const ServeView& view() const;  // sorted by name
  const StepStats& last_stats() const;
  const TraceConfig& config() const;
  // The FP32 master weights of a model tensor (ModelTensors name), valid
  // until the next Step(); kNotFound for another name. For tests and error
  // measurements.
  Result<std::span<const float>> master(std::string_view name) const;
  // config.json for the view: ModelConfigJson plus, for kQuantized, the
  // quantization_config.
  std::string config_json() const;
  // Bytes held: master, moments and view.
  uint64_t memory_bytes() const;
  // What Create would hold for `shape` and `format`, to check before allocating.
  static uint64_t MemoryBytesFor(const ModelShape& shape, ServeFormat format);

 private:
  struct Impl;
  explicit TraceGenerator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Writes the generator's current view as a checkpoint directory at `path`
// (sharded by options.shard_bytes_max), tensors in the reference writer's
// order, "tern.trace.step" added to the metadata and config.json beside the
// weights: what `tern datagen` writes per step, and what the agent demo
// publishes. Atomic: nothing at path on error.
struct CreateOptions;
TERN_EXPORT Status WriteTraceCheckpoint(const TraceGenerator& gen, const std::string& path,
                                        const std::map<std::string, std::string>& base_metadata,
                                        const CreateOptions& options, ThreadPool& pool);

}  // namespace tern
