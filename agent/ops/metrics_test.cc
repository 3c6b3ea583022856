#include "agent/ops/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>

namespace tern::agent {
namespace {

// The exposition a scraper sees, byte for byte: families sorted by name,
// series by label text, labels by name, escapes, histogram buckets
// cumulative with +Inf, counters as integers.
TEST(Metrics, RenderGolden) {
  MetricsRegistry reg;
  auto version = reg.GetGauge("tern_version", "Version served at DIR/current.", {{"member", "m2"}});
  ASSERT_TRUE(version.ok()) << version.status().ToString();
  (*version)->Set(42);
  auto v1 = reg.GetGauge("tern_version", "Version served at DIR/current.", {{"member", "m1"}});
  ASSERT_TRUE(v1.ok());
  (*v1)->Set(41.5);
  auto bytes = reg.GetCounter("tern_link_bytes_total", "Bytes sent per link.\nSecond \\ line.",
                              {{"to", "m\"3\"\n"}, {"from", "root"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  (*bytes)->Add(1000);
  (*bytes)->Add(24);
  auto apply = reg.GetHistogram("tern_apply_seconds", "Apply time.", {0.01, 0.1, 1});
  ASSERT_TRUE(apply.ok());
  for (double v : {0.005, 0.01, 0.05, 2.0}) (*apply)->Observe(v);
  auto up = reg.GetGauge("tern_up", "");
  ASSERT_TRUE(up.ok());
  (*up)->Set(std::numeric_limits<double>::infinity());

  const std::string expected =
      "# HELP tern_apply_seconds Apply time.\n"
      "# TYPE tern_apply_seconds histogram\n"
      "tern_apply_seconds_bucket{le=\"0.01\"} 2\n"
      "tern_apply_seconds_bucket{le=\"0.1\"} 3\n"
      "tern_apply_seconds_bucket{le=\"1\"} 3\n"
      "tern_apply_seconds_bucket{le=\"+Inf\"} 4\n"
      "tern_apply_seconds_sum 2.065\n"
      "tern_apply_seconds_count 4\n"
      "# HELP tern_link_bytes_total Bytes sent per link.\\nSecond \\\\ line.\n"
      "# TYPE tern_link_bytes_total counter\n"
      "tern_link_bytes_total{from=\"root\",to=\"m\\\"3\\\"\\n\"} 1024\n"
      "# HELP tern_up \n"
      "# TYPE tern_up gauge\n"
      "tern_up +Inf\n"
      "# HELP tern_version Version served at DIR/current.\n"
      "# TYPE tern_version gauge\n"
      "tern_version{member=\"m1\"} 41.5\n"
      "tern_version{member=\"m2\"} 42\n";
  EXPECT_EQ(reg.Render(), expected);
}

TEST(Metrics, SameNameAndLabelsInAnyOrderIsOneSeries) {
  MetricsRegistry reg;
  auto a = reg.GetCounter("c_total", "h", {{"a", "1"}, {"b", "2"}});
  auto b = reg.GetCounter("c_total", "h", {{"b", "2"}, {"a", "1"}});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ(reg.series_count(), 1u);
}

TEST(Metrics, RefusesBadNamesLabelsAndConflicts) {
  MetricsRegistry reg;
  EXPECT_EQ(reg.GetCounter("", "h").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(reg.GetCounter("1abc", "h").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(reg.GetCounter("a-b", "h").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(reg.GetCounter(std::string(kMaxNameBytes + 1, 'a'), "h").status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(reg.GetCounter("ok", "h", {{"__x", "1"}}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(reg.GetCounter("ok", "h", {{"a:b", "1"}}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(reg.GetCounter("ok", "h", {{"a", "1"}, {"a", "2"}}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(
      reg.GetCounter("ok", "h", {{"a", std::string(kMaxLabelValueBytes + 1, 'x')}}).status().code(),
      Code::kInvalidArgument);
  EXPECT_EQ(reg.GetCounter("ok", "h", {{"a", "\xff"}}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(reg.GetCounter("ok", "h", {{"a", "\xc0\x80"}}).status().code(),  // overlong NUL
            Code::kInvalidArgument);
  EXPECT_EQ(reg.GetCounter("ok", "h", {{"a", "\xed\xa0\x80"}}).status().code(),  // surrogate
            Code::kInvalidArgument);
  EXPECT_TRUE(reg.GetCounter("ok", "h", {{"a", "\xc3\xa9t\xc3\xa9"}}).ok());  // "été"
  Labels many;
  for (size_t i = 0; i <= kMaxLabels; ++i) many.emplace_back("l" + std::to_string(i), "v");
  EXPECT_EQ(reg.GetCounter("ok", "h", many).status().code(), Code::kInvalidArgument);
  // Same name, another type or help.
  EXPECT_EQ(reg.GetGauge("ok", "h").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(reg.GetCounter("ok", "other help").status().code(), Code::kInvalidArgument);
  // Histogram bounds.
  EXPECT_EQ(reg.GetHistogram("h1", "h", {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(reg.GetHistogram("h1", "h", {1, 1}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(reg.GetHistogram("h1", "h", {2, 1}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(reg.GetHistogram("h1", "h", {1, NAN}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(reg.GetHistogram("h1", "h", {1}, {{"le", "x"}}).status().code(),
            Code::kInvalidArgument);
  ASSERT_TRUE(reg.GetHistogram("h1", "h", {1, 2}).ok());
  EXPECT_EQ(reg.GetHistogram("h1", "h", {1, 3}).status().code(), Code::kInvalidArgument);
  // Nothing refused was half-registered: ok{a="été"} and h1 only.
  EXPECT_EQ(reg.series_count(), 2u);
}

TEST(Metrics, SeriesCountIsBounded) {
  MetricsRegistry reg(MetricsRegistry::Options{.max_series = 3});
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(reg.GetGauge("g", "h", {{"member", std::to_string(i)}}).ok());
  }
  auto over = reg.GetGauge("g", "h", {{"member", "3"}});
  EXPECT_EQ(over.status().code(), Code::kResourceExhausted);
  EXPECT_EQ(reg.GetGauge("other", "h").status().code(), Code::kResourceExhausted);
  // Existing series are still handed out when full.
  EXPECT_TRUE(reg.GetGauge("g", "h", {{"member", "0"}}).ok());
  // A removed series frees its slot.
  EXPECT_TRUE(reg.Remove("g", {{"member", "1"}}));
  EXPECT_FALSE(reg.Remove("g", {{"member", "1"}}));
  EXPECT_TRUE(reg.GetGauge("g", "h", {{"member", "3"}}).ok());
  EXPECT_EQ(reg.series_count(), 3u);
  // A refused new family leaves no empty family behind in the rendering.
  EXPECT_EQ(reg.Render().find("other"), std::string::npos);
}

TEST(Metrics, RemovedSeriesStaysUsableByHolder) {
  MetricsRegistry reg;
  auto g = reg.GetGauge("g", "h", {{"member", "a"}});
  ASSERT_TRUE(g.ok());
  auto held = *g;
  EXPECT_FALSE(reg.Remove("nope", {{"member", "a"}}));
  EXPECT_FALSE(reg.Remove("g", {{"member", "b"}}));
  auto two = reg.GetGauge("g", "h", {{"link", "x"}, {"member", "b"}});
  ASSERT_TRUE(two.ok());
  EXPECT_TRUE(reg.Remove("g", {{"member", "b"}, {"link", "x"}}));  // any label order
  ASSERT_TRUE(reg.Remove("g", {{"member", "a"}}));
  held->Set(3);  // no use-after-free (ASan build)
  EXPECT_EQ(reg.Render(), "");
  // The family's name is free again, even with another type.
  EXPECT_TRUE(reg.GetCounter("g", "h2").ok());
}

TEST(Metrics, HistogramBucketsAreLessOrEqual) {
  Histogram h({1, 2});
  h.Observe(1);    // le=1
  h.Observe(1.5);  // le=2
  h.Observe(3);    // +Inf
  h.Observe(NAN);  // ignored
  auto s = h.Read();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(s.count, 3u);
  EXPECT_DOUBLE_EQ(s.sum, 5.5);
}

TEST(Metrics, FormatSampleValue) {
  EXPECT_EQ(FormatSampleValue(0), "0");
  EXPECT_EQ(FormatSampleValue(-2.5), "-2.5");
  EXPECT_EQ(FormatSampleValue(0.1), "0.1");
  EXPECT_EQ(FormatSampleValue(1e21), "1e+21");
  EXPECT_EQ(FormatSampleValue(NAN), "NaN");
  EXPECT_EQ(FormatSampleValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(EscapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(EscapeHelp("a\\b\"c\nd"), "a\\\\b\"c\\nd");
}

// Updates from many threads, while others register, remove and render: the
// totals are exact and (under ASan/TSan) nothing races.
TEST(Metrics, ConcurrentUpdatesAreExact) {
  MetricsRegistry reg;
  constexpr int kThreads = 8, kIters = 20000;
  std::vector<std::thread> threads;
  std::atomic<bool> stop{false};
  std::thread renderer([&] {
    while (!stop.load()) (void)reg.Render();
  });
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIters; ++i) {
        auto c = reg.GetCounter("c_total", "h", {{"link", std::to_string(i % 4)}});
        ASSERT_TRUE(c.ok());
        (*c)->Add(1);
        auto g = reg.GetGauge("g", "h");
        ASSERT_TRUE(g.ok());
        (*g)->Add(1);
        auto h = reg.GetHistogram("h_seconds", "h", {0.5});
        ASSERT_TRUE(h.ok());
        (*h)->Observe(t % 2 ? 0.25 : 1.0);
        auto tmp = reg.GetGauge("tmp", "h", {{"t", std::to_string(t)}});
        ASSERT_TRUE(tmp.ok());
        reg.Remove("tmp", {{"t", std::to_string(t)}});
      }
    });
  }
  for (auto& th : threads) th.join();
  stop = true;
  renderer.join();
  uint64_t total = 0;
  for (int l = 0; l < 4; ++l)
    total += (*reg.GetCounter("c_total", "h", {{"link", std::to_string(l)}}))->value();
  EXPECT_EQ(total, uint64_t{kThreads} * kIters);
  EXPECT_EQ((*reg.GetGauge("g", "h"))->value(), double(kThreads) * kIters);
  auto snap = (*reg.GetHistogram("h_seconds", "h", {0.5}))->Read();
  EXPECT_EQ(snap.count, uint64_t{kThreads} * kIters);
  EXPECT_EQ(snap.cumulative[0], uint64_t{kThreads / 2} * kIters);
  EXPECT_EQ(reg.series_count(), 6u);  // 4 links + g + h_seconds; every tmp removed
}

}  // namespace
}  // namespace tern::agent
