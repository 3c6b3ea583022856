// INT4 groups along `in` (group 32/64/128), two checkpoint layouts:
//  * compressed-tensors pack-quantized: q in [-8, 7] stored as q + 8, eight
//    per I32 along `in` (element i at bits 4 * (i % 8)); BF16 scales;
//    asymmetric zero points in [-8, 7] packed the same way along `out`.
//    symmetric: s = max(amax / 7.5, FLT_EPSILON), q = clamp(rne(x / s), -8, 7)
//    asymmetric: lo = min(min x, 0), hi = max(max x, 0), s = (hi - lo) / 15,
//                zp = clamp(-8 - rne(lo / s), -8, 7), q = clamp(rne(x / s) + zp, -8, 7)
//  * GPTQ (symmetric, desc_act = false): q + 8 in [0, 15] packed eight per
//    I32 along `in` into qweight [in/8, out]; F16 scales [in/g, out]; qzeros
//    hold zero - 1 = 7 in every nibble (the "v1" convention vLLM loads).
// x / s uses the scale as stored (BF16 / F16), so dequant (q - zp) * s is the
// engine's exact arithmetic.
#include <cfloat>
#include <cmath>

#include "quant/cast_internal.h"
#include "quant/quantize_internal.h"

namespace tern::quant {
namespace {

struct Int4Layout {
  bool gptq = false;
  uint64_t groups = 0;  // per row: in / group
};

Result<Int4Layout> MakeLayout(const QuantSpec& spec, const Dims& d) {
  TERN_REQUIRE(d.lead == 1, kInvalidArgument, spec.name,
               " is a per-Linear layout: expects a 2-D [out, in] weight, one call per expert");
  TERN_REQUIRE(spec.group == 32 || spec.group == 64 || spec.group == 128, kInvalidArgument,
               "INT4 group must be 32, 64 or 128, got ", spec.group);
  TERN_REQUIRE(d.in % spec.group == 0, kInvalidArgument, spec.name,
               " needs in-features divisible by the group ", spec.group, "; got ", d.in,
               " (keep this tensor unquantized)");
  Int4Layout l;
  l.gptq = spec.scheme == QuantScheme::kGptqInt4;
  TERN_REQUIRE(!l.gptq || spec.symmetric, kInvalidArgument, "GPTQ output is symmetric only");
  TERN_REQUIRE(!l.gptq || d.out % 8 == 0, kInvalidArgument,
               "GPTQ packs qzeros eight per I32 along out-features; out = ", d.out,
               " is not a multiple of 8");
  l.groups = d.in / spec.group;
  return l;
}

// Scale as stored (BF16 for compressed-tensors, F16 for GPTQ) and decoded.
uint16_t EncodeScale(float s, bool gptq) {
  uint32_t u;
  std::memcpy(&u, &s, 4);
  uint16_t bits = gptq ? F32BitsToF16(u) : F32BitsToBF16(u);
  if ((bits & 0x7FFF) == 0) bits = 1;  // never a zero scale: smallest positive
  return bits;
}
float DecodeScale(uint16_t bits, bool gptq) {
  const uint32_t u = gptq ? F16ToF32Bits(bits) : static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

Result<Quantized> QuantizeInt4(const QuantSpec& spec, const float* master,
                               const std::vector<uint64_t>& shape, const Dims& d,
                               const Quantized* previous, const ScalePolicy& policy) {
  TERN_ASSIGN_OR_RETURN(Int4Layout l, MakeLayout(spec, d));
  const uint64_t out = d.out, in = d.in, g = spec.group, G = l.groups;
  const DType scale_dtype = l.gptq ? DType::kF16 : DType::kBF16;
  const std::vector<uint64_t> scale_shape =
      l.gptq ? std::vector<uint64_t>{G, out} : std::vector<uint64_t>{out, G};
  const char* scale_name = l.gptq ? ".scales" : ".weight_scale";
  const std::vector<uint64_t> zp_shape = {(out + 7) / 8, G};
  TERN_ASSIGN_OR_RETURN(const QuantTensor* prev_scales,
                        FindPrevious(previous, scale_name, scale_dtype, scale_shape));
  const QuantTensor* prev_zp = nullptr;
  if (!spec.symmetric) {
    TERN_ASSIGN_OR_RETURN(prev_zp, FindPrevious(previous, ".weight_zero_point", DType::kI32, zp_shape));
  }

  Quantized q;
  if (l.gptq) {
    q.tensors.push_back(NewTensor(".qweight", DType::kI32, {in / 8, out}));
    q.tensors.push_back(NewTensor(".scales", DType::kF16, scale_shape));
    q.tensors.push_back(NewTensor(".qzeros", DType::kI32, {G, out / 8}));
    q.tensors.push_back(NewTensor(".g_idx", DType::kI32, {in}));
    QuantTensor& qzeros = q.tensors[2];
    for (uint64_t k = 0; k < G * out / 8; ++k) Store<uint32_t>(qzeros, k, 0x77777777u);
    for (uint64_t i = 0; i < in; ++i) Store<int32_t>(q.tensors[3], i, static_cast<int32_t>(i / g));
  } else {
    q.tensors.push_back(NewTensor(".weight_packed", DType::kI32, {out, in / 8}));
    q.tensors.push_back(NewTensor(".weight_scale", DType::kBF16, scale_shape));
    q.tensors.push_back(NewTensor(".weight_shape", DType::kI64, {2}));
    Store<int64_t>(q.tensors[2], 0, static_cast<int64_t>(out));
    Store<int64_t>(q.tensors[2], 1, static_cast<int64_t>(in));
    if (!spec.symmetric) q.tensors.push_back(NewTensor(".weight_zero_point", DType::kI32, zp_shape));
  }
  QuantTensor& packed = q.tensors[0];
  QuantTensor& scales = q.tensors[1];
  QuantTensor* zps = spec.symmetric ? nullptr : &q.tensors[3];
  q.scale_groups = out * G;

  for (uint64_t o = 0; o < out; ++o) {
    for (uint64_t k = 0; k < G; ++k) {
      const float* x = master + o * in + k * g;
      float lo = 0.0f, hi = 0.0f;
      for (uint64_t i = 0; i < g; ++i) lo = std::fmin(lo, x[i]), hi = std::fmax(hi, x[i]);
      const uint64_t si = l.gptq ? k * out + o : o * G + k;
      const float fresh = spec.symmetric
                              ? std::fmax(std::fmax(-lo, hi) / 7.5f, l.gptq ? 0.0f : FLT_EPSILON)
                              : std::fmax((hi - lo) / 15.0f, FLT_EPSILON);
      // GPTQ maps an all-zero group to [-1, 1].
      const float fresh_or_unit = (l.gptq && fresh == 0.0f) ? 2.0f / 15.0f : fresh;
      uint16_t sbits = 0;
      int zp = 0;
      bool kept = false;
      if (prev_scales != nullptr) {
        const uint16_t pbits = Load<uint16_t>(*prev_scales, si);
        const float ps = DecodeScale(pbits, l.gptq);
        int pzp = 0;
        if (prev_zp != nullptr) {
          const uint32_t word = Load<uint32_t>(*prev_zp, (o / 8) * G + k);
          pzp = static_cast<int>((word >> (4 * (o % 8))) & 0xF) - 8;
        }
        // Asymmetric: the previous grid must still cover [lo, hi].
        const bool covers = spec.symmetric || (std::nearbyint(lo / ps) + pzp >= -8 &&
                                               std::nearbyint(hi / ps) + pzp <= 7);
        if (std::isfinite(ps) && covers && KeepPrevious(fresh_or_unit, ps, policy)) {
          sbits = pbits;
          zp = pzp;
          kept = true;
        }
      }
      if (!kept) {
        const float target = fresh_or_unit * RescaleFactor(policy);
        sbits = EncodeScale(target, l.gptq);
        // kBand rounds the stored scale up (see ScalePolicy); positive
        // BF16/F16 patterns are monotonic, so +1 is the next value up.
        if (policy.kind == ScalePolicy::Kind::kBand && DecodeScale(sbits, l.gptq) < target) ++sbits;
        if (!std::isfinite(DecodeScale(sbits, l.gptq))) {
          return TERN_ERROR(kOutOfRange, "row ", o, " group ", k, ": scale ", fresh_or_unit,
                            " does not fit ", DTypeName(scale_dtype));
        }
        if (!spec.symmetric) {
          const float s = DecodeScale(sbits, l.gptq);
          zp = static_cast<int>(std::fmin(std::fmax(-8.0f - std::nearbyint(lo / s), -8.0f), 7.0f));
        }
      }
      q.rescaled_groups += !kept;
      Store<uint16_t>(scales, si, sbits);
      if (zps != nullptr) {
        const uint64_t wi = (o / 8) * G + k;
        Store<uint32_t>(*zps, wi, Load<uint32_t>(*zps, wi) |
                                      (static_cast<uint32_t>(zp + 8) << (4 * (o % 8))));
      }
      const float s = DecodeScale(sbits, l.gptq);
      for (uint64_t i = 0; i < g; ++i) {
        const float v = std::fmin(std::fmax(std::nearbyint(x[i] / s) + static_cast<float>(zp), -8.0f), 7.0f);
        const uint32_t nib = static_cast<uint32_t>(static_cast<int>(v) + 8);
        const uint64_t col = k * g + i;
        const uint64_t wi = l.gptq ? (col / 8) * out + o : o * (in / 8) + col / 8;
        Store<uint32_t>(packed, wi, Load<uint32_t>(packed, wi) | (nib << (4 * (col % 8))));
      }
    }
  }
  return q;
}

Result<std::vector<float>> DequantizeInt4(const QuantSpec& spec, const Quantized& q,
                                          const std::vector<uint64_t>& shape, const Dims& d) {
  TERN_ASSIGN_OR_RETURN(Int4Layout l, MakeLayout(spec, d));
  const uint64_t out = d.out, in = d.in, g = spec.group, G = l.groups;
  const QuantTensor *packed, *scales, *zps = nullptr, *qzeros = nullptr;
  if (l.gptq) {
    TERN_ASSIGN_OR_RETURN(packed, FindChecked(q, ".qweight", DType::kI32, {in / 8, out}));
    TERN_ASSIGN_OR_RETURN(scales, FindChecked(q, ".scales", DType::kF16, {G, out}));
    TERN_ASSIGN_OR_RETURN(qzeros, FindChecked(q, ".qzeros", DType::kI32, {G, out / 8}));
  } else {
    TERN_ASSIGN_OR_RETURN(packed, FindChecked(q, ".weight_packed", DType::kI32, {out, in / 8}));
    TERN_ASSIGN_OR_RETURN(scales, FindChecked(q, ".weight_scale", DType::kBF16, {out, G}));
    if (!spec.symmetric) {
      TERN_ASSIGN_OR_RETURN(zps, FindChecked(q, ".weight_zero_point", DType::kI32, {(out + 7) / 8, G}));
    }
  }
  std::vector<float> res(d.count);
  for (uint64_t o = 0; o < out; ++o) {
    for (uint64_t i = 0; i < in; ++i) {
      const uint64_t k = i / g;
      const float s = DecodeScale(Load<uint16_t>(*scales, l.gptq ? k * out + o : o * G + k), l.gptq);
      int zero;  // in the unsigned nibble domain
      if (l.gptq) {
        zero = static_cast<int>((Load<uint32_t>(*qzeros, k * (out / 8) + o / 8) >> (4 * (o % 8))) & 0xF) + 1;
      } else if (zps != nullptr) {
        zero = static_cast<int>((Load<uint32_t>(*zps, (o / 8) * G + k) >> (4 * (o % 8))) & 0xF);
      } else {
        zero = 8;
      }
      const uint64_t wi = l.gptq ? (i / 8) * out + o : o * (in / 8) + i / 8;
      const int nib = static_cast<int>((Load<uint32_t>(*packed, wi) >> (4 * (i % 8))) & 0xF);
      res[o * in + i] = static_cast<float>(nib - zero) * s;
    }
  }
  return res;
}

}  // namespace tern::quant
