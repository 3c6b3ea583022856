#include "patch/segment_codec.h"

#include <gtest/gtest.h>

#include <random>

namespace tern::patch {
namespace {

struct Decoded {
  std::vector<uint64_t> positions, deltas;
};

Decoded RoundTrip(const std::vector<uint64_t>& pos, const std::vector<uint64_t>& delta, int w, uint64_t count,
                  Encoding* encoding = nullptr) {
  std::vector<uint8_t> rec;
  EncodeRecord(pos.data(), delta.data(), pos.size(), w, 3, 64, count, &rec);
  auto r = ParseRecord(rec.data(), rec.size(), w);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  Decoded out;
  if (!r.ok()) return out;
  EXPECT_EQ(r->total_bytes, rec.size());
  EXPECT_EQ(r->h.tensor_index, 3u);
  EXPECT_EQ(r->h.first_element, 64u);
  if (encoding) *encoding = static_cast<Encoding>(r->h.encoding);
  Status s = DecodeRecord(*r, w, [&](uint64_t p, uint64_t d) {
    out.positions.push_back(p);
    out.deltas.push_back(d);
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

TEST(SegmentCodecTest, ZigZagRoundTripsEveryWidth) {
  std::mt19937_64 rng(5);
  for (int w : {4, 8, 16, 32, 64}) {
    const uint64_t mask = WidthMask(w);
    EXPECT_EQ(ZigZag(mask, w), 1u);  // -1
    EXPECT_EQ(ZigZag(1, w), 2u);
    EXPECT_EQ(ZigZag(uint64_t{1} << (w - 1), w), mask);  // most negative
    for (int i = 0; i < 1000; ++i) {
      const uint64_t d = rng() & mask;
      EXPECT_LE(ZigZag(d, w), mask);
      EXPECT_EQ(UnZigZag(ZigZag(d, w), w), d);
    }
  }
}

TEST(SegmentCodecTest, PicksEachEncodingAndRoundTrips) {
  std::mt19937_64 rng(6);
  for (int w : {4, 8, 16, 32, 64}) {
    const uint64_t mask = WidthMask(w);
    const uint64_t count = 5000;
    struct Case {
      double density;
      bool random_values;
      Encoding expect;
    };
    for (Case c : {Case{0.01, false, kSparse}, Case{1.0, false, kDense}, Case{1.0, true, kRaw}}) {
      std::vector<uint64_t> pos, delta;
      std::bernoulli_distribution pick(c.density);
      for (uint64_t i = 0; i < count; ++i) {
        if (!pick(rng)) continue;
        uint64_t d = c.random_values ? rng() & mask : (rng() & 1 ? 1 : mask);
        if (d == 0) d = 1;
        pos.push_back(i);
        delta.push_back(d);
      }
      Encoding e;
      Decoded out = RoundTrip(pos, delta, w, count, &e);
      EXPECT_EQ(out.positions, pos) << "w=" << w << " density=" << c.density;
      EXPECT_EQ(out.deltas, delta);
      if (w > 4 || c.expect != kRaw) {
        EXPECT_EQ(e, c.expect) << "w=" << w << " density=" << c.density;
      }
    }
  }
}

TEST(SegmentCodecTest, EdgePositionsAndSingleElement) {
  for (int w : {4, 16, 64}) {
    Decoded a = RoundTrip({0}, {1}, w, 1);
    EXPECT_EQ(a.positions, std::vector<uint64_t>{0});
    Decoded b = RoundTrip({0, kMaxSegmentElements - 1}, {WidthMask(w), 2}, w, kMaxSegmentElements);
    EXPECT_EQ(b.positions, (std::vector<uint64_t>{0, kMaxSegmentElements - 1}));
    EXPECT_EQ(b.deltas, (std::vector<uint64_t>{WidthMask(w), 2}));
  }
}

TEST(SegmentCodecTest, DeepHuffmanTreeIsLengthLimited) {
  // Fibonacci symbol frequencies give an unlimited Huffman depth of ~25.
  std::vector<uint64_t> pos, delta;
  uint64_t f0 = 1, f1 = 1;
  for (int sym = 1; sym < 26 && pos.size() < 200000; ++sym) {
    const uint64_t z = sym < 16 ? sym : (uint64_t{1} << (sym - 12));
    for (uint64_t k = 0; k < f0; ++k) {
      pos.push_back(pos.size());
      delta.push_back(UnZigZag(z, 32));
    }
    const uint64_t f2 = f0 + f1;
    f0 = f1;
    f1 = f2;
  }
  Decoded out = RoundTrip(pos, delta, 32, pos.size() + 10);
  EXPECT_EQ(out.deltas, delta);
}

TEST(SegmentCodecTest, UnaryRunsDecodeAndAreBounded) {
  std::vector<uint8_t> bytes;
  BitWriter w(&bytes);
  w.PutUnary(1000000);
  w.PutUnary(0);
  w.PutUnary(57);
  w.Finish();
  BitReader r(bytes.data(), bytes.size());
  uint64_t q;
  ASSERT_TRUE(r.ReadUnary(uint64_t{1} << 24, &q));
  EXPECT_EQ(q, 1000000u);
  ASSERT_TRUE(r.ReadUnary(10, &q));
  EXPECT_EQ(q, 0u);
  EXPECT_FALSE(r.ReadUnary(56, &q));  // over the caller's bound
  std::vector<uint8_t> zeros(1 << 16, 0);
  BitReader z(zeros.data(), zeros.size());
  EXPECT_FALSE(z.ReadUnary(~uint64_t{0}, &q));  // runs off the end, stops
}

TEST(SegmentCodecTest, RejectsDamagedRecords) {
  std::vector<uint64_t> pos = {3, 9, 10}, delta = {1, 0xffff, 5};
  std::vector<uint8_t> rec;
  EncodeRecord(pos.data(), delta.data(), pos.size(), 16, 0, 0, 100, &rec);
  for (size_t cut = 0; cut < rec.size(); ++cut) EXPECT_FALSE(ParseRecord(rec.data(), cut, 16).ok());
  for (size_t bit = 0; bit < rec.size() * 8; ++bit) {
    std::vector<uint8_t> bad = rec;
    bad[bit / 8] ^= static_cast<uint8_t>(1 << (bit % 8));
    auto r = ParseRecord(bad.data(), bad.size(), 16);
    EXPECT_FALSE(r.ok()) << "bit " << bit;
  }
}

// The decode loops as they were before the unchecked fast path: every read
// bounds-checked, one change at a time. The oracle for FastPathMatchesChecked.
Status CheckedDecode(const RecordView& r, int w,
                     std::vector<std::pair<uint64_t, uint64_t>>* calls) {
  const RecordHeader& h = r.h;
  uint8_t lengths[kSymbols];
  TERN_RETURN_IF_ERROR(ParseCodeLengths(r.table, h.table_bytes, lengths));
  HuffmanDecoder dec;
  BuildDecoder(lengths, &dec);
  BitReader vin(r.values, h.value_bytes);
  if (h.encoding == kDense) {
    uint64_t changed = 0;
    for (uint64_t i = 0; i < h.element_count; ++i) {
      uint64_t z;
      if (!DecodeValue(vin, dec, w, &z) || vin.Overrun())
        return TERN_ERROR(kCorrupt, "DENSE segment: bad value code at element ", i);
      if (z != 0) {
        ++changed;
        calls->emplace_back(i, UnZigZag(z, w));
      }
    }
    TERN_REQUIRE(vin.FinishedCleanly(), kCorrupt,
                 "DENSE segment: values stream not cleanly consumed");
    TERN_REQUIRE(changed == h.changed_count, kCorrupt, "DENSE segment: changed count mismatch");
    return Status::Ok();
  }
  BitReader pin(r.positions, h.position_bytes);
  const int k = h.rice_k;
  const uint64_t count = h.element_count;
  uint64_t next = 0;
  for (uint64_t j = 0; j < h.changed_count; ++j) {
    uint64_t q;
    if (!pin.ReadUnary((count - 1) >> k, &q))
      return TERN_ERROR(kCorrupt, "SPARSE segment: bad position code at change ", j);
    const uint64_t gap = (q << k) | pin.Read(k);
    if (pin.Overrun() || gap >= count - next)
      return TERN_ERROR(kCorrupt, "SPARSE segment: position out of range at change ", j);
    const uint64_t pos = next + gap;
    uint64_t z;
    if (!DecodeValue(vin, dec, w, &z) || vin.Overrun() || z == 0)
      return TERN_ERROR(kCorrupt, "SPARSE segment: bad value code at change ", j);
    calls->emplace_back(pos, UnZigZag(z, w));
    next = pos + 1;
  }
  TERN_REQUIRE(pin.FinishedCleanly(), kCorrupt,
               "SPARSE segment: positions stream not cleanly consumed");
  TERN_REQUIRE(vin.FinishedCleanly(), kCorrupt,
               "SPARSE segment: values stream not cleanly consumed");
  return Status::Ok();
}

// "corrupt: segment_codec.h:202: msg" -> "corrupt: msg": the two decoders
// raise the same errors from different lines.
std::string WithoutLocation(const Status& s) {
  std::string m = s.ToString();
  size_t at = m.find(".h:");
  if (at == std::string::npos) at = m.find(".cc:");
  if (at == std::string::npos) return m;
  const size_t code_end = m.find(": ");
  const size_t msg = m.find(": ", at);
  return m.substr(0, code_end + 2) + m.substr(msg + 2);
}

// The fast path (unchecked peeks, one table lookup per value) must accept
// exactly what the checked path accepts, pass on the same changes before an
// error and fail with the same message: checked on intact records that hit
// every fallback (unary runs longer than a peek, values wider than one, the
// stream tails) and on many damaged copies of them (checksums bypassed).
TEST(SegmentCodecTest, FastPathMatchesCheckedDecode) {
  std::mt19937_64 rng(11);
  int records = 0, damaged_rejected = 0;
  for (int w : {4, 8, 16, 32, 64}) {
    for (double density : {0.002, 0.03, 0.3, 0.9}) {
      const uint64_t count = 20000;
      std::vector<uint64_t> pos, delta;
      std::bernoulli_distribution pick(density);
      for (uint64_t i = 0; i < count; ++i) {
        // Now and then a long run without changes: a unary code longer than
        // one 56-bit peek.
        if (i % 5000 == 100) i += 3000;
        if (i >= count || !pick(rng)) continue;
        uint64_t d =
            rng() % 16 == 0 ? rng() & WidthMask(w) : (rng() & 1 ? 1 : WidthMask(w) - rng() % 3);
        if (d == 0) d = 1;
        pos.push_back(i);
        delta.push_back(d);
      }
      std::vector<uint8_t> rec;
      EncodeRecord(pos.data(), delta.data(), pos.size(), w, 0, 0, count, &rec);
      auto parsed = ParseRecord(rec.data(), rec.size(), w);
      ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
      if (parsed->h.encoding == kRaw) continue;
      ++records;
      for (int trial = 0; trial < 60; ++trial) {
        std::vector<uint8_t> bad = rec;
        const size_t streams = sizeof(RecordHeader) + parsed->h.table_bytes;
        const size_t stream_bytes = rec.size() - kChecksumBytes - streams;
        if (trial > 0) {
          const int flips = 1 + static_cast<int>(rng() % 3);
          for (int f = 0; f < flips; ++f) {
            const size_t at = streams + rng() % stream_bytes;
            bad[at] ^= static_cast<uint8_t>(1 << (rng() % 8));
          }
        }
        RecordView r = *parsed;
        r.table = bad.data() + (parsed->table - rec.data());
        r.positions = bad.data() + (parsed->positions - rec.data());
        r.values = bad.data() + (parsed->values - rec.data());
        std::vector<std::pair<uint64_t, uint64_t>> fast_calls, checked_calls;
        const Status fast =
            DecodeRecord(r, w, [&](uint64_t p, uint64_t d) { fast_calls.emplace_back(p, d); });
        const Status checked = CheckedDecode(r, w, &checked_calls);
        ASSERT_EQ(WithoutLocation(fast), WithoutLocation(checked))
            << "w=" << w << " density=" << density << " trial " << trial;
        ASSERT_EQ(fast_calls, checked_calls)
            << "w=" << w << " density=" << density << " trial " << trial;
        if (trial == 0) {
          ASSERT_TRUE(fast.ok()) << fast.ToString();
          std::vector<std::pair<uint64_t, uint64_t>> want;
          for (size_t j = 0; j < pos.size(); ++j) want.emplace_back(pos[j], delta[j]);
          EXPECT_EQ(fast_calls, want);
        } else {
          damaged_rejected += !fast.ok();
        }
      }
    }
  }
  EXPECT_GE(records, 15);
  EXPECT_GT(damaged_rejected, 100);  // the damage is mostly caught, by both paths
}

}  // namespace
}  // namespace tern::patch
