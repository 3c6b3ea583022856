#include "patch/segment_codec.h"

#include <gtest/gtest.h>

#include <random>

namespace tern::patchfmt {
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

}  // namespace
}  // namespace tern::patchfmt
