#include "agent/daemon/stall_watch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

namespace tern::agent {
namespace {

constexpr uint64_t kStall = 10'000'000;  // 10 s, the default

// Looks every 250 ms from `from` to `to`; the time of the first report (0:
// none). bytes_at(t) gives (verified, wire).
template <typename F>
uint64_t FirstReport(StallWatch& w, uint64_t from, uint64_t to, F bytes_at, bool due = true) {
  for (uint64_t t = from; t <= to; t += 250'000) {
    const auto [verified, wire] = bytes_at(t);
    if (ParentStalled(w, verified, wire, due, t, kStall)) return t;
  }
  return 0;
}

TEST(StallWatch, NoByteAtAllIsReportedAfterOneStallTime) {
  StallWatch w{0, 0, 0, 0};
  const uint64_t at = FirstReport(w, 0, 30'000'000, [](uint64_t) { return std::pair{0, 0}; });
  EXPECT_EQ(at, 10'250'000u);  // the first look past 10 s
  // Reported at most once per stall time.
  EXPECT_EQ(FirstReport(w, at + 250'000, at + 10'000'000, [](uint64_t) { return std::pair{0, 0}; }), 0u);
}

// 4 MiB at 300 kB/s: 14 s for one chunk. Bytes arrive all the while; the
// chunk verifies at 14 s. Counted in whole chunks alone that is a stall
// at 10 s; with the wire's bytes it is not.
TEST(StallWatch, AChunkArrivingSlowlyIsNotAStall) {
  StallWatch w{0, 0, 0, 0};
  auto slow = [](uint64_t t) {
    const uint64_t wire = std::min<uint64_t>(t / 1'000'000 * 300'000, 4u << 20);
    return std::pair<uint64_t, uint64_t>{t >= 14'000'000 ? 4u << 20 : 0, wire};
  };
  EXPECT_EQ(FirstReport(w, 0, 15'000'000, slow), 0u);
  // The same link without the wire's count (a backend that does not count):
  // reported at 10 s, as before.
  StallWatch v{0, 0, 0, 0};
  EXPECT_EQ(FirstReport(v, 0, 15'000'000, [&](uint64_t t) { return std::pair{slow(t).first, uint64_t{0}}; }),
            10'250'000u);
}

// A parent that trickles bytes but never completes a chunk: caught after
// two stall times.
TEST(StallWatch, BytesWithoutAWholeChunkAreCaughtAfterTwoStallTimes) {
  StallWatch w{0, 0, 0, 0};
  EXPECT_EQ(FirstReport(w, 0, 30'000'000, [](uint64_t t) { return std::pair<uint64_t, uint64_t>{0, t / 1000}; }),
            20'250'000u);
}

// Nothing due: nothing expected, the clock restarts.
TEST(StallWatch, NothingIsExpectedWhileNoVersionIsDue) {
  StallWatch w{0, 0, 0, 0};
  EXPECT_EQ(FirstReport(w, 0, 60'000'000, [](uint64_t) { return std::pair{0, 0}; }, /*due=*/false), 0u);
  EXPECT_EQ(FirstReport(w, 60'250'000, 80'000'000, [](uint64_t) { return std::pair{0, 0}; }),
            70'250'000u);  // one stall time after the last look with nothing due
}

TEST(StallWatch, StallTimeZeroNeverReports) {
  StallWatch w{0, 0, 0, 0};
  for (uint64_t t = 0; t < 100'000'000; t += 1'000'000) EXPECT_FALSE(ParentStalled(w, 0, 0, true, t, 0));
}

}  // namespace
}  // namespace tern::agent
