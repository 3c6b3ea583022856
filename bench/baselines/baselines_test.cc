#include <zstd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "bench/baselines/entropy_bound.h"
#include "bench/baselines/generic.h"
#include "bench/baselines/pulse.h"
#include "bench/baselines/synth.h"

namespace tern::bench {
namespace {

std::span<const uint8_t> Bytes(const std::vector<uint16_t>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * 2};
}

TEST(EntropyBound, ZigzagOfBitPatternDeltas) {
  EXPECT_EQ(ZigzagDelta(100, 100, 16), 0u);
  EXPECT_EQ(ZigzagDelta(100, 99, 16), 1u);
  EXPECT_EQ(ZigzagDelta(100, 101, 16), 2u);
  EXPECT_EQ(ZigzagDelta(100, 98, 16), 3u);
  EXPECT_EQ(ZigzagDelta(0xFFFF, 0x0000, 16), 2u);  // +1 modulo 2^16
  EXPECT_EQ(ZigzagDelta(0x0000, 0xFFFF, 16), 1u);  // -1 modulo 2^16
  EXPECT_EQ(ZigzagDelta(0, 0x8000, 16), 0xFFFFu);  // -2^15, the most negative
  EXPECT_EQ(ZigzagDelta(5, 4, 64), 1u);
  EXPECT_EQ(ZigzagDelta(0, ~uint64_t{0}, 64), 1u);
  EXPECT_EQ(ZigzagDelta(1, 0xFF, 8), 3u);  // delta 0xFE is -2 in 8 bits
}

TEST(EntropyBound, KnownDistribution) {
  // 1024 elements, 256 changed (p = 1/4): half by +1, a quarter by -1, a
  // quarter by +3 -> value entropy 1.5 bits.
  std::vector<uint16_t> a(1024), b;
  for (size_t i = 0; i < a.size(); ++i) a[i] = uint16_t(0x3C00 + i);
  b = a;
  for (int j = 0; j < 256; ++j) {
    const size_t i = size_t(j) * 4 + 1;
    b[i] = uint16_t(a[i] + (j < 128 ? 1 : j < 192 ? -1 : 3));
  }
  EntropyCounter c;
  ASSERT_TRUE(c.Add(Bytes(a), Bytes(b), 16).ok());
  const EntropyBound e = c.Bound();
  EXPECT_EQ(e.elements, 1024u);
  EXPECT_EQ(e.changed, 256u);
  const double h = -0.25 * std::log2(0.25) - 0.75 * std::log2(0.75);
  EXPECT_NEAR(e.position_bits, 1024 * h, 1e-6);
  EXPECT_NEAR(e.value_bits, 256 * 1.5, 1e-6);
  EXPECT_NEAR(e.total_bytes(), (1024 * h + 384) / 8, 1e-6);

  // Splitting the data over two counters and merging gives the same bound.
  EntropyCounter lo, hi;
  ASSERT_TRUE(lo.Add(Bytes(a).subspan(0, 1000), Bytes(b).subspan(0, 1000), 16).ok());
  ASSERT_TRUE(hi.Add(Bytes(a).subspan(1000), Bytes(b).subspan(1000), 16).ok());
  lo.Merge(hi);
  EXPECT_NEAR(lo.Bound().total_bits(), e.total_bits(), 1e-6);
}

TEST(EntropyBound, DegenerateCases) {
  std::vector<uint16_t> a(64, 7);
  EntropyCounter same;
  ASSERT_TRUE(same.Add(Bytes(a), Bytes(a), 16).ok());
  EXPECT_EQ(same.Bound().total_bits(), 0.0);
  // Every element changes by the same delta: no position or value information.
  std::vector<uint16_t> b(64, 8);
  EntropyCounter all;
  ASSERT_TRUE(all.Add(Bytes(a), Bytes(b), 16).ok());
  EXPECT_EQ(all.Bound().total_bits(), 0.0);
  EXPECT_EQ(all.changed(), 64u);
  // Bad arguments are errors, not crashes.
  EntropyCounter bad;
  EXPECT_EQ(bad.Add(Bytes(a), Bytes(a).subspan(2), 16).code(), Code::kMismatch);
  EXPECT_EQ(bad.Add(Bytes(a).subspan(1), Bytes(a).subspan(1), 16).code(), Code::kInvalidArgument);
  EXPECT_EQ(bad.Add(Bytes(a), Bytes(a), 4).code(), Code::kUnsupported);
}

TEST(EntropyBound, WideElementsUseTheOverflowTable) {
  std::vector<uint32_t> a(100, 0), b(100, 0);
  for (int i = 0; i < 10; ++i) b[size_t(i) * 10] = 0x100000u * uint32_t(i + 1);  // 10 distinct
  EntropyCounter c;
  ASSERT_TRUE(c.Add({reinterpret_cast<uint8_t*>(a.data()), 400},
                    {reinterpret_cast<uint8_t*>(b.data()), 400}, 32)
                  .ok());
  EXPECT_EQ(c.changed(), 10u);
  EXPECT_NEAR(c.Bound().value_bits, 10 * std::log2(10.0), 1e-9);
}

TEST(EntropyBound, ExponentContextSeparatesClasses) {
  // 1000 BF16 elements near 2^-7 and 1000 near 1.0; 100 of the small ones
  // move by +1 ulp, none of the large ones.
  std::vector<uint16_t> a(2000), b;
  for (size_t i = 0; i < 2000; ++i) a[i] = i % 2 ? uint16_t(0x3C00 + i % 64) : uint16_t(0x3F80 + i % 64);
  b = a;
  for (size_t j = 0; j < 100; ++j) b[j * 20 + 1] += 1;
  ExponentContextCounter ctx;
  ASSERT_TRUE(ctx.Add(Bytes(a), Bytes(b), DType::kBF16).ok());
  const EntropyBound c = ctx.Bound();
  EXPECT_EQ(c.elements, 2000u);
  EXPECT_EQ(c.changed, 100u);
  EXPECT_NEAR(c.position_bits, 1000 * BinaryEntropyBits(0.1), 1e-6);
  EXPECT_NEAR(c.value_bits, 0.0, 1e-9);
  EntropyCounter plain;
  ASSERT_TRUE(plain.Add(Bytes(a), Bytes(b), 16).ok());
  EXPECT_NEAR(plain.Bound().position_bits, 2000 * BinaryEntropyBits(0.05), 1e-6);
  EXPECT_LT(c.total_bits(), plain.Bound().total_bits());
  // Without an exponent field (U16) it is the plain bound.
  ExponentContextCounter flat;
  ASSERT_TRUE(flat.Add(Bytes(a), Bytes(b), DType::kU16).ok());
  EXPECT_NEAR(flat.Bound().total_bits(), plain.Bound().total_bits(), 1e-6);
}

TEST(Synth, ExactDensityAndSmallDeltas) {
  ThreadPool pool(2);
  SynthOptions o;
  o.elements = 200003;
  o.density = 0.01;
  o.seed = 42;
  const SynthStep s = SynthesizeBf16Step(o, pool);
  ASSERT_EQ(s.old_bits.size(), o.elements);
  EXPECT_EQ(s.changed, 2000u);
  uint64_t changed = 0, ones = 0;
  std::map<uint64_t, uint64_t> zig;
  for (uint64_t i = 0; i < o.elements; ++i) {
    if (s.old_bits[i] == s.new_bits[i]) continue;
    ++changed;
    const uint64_t z = ZigzagDelta(s.old_bits[i], s.new_bits[i], 16);
    EXPECT_LE(z, 8u);  // |delta| <= 4 ulp
    ones += z <= 2;
  }
  EXPECT_EQ(changed, 2000u);
  EXPECT_NEAR(double(ones) / double(changed), 0.90, 0.03);
  // Weights look like N(0, 0.02) in BF16: |w| mostly below 0.06, exponent sane.
  uint64_t small = 0;
  for (uint16_t w : s.old_bits) {
    uint32_t f = uint32_t(w) << 16;
    float x;
    std::memcpy(&x, &f, 4);
    small += std::fabs(x) < 0.06f;
  }
  EXPECT_GT(double(small) / double(o.elements), 0.99);
  // Deterministic across pool sizes.
  ThreadPool one(1);
  const SynthStep t = SynthesizeBf16Step(o, one);
  EXPECT_EQ(s.old_bits, t.old_bits);
  EXPECT_EQ(s.new_bits, t.new_bits);
}

TEST(Synth, DenseAndEmpty) {
  ThreadPool pool(1);
  SynthOptions o;
  o.elements = 1000;
  o.density = 0.9;
  EXPECT_EQ(SynthesizeBf16Step(o, pool).changed, 900u);
  o.density = 0;
  const SynthStep s = SynthesizeBf16Step(o, pool);
  EXPECT_EQ(s.changed, 0u);
  EXPECT_EQ(s.old_bits, s.new_bits);
}

TEST(Synth, Bf16RoundsToNearestEven) {
  EXPECT_EQ(Bf16FromFloat(1.0f), 0x3F80);
  EXPECT_EQ(Bf16FromFloat(-2.0f), 0xC000);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(Bf16FromFloat(1.00390625f), 0x3F80);
  EXPECT_EQ(Bf16FromFloat(1.01171875f), 0x3F82);  // 1 + 3*2^-8: ties up to even
}

// Two-tensor views over caller-owned buffers.
struct Views {
  std::vector<TensorDesc> descs;
  std::vector<std::vector<uint8_t>> old_data, new_data;
  ServeView old_view, new_view;
  MutableServeView base;
  std::vector<std::vector<uint8_t>> base_data;
  void Build() {
    old_view = {};
    new_view = {};
    base = {};
    base_data = old_data;
    for (size_t t = 0; t < descs.size(); ++t) {
      old_view.tensors.push_back({&descs[t], old_data[t].data()});
      new_view.tensors.push_back({&descs[t], new_data[t].data()});
      base.tensors.push_back({&descs[t], base_data[t].data()});
    }
  }
};

Views MakeViews(uint64_t seed, double density) {
  Views v;
  v.descs = {{"a.weight", DType::kBF16, {300, 1000}},
             {"b.bias", DType::kF32, {5000}},
             {"c.u8", DType::kU8, {70, 70}},
             {"d.f64", DType::kF64, {3, 5, 7}}};
  uint64_t state = seed;
  auto rnd = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 11;
  };
  for (const auto& d : v.descs) {
    std::vector<uint8_t> a(d.bytes());
    for (auto& x : a) x = uint8_t(rnd());
    std::vector<uint8_t> b = a;
    const uint64_t eb = uint64_t(ElementBits(d.dtype)) / 8;
    for (uint64_t i = 0; i < d.elements(); ++i)
      if (double(rnd() % 1000000) / 1e6 < density) b[i * eb + rnd() % eb] ^= uint8_t(1 + rnd() % 255);
    v.old_data.push_back(std::move(a));
    v.new_data.push_back(std::move(b));
  }
  v.Build();
  return v;
}

