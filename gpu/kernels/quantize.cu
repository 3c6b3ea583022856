// GpuQuantize (include/tern/gpu.h): master weights -> serve view on the GPU,
// tern::Quantize's bytes. Docs: docs/gpu.md, "Cast and quantize".
//
// Kernels, stream-ordered and gated on one device flag (the first NaN/Inf
// element, found first), so that a bad master leaves every output as it was:
//   FiniteKernel -> casts: CastKernel;
//   FP8: GroupAmaxKernel (a warp per row piece of a group, atomicMax on the
//        bits of |x|: exact) -> Fp8ScaleKernel (a thread per group, reads the
//        previous scale in place) -> Fp8EncodeKernel (a thread per element);
//   FP4: AmaxKernel (NVFP4's tensor amax) -> Fp4GlobalKernel (one thread) ->
//        Fp4BlockKernel (a thread per 16/32-element block).
//   INT4 (pack-quantized, GPTQ): Int4ScaleKernel -> Int4EncodeKernel ->
//        Int4ConstKernel (a thread per 8 rows x one group; gpu/ops/int4_ops.h).
// The per-group and per-block arithmetic is cast_ops.h's, tested on the CPU
// against quant/.
#include <algorithm>
#include <limits>
#include <vector>

#include "gpu/kernels/cuda_util.h"
#include "gpu/ops/cast_ops.h"
#include "gpu/ops/int4_ops.h"
#include "tern/gpu.h"

