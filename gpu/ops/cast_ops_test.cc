// The GPU cast and quantize logic (gpu/ops/cast_ops.h) against the CPU reference
// (quant/), bit for bit: every 16-bit and 8-bit code, FP32 patterns around
// every rounding boundary, and whole tensors through tern::Quantize with
// and without a previous state under both scale policies.
#include "gpu/ops/cast_ops.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>
#include <vector>

#include "base/hash.h"
#include "gpu/ops/int4_ops.h"
#include "quant/cast_internal.h"
#include "quant/minifloat.h"
#include "tern/float_cast.h"
#include "tern/quantize.h"

namespace tern::gpu {
namespace {

namespace ref = tern::quant;

// Low halves that cover every rounding case of a 16-bit result (below, at
// and above the halfway point, both parities) and of the minifloats (their
// rounding bits lie in the high half, which the sweep enumerates).
constexpr uint32_t kLowHalves[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1234, 0xC000};

template <class Fn>
void ForSweep(Fn&& fn) {
  for (uint32_t hi = 0; hi < 0x10000; ++hi)
    for (uint32_t lo : kLowHalves) fn((hi << 16) | lo);
}

uint32_t Bits(float f) { return FloatBits(f); }

constexpr uint64_t kFrozenEncode = 0xc4ac832e21b0b2f8ull, kFrozenDecode = 0x6801267af54981dbull;

TEST(GpuCastOps, F32ToBF16MatchesReference) {
  uint64_t bad = 0;
  ForSweep([&](uint32_t u) { bad += F32ToBF16(u) != ref::F32BitsToBF16(u); });
  EXPECT_EQ(bad, 0u);
  // And the vectorized public cast, on the same patterns.
  std::vector<float> in;
  ForSweep([&](uint32_t u) { in.push_back(BitsFloat(u)); });
  std::vector<uint16_t> out(in.size());
  CastF32ToBF16(in.data(), out.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(F32ToBF16(Bits(in[i])), out[i]) << std::hex << Bits(in[i]);
}

TEST(GpuCastOps, F32ToF16MatchesReference) {
  uint64_t bad = 0;
  ForSweep([&](uint32_t u) { bad += F32ToF16(u) != ref::F32BitsToF16(u); });
  EXPECT_EQ(bad, 0u);
}

TEST(GpuCastOps, EveryBF16PatternWidensAndRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint32_t wide = BF16ToF32Bits(static_cast<uint16_t>(b));
    ASSERT_EQ(wide, Bits(BF16ToF32(static_cast<uint16_t>(b))));
    // Narrowing an exact BF16 value gives it back; every NaN becomes 0xFFFF.
    const bool nan = (b & 0x7FFF) > 0x7F80;
    ASSERT_EQ(F32ToBF16(wide), nan ? 0xFFFF : b) << std::hex << b;
  }
}

// quant/'s names are the shared codecs (one copy, format/minifloat.h).
TEST(GpuCastOps, QuantUsesTheSharedMiniFloatCodecs) {
  EXPECT_EQ(&ref::EncodeMini, &EncodeMini);
  EXPECT_EQ(&ref::DecodeMini, &DecodeMini);
  EXPECT_EQ(&ref::DecodeE8M0, &DecodeE8M0);
  const std::pair<MiniFormat, ref::MiniFloat> formats[] = {
      {E4M3(), ref::kE4M3}, {E5M2(), ref::kE5M2}, {E2M1(), ref::kE2M1}};
  for (const auto& [f, r] : formats) {
    EXPECT_EQ(f.ebits, r.ebits);
    EXPECT_EQ(f.max_code, r.max_code);
    EXPECT_EQ(f.max_value, r.max_value);
  }
}

// The minifloat codecs' every answer over the sweep, as XXH3 digests frozen
// from quant/'s former ldexp-based implementation (while the GPU's copy was
// checked equal to it over this sweep) before the CPU and the GPU came to
// share one copy (format/minifloat.h): a change of any encode or decode
// result fails here. quant/minifloat_test.cc holds it to hand tables.
TEST(GpuCastOps, MiniFloatCodecsAreFrozen) {
  const MiniFormat formats[] = {E4M3(), E5M2(), E2M1()};
  std::vector<uint8_t> enc;
  enc.reserve(6 * 524288);
  for (const MiniFormat& f : formats)
    for (bool sat : {false, true}) ForSweep([&](uint32_t u) { enc.push_back(EncodeMini(BitsFloat(u), f, sat)); });
  std::vector<uint32_t> dec;
  for (const MiniFormat& f : formats)
    for (int c = 0; c < (1 << (f.ebits + f.mbits + 1)); ++c) dec.push_back(Bits(DecodeMini(static_cast<uint8_t>(c), f)));
  for (int c = 0; c < 256; ++c) dec.push_back(Bits(DecodeE8M0(static_cast<uint8_t>(c))));
  EXPECT_EQ(enc.size(), 6u * 524288);
  EXPECT_EQ(Xxh3(enc.data(), enc.size()), kFrozenEncode) << std::hex << Xxh3(enc.data(), enc.size());
  EXPECT_EQ(Xxh3(dec.data(), dec.size() * 4), kFrozenDecode) << std::hex << Xxh3(dec.data(), dec.size() * 4);
}

TEST(GpuCastOps, FloorLog2MatchesFrexp) {
  ForSweep([&](uint32_t u) {
    const float x = BitsFloat(u & 0x7FFFFFFFu);
    if (!(x > 0.0f) || std::isnan(x)) return;
    int e;
    std::frexp(x, &e);
    ASSERT_EQ(FloorLog2(x), e - 1) << std::hex << u;
  });
}

TEST(GpuCastOps, Pow2IsExactOverTheWholeRange) {
  for (int e = -149; e <= 127; ++e) ASSERT_EQ(Pow2(e), std::ldexp(1.0f, e)) << e;
}

// ---- Whole tensors: the kernels' composition of the per-group functions,
// run on the host, against tern::Quantize. ---------------------------------

std::vector<uint8_t> F32Bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

QuantPolicy ToPolicy(const ScalePolicy& p) {
  return {p.kind == ScalePolicy::Kind::kBand, p.band_low, p.headroom};
}

// What the FP8 kernels compute: amax per group, a scale per group, a code
// per element (gpu/kernels_quant.cu).
void EmulateFp8(const Fp8Grouping& g, const MiniFormat& fmt, const std::vector<float>& x,
                const std::vector<float>* prev_scales, const QuantPolicy& p, std::vector<uint8_t>* codes,
                std::vector<float>* scales) {
  std::vector<float> amax(g.groups(), 0.0f);
  for (uint64_t i = 0; i < x.size(); ++i) amax[g.Group(i)] = MaxF(amax[g.Group(i)], AbsF(x[i]));
  scales->resize(g.groups());
  for (uint64_t k = 0; k < g.groups(); ++k) {
    bool kept;
    (*scales)[k] = ChooseFp8Scale(amax[k], prev_scales != nullptr, prev_scales ? (*prev_scales)[k] : 0.0f, fmt,
                                  p, &kept);
  }
  codes->resize(x.size());
  for (uint64_t i = 0; i < x.size(); ++i) (*codes)[i] = EncodeFp8(x[i], (*scales)[g.Group(i)], fmt);
}

void EmulateFp4(Fp4Scheme s, const std::vector<float>& x, const Quantized* prev, const std::string& scales_name,
                const std::string& global_name, const QuantPolicy& p, std::vector<uint8_t>* codes,
                std::vector<uint8_t>* scales, float* global_stored) {
  const uint64_t block = Fp4Block(s);
  Fp4Global g;
  if (s != Fp4Scheme::kMxfp4) {
    float amax = 0.0f;
    for (float v : x) amax = MaxF(amax, AbsF(v));
    float stored = 0.0f;
    const QuantTensor* pg = prev ? prev->Find(global_name) : nullptr;
    if (pg) std::memcpy(&stored, pg->data.data(), 4);
    g = ChooseFp4Global(amax, pg != nullptr, stored, s, p);
    *global_stored = g.stored(s);
  }
  const QuantTensor* ps = prev ? prev->Find(scales_name) : nullptr;
  codes->resize(x.size() / 2);
  scales->resize(x.size() / block);
  for (uint64_t b = 0; b < x.size() / block; ++b) {
    bool kept;
    (*scales)[b] = QuantizeFp4Block(x.data() + b * block, s, g, ps != nullptr, ps ? ps->data[b] : 0, p,
                                    codes->data() + b * block / 2, &kept);
  }
}

// Weights with the edge cases the scale math meets: zero groups, subnormals,
// values near FLT_MAX, exact ties of the minifloat grids, mixed signs.
std::vector<float> EdgeWeights(uint64_t n, std::mt19937_64& rng, int flavour) {
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  if (flavour == 1) {
    for (uint64_t i = 0; i < n / 4; ++i) x[i] = 0.0f;  // a zero block or group
    x[n / 2] = 1e-40f;                                   // subnormal
    x[n / 2 + 1] = -0.0f;
  }
  if (flavour == 2) {
    for (uint64_t i = 0; i < n; i += 7) x[i] = (i & 1 ? -1.0f : 1.0f) * FLT_MAX / (1 + (i % 3));
  }
  if (flavour == 3) {
    const float grid[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 448.0f, 464.0f};
    for (uint64_t i = 0; i < n; ++i) x[i] = grid[i % 9] * (i & 2 ? -1.0f : 1.0f);
  }
  if (flavour == 4) {
    for (uint64_t i = 0; i < n; ++i) x[i] = 1e-38f * static_cast<float>(i % 5);  // tiny, normal/subnormal
  }
  return x;
}

class GpuQuantEquivalence : public ::testing::TestWithParam<int> {};

TEST_P(GpuQuantEquivalence, Fp8MatchesQuantize) {
  const int flavour = GetParam();
  std::mt19937_64 rng(100 + flavour);
  const std::vector<uint64_t> shape = {2, 130, 260};  // partial 128-blocks in both dims
  const uint64_t n = 2 * 130 * 260;
  for (const char* name : {"fp8-e4m3-tensor", "fp8-e4m3-channel", "fp8-e4m3-block128", "fp8-e5m2-tensor",
                           "fp8-e5m2-channel"}) {
    auto spec = ParseQuantFormat(name);
    ASSERT_TRUE(spec.ok());
    const Fp8Scheme scheme = spec->scheme == QuantScheme::kFp8Tensor    ? Fp8Scheme::kTensor
                             : spec->scheme == QuantScheme::kFp8Channel ? Fp8Scheme::kChannel
                                                                        : Fp8Scheme::kBlock128;
    const MiniFormat& fmt = spec->code_dtype == DType::kF8E4M3 ? E4M3() : E5M2();
    const Fp8Grouping g = MakeFp8Grouping(scheme, 2, 130, 260);
    for (ScalePolicy policy : {ScalePolicy{ScalePolicy::Kind::kFresh}, ScalePolicy{}}) {
      std::vector<float> x = EdgeWeights(n, rng, flavour);
      auto q0 = Quantize(*spec, x.data(), shape, nullptr, policy);
      ASSERT_TRUE(q0.ok()) << q0.status().ToString();
      std::vector<uint8_t> codes;
      std::vector<float> scales;
      EmulateFp8(g, fmt, x, nullptr, ToPolicy(policy), &codes, &scales);
      EXPECT_EQ(codes, q0->tensors[0].data) << name;
      EXPECT_EQ(F32Bytes(scales), q0->tensors[1].data) << name;
      // A step later: drift some weights, keep scales where the band allows.
      for (uint64_t i = 0; i < n; i += 3) x[i] *= (i % 2 || AbsF(x[i]) > 1e30f ? 0.97f : 1.03f);
      auto q1 = Quantize(*spec, x.data(), shape, &*q0, policy);
      ASSERT_TRUE(q1.ok());
      std::vector<float> prev(scales);
      EmulateFp8(g, fmt, x, &prev, ToPolicy(policy), &codes, &scales);
      EXPECT_EQ(codes, q1->tensors[0].data) << name << " with previous";
      EXPECT_EQ(F32Bytes(scales), q1->tensors[1].data) << name << " with previous";
    }
  }
}

TEST_P(GpuQuantEquivalence, Fp4MatchesQuantize) {
  const int flavour = GetParam();
  std::mt19937_64 rng(200 + flavour);
  const std::vector<uint64_t> shape = {3, 64, 96};
  const uint64_t n = 3 * 64 * 96;
  struct Case {
    const char* name;
    Fp4Scheme scheme;
    const char* codes;
    const char* scales;
    const char* global;
  };
  for (const Case& c : {Case{"nvfp4", Fp4Scheme::kNvfp4, ".weight", ".weight_scale", ".weight_scale_2"},
                        Case{"nvfp4-ct", Fp4Scheme::kNvfp4Ct, ".weight_packed", ".weight_scale",
                             ".weight_global_scale"},
                        Case{"mxfp4", Fp4Scheme::kMxfp4, "_blocks", "_scales", ""}}) {
    auto spec = ParseQuantFormat(c.name);
    ASSERT_TRUE(spec.ok());
    for (ScalePolicy policy : {ScalePolicy{ScalePolicy::Kind::kFresh}, ScalePolicy{},
                               ScalePolicy{ScalePolicy::Kind::kBand, 0.5f, 1.25f}}) {
      std::vector<float> x = EdgeWeights(n, rng, flavour);
      const Quantized* prev = nullptr;
      Quantized held;  // the previous state of the next step
      Result<Quantized> q = Quantize(*spec, x.data(), shape, nullptr, policy);
      for (int step = 0; step < 3; ++step) {
        ASSERT_TRUE(q.ok()) << q.status().ToString();
        std::vector<uint8_t> codes, scales;
        float global = 0.0f;
        EmulateFp4(c.scheme, x, prev, c.scales, c.global, ToPolicy(policy), &codes, &scales, &global);
        EXPECT_EQ(codes, q->Find(c.codes)->data) << c.name << " step " << step;
        EXPECT_EQ(scales, q->Find(c.scales)->data) << c.name << " step " << step;
        if (c.scheme != Fp4Scheme::kMxfp4) {
          EXPECT_EQ(F32Bytes({global}), q->Find(c.global)->data) << c.name << " step " << step;
        }
        held = *q;
        prev = &held;
        for (uint64_t i = 0; i < n; i += 5) x[i] *= (i % 2 || AbsF(x[i]) > 1e30f ? 0.93f : 1.05f);
        q = Quantize(*spec, x.data(), shape, prev, policy);
      }
    }
  }
}

// What the INT4 kernels compute: per group of 8 rows x g columns the scale
// and zero point (Int4GroupScale), then the nibbles, packed as the
// reference packs them. False: a scale overflowed (the reference fails too).
bool EmulateInt4(const QuantSpec& spec, const std::vector<float>& x, uint64_t out, uint64_t in,
                 const Quantized* prev, const QuantPolicy& p, Quantized* q) {
  const bool gptq = spec.scheme == QuantScheme::kGptqInt4, sym = spec.symmetric;
  const uint64_t g = spec.group, G = in / g;
  const QuantTensor* ps = prev ? prev->Find(gptq ? ".scales" : ".weight_scale") : nullptr;
  const QuantTensor* pz = prev && !sym ? prev->Find(".weight_zero_point") : nullptr;
  std::vector<uint32_t> packed(out * in / 8, 0), zps((out + 7) / 8 * G, 0);
  std::vector<uint16_t> scales(out * G);
  for (uint64_t o = 0; o < out; ++o) {
    for (uint64_t k = 0; k < G; ++k) {
      const uint64_t si = gptq ? k * out + o : o * G + k, zi = (o / 8) * G + k;
      uint16_t pbits = 0;
      int pzp = 0;
      if (ps) std::memcpy(&pbits, ps->data.data() + 2 * si, 2);
      if (pz) {
        uint32_t w;
        std::memcpy(&w, pz->data.data() + 4 * zi, 4);
        pzp = static_cast<int>((w >> (4 * (o % 8))) & 0xF) - 8;
      }
      Int4Group r;
      const float* row = x.data() + o * in + k * g;
      if (!Int4GroupScale([&](uint64_t i) { return row[i]; }, g, sym, gptq, ps != nullptr, pbits, pzp, p, &r))
        return false;
      scales[si] = r.scale_bits;
      if (!sym) zps[zi] |= static_cast<uint32_t>(r.zp + 8) << (4 * (o % 8));
      const float sd = DecodeInt4Scale(r.scale_bits, gptq);
      for (uint64_t i = 0; i < g; ++i) {
        const uint64_t col = k * g + i;
        const uint64_t wi = gptq ? (col / 8) * out + o : o * (in / 8) + col / 8;
        packed[wi] |= Int4Nibble(row[i], sd, r.zp) << (4 * (col % 8));
      }
    }
  }
  auto bytes = [](const auto& v) {
    std::vector<uint8_t> b(v.size() * sizeof(v[0]));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  };
  q->tensors.clear();
  q->tensors.push_back({gptq ? ".qweight" : ".weight_packed", DType::kI32, {}, bytes(packed)});
  q->tensors.push_back({gptq ? ".scales" : ".weight_scale", gptq ? DType::kF16 : DType::kBF16, {}, bytes(scales)});
  if (!sym) q->tensors.push_back({".weight_zero_point", DType::kI32, {}, bytes(zps)});
  return true;
}

TEST(GpuInt4Ops, RintAndF16WidenMatchTheLibrary) {
  uint64_t bad = 0;
  ForSweep([&](uint32_t u) {
    const float x = BitsFloat(u);
    const float want = std::nearbyint(x);
    bad += !(Bits(RintF(x)) == Bits(want) || (std::isnan(x) && std::isnan(RintF(x))));
  });
  EXPECT_EQ(bad, 0u);
  for (uint32_t h = 0; h < 0x10000; ++h)
    ASSERT_EQ(F16ToF32Bits(static_cast<uint16_t>(h)), ref::F16ToF32Bits(static_cast<uint16_t>(h))) << h;
}

TEST_P(GpuQuantEquivalence, Int4MatchesQuantize) {
  const int flavour = GetParam();
  std::mt19937_64 rng(300 + flavour);
  const uint64_t out = 44, in = 256;  // out not a multiple of 8: a partial zero-point word
  int compared = 0, refused = 0;
  for (const char* name : {"int4-g32", "int4-g128", "int4-g64-asym", "int4-g32-asym", "gptq-int4-g128",
                           "gptq-int4-g32"}) {
    auto spec = ParseQuantFormat(name);
    ASSERT_TRUE(spec.ok()) << name;
    const uint64_t rows = spec->scheme == QuantScheme::kGptqInt4 ? 48 : out;  // GPTQ: out % 8 == 0
    const std::vector<uint64_t> shape = {rows, in};
    for (ScalePolicy policy : {ScalePolicy{ScalePolicy::Kind::kFresh}, ScalePolicy{},
                               ScalePolicy{ScalePolicy::Kind::kBand, 0.5f, 1.25f}}) {
      std::vector<float> x = EdgeWeights(rows * in, rng, flavour);
      Quantized held;
      const Quantized* prev = nullptr;
      for (int step = 0; step < 3; ++step) {
        Result<Quantized> q = Quantize(*spec, x.data(), shape, prev, policy);
        Quantized emu;
        const bool ok = EmulateInt4(*spec, x, rows, in, prev, ToPolicy(policy), &emu);
        ASSERT_EQ(ok, q.ok()) << name << " step " << step << ": " << q.status().ToString();
        if (!ok) {
          ++refused;
          break;
        }
        for (const QuantTensor& t : emu.tensors) {
          const QuantTensor* want = q->Find(t.suffix);
          ASSERT_NE(want, nullptr) << t.suffix;
          ASSERT_EQ(t.data, want->data) << name << " " << t.suffix << " step " << step;
        }
        ++compared;
        held = *q;
        prev = &held;
        for (uint64_t i = 0; i < x.size(); i += 5) x[i] *= (i % 2 || AbsF(x[i]) > 1e30f ? 0.93f : 1.05f);
      }
    }
  }
  EXPECT_GT(compared, 0);
  if (flavour != 2) {
    EXPECT_EQ(refused, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Flavours, GpuQuantEquivalence, ::testing::Values(0, 1, 2, 3, 4));

}  // namespace
}  // namespace tern::gpu