class PulseRoundTrip : public ::testing::TestWithParam<std::tuple<PulseIndexLayout, double>> {};

TEST_P(PulseRoundTrip, AppliesBitExactly) {
  const auto [layout, density] = GetParam();
  Views v = MakeViews(7, density);
  // Edge positions: first and last element of the BF16 tensor.
  v.new_data[0][0] ^= 1;
  v.new_data[0].back() ^= 0x80;
  v.Build();
  auto patch = PulseEncode(v.old_view, v.new_view, {layout, 1});
  ASSERT_TRUE(patch.ok()) << patch.status().ToString();
  ASSERT_TRUE(PulseApply(*patch, v.base).ok());
  for (size_t t = 0; t < v.descs.size(); ++t) EXPECT_EQ(v.base_data[t], v.new_data[t]) << t;
}

INSTANTIATE_TEST_SUITE_P(Layouts, PulseRoundTrip,
                         ::testing::Combine(::testing::Values(PulseIndexLayout::kFlatGaps,
                                                              PulseIndexLayout::kCooRowCol),
                                            ::testing::Values(0.0, 0.001, 0.01, 0.3, 1.0)),
                         [](const auto& info) {
                           const bool flat = std::get<0>(info.param) == PulseIndexLayout::kFlatGaps;
                           return std::string(flat ? "flat_" : "coo_") + "permille_" +
                                  std::to_string(int(std::get<1>(info.param) * 1000));
                         });

