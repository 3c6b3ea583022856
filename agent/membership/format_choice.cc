// The root's per-version patch format (agent/membership/format_choice.h;
// docs/agent.md "Choosing the patch format").
#include "agent/membership/format_choice.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <vector>

#include "agent/manifest/object_ref.h"
#include "tern/status.h"

namespace tern::agent {
namespace {

// Member m's apply rate for `format` in bytes of view per second: measured,
// else estimated from the other format's; 0 when it measured neither.
double ApplyRate(const Heartbeat& hb, uint16_t format, double speedup) {
  const double f1 = hb.apply_f1_bytes_per_s, f2 = hb.apply_f2_bytes_per_s;
  if (format == 1) return f1 > 0 ? f1 : f2 * speedup;
  return f2 > 0 ? f2 : f1 / speedup;
}

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", s);
  return buf;
}

}  // namespace

void ApplyRateFigure::Note(double rate, bool on_prepared_spare) {
  if (!std::isfinite(rate) || !(rate > 0)) return;
  if (!on_prepared_spare) {
    if (bytes_per_s == 0) bytes_per_s = rate;
    return;
  }
  // An aged figure weighs less against the newest: the halving of the
  // smoothing and the figure's own age.
  const double old_weight =
      prepared ? 0.5 * std::exp2(-double(other_applies) / kStaleHalfLifeApplies) : 0;
  bytes_per_s = old_weight * bytes_per_s + (1 - old_weight) * rate;
  prepared = true;
  other_applies = 0;
}

void NoteApplyRate(ApplyRateFigure figures[2], uint16_t format, double rate, bool prepared) {
  if ((format != 1 && format != 2) || !std::isfinite(rate) || !(rate > 0)) return;
  figures[format - 1].Note(rate, prepared);
  uint32_t& age = figures[2 - format].other_applies;
  age = std::min(age + 1, kStaleAppliesMax);
}

std::pair<double, double> ReportedApplyRates(const ApplyRateFigure& f1, const ApplyRateFigure& f2) {
  const double r1 = f1.prepared || !f2.prepared ? f1.bytes_per_s : 0;
  const double r2 = f2.prepared || !f1.prepared ? f2.bytes_per_s : 0;
  // Toward the estimate from the other format's figure, which is fresh: at
  // most one figure has aged (noting one resets its age and ages the other).
  auto aged = [](const ApplyRateFigure& f, double measured, double estimate) {
    if (f.other_applies == 0 || !f.prepared || !(measured > 0) || !(estimate > 0)) return measured;
    const double w = std::exp2(-double(f.other_applies) / kStaleHalfLifeApplies);
    return std::exp(w * std::log(measured) + (1 - w) * std::log(estimate));
  };
  const double e1 = f2.prepared ? r2 * kApplySpeedupPrior : 0;
  const double e2 = f1.prepared ? r1 / kApplySpeedupPrior : 0;
  return {aged(f1, r1, e1), aged(f2, r2, e2)};
}

FormatPrediction PredictFormat(const topology::Plan& plan,
                               const std::map<std::string, MemberRecord>& members,
                               uint16_t format, uint64_t size_bytes, uint64_t view_bytes,
                               const FormatChoiceOptions& options) {
  TERN_ASSERT(format == 1 || format == 2);
  FormatPrediction out;
  out.size_bytes = size_bytes;
  const size_t stripes = plan.parent.size();
  if (stripes == 0 || view_bytes == 0) return out;
  const double share = double(size_bytes) / double(stripes);
  const double chunk = std::min(share, double(DefaultChunkBytes(size_bytes)));
  // A node's uplink is shared by its children in every stripe.
  std::map<std::string, uint32_t> fanout;
  for (const auto& stripe : plan.parent)
    for (const auto& [id, p] : stripe) ++fanout[p];
  auto node = [&](const std::string& id) -> const topology::Member* {
    if (id == plan.root.id) return &plan.root;
    auto it = plan.members.find(id);
    return it == plan.members.end() ? nullptr : &it->second;
  };
  std::map<std::string, double> last_byte;  // over all stripes
  for (size_t s = 0; s < stripes; ++s) {
    std::map<std::string, std::vector<std::string>> kids;
    for (const auto& [id, p] : plan.parent[s]) kids[p].push_back(id);
    std::map<std::string, std::pair<double, double>> at;  // id -> (first chunk, last byte)
    at[plan.root.id] = {0, 0};
    std::deque<std::string> todo{plan.root.id};
    // Each member is reached once per stripe (the plan is a tree):
    // bounded by the member count.
    while (!todo.empty()) {
      const std::string p = todo.front();
      todo.pop_front();
      const auto [p_first, p_last] = at[p];
      const topology::Member* pm = node(p);
      for (const std::string& c : kids[p]) {
        if (at.count(c)) continue;  // not a tree: never loop
        double rate = 0, half_rtt = 0;
        if (auto rec = members.find(c); rec != members.end() && s < rec->second.last.parents.size()) {
          rate = rec->second.last.parents[s].rate_in_bytes_per_s;
          half_rtt = rec->second.last.parents[s].rtt_s / 2;
        }
        if (rate <= 0) {
          // Not measured yet: the planner's configured figures.
          const topology::Member* cm = node(c);
          const double up = pm ? pm->uplink_bytes_per_s / std::max<uint32_t>(fanout[p], 1) : 0;
          const double down = cm ? cm->downlink_bytes_per_s / double(stripes) : 0;
          rate = std::min(up, down);
        }
        if (!(rate > 0)) rate = 1;  // nothing known: one byte a second, never a division by 0
        const double first = p_first + half_rtt + chunk / rate;
        const double last = std::max(p_first + half_rtt + share / rate, p_last + half_rtt + chunk / rate);
        at[c] = {first, last};
        last_byte[c] = std::max(last_byte[c], last);
        todo.push_back(c);
      }
    }
  }
  for (const auto& [id, rec] : members) {
    if (rec.info.relay_only) continue;
    const double rate = ApplyRate(rec.last, format, options.apply_speedup);
    if (!(rate > 0)) continue;
    auto lb = last_byte.find(id);
    if (lb == last_byte.end()) continue;  // not in the plan
    const double apply_s = double(view_bytes) / rate;
    const double t = lb->second + apply_s;
    if (out.last_member.empty() || t > out.seconds) {
      out.seconds = t;
      out.last_member = id;
      out.last_byte_s = lb->second;
      out.apply_s = apply_s;
    }
  }
  return out;
}

