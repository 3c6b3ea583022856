// Format names, shape checks and dispatch for the quantizers; the formats themselves live in quantize_{fp8,fp4,int4}.cc.
#include <cmath>
#include <string>

#include "quant/quantize_internal.h"
#include "tern/float_cast.h"

namespace tern {
namespace quant {

Result<Dims> CheckShape(const std::vector<uint64_t>& shape) {
  TERN_REQUIRE(shape.size() >= 2, kInvalidArgument,
               "quantized weights need shape [..., out, in]; got rank ", shape.size());
  Dims d;
  for (size_t i = 0; i + 2 < shape.size(); ++i) {
    TERN_REQUIRE(shape[i] > 0, kInvalidArgument, "dimension ", i, " is 0");
    TERN_REQUIRE(!__builtin_mul_overflow(d.lead, shape[i], &d.lead), kOutOfRange,
                 "shape overflows 64 bits");
  }
  d.out = shape[shape.size() - 2];
  d.in = shape.back();
  TERN_REQUIRE(d.out > 0 && d.in > 0, kInvalidArgument, "empty weight (out or in is 0)");
  uint64_t rows;
  TERN_REQUIRE(!__builtin_mul_overflow(d.lead, d.out, &rows) &&
                   !__builtin_mul_overflow(rows, d.in, &d.count) && d.count <= (1ull << 62),
               kOutOfRange, "shape overflows 64 bits");
  return d;
}

Status CheckFinite(const float* x, uint64_t n) {
  // Branch-free scan first (vectorises); locate the culprit only on failure.
  uint32_t bad = 0;
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    bad |= (u & 0x7F800000u) == 0x7F800000u;
  }
  if (!bad) return Status::Ok();
  for (uint64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {
      return TERN_ERROR(kInvalidArgument, "master weight element ", i, " is ", x[i],
                        "; NaN/Inf cannot be quantized (fix the trainer's weights)");
    }
  }
  return Status::Ok();
}

float AbsMax(const float* x, uint64_t n) {
  float m = 0.0f;
  for (uint64_t i = 0; i < n; ++i) m = std::fmax(m, std::fabs(x[i]));
  return m;
}

QuantTensor NewTensor(std::string_view suffix, DType dtype, std::vector<uint64_t> shape) {
  QuantTensor t;
  t.suffix = std::string(suffix);
  t.dtype = dtype;
  uint64_t n = 1;
  for (uint64_t s : shape) n *= s;  // shapes come from CheckShape-bounded dims
  t.shape = std::move(shape);
  t.data.assign(DTypeBytes(dtype, n), 0);
  return t;
}

namespace {
std::string ShapeString(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The error code depends on whose bytes these are (a caller's previous
// state: kMismatch; a tensor to decode: kCorrupt), so no TERN_REQUIRE here.
Result<const QuantTensor*> Lookup(const Quantized& q, std::string_view suffix, DType dtype,
                                  const std::vector<uint64_t>& shape, Code code,
                                  const char* what) {
  auto fail = [&](const std::string& msg) {
    return Status(code, internal::Where(__FILE__, __LINE__) + what + msg);
  };
  const QuantTensor* t = q.Find(suffix);
  if (t == nullptr) return fail(internal::StrCat(" has no tensor '", suffix, "'"));
  if (t->dtype != dtype || t->shape != shape) {
    return fail(internal::StrCat(" tensor '", suffix, "' is ", DTypeName(t->dtype), " ",
                                 ShapeString(t->shape), ", expected ", DTypeName(dtype), " ",
                                 ShapeString(shape)));
  }
  uint64_t n = 1;
  for (uint64_t s : shape) n *= s;
  if (t->data.size() != DTypeBytes(dtype, n)) {
    return fail(internal::StrCat(" tensor '", suffix, "' has ", t->data.size(),
                                 " bytes, expected ", DTypeBytes(dtype, n)));
  }
  return t;
}
}  // namespace

Result<const QuantTensor*> FindPrevious(const Quantized* previous, std::string_view suffix,
                                        DType dtype, const std::vector<uint64_t>& shape) {
  if (previous == nullptr) return static_cast<const QuantTensor*>(nullptr);
  return Lookup(*previous, suffix, dtype, shape, Code::kMismatch, "previous quantized state");
}

Result<const QuantTensor*> FindChecked(const Quantized& q, std::string_view suffix, DType dtype,
                                       const std::vector<uint64_t>& shape) {
  return Lookup(q, suffix, dtype, shape, Code::kCorrupt, "quantized weight");
}

namespace {
constexpr float kNvfp4GlobalRange = 6.0f * 448.0f;  // E2M1 max * E4M3 max

float Fp8Max(const QuantSpec& spec) { return spec.code_dtype == DType::kF8E5M2 ? 57344.0f : 448.0f; }

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
}  // namespace

Result<float> ChooseTensorScale(const QuantSpec& spec, float amax, const float* previous,
                                const float* shared, const ScalePolicy& policy, bool* kept) {
  float s;
  if (shared == nullptr) {
    s = TensorScale(spec, amax, previous, policy);
  } else {
    s = *shared;
    const bool ct = spec.scheme == QuantScheme::kNvfp4Ct;
    const float max = spec.scheme == QuantScheme::kFp8Tensor ? Fp8Max(spec) : kNvfp4GlobalRange;
    // nvfp4-ct stores the reciprocal (codes per unit), so coarser is smaller.
    // A few ulp of slack: a kept previous scale was compared in its
    // reciprocal form, and the encoders saturate anyway.
    constexpr float kSlack = 1.0f + 1e-6f;
    const bool covers = amax == 0.0f || (ct ? s <= kSlack * (max / amax) : kSlack * s >= amax / max);
    TERN_REQUIRE(std::isfinite(s) && s > 0.0f && covers, kInvalidArgument, spec.name,
                 ": shared per-tensor scale ", s, " does not cover this tensor's amax ", amax,
                 " (compute it with TensorScale over every part of the fused layer)");
  }
  *kept = previous != nullptr && Bits(s) == Bits(*previous);
  return s;
}

}  // namespace quant

using namespace quant;

bool HasTensorScale(const QuantSpec& spec) {
  return spec.scheme == QuantScheme::kFp8Tensor || spec.scheme == QuantScheme::kNvfp4 ||
         spec.scheme == QuantScheme::kNvfp4Ct;
}

float TensorScale(const QuantSpec& spec, float amax, const float* previous,
                  const ScalePolicy& policy) {
  TERN_ASSERT(HasTensorScale(spec), "TensorScale: ", spec.name, " has no per-tensor scale");
  if (spec.scheme == QuantScheme::kFp8Tensor) {
    // An all-zero tensor quantizes to zero codes under any scale (and fits any
    // previous one); 1 keeps the dequant multiplier finite.
    const float fresh = amax > 0.0f ? amax / Fp8Max(spec) : 1.0f;
    const float old = previous ? *previous : 0.0f;
    const float fit = (amax == 0.0f && old > 0.0f) ? old : fresh;
    bool kept;
    const float s = ChooseScale(fit, previous ? &old : nullptr, policy, &kept);
    // Headroom must not push the scale to Inf (amax near FLT_MAX).
    return std::isfinite(s) ? s : fresh;
  }
  // NVFP4, held as ModelOpt's scale_2 = what one unit of a block scale is
  // worth; compressed-tensors stores its reciprocal.
  const bool ct = spec.scheme == QuantScheme::kNvfp4Ct;
  const float fresh = amax / kNvfp4GlobalRange;
  if (previous != nullptr) {
    const float prev_scale_2 = ct ? 1.0f / *previous : *previous;
    if (amax > 0.0f && std::isfinite(prev_scale_2) && KeepPrevious(fresh, prev_scale_2, policy))
      return *previous;
  }
  if (amax == 0.0f) return 1.0f;
  const float a = amax * RescaleFactor(policy);
  return ct ? kNvfp4GlobalRange / a : a / kNvfp4GlobalRange;
}

const QuantTensor* Quantized::Find(std::string_view suffix) const {
  for (const QuantTensor& t : tensors)
    if (t.suffix == suffix) return &t;
  return nullptr;
}

std::vector<std::string> QuantFormatNames() {
  std::vector<std::string> names = {"bf16",           "fp16",           "fp8-e4m3-tensor",
                                    "fp8-e4m3-channel", "fp8-e4m3-block128", "fp8-e5m2-tensor",
                                    "fp8-e5m2-channel", "nvfp4",          "nvfp4-ct",
                                    "mxfp4"};
  for (const char* g : {"32", "64", "128"}) {
    names.push_back(std::string("int4-g") + g);
    names.push_back(std::string("int4-g") + g + "-asym");
    names.push_back(std::string("gptq-int4-g") + g);
  }
  return names;
}

Result<QuantSpec> ParseQuantFormat(std::string_view name) {
  QuantSpec s;
  s.name = std::string(name);
  auto fp8 = [&](QuantScheme scheme, DType dtype) {
    s.scheme = scheme;
    s.code_dtype = dtype;
    return s;
  };
  if (name == "bf16") return fp8(QuantScheme::kBF16, DType::kBF16);
  if (name == "fp16") return fp8(QuantScheme::kF16, DType::kF16);
  if (name == "fp8-e4m3-tensor") return fp8(QuantScheme::kFp8Tensor, DType::kF8E4M3);
  if (name == "fp8-e4m3-channel") return fp8(QuantScheme::kFp8Channel, DType::kF8E4M3);
  if (name == "fp8-e4m3-block128") return fp8(QuantScheme::kFp8Block128, DType::kF8E4M3);
  if (name == "fp8-e5m2-tensor") return fp8(QuantScheme::kFp8Tensor, DType::kF8E5M2);
  if (name == "fp8-e5m2-channel") return fp8(QuantScheme::kFp8Channel, DType::kF8E5M2);
  if (name == "nvfp4") return fp8(QuantScheme::kNvfp4, DType::kF4);
  if (name == "nvfp4-ct") return fp8(QuantScheme::kNvfp4Ct, DType::kF4);
  if (name == "mxfp4") return fp8(QuantScheme::kMxfp4, DType::kF4);
  std::string_view rest = name;
  bool gptq = false;
  if (rest.substr(0, 5) == "gptq-") gptq = true, rest.remove_prefix(5);
  if (rest.substr(0, 6) == "int4-g") {
    rest.remove_prefix(6);
    bool asym = false;
    if (rest.size() > 5 && rest.substr(rest.size() - 5) == "-asym") {
      asym = true;
      rest.remove_suffix(5);
    }
    if ((rest == "32" || rest == "64" || rest == "128") && !(gptq && asym)) {
      s.scheme = gptq ? QuantScheme::kGptqInt4 : QuantScheme::kInt4Pack;
      s.code_dtype = DType::kI32;
      s.group = static_cast<uint32_t>(std::stoul(std::string(rest)));
      s.symmetric = !asym;
      return s;
    }
  }
  std::string known;
  for (const std::string& n : QuantFormatNames()) known += (known.empty() ? "" : ", ") + n;
  return TERN_ERROR(kInvalidArgument, "unknown quantization format '", name, "' (known: ", known,
                    ")");
}

Result<Quantized> Quantize(const QuantSpec& spec, const float* master,
                           const std::vector<uint64_t>& shape, const Quantized* previous,
                           const ScalePolicy& policy, const float* tensor_scale) {
  TERN_ASSIGN_OR_RETURN(Dims d, CheckShape(shape));
  TERN_REQUIRE(tensor_scale == nullptr || HasTensorScale(spec), kInvalidArgument, spec.name,
               " has no per-tensor scale to share");
  TERN_REQUIRE(policy.band_low > 0.0f && policy.band_low <= 1.0f, kInvalidArgument,
               "scale policy band_low must be in (0, 1], got ", policy.band_low);
  TERN_REQUIRE(policy.headroom >= 1.0f && policy.headroom <= 2.0f, kInvalidArgument,
               "scale policy headroom must be in [1, 2], got ", policy.headroom);
  TERN_RETURN_IF_ERROR(CheckFinite(master, d.count));
  switch (spec.scheme) {
    case QuantScheme::kBF16:
    case QuantScheme::kF16: {
      const bool bf = spec.scheme == QuantScheme::kBF16;
      Quantized q;
      q.tensors.push_back(NewTensor(".weight", bf ? DType::kBF16 : DType::kF16, shape));
      auto* out = reinterpret_cast<uint16_t*>(q.tensors[0].data.data());
      if (bf) {
        CastF32ToBF16(master, out, d.count);
      } else {
        CastF32ToF16(master, out, d.count);
      }
      return q;
    }
    case QuantScheme::kFp8Tensor:
    case QuantScheme::kFp8Channel:
    case QuantScheme::kFp8Block128:
      return QuantizeFp8(spec, master, shape, d, previous, policy, tensor_scale);
    case QuantScheme::kNvfp4:
    case QuantScheme::kNvfp4Ct:
    case QuantScheme::kMxfp4:
      return QuantizeFp4(spec, master, shape, d, previous, policy, tensor_scale);
    case QuantScheme::kInt4Pack:
    case QuantScheme::kGptqInt4:
      return QuantizeInt4(spec, master, shape, d, previous, policy);
  }
  return TERN_ERROR(kInvalidArgument, "unknown quantization scheme ", static_cast<int>(spec.scheme));
}

Result<std::vector<float>> Dequantize(const QuantSpec& spec, const Quantized& q,
                                      const std::vector<uint64_t>& shape) {
  TERN_ASSIGN_OR_RETURN(Dims d, CheckShape(shape));
  switch (spec.scheme) {
    case QuantScheme::kBF16:
    case QuantScheme::kF16: {
      const bool bf = spec.scheme == QuantScheme::kBF16;
      TERN_ASSIGN_OR_RETURN(const QuantTensor* w,
                            FindChecked(q, ".weight", bf ? DType::kBF16 : DType::kF16, shape));
      std::vector<float> out(d.count);
      const auto* in = reinterpret_cast<const uint16_t*>(w->data.data());
      if (bf) {
        CastBF16ToF32(in, out.data(), d.count);
      } else {
        CastF16ToF32(in, out.data(), d.count);
      }
      return out;
    }
    case QuantScheme::kFp8Tensor:
    case QuantScheme::kFp8Channel:
    case QuantScheme::kFp8Block128:
      return DequantizeFp8(spec, q, shape, d);
    case QuantScheme::kNvfp4:
    case QuantScheme::kNvfp4Ct:
    case QuantScheme::kMxfp4:
      return DequantizeFp4(spec, q, shape, d);
    case QuantScheme::kInt4Pack:
    case QuantScheme::kGptqInt4:
      return DequantizeInt4(spec, q, shape, d);
  }
  return TERN_ERROR(kInvalidArgument, "unknown quantization scheme ", static_cast<int>(spec.scheme));
}

}  // namespace tern