TEST(Pulse, IndexWidthIsTheSmallestThatFits) {
  EXPECT_EQ(PulseIndexWidthBytes(0), 1);
  EXPECT_EQ(PulseIndexWidthBytes(255), 1);
  EXPECT_EQ(PulseIndexWidthBytes(256), 2);
  EXPECT_EQ(PulseIndexWidthBytes(65535), 2);
  EXPECT_EQ(PulseIndexWidthBytes(65536), 4);
  EXPECT_EQ(PulseIndexWidthBytes(uint64_t{1} << 32), 8);
  EXPECT_EQ(PulseIndexWidthBytes(3, 2), 2);
}

TEST(Pulse, PayloadIsGapsPlusRawValuesUnderZstd1) {
  // One BF16 tensor, changes every 300 elements: gaps need u16. The frame must
  // decompress to header + 2 bytes of gap + 2 bytes of value per change.
  TensorDesc d{"w", DType::kBF16, {30000}};
  std::vector<uint16_t> a(30000, 0x3C00), b = a;
  for (size_t i = 0; i < b.size(); i += 300) b[i] = uint16_t(0x3C01 + i);
  ServeView va, vb;
  va.tensors.push_back({&d, reinterpret_cast<const uint8_t*>(a.data())});
  vb.tensors.push_back({&d, reinterpret_cast<const uint8_t*>(b.data())});
  auto patch = PulseEncode(va, vb);
  ASSERT_TRUE(patch.ok());
  const unsigned long long raw = ZSTD_getFrameContentSize(patch->data(), patch->size());
  const uint64_t header = 4 + 4 + 2 + 1 + 4 + 8 * 3;
  EXPECT_EQ(raw, header + 100 * (2 + 2));
}

