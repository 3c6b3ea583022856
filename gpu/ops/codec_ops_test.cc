// The GPU codec logic (gpu/ops/codec_ops.h, gpu/ops/encode_ops.h) against patch/'s
// reference: the same digests, the same records byte for byte from the
// encoder, the same (position, delta) lists from the decoder, and the same
// accept/reject decision on corrupted streams.
#include "gpu/ops/codec_ops.h"

#include <gtest/gtest.h>

#include <random>
#include <utility>
#include <vector>

#include "base/hash.h"
#include "gpu/ops/encode_ops.h"
#include "patch/segment_codec.h"
#include "patch/test_util.h"
#include "tern/digest.h"
#include "tern/patch.h"

namespace tern::gpu {
namespace {

using Changes = std::vector<std::pair<uint64_t, uint64_t>>;
constexpr int kWidths[] = {4, 8, 16, 32, 64};

DType DTypeOfWidth(int w) {
  switch (w) {
    case 4: return DType::kF4;
    case 8: return DType::kF8E4M3;
    case 16: return DType::kBF16;
    case 32: return DType::kF32;
    default: return DType::kU64;
  }
}

TEST(GpuCodecOps, ZigZagAndSymbolsMatchReference) {
  std::mt19937_64 rng(1);
  for (int w : kWidths) {
    for (int i = 0; i < 20000; ++i) {
      uint64_t d = (i < 64 ? static_cast<uint64_t>(i) : (i & 1 ? rng() >> (rng() % 64) : 0 - (rng() % 100))) &
                   WidthMask(w);
      ASSERT_EQ(ZigZag(d, w), patch::ZigZag(d, w));
      ASSERT_EQ(UnZigZag(ZigZag(d, w), w), d);
      int eb, reb;
      uint64_t ex, rex;
      ASSERT_EQ(ValueSymbol(ZigZag(d, w), &eb, &ex), patch::ValueSymbol(ZigZag(d, w), &reb, &rex));
      ASSERT_EQ(eb, reb);
      ASSERT_EQ(ex, rex);
    }
  }
}

TEST(GpuCodecOps, DigestTermsMatchReference) {
  std::mt19937_64 rng(2);
  for (int i = 0; i < 10000; ++i) {
    const uint64_t seed = rng(), index = i < 100 ? i : rng(), a = rng(), b = rng() >> (i % 64);
    uint64_t acc[4] = {};
    AddElementHash(seed, index, a, acc);
    EXPECT_EQ(ViewDigest({acc[0], acc[1], acc[2], acc[3]}), ElementHash(seed, index, a));
    uint64_t chg[4] = {};
    AddElementChange(seed, index, a, b, chg);
    ViewDigest want = ElementHash(seed, index, b);
    want -= ElementHash(seed, index, a);
    EXPECT_EQ(ViewDigest({chg[0], chg[1], chg[2], chg[3]}), want);
    uint64_t t[4] = {};
    AddTensorTerm(seed, t);
    EXPECT_EQ(ViewDigest({t[0], t[1], t[2], t[3]}), TensorTerm(seed));
  }
}

TEST(GpuCodecOps, ElementAccessMatchesReference) {
  std::mt19937_64 rng(3);
  for (int w : kWidths) {
    std::vector<uint8_t> a(256), b(256);
    testing::FillRandom(a, rng);
    b = a;
    for (uint64_t i = 0; i < 256 * 8 / static_cast<uint64_t>(w); ++i) {
      ASSERT_EQ(LoadElement(a.data(), i, w), testing::Get(a, w, i));
      const uint64_t v = rng() & WidthMask(w);
      StoreElement(a.data(), i, w, v);
      testing::Set(b, w, i, v);
      ASSERT_EQ(a, b);
    }
  }
}

// A segment of `count` elements of width w with about density * count
// changes, encoded by the CPU encoder (tern::EncodeSegment).
struct Segment {
  std::vector<uint8_t> old_bytes, new_bytes;
  SegmentRecord record;
};

Segment MakeSegment(int w, uint64_t count, double density, std::mt19937_64& rng) {
  testing::OwnedView a, b;
  a.Add("t", DTypeOfWidth(w), {count});
  testing::FillRandom(a.data[0], rng);
  b = a;
  testing::Mutate(b.data[0], w, count, density, rng);
  Segment s;
  auto r = EncodeSegment(a.View(), b.View(), 0, 0, count);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  s.old_bytes = a.data[0];
  s.new_bytes = b.data[0];
  s.record = std::move(*r);
  return s;
}

SegmentStreams StreamsOf(const uint8_t* rec) {
  SegmentStreams s;
  std::memcpy(&s.h, rec, sizeof(RecordHeader));
  s.table = rec + sizeof(RecordHeader);
  s.positions = s.table + s.h.table_bytes;
  s.values = s.positions + s.h.position_bytes;
  return s;
}

// patch/'s decoder on the record as it stands, checksum not consulted (the
// corruption tests change payload bytes without fixing it).
bool ReferenceDecode(const std::vector<uint8_t>& rec, int w, Changes* out) {
  patch::RecordView r{};
  std::memcpy(&r.h, rec.data(), sizeof(r.h));
  r.table = rec.data() + sizeof(r.h);
  r.positions = r.table + r.h.table_bytes;
  r.values = r.positions + r.h.position_bytes;
  out->clear();
  return patch::DecodeRecord(r, w, [&](uint64_t p, uint64_t d) { out->emplace_back(p, d); }).ok();
}

bool GpuDecode(const std::vector<uint8_t>& rec, int w, Changes* out, int* err = nullptr) {
  out->clear();
  const int e = DecodeSegment(StreamsOf(rec.data()), w, [&](uint64_t p, uint64_t d) { out->emplace_back(p, d); });
  if (err) *err = e;
  return e == kDecodeOk;
}

struct Shape {
  uint64_t count;
  double density;
};
constexpr Shape kShapes[] = {{1, 1.0},      {2, 1.0},       {7, 0.5},     {100, 0.01},   {1000, 0.001},
                             {4096, 0.01},  {4096, 0.2},    {4096, 0.9},  {4096, 1.0},   {65536, 0.01},
                             {65537, 0.01}, {10000, 0.0005}, {3001, 0.3}, {1 << 17, 0.002}};

TEST(GpuCodecOps, EncoderWritesTheReferenceBytes) {
  std::mt19937_64 rng(4);
  int encodings[3] = {};
  for (int w : kWidths) {
    for (const Shape& sh : kShapes) {
      const Segment s = MakeSegment(w, sh.count, sh.density, rng);
      if (s.record.bytes.empty()) continue;
      Changes ch;
      ASSERT_TRUE(ReferenceDecode(s.record.bytes, w, &ch));
      std::vector<uint32_t> pos;
      std::vector<uint64_t> del;
      for (auto [p, d] : ch) pos.push_back(static_cast<uint32_t>(p)), del.push_back(d);
      std::vector<uint8_t> out(MaxRecordBodyBytes(sh.count, w));
      const uint64_t n = EncodeRecordBody(pos.data(), del.data(), pos.size(), w, 0, 0, sh.count, out.data(),
                                          out.size());
      ASSERT_GT(n, 0u);
      out.resize(n);
      const uint64_t sum = Xxh3(out.data(), out.size());
      out.resize(n + 8);
      std::memcpy(out.data() + n, &sum, 8);
      ASSERT_EQ(out, s.record.bytes) << "w " << w << " count " << sh.count << " density " << sh.density;
      encodings[s.record.bytes[4]]++;
    }
  }
  // The shapes exercise every encoding.
  EXPECT_GT(encodings[kSparse], 0);
  EXPECT_GT(encodings[kDense], 0);
  EXPECT_GT(encodings[kRaw], 0);
}

TEST(GpuCodecOps, EncoderRejectsATooSmallBuffer) {
  const uint32_t pos[] = {0, 5};
  const uint64_t del[] = {1, 3};
  std::vector<uint8_t> out(MaxRecordBodyBytes(8, 8));
  const uint64_t n = EncodeRecordBody(pos, del, 2, 8, 0, 0, 8, out.data(), out.size());
  ASSERT_GT(n, 0u);
  EXPECT_EQ(EncodeRecordBody(pos, del, 2, 8, 0, 0, 8, out.data(), n - 1), 0u);
}

TEST(GpuCodecOps, DecoderMatchesReferenceOnValidRecords) {
  std::mt19937_64 rng(5);
  for (int w : kWidths) {
    for (const Shape& sh : kShapes) {
      const Segment s = MakeSegment(w, sh.count, sh.density, rng);
      if (s.record.bytes.empty()) continue;
      Changes want, got;
      ASSERT_TRUE(ReferenceDecode(s.record.bytes, w, &want));
      int err = -1;
      ASSERT_TRUE(GpuDecode(s.record.bytes, w, &got, &err)) << "error " << err << " w " << w;
      ASSERT_EQ(got, want);
      // And the changes rebuild the target, with the reference's digest delta.
      std::vector<uint8_t> x = s.old_bytes;
      uint64_t acc[4] = {};
      const uint64_t seed = 12345;
      for (auto [p, d] : got) {
        const uint64_t old = LoadElement(x.data(), p, w);
        StoreElement(x.data(), p, w, (old + d) & WidthMask(w));
        AddElementChange(seed, p, old, (old + d) & WidthMask(w), acc);
      }
      ASSERT_EQ(x, s.new_bytes);
    }
  }
}

// Corrupt payload bytes (and the header fields the decoder reads) at
// random: both decoders must agree on accept/reject and, when both accept,
// on the changes. 
TEST(GpuCodecOps, DecoderAgreesWithReferenceOnCorruptedRecords) {
  std::mt19937_64 rng(6);
  int rejected = 0, accepted = 0;
  for (int w : kWidths) {
    for (const Shape& sh : kShapes) {
      if (sh.count > 5000) continue;  // keeps the loop short; shapes above cover size
      const Segment s = MakeSegment(w, sh.count, sh.density, rng);
      if (s.record.bytes.empty()) continue;
      const size_t payload = s.record.bytes.size() - 8 - sizeof(RecordHeader);
      for (int trial = 0; trial < 300; ++trial) {
        std::vector<uint8_t> rec = s.record.bytes;
        const int kind = trial % 6;
        if (kind < 4 && payload > 0) {  // flip 1-3 bits of the payload
          for (int f = 0; f <= kind % 3; ++f) {
            const size_t at = sizeof(RecordHeader) + rng() % payload;
            rec[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
          }
        } else if (kind == 4) {  // changed_count off by a little
          uint64_t c;
          std::memcpy(&c, rec.data() + 24, 8);
          c += (rng() % 2) ? 1 : -1;
          std::memcpy(rec.data() + 24, &c, 8);
        } else if (rec[4] == kSparse) {  // another Rice parameter
          rec[5] = static_cast<uint8_t>(rng() % 64);
        }
        Changes want, got;
        const bool ref_ok = ReferenceDecode(rec, w, &want);
        // The reference validates header fields in ParseRecord, before
        // decoding; a changed count above element_count is one of them.
        uint64_t changed, count;
        std::memcpy(&changed, rec.data() + 24, 8);
        std::memcpy(&count, rec.data() + 16, 8);
        const bool header_ok = changed <= count && (rec[4] != kSparse || changed >= 1);
        const bool gpu_ok = GpuDecode(rec, w, &got);
        ASSERT_EQ(gpu_ok, ref_ok && header_ok) << "w " << w << " count " << sh.count << " trial " << trial;
        if (gpu_ok) {
          ASSERT_EQ(got, want);
          ++accepted;
        } else {
          ++rejected;
        }
      }
    }
  }
  // Both outcomes occur (a bit flip in a RAW payload is often still valid).
  EXPECT_GT(rejected, 1000);
  EXPECT_GT(accepted, 100);
}

TEST(GpuCodecOps, DecoderRejectsBadTables) {
  // nsym 0, nsym 77, size mismatch, padding nibble, last length 0,
  // oversubscribed (three codes of length 1).
  const std::vector<std::vector<uint8_t>> tables = {
      {0x00, 0x00}, {77, 0x11}, {0x03, 0x10}, {0x03, 0x10, 0x11}, {0x02, 0x01}, {0x03, 0x11, 0x01}};
  for (const auto& t : tables) {
    CanonicalDecoder c;
    EXPECT_NE(ParseCodeTable(t.data(), static_cast<uint32_t>(t.size()), &c), kDecodeOk);
    uint8_t lengths[patch::kSymbols];
    EXPECT_FALSE(patch::ParseCodeLengths(t.data(), static_cast<uint32_t>(t.size()), lengths).ok());
  }
}

}  // namespace
}  // namespace tern::gpu
