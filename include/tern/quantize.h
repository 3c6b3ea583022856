// Quantizers: FP32 master weights -> the tensors a rollout engine loads
// (codes and scales, in the checkpoint layout vLLM / SGLang read).
//
// Contract:
//  * Pure functions over arrays: no file I/O, no globals. The same inputs give
//    the same bytes on every machine (IEEE FP32 arithmetic only, no FMA
//    contraction in the scale math, round-to-nearest-even everywhere).
//  * A weight has shape [lead..., out, in] (rank >= 2); leading dims (MoE
//    experts) are independent matrices. Scales group along `in` (the
//    reduction dim) except 128x128 blocks, which tile [out, in].
//  * Bad input is a Status, never wrong codes: NaN/Inf in the master
//    (kInvalidArgument, naming the element), `in` not divisible by the group
//    where the layout needs it, rank < 2, unknown format names.
//  * docs/quantization.md documents every layout, its rounding and scale
//    arithmetic, and the scale policy's measured trade-off.
//
// Thread safety: all functions are reentrant; Quantized is a plain value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tern/dtype.h"
#include "tern/export.h"
#include "tern/status.h"

namespace tern {

enum class QuantScheme : uint8_t {
  kBF16,          // plain cast, `.weight` BF16
  kF16,           // plain cast, `.weight` F16
  kFp8Tensor,     // `.weight` F8 + `.weight_scale` F32 [1]
  kFp8Channel,    // `.weight` F8 + `.weight_scale` F32 [lead..., out, 1]
  kFp8Block128,   // DeepSeek-V3: `.weight` F8_E4M3 + `.weight_scale_inv` F32
                  // [lead..., ceil(out/128), ceil(in/128)]
  kNvfp4,         // ModelOpt: `.weight` U8 [.., out, in/2], `.weight_scale`
                  // F8_E4M3 [.., out, in/16], `.weight_scale_2` F32 [1],
                  // `.input_scale` F32 [1] (1.0: static activation scale
                  // is a calibration product we do not have)
  kNvfp4Ct,       // compressed-tensors: `.weight_packed`, `.weight_scale`,
                  // `.weight_global_scale` F32 [1] = 1 / ModelOpt's scale_2
  kMxfp4,         // gpt-oss: `_blocks` U8 [.., out, in/32, 16] and `_scales`
                  // U8 (E8M0) [.., out, in/32]
  kInt4Pack,      // compressed-tensors pack-quantized: `.weight_packed` I32
                  // [.., out, in/8], `.weight_scale` BF16 [.., out, in/g],
                  // `.weight_zero_point` I32 [.., ceil(out/8), in/g] (asym),
                  // `.weight_shape` I64 [2]
  kGptqInt4,      // GPTQ (v1 zeros): `.qweight` I32 [in/8, out], `.qzeros`
                  // I32 [in/g, out/8], `.scales` F16 [in/g, out], `.g_idx`
                  // I32 [in]; symmetric only
};

struct QuantSpec {
  QuantScheme scheme = QuantScheme::kBF16;
  DType code_dtype = DType::kBF16;  // element dtype for FP8 (E4M3 or E5M2)
  uint32_t group = 0;               // elements per scale along `in` (INT4)
  bool symmetric = true;            // INT4 only
  std::string name;                 // canonical format name
};

// Parses a format name: bf16, fp16, fp8-e4m3-tensor, fp8-e4m3-channel,
// fp8-e4m3-block128, fp8-e5m2-tensor, fp8-e5m2-channel, nvfp4, nvfp4-ct,
// mxfp4, int4-g{32,64,128}[-asym], gptq-int4-g{32,64,128}.
TERN_EXPORT Result<QuantSpec> ParseQuantFormat(std::string_view name);
// Every name ParseQuantFormat accepts, for --help and tests.
TERN_EXPORT std::vector<std::string> QuantFormatNames();

// One output tensor: full name = weight prefix + suffix (".weight",
// ".weight_scale_inv", "_blocks", ...). Data is little-endian, row-major.
struct QuantTensor {
  std::string suffix;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> data;
};

struct Quantized {
  std::vector<QuantTensor> tensors;
  // Groups whose scale was recomputed (the rest kept the previous scale),
  // out of all scale groups; both 0 for plain casts.
  uint64_t rescaled_groups = 0;
  uint64_t scale_groups = 0;