namespace tern {
namespace gpu {
namespace {

constexpr unsigned long long kAllFinite = std::numeric_limits<unsigned long long>::max();

template <class M>
__device__ __forceinline__ float LoadMaster(const void* p, uint64_t i) {
  if constexpr (sizeof(M) == 4) {
    return static_cast<const float*>(p)[i];
  } else {
    return BitsFloat(BF16ToF32Bits(static_cast<const uint16_t*>(p)[i]));
  }
}

#define TERN_GRID_STRIDE(i, n)                                                             \
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x, tern_stride_ =        \
                    uint64_t{gridDim.x} * blockDim.x;                                      \
       i < (n); i += tern_stride_)

template <class M>
__global__ void FiniteKernel(const void* master, uint64_t n, unsigned long long* first_bad) {
  TERN_GRID_STRIDE(i, n) {
    if (!IsFinite(LoadMaster<M>(master, i))) atomicMin(first_bad, static_cast<unsigned long long>(i));
  }
}

template <class M>
__global__ void CastKernel(const void* master, uint64_t n, bool f16, uint16_t* out,
                           const unsigned long long* first_bad) {
  if (*first_bad != kAllFinite) return;
  TERN_GRID_STRIDE(i, n) {
    const uint32_t u = FloatBits(LoadMaster<M>(master, i));
    out[i] = f16 ? F32ToF16(u) : F32ToBF16(u);
  }
}

// A warp per (row, column group): lanes stride the row piece (coalesced),
// then one atomicMax per warp. |x| >= 0, so its bits order like its value.
template <class M>
__global__ void GroupAmaxKernel(const void* master, Fp8Grouping g, uint32_t* amax_bits) {
  const uint64_t rows = g.lead * g.out;
  const uint64_t pieces = rows * g.col_groups;
  const uint64_t warp = (uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5;
  const uint64_t warps = (uint64_t{gridDim.x} * blockDim.x) >> 5;
  const unsigned lane = threadIdx.x & 31;
  for (uint64_t p = warp; p < pieces; p += warps) {
    const uint64_t r = p / g.col_groups, c = p % g.col_groups;
    const uint64_t begin = c * g.col_width;
    const uint64_t end = begin + g.col_width < g.in ? begin + g.col_width : g.in;
    float m = 0.0f;
    for (uint64_t i = begin + lane; i < end; i += 32) m = MaxF(m, AbsF(LoadMaster<M>(master, r * g.in + i)));
    for (int off = 16; off > 0; off >>= 1) m = MaxF(m, __shfl_down_sync(0xffffffffu, m, off));
    if (lane == 0) atomicMax(amax_bits + g.RowGroup(r) * g.col_groups + c, FloatBits(m));
  }
}

__global__ void Fp8ScaleKernel(const uint32_t* amax_bits, uint64_t groups, MiniFormat fmt, QuantPolicy p,
                               bool has_prev, float* scales, unsigned long long* rescaled,
                               const unsigned long long* first_bad) {
  if (*first_bad != kAllFinite) return;
  TERN_GRID_STRIDE(k, groups) {
    bool kept;
    scales[k] = ChooseFp8Scale(BitsFloat(amax_bits[k]), has_prev, has_prev ? scales[k] : 0.0f, fmt, p, &kept);
    if (!kept) atomicAdd(rescaled, 1ull);
  }
}

template <class M>
__global__ void Fp8EncodeKernel(const void* master, Fp8Grouping g, MiniFormat fmt, const float* scales,
                                uint8_t* codes, const unsigned long long* first_bad) {
  if (*first_bad != kAllFinite) return;
  const uint64_t n = g.lead * g.out * g.in;
  TERN_GRID_STRIDE(i, n) { codes[i] = EncodeFp8(LoadMaster<M>(master, i), scales[g.Group(i)], fmt); }
}

template <class M>
__global__ void AmaxKernel(const void* master, uint64_t n, uint32_t* amax_bits) {
  float m = 0.0f;
  TERN_GRID_STRIDE(i, n) { m = MaxF(m, AbsF(LoadMaster<M>(master, i))); }
  for (int off = 16; off > 0; off >>= 1) m = MaxF(m, __shfl_down_sync(0xffffffffu, m, off));
  if ((threadIdx.x & 31) == 0) atomicMax(amax_bits, FloatBits(m));
}

// One thread: the NVFP4 global scale, written in place (the previous value
// is read first) and kept in *g for the block kernel.
__global__ void Fp4GlobalKernel(const uint32_t* amax_bits, Fp4Scheme s, QuantPolicy p, bool has_prev,
                                float* global, float* input_scale, Fp4Global* g, const unsigned long long* first_bad) {
  if (*first_bad != kAllFinite || threadIdx.x != 0 || blockIdx.x != 0) return;
  *g = ChooseFp4Global(BitsFloat(*amax_bits), has_prev, has_prev ? *global : 0.0f, s, p);
  *global = g->stored(s);
  if (input_scale != nullptr) *input_scale = 1.0f;
}

template <class M>
__global__ void Fp4BlockKernel(const void* master, uint64_t blocks, Fp4Scheme s, const Fp4Global* g_in,
                               QuantPolicy p, bool has_prev, uint8_t* codes, uint8_t* scales,
                               unsigned long long* rescaled, const unsigned long long* first_bad) {
  if (*first_bad != kAllFinite) return;
  const Fp4Global g = s == Fp4Scheme::kMxfp4 ? Fp4Global{} : *g_in;
  const uint64_t block = Fp4Block(s);
  TERN_GRID_STRIDE(b, blocks) {
    float x[32];
    for (uint64_t i = 0; i < block; ++i) x[i] = LoadMaster<M>(master, b * block + i);
    bool kept;
    scales[b] = QuantizeFp4Block(x, s, g, has_prev, has_prev ? scales[b] : 0, p, codes + b * block / 2, &kept);
    if (!kept) atomicAdd(rescaled, 1ull);
  }
}

// INT4 (gpu/ops/int4_ops.h): a thread per (8 rows, group k), the rows that
// share a zero-point word ((o / 8) * G + k). The scale pass reads the
// previous state in place and writes only scratch, so an overflow (kOutOfRange)
// or a NaN master leaves every output as it was; the encode pass then
// writes scales, zero points and whole packed words (a group is g / 8 words
// of one row: no two threads share a word).
constexpr unsigned long long kNoOverflow = std::numeric_limits<unsigned long long>::max();

struct Int4Shape {
  uint64_t out, in, g, groups;  // groups per row
  bool sym, gptq;
};

template <class M>
__global__ void Int4ScaleKernel(const void* master, Int4Shape s, bool has_prev, const uint16_t* scales_prev,
                                const uint32_t* zps_prev, QuantPolicy p, uint16_t* scale_scratch,
                                uint32_t* zp_scratch, unsigned long long* rescaled,
                                unsigned long long* first_overflow, const unsigned long long* first_bad) {
  if (*first_bad != kAllFinite) return;
  const uint64_t words = (s.out + 7) / 8 * s.groups;
  TERN_GRID_STRIDE(t, words) {
    const uint64_t o8 = t / s.groups, k = t % s.groups;
    const uint32_t prev_word = has_prev && zps_prev != nullptr ? zps_prev[t] : 0;
    uint32_t word = 0;
    const uint64_t end = o8 * 8 + 8 < s.out ? o8 * 8 + 8 : s.out;
    for (uint64_t o = o8 * 8; o < end; ++o) {
      const uint64_t si = s.gptq ? k * s.out + o : o * s.groups + k;
      const int pzp = zps_prev != nullptr ? static_cast<int>((prev_word >> (4 * (o % 8))) & 0xF) - 8 : 0;
      const uint64_t base = o * s.in + k * s.g;
      Int4Group r;
      if (!Int4GroupScale([&](uint64_t i) { return LoadMaster<M>(master, base + i); }, s.g, s.sym, s.gptq,
                          has_prev, has_prev ? scales_prev[si] : uint16_t{0}, pzp, p, &r)) {
        atomicMin(first_overflow, static_cast<unsigned long long>(o * s.groups + k));
        continue;
      }
      if (!r.kept) atomicAdd(rescaled, 1ull);
      scale_scratch[si] = r.scale_bits;
      if (!s.sym) word |= static_cast<uint32_t>(r.zp + 8) << (4 * (o % 8));
    }
    zp_scratch[t] = word;
  }
}

template <class M>
__global__ void Int4EncodeKernel(const void* master, Int4Shape s, const uint16_t* scale_scratch,
                                 const uint32_t* zp_scratch, uint32_t* packed, uint16_t* scales, uint32_t* zps,
                                 const unsigned long long* first_overflow, const unsigned long long* first_bad) {
  if (*first_bad != kAllFinite || *first_overflow != kNoOverflow) return;
  const uint64_t words = (s.out + 7) / 8 * s.groups;
  TERN_GRID_STRIDE(t, words) {
    const uint64_t o8 = t / s.groups, k = t % s.groups;
    const uint64_t end = o8 * 8 + 8 < s.out ? o8 * 8 + 8 : s.out;
    for (uint64_t o = o8 * 8; o < end; ++o) {
      const uint64_t si = s.gptq ? k * s.out + o : o * s.groups + k;
      const uint16_t bits = scale_scratch[si];
      scales[si] = bits;
      const int zp = s.sym ? 0 : static_cast<int>((zp_scratch[t] >> (4 * (o % 8))) & 0xF) - 8;
      const float sd = DecodeInt4Scale(bits, s.gptq);
      for (uint64_t w = 0; w < s.g / 8; ++w) {
        const uint64_t col0 = k * s.g + w * 8;
        uint32_t word = 0;
        for (int j = 0; j < 8; ++j) word |= Int4Nibble(LoadMaster<M>(master, o * s.in + col0 + j), sd, zp) << (4 * j);
        packed[s.gptq ? (col0 / 8) * s.out + o : o * (s.in / 8) + col0 / 8] = word;
      }
    }
    if (!s.sym) zps[t] = zp_scratch[t];
  }
}

// The constant outputs: GPTQ's qzeros (zero - 1 = 7 in every nibble) and
// g_idx (i / g); compressed-tensors' weight_shape {out, in}.
__global__ void Int4ConstKernel(Int4Shape s, uint32_t* qzeros, int32_t* g_idx, int64_t* shape,
                                const unsigned long long* first_overflow, const unsigned long long* first_bad) {
  if (*first_bad != kAllFinite || *first_overflow != kNoOverflow) return;
  if (!s.gptq) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      shape[0] = static_cast<int64_t>(s.out);
      shape[1] = static_cast<int64_t>(s.in);
    }
    return;
  }
  const uint64_t zwords = s.groups * s.out / 8, n = zwords > s.in ? zwords : s.in;
  TERN_GRID_STRIDE(i, n) {
    if (i < zwords) qzeros[i] = 0x77777777u;
    if (i < s.in) g_idx[i] = static_cast<int32_t>(i / s.g);
  }
}

struct Dims {
  uint64_t lead = 1, out = 0, in = 0, count = 0;
};

Result<Dims> CheckShape(const std::vector<uint64_t>& shape) {
  TERN_REQUIRE(shape.size() >= 2, kInvalidArgument, "a weight needs rank >= 2, got ", shape.size());
  Dims d;
  for (size_t i = 0; i + 2 < shape.size(); ++i)
    TERN_REQUIRE(!__builtin_mul_overflow(d.lead, shape[i], &d.lead), kOutOfRange, "shape overflows 64 bits");
  d.out = shape[shape.size() - 2];
  d.in = shape.back();
  TERN_REQUIRE(d.out > 0 && d.in > 0, kInvalidArgument, "empty weight (out or in is 0)");
  uint64_t rows;
  TERN_REQUIRE(!__builtin_mul_overflow(d.lead, d.out, &rows) && !__builtin_mul_overflow(rows, d.in, &d.count) &&
                   d.count <= (1ull << 62),
               kOutOfRange, "shape overflows 64 bits");
  return d;
}

}  // namespace
}  // namespace gpu