FormatChooser::FormatChooser(FormatChoiceOptions options)
    : options_(options),
      current_(options.forced_format != 0 ? options.forced_format : options.default_format) {
  TERN_ASSERT(options_.forced_format <= 2);
  TERN_ASSERT(options_.default_format == 1 || options_.default_format == 2);
  TERN_ASSERT(options_.size_ratio > 0 && options_.apply_speedup > 0);
}

void FormatChooser::NotePublished(uint16_t format, uint64_t patch_bytes) {
  if (patch_bytes == 0 || (format != 1 && format != 2)) return;
  last_patch_format_ = format;
  last_patch_bytes_ = patch_bytes;
}

FormatChoice FormatChooser::Choose(const topology::Plan& plan,
                                   const std::map<std::string, MemberRecord>& members,
                                   uint64_t view_bytes) {
  FormatChoice c;
  const bool forced = options_.forced_format != 0;
  auto settle = [&](uint16_t format, std::string why) {
    c.format = current_ = format;
    c.reason = "format " + std::to_string(format) + ": " + why;
    last_ = c;
    return c;
  };
  if (last_patch_bytes_ == 0 || view_bytes == 0)
    return settle(forced ? options_.forced_format : options_.default_format,
                  forced ? "forced (--patch-format)" : "the default (no patch published yet to size from)");
  const double size1 = last_patch_format_ == 1 ? double(last_patch_bytes_)
                                               : double(last_patch_bytes_) / options_.size_ratio;
  c.f1 = PredictFormat(plan, members, 1, uint64_t(std::llround(size1)), view_bytes, options_);
  c.f2 = PredictFormat(plan, members, 2, uint64_t(std::llround(size1 * options_.size_ratio)),
                       view_bytes, options_);
  if (c.f1.last_member.empty() || c.f2.last_member.empty())
    return settle(forced ? options_.forced_format : options_.default_format,
                  forced ? "forced (--patch-format)"
                         : "the default (no serving member has measured an apply yet)");
  c.predicted = true;
  auto pick = [&](uint16_t f) -> const FormatPrediction& { return f == 1 ? c.f1 : c.f2; };
  uint16_t format = current_;
  std::string note;
  if (forced) {
    format = options_.forced_format;
    note = ", forced (--patch-format)";
  } else {
    const uint16_t other = current_ == 1 ? 2 : 1;
    if (pick(other).seconds < pick(current_).seconds * (1 - options_.switch_margin)) {
      format = other;
    } else if (pick(other).seconds < pick(current_).seconds) {
      note = ", kept: within the " + std::to_string(int(std::lround(options_.switch_margin * 100))) +
             "% margin";
    }
  }
  const FormatPrediction& mine = pick(format);
  const FormatPrediction& theirs = pick(format == 1 ? 2 : 1);
  return settle(format, "predicted " + Seconds(mine.seconds) + " vs " + Seconds(theirs.seconds) +
                            note + "; " + (mine.apply_s >= mine.last_byte_s ? "apply" : "transfer") +
                            "-bound on " + mine.last_member);
}

}  // namespace tern::agent
