// The root's choice of each version's patch format from what its members
// measure (docs/agent.md "Choosing the patch format"). Format 2 is about
// 0.7x format 1's bytes but its decode reads the whole base; format 1 is
// bigger and applies several times faster per byte of view. Which one
// brings the last member to serve sooner depends on the fleet: bandwidth-
// bound trees want 2, CPU-bound members want 1.
//
// The model: for format f, predicted time to the last member serving =
//   max over serving members m of  last_byte_f(m) + view_bytes / apply_f(m)
// where last_byte_f(m) pipelines size_f along m's relay path in every stripe
// as the relay does (cut-through per chunk: a member's last byte comes no
// earlier than its parent's plus one chunk and half the edge's round trip,
// nor earlier than its first chunk plus its share at the edge's rate), with
// each edge's rate and round trip as the child measured them (HEARTBEAT's
// per-stripe figures; unmeasured: the planner's configured rates).
// apply_f(m) is m's reported rate for f; a member that measured only the
// other format is estimated from it with the codec's ratio
// (kApplySpeedupPrior). size_f comes from the last patch published, in its
// format, and the size ratio (kSizeRatioPrior).
//
// Thread safety: none; the root calls it under its lock.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "agent/membership/membership.h"
#include "tern/topology.h"

namespace tern::agent {

// Format 2's bytes over format 1's for the same version (docs/benchmarks.md
// "Patch format 2": 0.71 at ~1% changed BF16; 0.60-0.69 MB against
// 0.83-0.96 MB on the WAN testbed).
inline constexpr double kSizeRatioPrior = 0.70;
// Format 1's apply rate over format 2's, per byte of view: the codec
// benchmark's decode+apply at 1% changed, format 2 3.9x a memcpy per core
// against format 1's 1.45x on the trace (docs/benchmarks.md; the low end:
// on the WAN testbed members applied format 1 5-6x faster).
inline constexpr double kApplySpeedupPrior = 2.7;

// A figure of the format the root does not write ages: after this many
// applies of the other format, the measured figure and the estimate from
// the other format's (kApplySpeedupPrior) weigh the same in what the
// member reports (ReportedApplyRates), and half as much again after as
// many more. docs/agent.md "Choosing the patch format", "Stale figures".
inline constexpr double kStaleHalfLifeApplies = 8;
// Ages stop counting here (the weight is 2^-64 by then): a bound, not a
// tuning figure.
inline constexpr uint32_t kStaleAppliesMax = 64 * 8;

// A member's figure of its apply rate for one format, in bytes of view per
// second, as it reports it in HEARTBEAT. An apply onto an unprepared spare
// (a version within --spare-grace-ms of the previous one: it copies the
// view first) stands in only until a prepared one comes. Prepared applies
// are smoothed (half the weight on the newest): one apply slowed by a
// neighbour's build moves it but does not make it. A figure last noted
// `other_applies` applies of the other format ago weighs less in both the
// smoothing and the report (kStaleHalfLifeApplies): the root keeps the last
// figure of the format it does not write, and a slow one, measured once in
// a busy moment, would otherwise hold that format back for good.
struct ApplyRateFigure {
  double bytes_per_s = 0;  // 0: none yet
  bool prepared = false;   // from a prepared spare
  uint32_t other_applies = 0;  // applies of the other format since this was noted
  // Not finite or not > 0: ignored.
  void Note(double rate_bytes_per_s, bool on_prepared_spare);
};

// An apply of `format` (1 or 2) at rate_bytes_per_s: noted in
// figures[format - 1], and figures of the other format one apply older.
// An invalid format or rate changes nothing.
void NoteApplyRate(ApplyRateFigure figures[2], uint16_t format, double rate_bytes_per_s,
                   bool on_prepared_spare);

// What a member reports for formats 1 and 2 (HEARTBEAT): its figures, but
// 0 for a figure from an unprepared spare while the other format has a
// prepared one, so that the root estimates it from that one with the
// codec's ratio (a root that switched formats at once never sees a
// prepared figure of the format it left). A prepared figure that has aged
// (other_applies > 0) next to a prepared one of the other format is
// reported between the two, in log space: measured^w * estimate^(1-w),
// w = 2^(-other_applies / kStaleHalfLifeApplies), estimate = the other
// format's figure times or over kApplySpeedupPrior. So the root returns to
// a format it left once the codec's ratio says that format wins, and
// measures it again: kept if the figure was stale, left again after one
// version if it was right (docs/agent.md, "Stale figures").
std::pair<double, double> ReportedApplyRates(const ApplyRateFigure& f1, const ApplyRateFigure& f2);

struct FormatChoiceOptions {
  // 1 or 2: the operator's (--patch-format), whatever the model says; 0:
  // chosen per version.
  uint16_t forced_format = 0;
  // Without a measured apply rate from any serving member, or before the
  // first patch (no size to scale): the format the root writes.
  uint16_t default_format = 2;
  // Hysteresis: the other format is taken only when it is predicted at
  // least this fraction sooner than the one in use (0..1).
  double switch_margin = 0.15;
  double size_ratio = kSizeRatioPrior;        // > 0
  double apply_speedup = kApplySpeedupPrior;  // > 0
};

// One format's prediction.
struct FormatPrediction {
  double seconds = 0;       // publish -> the last serving member serves
  std::string last_member;  // who that is (empty: no serving member)
  double last_byte_s = 0;   // the last member's: transfer
  double apply_s = 0;       // and apply
  uint64_t size_bytes = 0;  // the patch size assumed
};

struct FormatChoice {
  uint16_t format = 0;
  bool predicted = false;       // false: forced with no data, or the default
  FormatPrediction f1, f2;      // meaningful with predicted
  std::string reason;           // for /status and the publish log line
};

// Predicts one format: size_bytes of patch, view_bytes of view (> 0).
// Members with no apply rate for either format are left out (they have
// not applied a patch yet); relay-only members forward but serve nothing.
FormatPrediction PredictFormat(const topology::Plan& plan,
                               const std::map<std::string, MemberRecord>& members,
                               uint16_t format, uint64_t size_bytes, uint64_t view_bytes,
                               const FormatChoiceOptions& options);

class FormatChooser {
 public:
  explicit FormatChooser(FormatChoiceOptions options);

  // The format of the next version, whose view is view_bytes.
  FormatChoice Choose(const topology::Plan& plan, const std::map<std::string, MemberRecord>& members,
                      uint64_t view_bytes);
  // A version was published in `format` with a patch of patch_bytes (0: a
  // keyframe only; not a size to scale from).
  void NotePublished(uint16_t format, uint64_t patch_bytes);

  uint16_t current() const { return current_; }
  const FormatChoice& last() const { return last_; }

 private:
  FormatChoiceOptions options_;
  uint16_t current_;  // the format in use (hysteresis is relative to it)
  uint16_t last_patch_format_ = 0;
  uint64_t last_patch_bytes_ = 0;
  FormatChoice last_;
};

}  // namespace tern::agent