Result<GpuQuantStats> GpuQuantize(const QuantSpec& spec, DType master_dtype, const void* master,
                                  const std::vector<uint64_t>& shape, std::span<void* const> outputs,
                                  bool has_previous, const ScalePolicy& policy, const GpuOptions& options) {
  using namespace gpu;
  TERN_REQUIRE(master_dtype == DType::kF32 || master_dtype == DType::kBF16, kInvalidArgument,
               "master weights must be F32 or BF16, got ", DTypeName(master_dtype));
  TERN_ASSIGN_OR_RETURN(const Dims d, CheckShape(shape));
  TERN_REQUIRE(policy.band_low > 0.0f && policy.band_low <= 1.0f, kInvalidArgument,
               "scale policy band_low must be in (0, 1], got ", policy.band_low);
  TERN_REQUIRE(policy.headroom >= 1.0f && policy.headroom <= 2.0f, kInvalidArgument,
               "scale policy headroom must be in [1, 2], got ", policy.headroom);
  size_t want_outputs = 0;
  switch (spec.scheme) {
    case QuantScheme::kBF16:
    case QuantScheme::kF16: want_outputs = 1; break;
    case QuantScheme::kFp8Tensor:
    case QuantScheme::kFp8Channel:
    case QuantScheme::kFp8Block128: want_outputs = 2; break;
    case QuantScheme::kNvfp4: want_outputs = 4; break;
    case QuantScheme::kNvfp4Ct: want_outputs = 3; break;
    case QuantScheme::kMxfp4: want_outputs = 2; break;
    case QuantScheme::kInt4Pack: want_outputs = spec.symmetric ? 3 : 4; break;
    case QuantScheme::kGptqInt4: want_outputs = 4; break;
    default: return TERN_ERROR(kUnsupported, spec.name, " is not quantized on the GPU yet (use tern::Quantize)");
  }
  TERN_REQUIRE(outputs.size() == want_outputs, kInvalidArgument, spec.name, " writes ", want_outputs,
               " tensors, got ", outputs.size(), " output buffers");
  for (void* o : outputs) TERN_REQUIRE(o != nullptr, kInvalidArgument, "null output buffer");
  TERN_RETURN_IF_ERROR(RequireDevice());
  TERN_RETURN_IF_ERROR(CheckDevicePointer(master, master_dtype == DType::kBF16 ? 2 : 4, "master"));
  const bool int4 = spec.scheme == QuantScheme::kInt4Pack || spec.scheme == QuantScheme::kGptqInt4;
  for (size_t k = 0; k < outputs.size(); ++k) {
    // Codes are bytes; casts write 16-bit values, scales and globals F32
    // (MXFP4's E8M0 scales and NVFP4's E4M3 block scales are bytes). INT4:
    // I32 words, 16-bit scales, compressed-tensors' I64 shape.
    const bool cast = spec.scheme == QuantScheme::kBF16 || spec.scheme == QuantScheme::kF16;
    const bool f32 = (k == 1 && want_outputs == 2 && spec.scheme != QuantScheme::kMxfp4 && !cast) || k >= 2;
    const uint64_t align = int4 ? (k == 1 ? 2 : (k == 2 && spec.scheme == QuantScheme::kInt4Pack) ? 8 : 4)
                                : (cast ? 2 : f32 ? 4 : 1);
    TERN_RETURN_IF_ERROR(CheckDevicePointer(outputs[k], align, "output " + std::to_string(k)));
  }
  const bool bf16 = master_dtype == DType::kBF16;
  const QuantPolicy p{policy.kind == ScalePolicy::Kind::kBand, policy.band_low, policy.headroom};
  cudaStream_t stream = static_cast<cudaStream_t>(options.stream);
  GpuQuantStats stats;

  // Flags: first_bad, rescaled; then the amax bits and FP4 global state.
  DeviceBuffer d_flags;
  TERN_RETURN_IF_ERROR(d_flags.Allocate(3 * sizeof(unsigned long long), stream));
  const unsigned long long init[3] = {kAllFinite, 0, kNoOverflow};
  TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_flags.as<void>(), init, sizeof(init), cudaMemcpyHostToDevice, stream));
  unsigned long long* first_bad = d_flags.as<unsigned long long>();
  unsigned long long* rescaled = first_bad + 1;
  unsigned long long* first_overflow = first_bad + 2;
  const unsigned grid = GridFor(d.count, 256);
  auto launch_check = [&]() -> Status {
    TERN_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::Ok();
  };
