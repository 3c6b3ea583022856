#include "agent/ops/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace tern::agent {
namespace {

bool IsNameChar(char c, bool first, bool allow_colon) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') return true;
  if (allow_colon && c == ':') return true;
  return !first && c >= '0' && c <= '9';
}

bool ValidName(std::string_view s, bool allow_colon) {
  if (s.empty() || s.size() > kMaxNameBytes) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!IsNameChar(s[i], i == 0, allow_colon)) return false;
  }
  return true;
}

// Strict UTF-8 (no overlongs, no surrogates, <= U+10FFFF): Prometheus reads
// the exposition as UTF-8, so a byte string that is not would break scrapes.
bool ValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<uint8_t>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= n) return false;
    for (size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<uint8_t>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

}  // namespace

std::string EscapeLabelValue(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

namespace {

using LabelRefs = std::vector<std::pair<std::string_view, std::string_view>>;

// The series key: labels sorted by name, rendered as in the exposition
// (a="1",b="2"), so that any order of the same labels names one series.
std::string LabelKey(LabelRefs& sorted) {
  std::sort(sorted.begin(), sorted.end());
  std::string key;
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (i) key += ',';
    key.append(sorted[i].first).append("=\"").append(EscapeLabelValue(sorted[i].second)) += '"';
  }
  return key;
}

}  // namespace

std::string EscapeHelp(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatSampleValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  TERN_ASSERT(ec == std::errc(), "to_chars of a double cannot overflow 64 bytes");
  return std::string(buf, end);
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  if (std::isnan(v)) return;
  // Prometheus buckets are "less than or equal to the bound".
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  std::lock_guard lock(mu_);
  ++counts_[i];
  sum_ += v;
  ++count_;
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.bounds = bounds_;
  std::lock_guard lock(mu_);
  uint64_t running = 0;
  for (uint64_t c : counts_) {
    running += c;
    s.cumulative.push_back(running);
  }
  s.sum = sum_;
  s.count = count_;
  return s;
}

Result<std::shared_ptr<void>> MetricsRegistry::GetSeries(std::string_view name,
                                                         std::string_view help, Type type,
                                                         std::vector<double> bounds,
                                                         const Labels& labels) {
  TERN_REQUIRE(ValidName(name, /*allow_colon=*/true), kInvalidArgument,
               "metrics: bad metric name (want [a-zA-Z_:][a-zA-Z0-9_:]*, <= ", kMaxNameBytes,
               " bytes)");
  TERN_REQUIRE(help.size() <= kMaxHelpBytes && ValidUtf8(help), kInvalidArgument, "metrics: ", name,
               ": help text not UTF-8 or longer than ", kMaxHelpBytes, " bytes");
  TERN_REQUIRE(labels.size() <= kMaxLabels, kInvalidArgument, "metrics: ", name, ": ",
               labels.size(), " labels, at most ", kMaxLabels);
  if (type == Type::kHistogram) {
    TERN_REQUIRE(!bounds.empty() && bounds.size() <= kMaxHistogramBuckets, kInvalidArgument,
                 "metrics: ", name, ": histogram needs 1..", kMaxHistogramBuckets, " bounds");
    for (size_t i = 0; i < bounds.size(); ++i) {
      TERN_REQUIRE(std::isfinite(bounds[i]) && (i == 0 || bounds[i - 1] < bounds[i]),
                   kInvalidArgument, "metrics: ", name,
                   ": histogram bounds must be finite and strictly ascending");
    }
  }
  LabelRefs sorted;
  for (const auto& [k, v] : labels) {
    TERN_REQUIRE(ValidName(k, /*allow_colon=*/false) && !k.starts_with("__"), kInvalidArgument,
                 "metrics: ", name, ": bad label name (want [a-zA-Z_][a-zA-Z0-9_]*, not __*)");
    TERN_REQUIRE(!(type == Type::kHistogram && k == "le"), kInvalidArgument, "metrics: ", name,
                 ": a histogram cannot have a label named le");
    TERN_REQUIRE(v.size() <= kMaxLabelValueBytes && ValidUtf8(v), kInvalidArgument,
                 "metrics: ", name, ": label ", k, " value not UTF-8 or longer than ",
                 kMaxLabelValueBytes, " bytes");
    sorted.emplace_back(k, v);
  }
  std::string key = LabelKey(sorted);
  for (size_t i = 1; i < sorted.size(); ++i) {
    TERN_REQUIRE(sorted[i - 1].first != sorted[i].first, kInvalidArgument, "metrics: ", name,
                 ": label ", sorted[i].first, " given twice");
  }

  std::lock_guard lock(mu_);
  auto fit = families_.find(name);
  if (fit == families_.end()) {
    TERN_REQUIRE(series_count_ < options_.max_series, kResourceExhausted, "metrics: ", name,
                 ": registry full (", options_.max_series, " series)");
    fit = families_.emplace(std::string(name), Family{type, std::string(help), bounds, {}}).first;
  }
  Family& fam = fit->second;
  TERN_REQUIRE(fam.type == type && fam.help == help && fam.bounds == bounds, kInvalidArgument,
               "metrics: ", name, " already registered with another type, help or buckets");
  auto sit = fam.series.find(key);
  if (sit != fam.series.end()) return sit->second;
  if (series_count_ >= options_.max_series) {
    if (fam.series.empty()) families_.erase(fit);
    return TERN_ERROR(kResourceExhausted, "metrics: ", name, ": registry full (",
                      options_.max_series, " series)");
  }
  std::shared_ptr<void> made;
  switch (type) {
    case Type::kCounter:
      made = std::make_shared<Counter>();
      break;
    case Type::kGauge:
      made = std::make_shared<Gauge>();
      break;
    case Type::kHistogram:
      made = std::make_shared<Histogram>(std::move(bounds));
      break;
  }
  fam.series.emplace(std::move(key), made);
  ++series_count_;
  return made;
}