  const QuantTensor* Find(std::string_view suffix) const;
};

// When to keep a previous scale. Re-quantizing from scratch (kFresh, which
// matches the reference quantizers bit for bit) rewrites every group whose max
// moved. kBand keeps a group's previous scale s_prev while the freshly computed
// scale s_new satisfies  band_low * s_prev <= s_new <= s_prev  (the group
// still fits without clipping and uses at least band_low of the range; for
// scales stored in a narrow dtype s_prev is the stored, decoded value). A group
// outside the band, or without a previous state, gets s_new * headroom (INT4's
// BF16/F16 scales round up, NVFP4's E4M3 ones to nearest), so that the small
// upward drift of an RL step does not force a re-scale next time.
struct ScalePolicy {
  enum class Kind : uint8_t { kFresh, kBand };
  Kind kind = Kind::kBand;
  // Defaults: the measured sweet spot (docs/benchmarks.md, "Quantized serve
  // views"): free for FP8; for INT4 -30..-60% patch bytes at +1% RMSE.
  float band_low = 0.9f;   // in (0, 1]
  float headroom = 1.01f;  // in [1, 2]
};

// Formats with one scale for a whole tensor: fp8-*-tensor (`.weight_scale`),
// nvfp4 (`.weight_scale_2`) and nvfp4-ct (`.weight_global_scale`). Engines
// fuse q/k/v and gate/up into one matrix with one such scale (vLLM keeps the
// parts' max: it re-quantizes FP8 parts to it, and mis-scales NVFP4 parts
// that differ), so the parts of a fused layer must share it: pass the result
// of TensorScale to Quantize for each part (FusedLayerKey in quant_plan.h
// names the parts).
TERN_EXPORT bool HasTensorScale(const QuantSpec& spec);

// The per-tensor scale, as stored, for weights whose largest |x| is `amax`
// (over all parts of a fused layer). `previous` is the stored scale of the
// last step (shared by all parts), or null; ScalePolicy::kBand keeps it while
// the band allows, exactly as Quantize does for a single tensor.
// Precondition: HasTensorScale(spec), amax finite and >= 0.
TERN_EXPORT float TensorScale(const QuantSpec& spec, float amax, const float* previous,
                              const ScalePolicy& policy);

// Quantizes `master` (FP32, `shape` = [lead..., out, in]). `previous` is the
// output of the last call for the same tensor and spec (or null); with
// ScalePolicy::kBand its scales are reused where the band allows. A previous
// state of another shape or layout is kMismatch. `tensor_scale` (formats with
// HasTensorScale only; null: derived from this tensor) is the stored
// per-tensor scale to use; it must cover this tensor's values (be at least
// as coarse as the one derived from it alone), else kInvalidArgument.
TERN_EXPORT Result<Quantized> Quantize(const QuantSpec& spec, const float* master,
                                       const std::vector<uint64_t>& shape,
                                       const Quantized* previous, const ScalePolicy& policy,
                                       const float* tensor_scale = nullptr);

// Dequantizes back to FP32 (the engine's arithmetic), for tests, error
// measurements and `tern` diagnostics. Validates every tensor's dtype and
// shape against spec and `shape` (kCorrupt on mismatch).
TERN_EXPORT Result<std::vector<float>> Dequantize(const QuantSpec& spec, const Quantized& q,
                                                  const std::vector<uint64_t>& shape);

// The `quantization_config` object for config.json that makes vLLM / SGLang
// load this layout (empty string for plain casts).
TERN_EXPORT std::string QuantizationConfigJson(const QuantSpec& spec);

}  // namespace tern
