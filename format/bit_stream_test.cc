// format/bit_stream.h against a bit-at-a-time model of §4: every read of the
// windowed reader (Peek, Read up to 64 bits, ReadUnary, the unchecked fast
// path) gives the stream's bits, zeros past the end with Overrun() set, and
// the writer's bytes read back; a bounded sink flags an overflow.
#include "format/bit_stream.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace tern::format {
namespace {

// Bit j of the stream (0 past the end).
uint64_t ModelBits(const std::vector<uint8_t>& s, uint64_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) {
    const uint64_t j = at + static_cast<uint64_t>(i);
    const uint64_t bit = j / 8 < s.size() ? (s[j / 8] >> (j % 8)) & 1 : 0;
    v |= bit << i;
  }
  return v;
}

TEST(BitStream, ReaderMatchesTheBitModel) {
  std::mt19937_64 rng(1);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<uint8_t> s(rng() % 40);
    for (auto& b : s) b = static_cast<uint8_t>(rng() % 4 == 0 ? 0 : rng());
    BitReader r(s.data(), s.size());
    uint64_t at = 0;
    for (int step = 0; step < 60 && at <= s.size() * 8 + 70; ++step) {
      const int kind = static_cast<int>(rng() % 5);
      const int n = static_cast<int>(rng() % (kind == 1 ? 65 : 57));
      if (kind == 0) {
        ASSERT_EQ(r.Peek(n), ModelBits(s, at, n)) << "peek " << n << " at " << at;
      } else if (kind == 1) {
        ASSERT_EQ(r.Read(n), ModelBits(s, at, n)) << "read " << n << " at " << at;
        at += static_cast<uint64_t>(n);
      } else if (kind == 2) {
        r.Skip(n);
        at += static_cast<uint64_t>(n);
      } else if (kind == 3) {
        const uint64_t max_q = rng() % 100;
        uint64_t q = 0, want = 0;
        while (at + want < s.size() * 8 && ModelBits(s, at + want, 1) == 0) ++want;
        const bool ok = r.ReadUnary(max_q, &q);
        const bool want_ok = at + want < s.size() * 8 && want <= max_q;
        ASSERT_EQ(ok, want_ok) << "unary at " << at;
        if (!ok) break;  // the position after a failed run is unspecified
        ASSERT_EQ(q, want);
        at += want + 1;
      } else if (r.FastReads() > 0) {
        ASSERT_EQ(r.PeekFast() & ((uint64_t{1} << 57) - 1), ModelBits(s, at, 57));
      }
      ASSERT_EQ(r.position_bits(), at);
      ASSERT_EQ(r.Overrun(), at > s.size() * 8);
    }
  }
}

TEST(BitStream, WriterRoundTripsAndBoundsItsSink) {
  std::mt19937_64 rng(2);
  std::vector<std::pair<uint64_t, int>> puts;
  uint64_t bits = 0;
  for (int i = 0; i < 500; ++i) {
    const int n = static_cast<int>(rng() % 65);
    puts.emplace_back(rng(), n);
    bits += static_cast<uint64_t>(n);
  }
  std::vector<uint8_t> buf((bits + 7) / 8);
  ByteSink sink{buf.data(), buf.size()};
  BitWriter<ByteSink> w(&sink);
  for (auto [v, n] : puts) w.Put(v, n);
  w.Finish();
  ASSERT_FALSE(sink.overflow);
  ASSERT_EQ(sink.size, buf.size());
  BitReader r(buf.data(), buf.size());
  for (auto [v, n] : puts) ASSERT_EQ(r.Read(n), n == 64 ? v : v & ((uint64_t{1} << n) - 1));
  EXPECT_TRUE(r.FinishedCleanly());

  std::vector<uint8_t> small(3);
  ByteSink tight{small.data(), small.size()};
  BitWriter<ByteSink> t(&tight);
  t.Put(~uint64_t{0}, 40);
  t.Finish();
  EXPECT_TRUE(tight.overflow);
  EXPECT_EQ(tight.size, 5u);
}

}  // namespace
}  // namespace tern::format