TEST(Pulse, RejectsBadInputWithoutTouchingTheView) {
  Views v = MakeViews(3, 0.01);
  auto patch = PulseEncode(v.old_view, v.new_view);
  ASSERT_TRUE(patch.ok());
  // Decompress, corrupt the inner payload in a few ways, recompress.
  std::vector<uint8_t> raw(ZSTD_getFrameContentSize(patch->data(), patch->size()));
  ASSERT_EQ(ZSTD_decompress(raw.data(), raw.size(), patch->data(), patch->size()), raw.size());
  auto pack = [](const std::vector<uint8_t>& r) {
    std::vector<uint8_t> out(ZSTD_compressBound(r.size()));
    out.resize(ZSTD_compress(out.data(), out.size(), r.data(), r.size(), 1));
    return out;
  };
  std::vector<std::vector<uint8_t>> bad;
  for (size_t cut : {size_t{0}, size_t{3}, size_t{9}, raw.size() / 2, raw.size() - 1})
    bad.push_back(pack(std::vector<uint8_t>(raw.begin(), raw.begin() + long(cut))));
  // Header fields of the first record (magic, count, name length, name,
  // value width, layout, index width, element count, row length).
  for (size_t at : {0, 4, 8, 12, 18, 19, 20, 22, 38}) {
    std::vector<uint8_t> r = raw;
    r[at] ^= 0xFF;
    bad.push_back(pack(r));
  }
  {
    std::vector<uint8_t> r = raw;
    r.push_back(0);
    bad.push_back(pack(r));
  }
  bad.push_back(std::vector<uint8_t>(patch->begin(), patch->begin() + long(patch->size() / 2)));
  bad.push_back({});
  for (const auto& p : bad) {
    EXPECT_FALSE(PulseApply(p, v.base).ok());
    for (size_t t = 0; t < v.descs.size(); ++t) ASSERT_EQ(v.base_data[t], v.old_data[t]);
  }
}

TEST(Generic, ZstdXorDecompressesToTheXor) {
  std::vector<uint16_t> a(3 << 19), b;  // 3 MiB: crosses the 1 MiB slices
  for (size_t i = 0; i < a.size(); ++i) a[i] = uint16_t(i * 2654435761u >> 7);
  b = a;
  for (size_t i = 0; i < b.size(); i += 97) b[i] ^= 1;
  std::vector<uint8_t> z;
  auto n = ZstdXorBytes(Bytes(a), Bytes(b), 3, &z);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, z.size());
  std::vector<uint8_t> x(a.size() * 2);
  ASSERT_EQ(ZSTD_decompress(x.data(), x.size(), z.data(), z.size()), x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], Bytes(a)[i] ^ Bytes(b)[i]) << i;
  EXPECT_LT(*n, x.size() / 20);  // mostly zeros
  // Counting only gives the same size.
  auto m = ZstdXorBytes(Bytes(a), Bytes(b), 3);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m, *n);
  EXPECT_EQ(NaiveSparseBytes(1000, 16), 6000u);
}

TEST(Generic, Xdelta3RoundTrips) {
  std::vector<uint16_t> a(1 << 16), b;
  for (size_t i = 0; i < a.size(); ++i) a[i] = uint16_t(i * 40503u);
  b = a;
  for (size_t i = 0; i < b.size(); i += 101) b[i] += 1;
  const char* tmp = std::getenv("TMPDIR");
  auto n = Xdelta3Bytes(Bytes(a), Bytes(b), tmp ? tmp : "/tmp", {}, /*check_roundtrip=*/true);
  if (!n.ok() && n.status().code() == Code::kUnavailable)
    GTEST_SKIP() << "xdelta3 not runnable: " << n.status().ToString();
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_GT(*n, 0u);
  EXPECT_LT(*n, a.size() * 2);
}

}  // namespace
}  // namespace tern::bench
