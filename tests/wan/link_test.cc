// The WAN link model: delay, rate, drop-tail queue and seeded loss.
#include "tools/wan/link.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace tern::wan {
namespace {

constexpr uint64_t kMs = 1000000;

TEST(WanLink, DelayOnlyDeliversAfterDelay) {
  Link link(LinkConfig{.delay_us = 50000}, 1);
  uint64_t at = 0;
  ASSERT_EQ(link.Offer(7 * kMs, 1500, &at), Verdict::kForward);
  EXPECT_EQ(at, 57 * kMs);
  ASSERT_EQ(link.Offer(8 * kMs, 64, &at), Verdict::kForward);
  EXPECT_EQ(at, 58 * kMs);
}

TEST(WanLink, RateSpacesPacketsBySerializationTime) {
  // 12 Mb/s: a 1500-byte packet takes exactly 1 ms.
  Link link(LinkConfig{.delay_us = 10000, .rate_bps = 12000000, .queue_bytes = 1 << 20}, 1);
  std::vector<uint64_t> at(5);
  for (uint64_t& t : at) ASSERT_EQ(link.Offer(0, 1500, &t), Verdict::kForward);
  for (size_t i = 0; i < at.size(); ++i) EXPECT_EQ(at[i], (i + 1) * kMs + 10 * kMs);
  EXPECT_EQ(link.BacklogBytes(0), 5 * 1500u);
  EXPECT_EQ(link.BacklogBytes(5 * kMs), 0u);
  // An idle link does not bank credit: a late packet still takes 1 ms.
  uint64_t t = 0;
  ASSERT_EQ(link.Offer(100 * kMs, 1500, &t), Verdict::kForward);
  EXPECT_EQ(t, 111 * kMs);
}

TEST(WanLink, LongRunThroughputEqualsRate) {
  const uint64_t rate_bps = 100000000;
  Link link(LinkConfig{.delay_us = 0, .rate_bps = rate_bps, .queue_bytes = 64 * 1500}, 1);
  // Offer twice the rate; the link must carry exactly its rate.
  const uint64_t gap_ns = 1500 * 8 * 1000000000ull / (2 * rate_bps);
  uint64_t first = 0, last = 0, bytes = 0;
  for (uint64_t i = 0; i < 20000; ++i) {
    uint64_t t = 0;
    if (link.Offer(i * gap_ns, 1500, &t) != Verdict::kForward) continue;
    if (bytes == 0) first = t;
    last = t;
    bytes += 1500;
  }
  const double measured_bps = (bytes - 1500) * 8.0 / ((last - first) / 1e9);
  EXPECT_NEAR(measured_bps / rate_bps, 1.0, 0.001);
  EXPECT_NEAR(link.stats().queue_drop_packets, 10000.0, 100.0);
}

TEST(WanLink, QueueIsBoundedAndDropsTail) {
  const uint64_t queue_bytes = 10 * 1500;
  Link link(LinkConfig{.delay_us = 1000, .rate_bps = 8000000, .queue_bytes = queue_bytes}, 1);
  int forwarded = 0, dropped = 0;
  for (int i = 0; i < 100; ++i) {
    uint64_t t = 0;
    const Verdict v = link.Offer(0, 1500, &t);
    forwarded += v == Verdict::kForward;
    dropped += v == Verdict::kDropQueue;
    EXPECT_LE(link.BacklogBytes(0), queue_bytes);
  }
  EXPECT_EQ(forwarded, 10);
  EXPECT_EQ(dropped, 90);
  EXPECT_EQ(link.stats().queue_drop_packets, 90u);
}

TEST(WanLink, LossRateMatchesAndIsReproducible) {
  const double p = 0.01;
  const int n = 200000;
  auto pattern = [&](uint64_t seed) {
    Link link(LinkConfig{.delay_us = 0, .loss = p}, seed);
    std::vector<bool> lost(n);
    for (int i = 0; i < n; ++i) {
      uint64_t t = 0;
      lost[i] = link.Offer(static_cast<uint64_t>(i), 100, &t) == Verdict::kDropLoss;
    }
    return lost;
  };
  const std::vector<bool> a = pattern(42), b = pattern(42), c = pattern(43);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  int losses = 0;
  for (bool x : a) losses += x;
  const double sigma = std::sqrt(n * p * (1 - p));
  EXPECT_NEAR(losses, n * p, 5 * sigma);
}

TEST(WanLink, CorruptionRateMatchesAndLeavesTheLossPatternAlone) {
  const int n = 200000;
  auto run = [&](double corrupt, int* corrupted) {
    Link link(LinkConfig{.delay_us = 0, .loss = 0.01, .corrupt = corrupt}, 42);
    std::vector<bool> lost(n);
    *corrupted = 0;
    for (int i = 0; i < n; ++i) {
      uint64_t where = 0, t = 0;
      *corrupted += link.Corrupt(&where);
      lost[i] = link.Offer(static_cast<uint64_t>(i), 100, &t) == Verdict::kDropLoss;
    }
    return lost;
  };
  int none = -1, some = -1;
  const std::vector<bool> a = run(0.0, &none), b = run(0.001, &some);
  EXPECT_EQ(a, b);
  EXPECT_EQ(none, 0);
  const double sigma = std::sqrt(n * 0.001 * 0.999);
  EXPECT_NEAR(some, n * 0.001, 5 * sigma);
}

TEST(WanLink, DeliveryTimesNeverDecrease) {
  Link link(LinkConfig{.delay_us = 5000, .rate_bps = 50000000, .queue_bytes = 1 << 20}, 3);
  Rng rng(9);
  uint64_t now = 0, prev = 0;
  for (int i = 0; i < 10000; ++i) {
    now += rng.Next() % 200000;
    if (i == 5000) now -= 1000000;  // a clock step backwards must not reorder
    uint64_t t = 0;
    if (link.Offer(now, 40 + rng.Next() % 1460, &t) != Verdict::kForward) continue;
    EXPECT_GE(t, prev);
    prev = t;
  }
}

}  // namespace
}  // namespace tern::wan
