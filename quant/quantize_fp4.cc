// 4-bit floats (E2M1, two per byte, even element in the low nibble):
//  * NVFP4: an E4M3 scale per 16 elements under an FP32 global scale.
//    ModelOpt:           scale_2 = amax / (6 * 448);  block = E4M3((bmax / 6) / scale_2)
//                        x ~ code * block * scale_2
//    compressed-tensors: global = (6 * 448) / amax;   block = E4M3(global * (bmax / 6))
//                        x ~ code * (block / global)
//  * MXFP4 (OCP Microscaling v1.0): an E8M0 power of two per 32 elements,
//    X = 2^(floor(log2(bmax)) - 2), codes saturate at 6; gpt-oss layout.
// Codes round to nearest even from x / effective_scale, saturating at +-6.
#include <algorithm>
#include <cmath>

#include "quant/minifloat.h"
#include "quant/quantize_internal.h"

namespace tern::quant {
namespace {

struct Fp4Layout {
  uint64_t block = 16;
  const char* codes = ".weight";
  const char* scales = ".weight_scale";
  const char* global = ".weight_scale_2";  // null for MXFP4
  std::vector<uint64_t> codes_shape;
  std::vector<uint64_t> scales_shape;
  DType scale_dtype = DType::kF8E4M3;
};

Result<Fp4Layout> MakeLayout(const QuantSpec& spec, const std::vector<uint64_t>& shape,
                             const Dims& d) {
  Fp4Layout l;
  std::vector<uint64_t> lead_out(shape.begin(), shape.end() - 1);
  if (spec.scheme == QuantScheme::kMxfp4) {
    l.block = 32;
    l.codes = "_blocks";
    l.scales = "_scales";
    l.global = nullptr;
    l.scale_dtype = DType::kU8;  // gpt-oss stores E8M0 as U8
  } else if (spec.scheme == QuantScheme::kNvfp4Ct) {
    l.codes = ".weight_packed";
    l.global = ".weight_global_scale";
  }
  TERN_REQUIRE(d.in % l.block == 0, kInvalidArgument, spec.name, " needs in-features divisible by ",
               l.block, "; got ", d.in, " (keep this tensor unquantized or pad it)");
  l.scales_shape = lead_out;
  l.scales_shape.push_back(d.in / l.block);
  l.codes_shape = lead_out;
  if (spec.scheme == QuantScheme::kMxfp4) {
    l.codes_shape.push_back(d.in / 32);
    l.codes_shape.push_back(16);
  } else {
    l.codes_shape.push_back(d.in / 2);
  }
  return l;
}

// floor(log2(x)) for finite x > 0, exactly (frexp is exact).
int FloorLog2(float x) {
  int e;
  std::frexp(x, &e);
  return e - 1;
}

}  // namespace

Result<Quantized> QuantizeFp4(const QuantSpec& spec, const float* master,
                              const std::vector<uint64_t>& shape, const Dims& d,
                              const Quantized* previous, const ScalePolicy& policy,
                              const float* tensor_scale) {
  TERN_ASSIGN_OR_RETURN(Fp4Layout l, MakeLayout(spec, shape, d));
  const bool mx = spec.scheme == QuantScheme::kMxfp4;
  const bool ct = spec.scheme == QuantScheme::kNvfp4Ct;
  TERN_ASSIGN_OR_RETURN(const QuantTensor* prev_scales,
                        FindPrevious(previous, l.scales, l.scale_dtype, l.scales_shape));
  const QuantTensor* prev_global = nullptr;
  if (!mx) {
    TERN_ASSIGN_OR_RETURN(prev_global, FindPrevious(previous, l.global, DType::kF32, {1}));
  }

  Quantized q;
  q.tensors.push_back(NewTensor(l.codes, DType::kU8, l.codes_shape));
  q.tensors.push_back(NewTensor(l.scales, l.scale_dtype, l.scales_shape));
  const uint64_t blocks = d.count / l.block;
  q.scale_groups = blocks;

  // Global scale (NVFP4), held as ModelOpt's scale_2 = what one unit of the
  // block scale is worth; compressed-tensors stores its reciprocal.
  float scale_2 = 1.0f;
  float global_ct = 1.0f;
  bool global_kept = false;
  if (!mx) {
    const float prev_stored = prev_global != nullptr ? Load<float>(*prev_global, 0) : 0.0f;
    TERN_ASSIGN_OR_RETURN(const float stored,
                          ChooseTensorScale(spec, AbsMax(master, d.count),
                                            prev_global != nullptr ? &prev_stored : nullptr,
                                            tensor_scale, policy, &global_kept));
    (ct ? global_ct : scale_2) = stored;
    q.tensors.push_back(NewTensor(l.global, DType::kF32, {1}));
    Store<float>(q.tensors.back(), 0, ct ? global_ct : scale_2);
    if (!ct) {
      // Static activation scale: a calibration product we cannot derive from
      // weights; 1.0 admits activations up to 2688. See docs/quantization.md.
      q.tensors.push_back(NewTensor(".input_scale", DType::kF32, {1}));
      Store<float>(q.tensors.back(), 0, 1.0f);
    }
  }
  QuantTensor& codes = q.tensors[0];
  QuantTensor& scales = q.tensors[1];

  for (uint64_t b = 0; b < blocks; ++b) {
    const float* x = master + b * l.block;
    const float bmax = AbsMax(x, l.block);
    float eff;  // what one E2M1 unit is worth in this block
    bool kept = false;
    if (mx) {
      // Fresh: 2^(floor(log2 bmax) - 2) per the OCP spec; zero blocks get the
      // smallest scale (any scale represents zeros).
      auto exponent_of = [](float m) {
        return m > 0.0f ? std::clamp(FloorLog2(m) - 2, -127, 127) : -127;
      };
      int e = exponent_of(bmax);
      if (prev_scales != nullptr) {
        const int prev_e = static_cast<int>(prev_scales->data[b]) - 127;
        if (prev_scales->data[b] != 0xFF &&
            (bmax == 0.0f || KeepPrevious(std::ldexp(1.0f, e), std::ldexp(1.0f, prev_e), policy)) &&
            policy.kind == ScalePolicy::Kind::kBand) {
          e = prev_e;
          kept = true;
        }
      }
      if (!kept) e = exponent_of(bmax * RescaleFactor(policy));
      scales.data[b] = static_cast<uint8_t>(e + 127);
      eff = std::ldexp(1.0f, e);
    } else {
      const float want = ct ? global_ct * (bmax / 6.0f) : (bmax / 6.0f) / scale_2;
      uint8_t code = 0;
      if (global_kept && prev_scales != nullptr) {
        const uint8_t prev_code = prev_scales->data[b];
        const float prev = DecodeMini(prev_code, kE4M3);
        if (std::isfinite(prev) && (KeepPrevious(want, prev, policy) || (bmax == 0.0f && prev > 0.0f))) {
          code = prev_code;
          kept = true;
        }
      }
      // Nearest, not rounded up as INT4's scales are: an E4M3 step is 6-12%,
      // and rounding up cost +12% RMSE for 4% fewer patch bytes (benchmarks).
      if (!kept) code = EncodeMini(want * RescaleFactor(policy), kE4M3, /*saturate=*/true);
      scales.data[b] = code;
      const float block_scale = DecodeMini(code, kE4M3);
      eff = ct ? block_scale / global_ct : block_scale * scale_2;
    }
    q.rescaled_groups += !kept;
    uint8_t* out = codes.data.data() + b * l.block / 2;
    for (uint64_t i = 0; i < l.block; i += 2) {
      const uint8_t lo = eff > 0.0f ? EncodeMini(x[i] / eff, kE2M1, true) : 0;
      const uint8_t hi = eff > 0.0f ? EncodeMini(x[i + 1] / eff, kE2M1, true) : 0;
      out[i / 2] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
  return q;
}

Result<std::vector<float>> DequantizeFp4(const QuantSpec& spec, const Quantized& q,
                                         const std::vector<uint64_t>& shape, const Dims& d) {
  TERN_ASSIGN_OR_RETURN(Fp4Layout l, MakeLayout(spec, shape, d));
  const bool mx = spec.scheme == QuantScheme::kMxfp4;
  const bool ct = spec.scheme == QuantScheme::kNvfp4Ct;
  TERN_ASSIGN_OR_RETURN(const QuantTensor* codes, FindChecked(q, l.codes, DType::kU8, l.codes_shape));
  TERN_ASSIGN_OR_RETURN(const QuantTensor* scales,
                        FindChecked(q, l.scales, l.scale_dtype, l.scales_shape));
  float global = 1.0f;
  if (!mx) {
    TERN_ASSIGN_OR_RETURN(const QuantTensor* g, FindChecked(q, l.global, DType::kF32, {1}));
    global = Load<float>(*g, 0);
  }
  std::vector<float> out(d.count);
  for (uint64_t b = 0; b < d.count / l.block; ++b) {
    float eff;
    if (mx) {
      eff = DecodeE8M0(scales->data[b]);
    } else {
      const float s = DecodeMini(scales->data[b], kE4M3);
      eff = ct ? s / global : s * global;
    }
    for (uint64_t i = 0; i < l.block; ++i) {
      const uint64_t k = b * l.block + i;
      const uint8_t byte = codes->data[k / 2];
      out[k] = DecodeMini((k & 1) ? byte >> 4 : byte & 0xF, kE2M1) * eff;
    }
  }
  return out;
}

}  // namespace tern::quant
