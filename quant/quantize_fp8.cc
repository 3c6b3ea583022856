// FP8 (E4M3FN / E5M2) with per-tensor, per-output-channel and 128x128 block
// scales. Scale arithmetic follows DeepSeek-V3 and vLLM: s = amax / max_code
// (448 for E4M3), code = RNE(clamp(x / s, -max, max)), dequant x = code * s.
#include <algorithm>
#include <cmath>

#include "quant/minifloat.h"
#include "quant/quantize_internal.h"

namespace tern::quant {
namespace {

constexpr uint64_t kBlock = 128;

// Element (row r, column i) belongs to group
// RowGroup(r) * col_groups + i / col_width.
struct Grouping {
  uint64_t row_groups = 1;
  uint64_t col_groups = 1;
  uint64_t col_width = 0;
  uint64_t out_blocks = 1;  // block scheme: ceil(out / 128)
  QuantScheme scheme = QuantScheme::kFp8Tensor;
  uint64_t out = 0;

  uint64_t RowGroup(uint64_t r) const {
    switch (scheme) {
      case QuantScheme::kFp8Tensor:
        return 0;
      case QuantScheme::kFp8Channel:
        return r;
      default:
        return (r / out) * out_blocks + (r % out) / kBlock;
    }
  }
  uint64_t groups() const { return row_groups * col_groups; }
};

Grouping MakeGrouping(QuantScheme scheme, const Dims& d) {
  Grouping g;
  g.scheme = scheme;
  g.out = d.out;
  g.col_width = d.in;
  if (scheme == QuantScheme::kFp8Channel) g.row_groups = d.lead * d.out;
  if (scheme == QuantScheme::kFp8Block128) {
    g.out_blocks = (d.out + kBlock - 1) / kBlock;
    g.row_groups = d.lead * g.out_blocks;
    g.col_groups = (d.in + kBlock - 1) / kBlock;
    g.col_width = kBlock;
  }
  return g;
}

std::vector<uint64_t> ScaleShape(QuantScheme scheme, const std::vector<uint64_t>& shape,
                                 const Grouping& g) {
  if (scheme == QuantScheme::kFp8Tensor) return {1};
  std::vector<uint64_t> s(shape.begin(), shape.end() - 2);
  if (scheme == QuantScheme::kFp8Channel) {
    s.push_back(shape[shape.size() - 2]);
    s.push_back(1);
  } else {
    s.push_back(g.out_blocks);
    s.push_back(g.col_groups);
  }
  return s;
}

const char* ScaleSuffix(QuantScheme scheme) {
  return scheme == QuantScheme::kFp8Block128 ? ".weight_scale_inv" : ".weight_scale";
}

}  // namespace

Result<Quantized> QuantizeFp8(const QuantSpec& spec, const float* master,
                              const std::vector<uint64_t>& shape, const Dims& d,
                              const Quantized* previous, const ScalePolicy& policy,
                              const float* tensor_scale) {
  TERN_REQUIRE(spec.code_dtype == DType::kF8E4M3 || spec.code_dtype == DType::kF8E5M2,
               kInvalidArgument, "FP8 codes must be F8_E4M3 or F8_E5M2");
  TERN_REQUIRE(spec.scheme != QuantScheme::kFp8Block128 || spec.code_dtype == DType::kF8E4M3,
               kInvalidArgument, "128x128 block scales are defined for E4M3 only");
  const MiniFloat& fmt = spec.code_dtype == DType::kF8E4M3 ? kE4M3 : kE5M2;
  const Grouping g = MakeGrouping(spec.scheme, d);
  const std::vector<uint64_t> scale_shape = ScaleShape(spec.scheme, shape, g);
  const char* scale_suffix = ScaleSuffix(spec.scheme);
  TERN_ASSIGN_OR_RETURN(const QuantTensor* prev,
                        FindPrevious(previous, scale_suffix, DType::kF32, scale_shape));

  const uint64_t rows = d.lead * d.out;
  std::vector<float> amax(g.groups(), 0.0f);
  for (uint64_t r = 0; r < rows; ++r) {
    const float* row = master + r * d.in;
    float* gm = amax.data() + g.RowGroup(r) * g.col_groups;
    for (uint64_t c = 0; c < g.col_groups; ++c) {
      const uint64_t begin = c * g.col_width;
      const uint64_t n = std::min(g.col_width, d.in - begin);
      gm[c] = std::max(gm[c], AbsMax(row + begin, n));
    }
  }

  Quantized q;
  q.tensors.push_back(NewTensor(".weight", spec.code_dtype, shape));
  q.tensors.push_back(NewTensor(scale_suffix, DType::kF32, scale_shape));
  QuantTensor& codes = q.tensors[0];
  QuantTensor& scales = q.tensors[1];
  std::vector<float> scale(g.groups());
  q.scale_groups = g.groups();
  if (spec.scheme == QuantScheme::kFp8Tensor) {
    // One group; its scale may be shared with the other parts of a fused layer.
    const float old = prev ? Load<float>(*prev, 0) : 0.0f;
    bool kept;
    TERN_ASSIGN_OR_RETURN(scale[0], ChooseTensorScale(spec, amax[0], prev ? &old : nullptr,
                                                      tensor_scale, policy, &kept));
    q.rescaled_groups += !kept;
    Store<float>(scales, 0, scale[0]);
  }
  for (uint64_t k = 0; k < g.groups() && spec.scheme != QuantScheme::kFp8Tensor; ++k) {
    // An all-zero group quantizes to zero codes under any scale; 1 keeps the
    // dequant multiplier finite.
    const float fresh = amax[k] > 0.0f ? amax[k] / fmt.max_value : 1.0f;
    const float old = prev ? Load<float>(*prev, k) : 0.0f;
    // An all-zero group fits any previous scale.
    const float fit = (amax[k] == 0.0f && old > 0.0f) ? old : fresh;
    bool kept;
    scale[k] = ChooseScale(fit, prev ? &old : nullptr, policy, &kept);
    // Headroom must not push the scale to Inf (amax near FLT_MAX).
    if (!std::isfinite(scale[k])) scale[k] = fresh;
    q.rescaled_groups += !kept;
    Store<float>(scales, k, scale[k]);
  }
  for (uint64_t r = 0; r < rows; ++r) {
    const float* row = master + r * d.in;
    uint8_t* out = codes.data.data() + r * d.in;
    const float* gs = scale.data() + g.RowGroup(r) * g.col_groups;
    for (uint64_t c = 0; c < g.col_groups; ++c) {
      const uint64_t begin = c * g.col_width;
      const uint64_t end = std::min(begin + g.col_width, d.in);
      const float s = gs[c];
      for (uint64_t i = begin; i < end; ++i) {
        const float v = std::clamp(row[i] / s, -fmt.max_value, fmt.max_value);
        out[i] = EncodeMini(v, fmt, /*saturate=*/true);
      }
    }
  }
  return q;
}

Result<std::vector<float>> DequantizeFp8(const QuantSpec& spec, const Quantized& q,
                                         const std::vector<uint64_t>& shape, const Dims& d) {
  const MiniFloat& fmt = spec.code_dtype == DType::kF8E4M3 ? kE4M3 : kE5M2;
  const Grouping g = MakeGrouping(spec.scheme, d);
  TERN_ASSIGN_OR_RETURN(const QuantTensor* codes, FindChecked(q, ".weight", spec.code_dtype, shape));
  TERN_ASSIGN_OR_RETURN(const QuantTensor* scales,
                        FindChecked(q, ScaleSuffix(spec.scheme), DType::kF32,
                                    ScaleShape(spec.scheme, shape, g)));
  float lut[256];
  for (int c = 0; c < 256; ++c) lut[c] = DecodeMini(static_cast<uint8_t>(c), fmt);
  std::vector<float> out(d.count);
  for (uint64_t r = 0; r < d.lead * d.out; ++r) {
    const uint64_t base = g.RowGroup(r) * g.col_groups;
    for (uint64_t i = 0; i < d.in; ++i) {
      const float s = Load<float>(*scales, base + i / g.col_width);
      out[r * d.in + i] = lut[codes->data[r * d.in + i]] * s;
    }
  }
  return out;
}

}  // namespace tern::quant
