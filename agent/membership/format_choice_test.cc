#include "agent/membership/format_choice.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <random>

namespace tern::agent {
namespace {

constexpr uint64_t kView = 40'000'000;  // a 20M-parameter BF16 view

// A fleet: members fed by `parent_of` in one stripe, each having received
// its last object at rate_in (bytes/s) over a round trip of rtt_s, and
// applying at apply1 / apply2 bytes of view per second (0: not measured).
struct Fleet {
  topology::Plan plan;
  std::map<std::string, MemberRecord> members;

  Fleet() {
    plan.root.id = "root";
    plan.root.region = "us";
    plan.root.uplink_bytes_per_s = plan.root.downlink_bytes_per_s = 1.25e8;
    plan.parent.resize(1);
  }
  MemberRecord& Add(const std::string& id, const std::string& parent, double rate_in, double rtt_s,
                    double apply1, double apply2) {
    topology::Member m;
    m.id = id;
    m.region = "us";
    m.uplink_bytes_per_s = m.downlink_bytes_per_s = 1.25e8;
    plan.members[id] = m;
    plan.parent[0][id] = parent;
    MemberRecord& r = members[id];
    r.info.id = id;
    r.last.parents = {ParentFigures{rtt_s, rate_in}};
    r.last.apply_f1_bytes_per_s = apply1;
    r.last.apply_f2_bytes_per_s = apply2;
    return r;
  }
  FormatChoice Choose(FormatChooser& chooser, uint64_t last_patch_bytes, uint16_t last_format) {
    chooser.NotePublished(last_format, last_patch_bytes);
    return chooser.Choose(plan, members, kView);
  }
};

// Three islands behind a fast link whose CPUs apply slowly (the WAN
// testbed's 17 members on 2 cores): the apply dominates and format 1's
// faster apply wins although its patch is bigger.
TEST(FormatChoice, ApplyBoundFleetPicksFormat1) {
  Fleet f;
  for (const char* id : {"m1", "m2", "m3"}) f.Add(id, "root", 1.25e8, 0.15, 0, 1.0e8);
  f.members["m3"].last.apply_f2_bytes_per_s = 0.5e8;  // the slowest
  FormatChooser chooser({});
  const FormatChoice c = f.Choose(chooser, 700'000, 2);
  EXPECT_EQ(c.format, 1) << c.reason;
  EXPECT_TRUE(c.predicted);
  // m3's format-1 rate is estimated from its format-2 one.
  EXPECT_NEAR(c.f1.apply_s, kView / (0.5e8 * kApplySpeedupPrior), 1e-9);
  EXPECT_NEAR(c.f2.apply_s, kView / 0.5e8, 1e-9);
  EXPECT_EQ(c.f1.last_member, "m3");
  EXPECT_EQ(c.f1.size_bytes, 1'000'000u);  // 700 kB / 0.7
  EXPECT_LT(c.f1.seconds, c.f2.seconds);
  EXPECT_NE(c.reason.find("format 1: predicted"), std::string::npos) << c.reason;
  EXPECT_NE(c.reason.find("apply-bound on m3"), std::string::npos) << c.reason;
}

// A thin cross-region link and fast applies: the bytes dominate, and format
// 2's smaller patch wins, also from format 1 in use.
TEST(FormatChoice, BandwidthBoundFleetPicksFormat2) {
  Fleet f;
  f.Add("eu", "root", 5e6, 0.15, 4e9, 2e9);
  f.Add("eu2", "eu", 1e8, 0.002, 4e9, 2e9);
  FormatChoiceOptions o;
  o.default_format = 1;
  FormatChooser chooser(o);
  EXPECT_EQ(chooser.current(), 1);
  const FormatChoice c = f.Choose(chooser, 10'000'000, 1);
  EXPECT_EQ(c.format, 2) << c.reason;
  EXPECT_EQ(c.f2.size_bytes, 7'000'000u);
  EXPECT_EQ(c.f2.last_member, "eu2");
  EXPECT_GT(c.f2.last_byte_s, c.f2.apply_s);
  EXPECT_NE(c.reason.find("transfer-bound on eu2"), std::string::npos) << c.reason;
}

// The relay's pipelining: a chain's last byte is the first hop's share at
// its rate plus, per further hop, one chunk and half a round trip.
TEST(FormatChoice, ChainPipelinesChunkByChunk) {
  Fleet f;
  f.Add("a", "root", 1e7, 0.1, 1e9, 1e9);
  f.Add("b", "a", 1e7, 0.1, 1e9, 1e9);
  f.Add("c", "b", 1e7, 0.1, 1e9, 1e9);
  const uint64_t size = 8 << 20;  // 8 chunks of 1 MiB
  const FormatPrediction p = PredictFormat(f.plan, f.members, 1, size, kView, {});
  const double share_s = double(size) / 1e7, chunk_s = double(1 << 20) / 1e7;
  EXPECT_EQ(p.last_member, "c");
  EXPECT_NEAR(p.last_byte_s, 0.05 + share_s + 2 * (0.05 + chunk_s), 1e-9);
  EXPECT_NEAR(p.seconds, p.last_byte_s + kView / 1e9, 1e-9);
  // A relay-only member forwards but is not waited for.
  f.members["c"].info.relay_only = true;
  EXPECT_EQ(PredictFormat(f.plan, f.members, 1, size, kView, {}).last_member, "b");
}

TEST(FormatChoice, OperatorOverrideWins) {
  Fleet f;
  for (const char* id : {"m1", "m2"}) f.Add(id, "root", 1.25e8, 0.15, 5e8, 1e8);
  FormatChoiceOptions o;
  o.forced_format = 2;
  FormatChooser chooser(o);
  const FormatChoice c = f.Choose(chooser, 700'000, 2);
  EXPECT_EQ(c.format, 2);
  EXPECT_TRUE(c.predicted);
  EXPECT_LT(c.f1.seconds, c.f2.seconds);  // the model would have picked 1
  EXPECT_NE(c.reason.find("forced"), std::string::npos) << c.reason;
}

TEST(FormatChoice, WithoutDataTheDefault) {
  Fleet f;
  f.Add("m1", "root", 0, 0, 0, 0);  // joined, nothing applied yet
  FormatChooser chooser({});
  // Nothing published yet: no size.
  FormatChoice c = chooser.Choose(f.plan, f.members, kView);
  EXPECT_EQ(c.format, 2);
  EXPECT_FALSE(c.predicted);
  EXPECT_NE(c.reason.find("no patch published yet"), std::string::npos) << c.reason;
  // A keyframe alone is no size either.
  chooser.NotePublished(2, 0);
  EXPECT_FALSE(chooser.Choose(f.plan, f.members, kView).predicted);
  // A size, but no member measured an apply.
  c = f.Choose(chooser, 700'000, 2);
  EXPECT_EQ(c.format, 2);
  EXPECT_FALSE(c.predicted);
  EXPECT_NE(c.reason.find("no serving member has measured"), std::string::npos) << c.reason;
  FormatChoiceOptions o;
  o.default_format = 1;
  FormatChooser one(o);
  EXPECT_EQ(f.Choose(one, 700'000, 2).format, 1);
}

// Two formats predicted within the margin: measurement noise of +-10% on
// every figure never flips the choice; a real change (applies 3x slower)
// does, once.
TEST(FormatChoice, NoFlappingOnNoise) {
  Fleet f;
  // Balanced: f1 = 1 MB over 10 MB/s + 40 MB / 800 MB/s = 0.1 + 0.05 + rtt;
  // f2 = 0.7 MB over 10 MB/s + 40 MB / 500 MB/s = 0.07 + 0.08 + rtt.
  f.Add("m1", "root", 1e7, 0.02, 8e8, 5e8);
  FormatChooser chooser({});
  chooser.NotePublished(2, 700'000);
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> noise(0.9, 1.1);
  int switches = 0;
  uint16_t prev = chooser.current();
  for (int i = 0; i < 200; ++i) {
    MemberRecord& m = f.members["m1"];
    m.last.parents[0].rate_in_bytes_per_s = 1e7 * noise(rng);
    m.last.apply_f1_bytes_per_s = 8e8 * noise(rng);
    m.last.apply_f2_bytes_per_s = 5e8 * noise(rng);
    const FormatChoice c = chooser.Choose(f.plan, f.members, kView);
    switches += c.format != prev;
    prev = c.format;
    chooser.NotePublished(c.format, c.format == 1 ? 1'000'000 : 700'000);
  }
  EXPECT_EQ(switches, 0);
  // The members' CPU becomes busy: format 2's slower apply now costs
  // 0.24 s against format 1's 0.15 s.
  for (int i = 0; i < 20; ++i) {
    MemberRecord& m = f.members["m1"];
    m.last.apply_f1_bytes_per_s = 8e8 / 3 * noise(rng);
    m.last.apply_f2_bytes_per_s = 5e8 / 3 * noise(rng);
    const FormatChoice c = chooser.Choose(f.plan, f.members, kView);
    switches += c.format != prev;
    prev = c.format;
    chooser.NotePublished(c.format, c.format == 1 ? 1'000'000 : 700'000);
  }
  EXPECT_EQ(switches, 1);
  EXPECT_EQ(prev, 1);
}

// A member's figure: the first apply after a keyframe (onto an unprepared
// spare, a copy of the view first) stands in until a prepared apply comes,
// then no longer counts; prepared applies are smoothed.
TEST(FormatChoice, AnUnpreparedApplyStandsInOnlyUntilAPreparedOne) {
  ApplyRateFigure f;
  f.Note(1e8, /*on_prepared_spare=*/false);
  EXPECT_EQ(f.bytes_per_s, 1e8);
  f.Note(0.5e8, false);  // still the first figure: a second slow one adds nothing
  EXPECT_EQ(f.bytes_per_s, 1e8);
  f.Note(4e8, true);  // replaces it outright
  EXPECT_EQ(f.bytes_per_s, 4e8);
  EXPECT_TRUE(f.prepared);
  f.Note(0.1e8, false);  // never moves a prepared figure
  EXPECT_EQ(f.bytes_per_s, 4e8);
  f.Note(2e8, true);
  EXPECT_EQ(f.bytes_per_s, 3e8);
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
    f.Note(bad, true);
    EXPECT_EQ(f.bytes_per_s, 3e8) << bad;
  }
}

// The first patch (format 2, unprepared) then format 1 (prepared): the
// format-2 figure is withheld, so that the root estimates it from the
// prepared format-1 one; alone, or next to another unprepared figure, it
// is reported.
TEST(FormatChoice, AnUnpreparedFigureIsWithheldNextToAPreparedOne) {
  ApplyRateFigure f1, f2;
  EXPECT_EQ(ReportedApplyRates(f1, f2), std::make_pair(0.0, 0.0));
  f2.Note(1e8, false);
  EXPECT_EQ(ReportedApplyRates(f1, f2), std::make_pair(0.0, 1e8));
  f1.Note(2e8, false);
  EXPECT_EQ(ReportedApplyRates(f1, f2), std::make_pair(2e8, 1e8));
  f1.Note(5e8, true);
  EXPECT_EQ(ReportedApplyRates(f1, f2), std::make_pair(5e8, 0.0));
  f2.Note(3e8, true);
  EXPECT_EQ(ReportedApplyRates(f1, f2), std::make_pair(5e8, 3e8));
}

// A prepared figure of the format not written ages towards the estimate
// from the other format's (kApplySpeedupPrior), in log space, with a
// half-life of kStaleHalfLifeApplies applies of the other format; a fresh
// measurement of the format replaces most of an aged figure.
TEST(FormatChoice, AStaleFigureAgesTowardsTheEstimate) {
  ApplyRateFigure figures[2];
  NoteApplyRate(figures, 2, 0.3e8, true);  // format 2, measured in a busy moment
  NoteApplyRate(figures, 1, 8e8, true);
  const double estimate = 8e8 / kApplySpeedupPrior;
  EXPECT_EQ(figures[1].other_applies, 1u);
  EXPECT_EQ(figures[0].other_applies, 0u);
  double last = ReportedApplyRates(figures[0], figures[1]).second;
  EXPECT_GT(last, 0.3e8);
  for (int i = 2; i <= 64; ++i) {
    NoteApplyRate(figures, 1, 8e8, true);
    const auto [r1, r2] = ReportedApplyRates(figures[0], figures[1]);
    EXPECT_EQ(r1, 8e8);  // the fresh figure is reported as measured
    EXPECT_GT(r2, last) << i;
    EXPECT_LT(r2, estimate) << i;
    last = r2;
    if (i == 8) {  // one half-life: half way in log space
      EXPECT_NEAR(std::log(r2), 0.5 * std::log(0.3e8) + 0.5 * std::log(estimate), 1e-9);
    }
  }
  EXPECT_NEAR(last / estimate, 1, 0.01);
  // Format 2 measured again: the aged figure weighs 0.5 * 2^-8 against it.
  NoteApplyRate(figures, 2, 5e8, true);
  EXPECT_NEAR(figures[1].bytes_per_s, 5e8, 5e8 * 0.01);
  EXPECT_EQ(figures[1].other_applies, 0u);
  EXPECT_EQ(ReportedApplyRates(figures[0], figures[1]).second, figures[1].bytes_per_s);
  // Ages are bounded, and bad input changes nothing.
  for (int i = 0; i < 10'000; ++i) NoteApplyRate(figures, 1, 8e8, true);
  EXPECT_EQ(figures[1].other_applies, kStaleAppliesMax);
  const double before = figures[0].bytes_per_s;
  NoteApplyRate(figures, 3, 1e9, true);
  NoteApplyRate(figures, 1, std::numeric_limits<double>::quiet_NaN(), true);
  NoteApplyRate(figures, 1, -1, true);
  EXPECT_EQ(figures[0].bytes_per_s, before);
  EXPECT_EQ(figures[1].other_applies, kStaleAppliesMax);
}

// An unprepared figure is not aged (it is withheld next to a prepared one
// already), nor is a figure whose counterpart is unprepared (no estimate
// worth ageing towards).
TEST(FormatChoice, OnlyPreparedFiguresAge) {
  ApplyRateFigure figures[2];
  NoteApplyRate(figures, 2, 1e8, false);
  NoteApplyRate(figures, 1, 2e8, false);
  NoteApplyRate(figures, 1, 2e8, false);
  EXPECT_EQ(ReportedApplyRates(figures[0], figures[1]), std::make_pair(2e8, 1e8));
  ApplyRateFigure g[2];
  NoteApplyRate(g, 2, 1e8, true);
  NoteApplyRate(g, 1, 2e8, false);
  NoteApplyRate(g, 1, 2e8, false);
  EXPECT_EQ(ReportedApplyRates(g[0], g[1]), std::make_pair(0.0, 1e8));
}

// The loop the root and a member run, version by version: the root
// chooses from what the member reports, the member applies that format at
// its true rate and notes it. A link-bound member (1 MB/s from the root)
// whose one format-2 apply came during a busy moment (0.3e8 B/s; true
// 5e8) makes the root leave format 2 (predicted 2.0 s against 1.5 s).
// Without ageing that figure is never measured again and format 1 (1.05 s
// per version against format 2's 0.78 s) stays for good; with it the root
// comes back to format 2 within about 22 versions and stays. A member whose
// format 2 really is that slow costs one format-2 version now and then.
struct Loop {
  Fleet fleet;
  FormatChooser chooser{{}};
  ApplyRateFigure figures[2];
  int versions_in[3] = {0, 0, 0};

  Loop() {
    fleet.Add("m", "root", 1e6, 0.0, 0, 0);
    chooser.NotePublished(2, 700'000);
    NoteApplyRate(figures, 2, 0.3e8, true);  // the busy moment
  }
  uint16_t Step(double true_f1, double true_f2) {
    MemberRecord& m = fleet.members["m"];
    std::tie(m.last.apply_f1_bytes_per_s, m.last.apply_f2_bytes_per_s) =
        ReportedApplyRates(figures[0], figures[1]);
    const FormatChoice c = chooser.Choose(fleet.plan, fleet.members, kView);
    chooser.NotePublished(c.format, c.format == 1 ? 1'000'000 : 700'000);
    NoteApplyRate(figures, c.format, c.format == 1 ? true_f1 : true_f2, true);
    ++versions_in[c.format];
    return c.format;
  }
};

TEST(FormatChoice, AStaleSlowFigureIsOvertaken) {
  Loop loop;
  EXPECT_EQ(loop.Step(8e8, 5e8), 1);  // the slow figure moves the root to format 1
  int back = 0;
  for (int v = 2; v <= 40 && back == 0; ++v)
    if (loop.Step(8e8, 5e8) == 2) back = v;
  ASSERT_NE(back, 0) << "format 1 for 40 versions on a stale format-2 figure";
  EXPECT_GE(back, 10);  // not at once: the margin and the half-life
  for (int v = 0; v < 100; ++v) EXPECT_EQ(loop.Step(8e8, 5e8), 2) << v;
}

TEST(FormatChoice, AFormatThatIsReallySlowIsOnlyProbed) {
  Loop loop;
  for (int v = 0; v < 200; ++v) loop.Step(8e8, 0.3e8);
  // Each return to format 2 measures it again and leaves after one version.
  EXPECT_GE(loop.versions_in[2], 1);
  EXPECT_LE(loop.versions_in[2], 200 / 15);
  EXPECT_EQ(loop.Step(8e8, 0.3e8), 1);
}

}  // namespace
}  // namespace tern::agent