Result<std::shared_ptr<Counter>> MetricsRegistry::GetCounter(std::string_view name,
                                                             std::string_view help,
                                                             const Labels& labels) {
  auto s = GetSeries(name, help, Type::kCounter, {}, labels);
  if (!s.ok()) return s.status();
  return std::static_pointer_cast<Counter>(*s);
}

Result<std::shared_ptr<Gauge>> MetricsRegistry::GetGauge(std::string_view name,
                                                         std::string_view help,
                                                         const Labels& labels) {
  auto s = GetSeries(name, help, Type::kGauge, {}, labels);
  if (!s.ok()) return s.status();
  return std::static_pointer_cast<Gauge>(*s);
}

Result<std::shared_ptr<Histogram>> MetricsRegistry::GetHistogram(std::string_view name,
                                                                 std::string_view help,
                                                                 std::vector<double> bounds,
                                                                 const Labels& labels) {
  auto s = GetSeries(name, help, Type::kHistogram, std::move(bounds), labels);
  if (!s.ok()) return s.status();
  return std::static_pointer_cast<Histogram>(*s);
}

bool MetricsRegistry::Remove(std::string_view name, const Labels& labels) {
  LabelRefs sorted(labels.begin(), labels.end());
  const std::string key = LabelKey(sorted);
  std::lock_guard lock(mu_);
  auto fit = families_.find(name);
  if (fit == families_.end()) return false;
  if (fit->second.series.erase(key) == 0) return false;
  --series_count_;
  if (fit->second.series.empty()) families_.erase(fit);
  return true;
}

size_t MetricsRegistry::series_count() const {
  std::lock_guard lock(mu_);
  return series_count_;
}

namespace {

// `name{labels,extra} value\n`; braces only when there is a label.
void AppendSample(std::string& out, std::string_view name, std::string_view labels,
                  std::string_view extra, std::string_view value) {
  out += name;
  if (!labels.empty() || !extra.empty()) {
    out += '{';
    out += labels;
    if (!labels.empty() && !extra.empty()) out += ',';
    out += extra;
    out += '}';
  }
  out += ' ';
  out += value;
  out += '\n';
}

}  // namespace

std::string MetricsRegistry::Render() const {
  std::string out;
  std::lock_guard lock(mu_);
  for (const auto& [name, fam] : families_) {
    static constexpr const char* kTypeName[] = {"counter", "gauge", "histogram"};
    out.append("# HELP ").append(name).append(" ").append(EscapeHelp(fam.help)) += '\n';
    out.append("# TYPE ").append(name).append(" ").append(kTypeName[int(fam.type)]) += '\n';
    for (const auto& [labels, series] : fam.series) {
      switch (fam.type) {
        case Type::kCounter:
          AppendSample(out, name, labels, "",
                       std::to_string(static_cast<const Counter*>(series.get())->value()));
          break;
        case Type::kGauge:
          AppendSample(out, name, labels, "",
                       FormatSampleValue(static_cast<const Gauge*>(series.get())->value()));
          break;
        case Type::kHistogram: {
          const auto snap = static_cast<const Histogram*>(series.get())->Read();
          const std::string bucket = name + "_bucket";
          for (size_t i = 0; i <= snap.bounds.size(); ++i) {
            const std::string le =
                i < snap.bounds.size() ? FormatSampleValue(snap.bounds[i]) : "+Inf";
            AppendSample(out, bucket, labels, "le=\"" + le + "\"",
                         std::to_string(snap.cumulative[i]));
          }
          AppendSample(out, name + "_sum", labels, "", FormatSampleValue(snap.sum));
          AppendSample(out, name + "_count", labels, "", std::to_string(snap.count));
          break;
        }
      }
    }
  }
  return out;
}

}  // namespace tern::agent
