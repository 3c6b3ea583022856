// Metrics of the transfer agent, rendered as Prometheus text exposition
// (format 0.0.4) for GET /metrics (docs/agent/operations.md).
//
// A MetricsRegistry holds families (one name, one type, one help line) of
// series (one label set each): counters, gauges and fixed-bucket histograms.
// The agent owns one registry and hands it to its parts; there is no global.
//
// Contract:
//  * Names are checked when a series is first asked for: metric names match
//    [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]* and do not
//    start with "__", at most kMaxLabels labels, no name twice; label values
//    are valid UTF-8 of at most kMaxLabelValueBytes (escaped on output);
//    help text is at most kMaxHelpBytes of valid UTF-8. A name
//    asked for again with another type, help or bucket list is
//    kInvalidArgument. More than Options::max_series series in all is
//    kResourceExhausted (a member id in a label cannot grow the registry
//    without bound).
//  * The same name and label set (in any order) always gives the same
//    series object. Series are shared_ptr: Remove() only forgets a series
//    (it stops being rendered); a holder's pointer stays valid.
//  * Render() is stable: families sorted by name, series by their label
//    text, labels inside a series by name; the same values always give the
//    same bytes (golden-tested).
//  * Thread safety: every method of the registry and of the series may be
//    called from any thread at once. Counter and Gauge updates are lock-free;
//    a Histogram takes its own small lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tern/status.h"

namespace tern::agent {

// Label name -> value, e.g. {{"member", "m3"}, {"link", "m1->m3"}}.
using Labels = std::vector<std::pair<std::string, std::string>>;

inline constexpr size_t kMaxLabels = 8;
inline constexpr size_t kMaxLabelValueBytes = 256;
inline constexpr size_t kMaxHistogramBuckets = 32;
inline constexpr size_t kMaxHelpBytes = 1024;
inline constexpr size_t kMaxNameBytes = 200;

// Monotonic count (bytes, chunks, retries). Rendered as an integer.
class Counter {
 public:
  void Add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down (version, lag, rate).
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double d) { value_.fetch_add(d, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Observations counted into fixed buckets (upper bounds, ascending, finite;
// +Inf is implicit), plus their sum and count: apply time, time-to-serve.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);  // NaN is ignored (it would poison the sum)
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Read() const;

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class MetricsRegistry {
 public:
  struct Options {
    size_t max_series = 10000;
  };
  MetricsRegistry() : MetricsRegistry(Options{}) {}
  explicit MetricsRegistry(Options options) : options_(options) {}
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  Result<std::shared_ptr<Counter>> GetCounter(std::string_view name, std::string_view help,
                                              const Labels& labels = {});
  Result<std::shared_ptr<Gauge>> GetGauge(std::string_view name, std::string_view help,
                                          const Labels& labels = {});
  Result<std::shared_ptr<Histogram>> GetHistogram(std::string_view name, std::string_view help,
                                                  std::vector<double> bounds,
                                                  const Labels& labels = {});
  // Forgets one series (a member left); returns whether it existed. A family
  // left without series is forgotten too (its name may be reused).
  bool Remove(std::string_view name, const Labels& labels);

  // The whole registry in Prometheus text exposition format 0.0.4.
  std::string Render() const;
  size_t series_count() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family {
    Type type;
    std::string help;
    std::vector<double> bounds;  // histograms only
    // Key: the rendered label text ("a=\"1\",b=\"2\""), sorted by label name.
    std::map<std::string, std::shared_ptr<void>> series;
  };
  Result<std::shared_ptr<void>> GetSeries(std::string_view name, std::string_view help, Type type,
                                          std::vector<double> bounds, const Labels& labels);

  const Options options_;
  mutable std::mutex mu_;
  std::map<std::string, Family, std::less<>> families_;
  size_t series_count_ = 0;
};

// Text exposition escaping (exposed for tests): label values escape '\', '"'
// and newline; help text escapes '\' and newline.
std::string EscapeLabelValue(std::string_view v);
std::string EscapeHelp(std::string_view v);
// A sample value as Prometheus reads it: shortest round-trip decimal,
// "+Inf", "-Inf", "NaN".
std::string FormatSampleValue(double v);

}  // namespace tern::agent