#define TERN_LAUNCH(kernel, g, b, ...)                                             \
  do {                                                                            \
    if (bf16) {                                                                   \
      kernel<uint16_t><<<(g), (b), 0, stream>>>(__VA_ARGS__);                     \
    } else {                                                                      \
      kernel<float><<<(g), (b), 0, stream>>>(__VA_ARGS__);                        \
    }                                                                             \
    TERN_RETURN_IF_ERROR(launch_check());                                         \
  } while (0)

  TERN_LAUNCH(FiniteKernel, grid, 256, master, d.count, first_bad);
  DeviceBuffer d_amax, d_global, d_int4;
  switch (spec.scheme) {
    case QuantScheme::kInt4Pack:
    case QuantScheme::kGptqInt4: {
      const bool gptq = spec.scheme == QuantScheme::kGptqInt4;
      // quant/quantize_int4.cc's layout rules.
      TERN_REQUIRE(d.lead == 1, kInvalidArgument, spec.name,
                   " is a per-Linear layout: expects a 2-D [out, in] weight, one call per expert");
      TERN_REQUIRE(spec.group == 32 || spec.group == 64 || spec.group == 128, kInvalidArgument,
                   "INT4 group must be 32, 64 or 128, got ", spec.group);
      TERN_REQUIRE(d.in % spec.group == 0, kInvalidArgument, spec.name, " needs in-features divisible by the group ",
                   spec.group, "; got ", d.in, " (keep this tensor unquantized)");
      TERN_REQUIRE(!gptq || spec.symmetric, kInvalidArgument, "GPTQ output is symmetric only");
      TERN_REQUIRE(!gptq || d.out % 8 == 0, kInvalidArgument,
                   "GPTQ packs qzeros eight per I32 along out-features; out = ", d.out, " is not a multiple of 8");
      const Int4Shape s{d.out, d.in, spec.group, d.in / spec.group, spec.symmetric, gptq};
      const uint64_t words = (d.out + 7) / 8 * s.groups, scales = d.out * s.groups;
      TERN_RETURN_IF_ERROR(d_int4.Allocate(scales * sizeof(uint16_t) + words * sizeof(uint32_t) + 4, stream));
      uint32_t* zp_scratch = reinterpret_cast<uint32_t*>(d_int4.as<uint8_t>() + (scales * 2 + 3) / 4 * 4);
      uint16_t* scale_scratch = d_int4.as<uint16_t>();
      uint32_t* zps = (!gptq && !spec.symmetric) ? static_cast<uint32_t*>(outputs[3]) : nullptr;
      TERN_LAUNCH(Int4ScaleKernel, GridFor(words, 128), 128, master, s, has_previous,
                  static_cast<const uint16_t*>(outputs[1]), zps, p, scale_scratch, zp_scratch, rescaled,
                  first_overflow, first_bad);
      TERN_LAUNCH(Int4EncodeKernel, GridFor(words, 128), 128, master, s, scale_scratch, zp_scratch,
                  static_cast<uint32_t*>(outputs[0]), static_cast<uint16_t*>(outputs[1]), zps, first_overflow,
                  first_bad);
      Int4ConstKernel<<<GridFor(std::max<uint64_t>(d.in, s.groups * d.out / 8), 256), 256, 0, stream>>>(
          s, gptq ? static_cast<uint32_t*>(outputs[2]) : nullptr, gptq ? static_cast<int32_t*>(outputs[3]) : nullptr,
          gptq ? nullptr : static_cast<int64_t*>(outputs[2]), first_overflow, first_bad);
      TERN_RETURN_IF_ERROR(launch_check());
      stats.scale_groups = scales;
      break;
    }
    case QuantScheme::kBF16:
    case QuantScheme::kF16:
      TERN_LAUNCH(CastKernel, grid, 256, master, d.count, spec.scheme == QuantScheme::kF16,
                  static_cast<uint16_t*>(outputs[0]), first_bad);
      break;
    case QuantScheme::kFp8Tensor:
    case QuantScheme::kFp8Channel:
    case QuantScheme::kFp8Block128: {
      TERN_REQUIRE(spec.code_dtype == DType::kF8E4M3 || spec.code_dtype == DType::kF8E5M2, kInvalidArgument,
                   "FP8 codes must be F8_E4M3 or F8_E5M2");
      TERN_REQUIRE(spec.scheme != QuantScheme::kFp8Block128 || spec.code_dtype == DType::kF8E4M3,
                   kInvalidArgument, "128x128 block scales are defined for E4M3 only");
      const Fp8Scheme scheme = spec.scheme == QuantScheme::kFp8Tensor    ? Fp8Scheme::kTensor
                               : spec.scheme == QuantScheme::kFp8Channel ? Fp8Scheme::kChannel
                                                                         : Fp8Scheme::kBlock128;
      const MiniFormat fmt = spec.code_dtype == DType::kF8E4M3 ? E4M3() : E5M2();
      const Fp8Grouping g = MakeFp8Grouping(scheme, d.lead, d.out, d.in);
      TERN_RETURN_IF_ERROR(d_amax.Allocate(g.groups() * sizeof(uint32_t), stream));
      TERN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d_amax.as<void>(), 0, d_amax.bytes(), stream));
      const uint64_t pieces = d.lead * d.out * g.col_groups;
      TERN_LAUNCH(GroupAmaxKernel, GridFor(pieces * 32, 256), 256, master, g, d_amax.as<uint32_t>());
      Fp8ScaleKernel<<<GridFor(g.groups(), 256), 256, 0, stream>>>(d_amax.as<uint32_t>(), g.groups(), fmt, p,
                                                                   has_previous, static_cast<float*>(outputs[1]),
                                                                   rescaled, first_bad);
      TERN_RETURN_IF_ERROR(launch_check());
      TERN_LAUNCH(Fp8EncodeKernel, grid, 256, master, g, fmt, static_cast<const float*>(outputs[1]),
                  static_cast<uint8_t*>(outputs[0]), first_bad);
      stats.scale_groups = g.groups();
      break;
    }
    default: {  // NVFP4, NVFP4-CT, MXFP4
      const Fp4Scheme s = spec.scheme == QuantScheme::kMxfp4     ? Fp4Scheme::kMxfp4
                          : spec.scheme == QuantScheme::kNvfp4Ct ? Fp4Scheme::kNvfp4Ct
                                                                 : Fp4Scheme::kNvfp4;
      const uint64_t block = Fp4Block(s);
      TERN_REQUIRE(d.in % block == 0, kInvalidArgument, spec.name, " needs in-features divisible by ", block,
                   "; got ", d.in, " (keep this tensor unquantized or pad it)");
      const uint64_t blocks = d.count / block;
      TERN_RETURN_IF_ERROR(d_global.Allocate(sizeof(Fp4Global) + sizeof(uint32_t), stream));
      Fp4Global* g = d_global.as<Fp4Global>();
      uint32_t* amax = reinterpret_cast<uint32_t*>(g + 1);
      if (s != Fp4Scheme::kMxfp4) {
        TERN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(amax, 0, sizeof(uint32_t), stream));
        TERN_LAUNCH(AmaxKernel, grid, 256, master, d.count, amax);
        Fp4GlobalKernel<<<1, 32, 0, stream>>>(amax, s, p, has_previous, static_cast<float*>(outputs[2]),
                                              s == Fp4Scheme::kNvfp4 ? static_cast<float*>(outputs[3]) : nullptr,
                                              g, first_bad);
        TERN_RETURN_IF_ERROR(launch_check());
      }
      TERN_LAUNCH(Fp4BlockKernel, GridFor(blocks, 128), 128, master, blocks, s, g, p, has_previous,
                  static_cast<uint8_t*>(outputs[0]), static_cast<uint8_t*>(outputs[1]), rescaled, first_bad);
      stats.scale_groups = blocks;
      break;
    }
  }
#undef TERN_LAUNCH
  unsigned long long flags[3];
  TERN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(flags, d_flags.as<void>(), sizeof(flags), cudaMemcpyDeviceToHost, stream));
  TERN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  TERN_REQUIRE(flags[0] == kAllFinite, kInvalidArgument, "master weight element ", flags[0],
               " is not finite; NaN/Inf cannot be quantized (fix the trainer's weights)");
  if (flags[2] != kNoOverflow) {  // INT4 only; the index is row * groups + group
    const uint64_t groups = d.in / spec.group;
    return TERN_ERROR(kOutOfRange, "row ", flags[2] / groups, " group ", flags[2] % groups,
                      ": the INT4 scale does not fit ", spec.scheme == QuantScheme::kGptqInt4 ? "F16" : "BF16",
                      " (outputs untouched)");
  }
  if (spec.scheme != QuantScheme::kBF16 && spec.scheme != QuantScheme::kF16) stats.rescaled_groups = flags[1];
  return stats;
}

}  // namespace tern
