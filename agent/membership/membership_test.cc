#include "agent/membership/membership.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>

namespace tern::agent {
namespace {

MemberInfo Info(const std::string& id, const std::string& region, double up = 1e9) {
  MemberInfo m;
  m.id = id;
  m.region = region;
  m.data_address = id + ":1";
  m.uplink_bytes_per_s = up;
  m.downlink_bytes_per_s = 1e9;
  return m;
}

topology::PlanOptions Options(uint32_t fanout = 2, uint32_t stripes = 1) {
  topology::PlanOptions o;
  o.fanout_max = fanout;
  o.root_fanout_max = 2;
  o.stripes = stripes;
  return o;
}

// PARENTS names the parent's intra-cluster address exactly for edges inside
// one cluster whose two ends both listen with the intra transport; every
// other edge (another cluster, another region, an end without one) gets the
// address of the transport every agent has.
TEST(Membership, IntraClusterEdgesGetTheParentsIntraAddress) {
  auto in = [](const std::string& id, const std::string& region, const std::string& cluster,
               bool intra) {
    MemberInfo m = Info(id, region);
    m.cluster = cluster;
    if (intra) {
      m.intra_address = id + ":intra";
      m.intra_backend = "verbs";
    }
    return m;
  };
  topology::PlanOptions o = Options(/*fanout=*/1);
  o.root_fanout_max = 1;  // a chain: root -> a -> b -> c -> d -> e
  Membership m(in("root", "us", "c0", true), o, 1000);
  std::vector<std::string> notify;
  ASSERT_TRUE(m.Join(in("a", "us", "c0", true), 0, 0, &notify).ok());   // root's cluster
  ASSERT_TRUE(m.Join(in("b", "us", "c0", false), 0, 0, &notify).ok());  // no intra transport
  ASSERT_TRUE(m.Join(in("c", "us", "c1", true), 0, 0, &notify).ok());   // another cluster
  ASSERT_TRUE(m.Join(in("d", "us", "c1", true), 0, 0, &notify).ok());
  ASSERT_TRUE(m.Join(in("e", "eu", "c1", true), 0, 0, &notify).ok());  // same name, other region
  for (const std::string id : {"a", "b", "c", "d", "e"}) {
    auto p = m.ParentsOf(id);
    ASSERT_TRUE(p.ok()) << id;
    const std::string parent = p->parents[0].id;
    const auto& members = m.members();
    const MemberInfo& pi =
        parent == "root" ? in("root", "us", "c0", true) : members.at(parent).info;
    const MemberInfo& ci = members.at(id).info;
    const bool want_intra = !pi.intra_address.empty() && !ci.intra_address.empty() &&
                            pi.region == ci.region && pi.cluster == ci.cluster;
    EXPECT_EQ(p->parents[0].intra, want_intra) << id << " <- " << parent;
    EXPECT_EQ(p->parents[0].data_address, want_intra ? parent + ":intra" : parent + ":1")
        << id << " <- " << parent;
  }
  // The cases above must include both kinds of edge.
  int intra = 0, other = 0;
  for (const std::string id : {"a", "b", "c", "d", "e"})
    (m.ParentsOf(id)->parents[0].intra ? intra : other)++;
  EXPECT_GT(intra, 0);
  EXPECT_GT(other, 0);
}

// One cluster, two intra backends (one member chose ucx, or fell back):
// an edge between members of different backends gets the parent's main
// address and intra = false, edges between equal backends stay intra, and
// the mix is noted once per cluster and pair of backends.
TEST(Membership, AnIntraEdgeNeedsTheSameBackendAtBothEnds) {
  auto in = [](const std::string& id, const std::string& backend) {
    MemberInfo m = Info(id, "us");
    m.cluster = "c0";
    m.intra_address = id + ":intra";
    m.intra_backend = backend;
    return m;
  };
  topology::PlanOptions o = Options(/*fanout=*/1);
  o.root_fanout_max = 1;  // a chain: root -> a -> b -> c -> d
  Membership m(in("root", "verbs"), o, 1000);
  std::vector<std::string> notify;
  ASSERT_TRUE(m.Join(in("a", "verbs"), 0, 0, &notify).ok());
  ASSERT_TRUE(m.Join(in("b", "ucx"), 0, 0, &notify).ok());
  ASSERT_TRUE(m.Join(in("c", "verbs"), 0, 0, &notify).ok());
  ASSERT_TRUE(m.Join(in("d", "verbs"), 0, 0, &notify).ok());
  std::vector<std::string> notes;
  std::map<std::string, ParentRef> got;
  for (const std::string id : {"a", "b", "c", "d"}) {
    auto p = m.ParentsOf(id, &notes);
    ASSERT_TRUE(p.ok()) << id;
    got[id] = p->parents[0];
  }
  ASSERT_EQ(got["a"].id, "root");
  ASSERT_EQ(got["b"].id, "a");
  ASSERT_EQ(got["c"].id, "b");
  ASSERT_EQ(got["d"].id, "c");
  EXPECT_TRUE(got["a"].intra);
  EXPECT_EQ(got["a"].data_address, "root:intra");
  EXPECT_FALSE(got["b"].intra);  // verbs parent, ucx child
  EXPECT_EQ(got["b"].data_address, "a:1");
  EXPECT_FALSE(got["c"].intra);  // ucx parent, verbs child
  EXPECT_EQ(got["c"].data_address, "b:1");
  EXPECT_TRUE(got["d"].intra);
  EXPECT_EQ(got["d"].data_address, "c:intra");
  // Two mixed edges, one pair of backends in one cluster: one note, naming
  // both backends; asking again notes nothing new.
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("us/c0"), std::string::npos) << notes[0];
  EXPECT_NE(notes[0].find("a runs verbs, b runs ucx"), std::string::npos) << notes[0];
  notes.clear();
  for (const std::string id : {"a", "b", "c", "d"}) ASSERT_TRUE(m.ParentsOf(id, &notes).ok());
  EXPECT_TRUE(notes.empty());
}

TEST(Membership, JoinTellsTheNewMemberItsParentsWithAddresses) {
  Membership m(Info("root", "us"), Options(), 1000);
  std::vector<std::string> notify;
  ASSERT_TRUE(m.Join(Info("a", "eu"), 0, 0, &notify).ok());
  EXPECT_EQ(notify, std::vector<std::string>{"a"});
  auto p = m.ParentsOf("a");
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->parents.size(), 1u);
  EXPECT_EQ(p->parents[0].id, "root");
  EXPECT_EQ(p->parents[0].data_address, "root:1");

  notify.clear();
  ASSERT_TRUE(m.Join(Info("b", "eu"), 0, 0, &notify).ok());
  p = m.ParentsOf("b");
  ASSERT_TRUE(p.ok());
  // Region-aware: the second eu member hangs below the first, not the root.
  EXPECT_EQ(p->parents[0].id, "a");
  EXPECT_EQ(p->parents[0].data_address, "a:1");
  EXPECT_EQ(m.DepthOf("b"), 2u);
}

// HELLO's relay_only reaches the planner: later joins prefer the relay-only
// member's slot among slots at the same depth; one that says relay-only
// but may not relay is refused.
TEST(Membership, RelayOnlyFlagReachesThePlanner) {
  Membership m(Info("root", "us"), Options(/*fanout=*/2), 1000);
  std::vector<std::string> notify;
  MemberInfo relay = Info("r", "eu", 1e8);  // slower than the others
  relay.relay_only = true;
  ASSERT_TRUE(m.Join(Info("a", "eu"), 0, 0, &notify).ok());
  ASSERT_TRUE(m.Join(relay, 0, 0, &notify).ok());
  ASSERT_TRUE(m.Join(Info("b", "eu"), 0, 0, &notify).ok());
  ASSERT_TRUE(m.Join(Info("c", "eu"), 0, 0, &notify).ok());
  EXPECT_TRUE(m.plan().members.at("r").relay_only);
  EXPECT_EQ(m.ParentsOf("c")->parents[0].id, "r");
  MemberInfo bad = Info("x", "eu");
  bad.relay_only = true;
  bad.may_relay = false;
  EXPECT_EQ(m.Join(bad, 0, 0, &notify).code(), Code::kInvalidArgument);
  EXPECT_FALSE(m.Has("x"));
}

TEST(Membership, SecondJoinWithTheSameIdIsRefused) {
  Membership m(Info("root", "us"), Options(), 1000);
  std::vector<std::string> notify;
  ASSERT_TRUE(m.Join(Info("a", "eu"), 0, 0, &notify).ok());
  EXPECT_EQ(m.Join(Info("a", "us"), 0, 0, &notify).code(), Code::kAlreadyExists);
  EXPECT_EQ(m.Join(Info("root", "us"), 0, 0, &notify).code(), Code::kInvalidArgument);
  EXPECT_EQ(m.members().size(), 1u);
}

TEST(Membership, LeaveReattachesOnlyTheOrphans) {
  Membership m(Info("root", "us"), Options(2), 1000);
  std::vector<std::string> notify;
  for (auto id : {"a", "b", "c", "d", "e"}) ASSERT_TRUE(m.Join(Info(id, "eu"), 0, 0, &notify).ok());
  auto pa = m.ParentsOf("a");
  ASSERT_TRUE(pa.ok());
  ASSERT_EQ(pa->parents[0].id, "root");
  std::vector<std::string> orphans;
  for (const auto& [id, rec] : m.members()) {
    auto p = m.ParentsOf(id);
    if (p.ok() && p->parents[0].id == "a") orphans.push_back(id);
  }
  ASSERT_FALSE(orphans.empty());
  const uint64_t epoch = m.epoch();
  notify.clear();
  m.Leave("a", &notify);
  EXPECT_GT(m.epoch(), epoch);
  std::sort(notify.begin(), notify.end());
  EXPECT_EQ(notify, orphans);  // exactly a's children, nobody else
  EXPECT_FALSE(m.Has("a"));
  for (const auto& id : orphans) {
    auto p = m.ParentsOf(id);
    ASSERT_TRUE(p.ok());
    EXPECT_NE(p->parents[0].id, "a");
  }
  EXPECT_TRUE(topology::Validate(m.plan()).ok());
}

TEST(Membership, SilentMembersAreReportedAfterTheDeadline) {
  Membership m(Info("root", "us"), Options(), 1000);
  std::vector<std::string> notify;
  ASSERT_TRUE(m.Join(Info("a", "eu"), 0, 0, &notify).ok());
  ASSERT_TRUE(m.Join(Info("b", "eu"), 0, 0, &notify).ok());
  Heartbeat hb;
  hb.served_version = 7;
  ASSERT_TRUE(m.Heartbeat("b", hb, 900).ok());
  EXPECT_TRUE(m.Silent(1000).empty());
  EXPECT_EQ(m.Silent(1001), std::vector<std::string>{"a"});
  EXPECT_EQ(m.members().at("b").served_version, 7u);
  EXPECT_EQ(m.Heartbeat("zz", hb, 1).code(), Code::kNotFound);
}

TEST(Membership, StripedPlansGiveOneParentPerStripe) {
  Membership m(Info("root", "us"), Options(2, 2), 1000);
  std::vector<std::string> notify;
  for (auto id : {"a", "b", "c", "d"}) ASSERT_TRUE(m.Join(Info(id, "eu"), 0, 0, &notify).ok());
  for (auto id : {"a", "b", "c", "d"}) {
    auto p = m.ParentsOf(id);
    ASSERT_TRUE(p.ok());
    ASSERT_EQ(p->parents.size(), 2u);
    EXPECT_EQ(p->parents[1].stripe, 1u);
  }
}

TEST(Membership, BadPlanOptionsAreReportedByJoin) {
  Membership m(Info("root", "us"), Options(0), 1000);
  std::vector<std::string> notify;
  EXPECT_EQ(m.Join(Info("a", "eu"), 0, 0, &notify).code(), Code::kInvalidArgument);
}

TEST(Membership, HeartbeatFiguresSteerLaterJoins) {
  // root -> a; b and c under a (equal configured uplinks).
  topology::PlanOptions o = Options(2);
  o.root_fanout_max = 1;
  Membership m(Info("root", "us"), o, 1000);
  std::vector<std::string> notify;
  ASSERT_TRUE(m.Join(Info("a", "eu", 2e9), 0, 0, &notify).ok());
  ASSERT_TRUE(m.Join(Info("b", "eu"), 0, 0, &notify).ok());
  ASSERT_TRUE(m.Join(Info("c", "eu"), 0, 0, &notify).ok());
  ASSERT_EQ(m.ParentsOf("b")->parents[0].id, "a");
  ASSERT_EQ(m.ParentsOf("c")->parents[0].id, "a");
  // b is far from the root, c near: a new member hangs below c.
  Heartbeat hb;
  hb.rtt_to_root_s = 0.150;
  ASSERT_TRUE(m.Heartbeat("b", hb, 1).ok());
  hb.rtt_to_root_s = 0.001;
  ASSERT_TRUE(m.Heartbeat("c", hb, 1).ok());
  const uint64_t epoch = m.epoch();
  EXPECT_EQ(m.epoch(), epoch);  // measuring moves nobody
  notify.clear();
  ASSERT_TRUE(m.Join(Info("d", "eu"), 0, 1, &notify).ok());
  EXPECT_EQ(m.ParentsOf("d")->parents[0].id, "c");
  EXPECT_DOUBLE_EQ(m.plan().members.at("b").rtt_to_root_s, 0.150);
  // A child's receive rate is a measured lower bound on its parent's uplink.
  hb = {};
  hb.parents = {{0.001, 3e9}};
  ASSERT_TRUE(m.Heartbeat("d", hb, 2).ok());
  EXPECT_DOUBLE_EQ(m.members().at("c").measured_uplink_bytes_per_s, 3e9);
  EXPECT_DOUBLE_EQ(m.plan().members.at("c").uplink_bytes_per_s, 3e9);
}

TEST(Membership, ParentReportPlansAroundTheParentOnly) {
  topology::PlanOptions o = Options(2);
  o.root_fanout_max = 1;
  Membership m(Info("root", "us"), o, 1000);
  std::vector<std::string> notify;
  for (std::string id : {"a", "b", "c", "d", "e"})
    ASSERT_TRUE(m.Join(Info(id, "eu"), 0, 0, &notify).ok());
  // a under the root; b, c under a; d, e under b.
  ASSERT_EQ(m.ParentsOf("b")->parents[0].id, "a");
  ASSERT_EQ(m.ParentsOf("d")->parents[0].id, "b");
  const std::string bad = "b";
  // a reports the root stalled (refused: the root is not planned around,
  // but a is starving now), then b reports a: a starves too, refused; and d
  // reports b, which starves as well: refused. Within dead_after (1000 us).
  notify.clear();
  EXPECT_EQ(m.ReportParent("a", {0, "root", ParentFault::kStalled}, 10, &notify).code(),
            Code::kMismatch);
  EXPECT_EQ(m.ReportParent(bad, {0, "a", ParentFault::kStalled}, 20, &notify).code(),
            Code::kMismatch);
  EXPECT_EQ(m.ReportParent("d", {0, bad, ParentFault::kStalled}, 30, &notify).code(),
            Code::kMismatch);
  // Stale (not its parent), the root, an unknown reporter: refused.
  EXPECT_EQ(m.ReportParent("d", {0, "c", ParentFault::kBadChunks}, 20, &notify).code(),
            Code::kMismatch);
  EXPECT_EQ(m.ReportParent("a", {0, "root", ParentFault::kBadChunks}, 20, &notify).code(),
            Code::kMismatch);
  EXPECT_EQ(m.ReportParent("zz", {0, bad, ParentFault::kBadChunks}, 20, &notify).code(),
            Code::kNotFound);
  EXPECT_TRUE(notify.empty());
  // Later, b has not reported for longer than dead_after: the edge b -> d is at fault.
  const topology::Plan before = m.plan();
  ASSERT_TRUE(m.ReportParent("d", {0, bad, ParentFault::kStalled}, 2000, &notify).ok());
  EXPECT_TRUE(m.members().at(bad).demoted);
  EXPECT_FALSE(m.plan().members.at(bad).may_relay);
  for (const auto& [id, p] : m.plan().parent[0]) EXPECT_NE(p, bad) << id;
  // Only b's children and b itself moved; each mover is told.
  std::vector<std::string> moved;
  for (const auto& mv : topology::Diff(before, m.plan())) moved.push_back(mv.id);
  std::sort(moved.begin(), moved.end());
  for (const auto& id : moved) EXPECT_TRUE(id == "b" || id == "d" || id == "e") << id;
  std::sort(notify.begin(), notify.end());
  EXPECT_EQ(notify, moved);
  // The second child's report now is stale: nothing more moves.
  notify.clear();
  EXPECT_EQ(m.ReportParent("e", {0, bad, ParentFault::kStalled}, 2001, &notify).code(),
            Code::kMismatch);
  EXPECT_TRUE(notify.empty());
}

// The relative rule: a stall report on a parent whose own heartbeats show it
// received nothing for the stall time, and which holds nothing newer than
// the reporter, is refused whatever the order of the reports (the parent
// starves too), for one more stall time at most. A parent that received,
// holds a newer version, or was not heard from recently is planned around
// as before.
TEST(Membership, AParentThatStarvesByItsHeartbeatsIsNotBlamed) {
  topology::PlanOptions o = Options(2);
  o.root_fanout_max = 1;
  constexpr uint64_t kDead = 3000, kStall = 10000;
  auto hb = [](uint64_t bytes_in, uint64_t served) {
    agent::Heartbeat h;
    h.bytes_in = bytes_in;
    h.served_version = served;
    return h;
  };
  auto fresh = [&](uint64_t joined_at) {
    auto m = std::make_unique<Membership>(Info("root", "us"), o, kDead, ProbationOptions{}, kStall);
    std::vector<std::string> notify;
    for (std::string id : {"a", "b", "c", "d", "e"})
      EXPECT_TRUE(m->Join(Info(id, "eu"), 1, joined_at, &notify).ok());
    // a under the root; b, c under a; d, e under b.
    EXPECT_EQ(m->ParentsOf("d")->parents[0].id, "b");
    return m;
  };
  // b's heartbeats every 500 us over [from, to], bytes_in as bytes_at(t) says.
  auto beat = [&](Membership& on, uint64_t from, uint64_t to, auto bytes_at, uint64_t served) {
    for (uint64_t t = from; t <= to; t += 500)
      ASSERT_TRUE(on.Heartbeat("b", hb(bytes_at(t), served), t).ok());
  };
  auto flat = [](uint64_t) { return uint64_t{4096}; };
  std::vector<std::string> notify;

  // Version 2 is due from t=100000; b took its last byte at 95000 and has
  // had none since, by heartbeats every 500 us. d reports b first.
  auto m = fresh(0);
  beat(*m, 95000, 110000, flat, 1);
  Status s = m->ReportParent("d", {0, "b", ParentFault::kStalled}, 110100, &notify);
  EXPECT_EQ(s.code(), Code::kMismatch) << s.ToString();
  EXPECT_NE(s.message().find("'b' has received nothing itself for 15 ms"), std::string::npos)
      << s.ToString();
  EXPECT_FALSE(m->members().at("b").demoted);
  EXPECT_TRUE(notify.empty());
  // Bad chunks are no stall: b is planned around at once.
  ASSERT_TRUE(m->ReportParent("d", {0, "b", ParentFault::kBadChunks}, 110200, &notify).ok());
  EXPECT_TRUE(m->members().at("b").demoted);

  // Still nothing at the next report, a second stall time on: b itself
  // cannot receive (or starves under the root, which is never planned
  // around), and is moved after all.
  m = fresh(0);
  beat(*m, 95000, 110000, flat, 1);
  EXPECT_EQ(m->ReportParent("d", {0, "b", ParentFault::kStalled}, 110100, &notify).code(),
            Code::kMismatch);
  beat(*m, 110500, 115000, flat, 1);
  EXPECT_TRUE(m->ReportParent("d", {0, "b", ParentFault::kStalled}, 115100, &notify).ok());
  EXPECT_TRUE(m->members().at("b").demoted);

  // b received within the stall time (it takes bytes but sends d none).
  m = fresh(0);
  beat(
      *m, 95000, 110000, [](uint64_t t) { return uint64_t{t < 105000 ? 4096u : 8192u}; }, 1);
  EXPECT_TRUE(m->ReportParent("d", {0, "b", ParentFault::kStalled}, 110100, &notify).ok());
  EXPECT_TRUE(m->members().at("b").demoted);

  // b holds version 2 (serves it) and sends d nothing.
  m = fresh(0);
  beat(*m, 95000, 110000, flat, 2);
  EXPECT_TRUE(m->ReportParent("d", {0, "b", ParentFault::kStalled}, 110100, &notify).ok());
  EXPECT_TRUE(m->members().at("b").demoted);

  // b fell silent (stopped) before the stall time's second half: its flat
  // heartbeats are no evidence of what it does now.
  m = fresh(0);
  beat(*m, 95000, 104000, flat, 1);
  EXPECT_TRUE(m->ReportParent("d", {0, "b", ParentFault::kStalled}, 110100, &notify).ok());
  EXPECT_TRUE(m->members().at("b").demoted);

  // The rule off (parent_stall_us 0): planned around as before.
  Membership off(Info("root", "us"), o, kDead);
  for (std::string id : {"a", "b", "c", "d", "e"})
    ASSERT_TRUE(off.Join(Info(id, "eu"), 1, 0, &notify).ok());
  beat(off, 95000, 110000, flat, 1);
  EXPECT_TRUE(off.ReportParent("d", {0, "b", ParentFault::kStalled}, 110100, &notify).ok());
}

// Mid-chunk: a parent with no whole chunk for a stall time (long past the
// relative rule's one extra stall time) whose heartbeats' wire bytes still
// move is receiving a chunk to forward, and is excused as long as they
// move; once they stop for a stall time it is planned around. The slow
// region head of a 40 MB keyframe at 10 Mbit/s (docs/agent.md §4).
TEST(Membership, AParentStillReceivingItsFirstWholeChunkIsNotBlamed) {
  topology::PlanOptions o = Options(2);
  o.root_fanout_max = 1;
  constexpr uint64_t kDead = 3000, kStall = 10000;
  auto hb = [](uint64_t bytes_in, uint64_t wire) {
    agent::Heartbeat h;
    h.bytes_in = bytes_in;
    h.wire_bytes_in = wire;
    h.served_version = 1;
    return h;
  };
  auto fresh = [&] {
    auto m = std::make_unique<Membership>(Info("root", "us"), o, kDead, ProbationOptions{}, kStall);
    std::vector<std::string> notify;
    for (std::string id : {"a", "b", "c", "d", "e"})
      EXPECT_TRUE(m->Join(Info(id, "eu"), 1, 0, &notify).ok());
    EXPECT_EQ(m->ParentsOf("d")->parents[0].id, "b");
    return m;
  };
  // b's last whole chunk came at join (t=0); from t=50000 its transport
  // takes bytes off its parent link, 1 kB per 500 us heartbeat, until
  // wire_until; then they stop.
  auto beat = [&](Membership& on, uint64_t to, uint64_t wire_until) {
    for (uint64_t t = 50000; t <= to; t += 500)
      ASSERT_TRUE(
          on.Heartbeat("b", hb(4096, 1000 * (std::min(t, wire_until) - 49500) / 500), t).ok());
  };
  std::vector<std::string> notify;
  // d's stall report on b is taken, and b is planned around.
  auto PlannedAround = [&](Membership& on, uint64_t at) {
    EXPECT_TRUE(on.ReportParent("d", {0, "b", ParentFault::kStalled}, at, &notify).ok());
    EXPECT_TRUE(on.members().at("b").demoted);
  };

  // 30 ms without a whole chunk since b's first heartbeat (three stall
  // times; its bytes_in then first differed from the join's zero) but
  // bytes coming in: excused, and said why.
  auto m = fresh();
  beat(*m, 80000, 80000);
  Status s = m->ReportParent("d", {0, "b", ParentFault::kStalled}, 80100, &notify);
  EXPECT_EQ(s.code(), Code::kMismatch) << s.ToString();
  EXPECT_NE(
      s.message().find(
          "'b' has no whole chunk for 30 ms but took bytes off its own parent's link 0 ms ago"),
      std::string::npos)
      << s.ToString();
  EXPECT_FALSE(m->members().at("b").demoted);
  EXPECT_TRUE(notify.empty());
  // Bad chunks are not excused by it.
  ASSERT_TRUE(m->ReportParent("d", {0, "b", ParentFault::kBadChunks}, 80200, &notify).ok());
  EXPECT_TRUE(m->members().at("b").demoted);

  // The wire bytes stopped at t=65000, more than a stall time before the
  // report: b is planned around as before.
  m = fresh();
  beat(*m, 80000, 65000);
  PlannedAround(*m, 80100);

  // Whole chunks moving too (b receives and forwards nothing): as before.
  m = fresh();
  for (uint64_t t = 50000; t <= 80000; t += 500) ASSERT_TRUE(m->Heartbeat("b", hb(t, t), t).ok());
  PlannedAround(*m, 80100);

  // Not heard from within min(dead_after, stall / 2): its wire bytes are
  // old news.
  m = fresh();
  beat(*m, 70000, 70000);
  PlannedAround(*m, 76000);

  // Bounded: wire bytes growing without a whole chunk for more than
  // kMidChunkStallTimes stall times (a link too slow to relay on, or a
  // member reporting bytes it never completes) no longer excuse it.
  m = fresh();
  const uint64_t limit =
      50000 + Membership::kMidChunkStallTimes * kStall;  // b's bytes_in last moved at 50000
  beat(*m, limit - 1000, limit - 1000);
  EXPECT_EQ(m->ReportParent("d", {0, "b", ParentFault::kStalled}, limit - 900, &notify).code(),
            Code::kMismatch);
  for (uint64_t t = limit - 500; t <= limit + 500; t += 500)  // still growing
    ASSERT_TRUE(m->Heartbeat("b", hb(4096, 1000 * (t - 49500) / 500), t).ok());
  PlannedAround(*m, limit + 600);

  // Only growth counts: a counter that drops (a redial) or repeats is no
  // progress.
  m = fresh();
  for (uint64_t t = 50000; t <= 80000; t += 500)
    ASSERT_TRUE(m->Heartbeat("b", hb(4096, t < 60000 ? 100000 - t : 1000), t).ok());
  PlannedAround(*m, 80100);
}

// What the root logs of a parent when it acts on a report: what the
// parent's own heartbeats say it received over the stall time before.
TEST(Membership, StallEvidenceSaysWhatTheParentReceived) {
  constexpr uint64_t kDead = 3000, kStall = 10000;
  Membership m(Info("root", "us"), Options(2), kDead, ProbationOptions{}, kStall);
  std::vector<std::string> notify;
  ASSERT_TRUE(m.Join(Info("b", "eu"), 1, 0, &notify).ok());
  EXPECT_EQ(m.StallEvidence("nobody", 0), "");
  EXPECT_EQ(m.StallEvidence("b", 2000), "its last heartbeat 2 ms ago, serving 1");
  agent::Heartbeat hb;
  hb.served_version = 1;
  for (uint64_t t = 95000; t <= 110000; t += 500) {
    hb.bytes_in = t < 105000 ? 4096 : 4096 + 3000;  // 3000 bytes in at 105000
    ASSERT_TRUE(m.Heartbeat("b", hb, t).ok());
  }
  EXPECT_EQ(m.StallEvidence("b", 112000),
            "its last heartbeat 2 ms ago, bytes in +3000 over the 10 ms before it, serving 1");
  // Bounded by age: every 100 us, only the last two stall times' (20 ms:
  // 201 samples) are kept.
  for (uint64_t t = 110500; t <= 500000; t += 100) ASSERT_TRUE(m.Heartbeat("b", hb, t).ok());
  const auto& samples = m.members().at("b").bytes_in_samples;
  EXPECT_EQ(samples.size(), 201u);
  EXPECT_EQ(samples.front().first, 480000u);
  // And by count: every 10 us, 256 samples (2.55 ms) at most.
  for (uint64_t t = 500010; t <= 600000; t += 10) ASSERT_TRUE(m.Heartbeat("b", hb, t).ok());
  EXPECT_EQ(samples.size(), MemberRecord::kMaxBytesInSamples);
  EXPECT_EQ(samples.front().first, 600000u - 255 * 10);
  EXPECT_EQ(m.StallEvidence("b", 600000),
            "its last heartbeat 0 ms ago, bytes in +0 over the 2 ms before it, serving 1");
  // A report of its own (refused: the root is not planned around) shows.
  EXPECT_EQ(m.ReportParent("b", {0, "root", ParentFault::kStalled}, 603000, &notify).code(),
            Code::kMismatch);
  EXPECT_EQ(m.StallEvidence("b", 607000),
            "its last heartbeat 7 ms ago, bytes in +0 over the 2 ms before it, serving 1, its own "
            "report of a stalled parent 4 ms ago");
}

TEST(Membership, EachStripesRateGoesToThatStripesParent) {
  Membership m(Info("root", "us"), Options(/*fanout=*/2, /*stripes=*/2), 1000);
  std::vector<std::string> notify;
  for (std::string id : {"a", "b", "c", "d"})
    ASSERT_TRUE(m.Join(Info(id, "eu"), 0, 0, &notify).ok());
  // A member whose parents are two other members (one per stripe).
  std::string child;
  std::string parent0, parent1;
  for (const auto& [id, rec] : m.members()) {
    auto p = m.ParentsOf(id);
    ASSERT_TRUE(p.ok());
    if (p->parents[0].id != "root" && p->parents[1].id != "root" &&
        p->parents[0].id != p->parents[1].id) {
      child = id;
      parent0 = p->parents[0].id;
      parent1 = p->parents[1].id;
    }
  }
  ASSERT_FALSE(child.empty()) << "no member with two member parents";
  Heartbeat hb;
  hb.parents = {{0.002, 1e8}, {0.003, 7e8}};
  ASSERT_TRUE(m.Heartbeat(child, hb, 1).ok());
  EXPECT_DOUBLE_EQ(m.members().at(parent0).measured_uplink_bytes_per_s, 1e8);
  EXPECT_DOUBLE_EQ(m.members().at(parent1).measured_uplink_bytes_per_s, 7e8);
  EXPECT_DOUBLE_EQ(m.plan().members.at(parent1).uplink_bytes_per_s, 7e8);
}
}  // namespace
}  // namespace tern::agent

namespace tern::agent {
namespace {

// The probation policy alone (agent/membership/probation.h), on a fake clock in
// microseconds.
TEST(Probation, StallsBackOffUpToTheBoundAndBadChunksWaitTheLongest) {
  ProbationOptions o;
  o.quiet_us = 1000;
  EXPECT_EQ(ProbationWaitUs(o, ParentFault::kStalled, 1), 1000u);
  EXPECT_EQ(ProbationWaitUs(o, ParentFault::kStalled, 2), 2000u);
  EXPECT_EQ(ProbationWaitUs(o, ParentFault::kStalled, 3), 4000u);
  EXPECT_EQ(ProbationWaitUs(o, ParentFault::kStalled, 5), 16000u);
  EXPECT_EQ(ProbationWaitUs(o, ParentFault::kStalled, 6), 16000u);  // bounded
  EXPECT_EQ(ProbationWaitUs(o, ParentFault::kStalled, 4000000000u), 16000u);
  EXPECT_EQ(ProbationWaitUs(o, ParentFault::kBadChunks, 1), 16000u);
  EXPECT_EQ(ProbationWaitUs(o, ParentFault::kBadChunks, 9), 16000u);
  // No probation: never (a leaf until it joins again).
  ProbationOptions off;
  off.quiet_us = 0;
  EXPECT_EQ(ProbationWaitUs(off, ParentFault::kStalled, 1), 0u);
  RelayProbation p;
  RecordDemotion(off, ParentFault::kStalled, 500, &p);
  EXPECT_FALSE(ProbationOver(p, ~uint64_t{0}));
  // A huge quiet period saturates instead of wrapping round to "at once".
  ProbationOptions huge;
  huge.quiet_us = ~uint64_t{0} / 4;
  RelayProbation q;
  RecordDemotion(huge, ParentFault::kBadChunks, 10, &q);
  EXPECT_FALSE(ProbationOver(q, ~uint64_t{0} - 1));
}

TEST(Probation, ARepeatOffenderWaitsLongerUntilACleanRunClearsItsRecord) {
  ProbationOptions o;
  o.quiet_us = 1000;
  RelayProbation p;
  uint64_t now = 5000;
  RecordDemotion(o, ParentFault::kStalled, now, &p);
  EXPECT_FALSE(ProbationOver(p, now + 999));
  EXPECT_TRUE(ProbationOver(p, now + 1000));
  now += 1000;
  RecordPromotion(now, &p);
  EXPECT_FALSE(ProbationOver(p, now + 100000));  // relaying: nothing to end
  // Reported again soon after: twice the wait.
  now += 10;
  RecordDemotion(o, ParentFault::kStalled, now, &p);
  EXPECT_EQ(p.strikes, 2u);
  EXPECT_FALSE(ProbationOver(p, now + 1999));
  EXPECT_TRUE(ProbationOver(p, now + 2000));
  now += 2000;
  RecordPromotion(now, &p);
  // After relaying for the longest wait (16 quiet periods) without a
  // report, the next demotion counts as a first again.
  now += 16000;
  RecordDemotion(o, ParentFault::kStalled, now, &p);
  EXPECT_EQ(p.strikes, 1u);
  EXPECT_TRUE(ProbationOver(p, now + 1000));
  // Bad chunks: the longest wait, even as a first.
  RelayProbation liar;
  RecordDemotion(o, ParentFault::kBadChunks, 0, &liar);
  EXPECT_FALSE(ProbationOver(liar, 15999));
  EXPECT_TRUE(ProbationOver(liar, 16000));
}

// Through Membership: a demoted relay relays again once its probation is
// over (no edge moves, nobody is told), later joins may hang under it, and
// a second demotion waits twice as long.
TEST(Membership, ADemotedRelayRelaysAgainAfterItsProbation) {
  topology::PlanOptions o = Options(2);
  o.root_fanout_max = 1;
  ProbationOptions probation;
  probation.quiet_us = 10000;
  Membership m(Info("root", "us"), o, 1000, probation);
  std::vector<std::string> notify;
  for (std::string id : {"a", "b", "c", "d", "e"})
    ASSERT_TRUE(m.Join(Info(id, "eu"), 0, 0, &notify).ok());
  ASSERT_EQ(m.ParentsOf("d")->parents[0].id, "b");
  uint64_t now = 5000;
  ASSERT_TRUE(m.ReportParent("d", {0, "b", ParentFault::kStalled}, now, &notify).ok());
  ASSERT_TRUE(m.members().at("b").demoted);
  EXPECT_TRUE(m.EndProbations(now + 9999).empty());
  EXPECT_TRUE(m.members().at("b").demoted);
  const topology::Plan before = m.plan();
  const uint64_t epoch = m.epoch();
  EXPECT_EQ(m.EndProbations(now + 10000), std::vector<std::string>{"b"});
  EXPECT_FALSE(m.members().at("b").demoted);
  EXPECT_TRUE(m.plan().members.at("b").may_relay);
  EXPECT_TRUE(topology::Diff(before, m.plan()).empty());
  EXPECT_EQ(m.epoch(), epoch);
  EXPECT_TRUE(topology::Validate(m.plan()).ok());
  EXPECT_TRUE(m.EndProbations(now + 20000).empty());  // once
  // Relay-capable again: some later join lands under b.
  bool under_b = false;
  for (int i = 0; i < 6 && !under_b; ++i) {
    const std::string id = "late" + std::to_string(i);
    ASSERT_TRUE(m.Join(Info(id, "eu"), 0, now, &notify).ok());
    under_b = m.ParentsOf(id)->parents[0].id == "b";
  }
  ASSERT_TRUE(under_b) << "no join picked the promoted relay";
  // Demoted again by its new child: now it waits 2 quiet periods.
  std::string child;
  for (const auto& [id, p] : m.plan().parent[0])
    if (p == "b") child = id;
  now += 30000;
  ASSERT_TRUE(m.ReportParent(child, {0, "b", ParentFault::kStalled}, now, &notify).ok());
  EXPECT_EQ(m.members().at("b").probation.strikes, 2u);
  EXPECT_TRUE(m.EndProbations(now + 19999).empty());
  EXPECT_EQ(m.EndProbations(now + 20000), std::vector<std::string>{"b"});
}

// Draining (a scheduler about to take a member away): its children move to
// other parents now, nobody else moves, it is a leaf from then on — later
// joins never land under it and a probation that ends does not promote it —
// and draining it again changes nothing.
TEST(Membership, ADrainedMemberLosesItsChildrenAndStaysALeaf) {
  topology::PlanOptions o = Options(2);
  o.root_fanout_max = 1;  // root -> a; everyone else under a or below
  ProbationOptions probation;
  probation.quiet_us = 1000;
  Membership m(Info("root", "us"), o, 1000, probation);
  std::vector<std::string> notify;
  for (std::string id : {"a", "b", "c", "d", "e"})
    ASSERT_TRUE(m.Join(Info(id, "eu"), 0, 0, &notify).ok());
  std::vector<std::string> children;
  for (const auto& [id, p] : m.plan().parent[0])
    if (p == "b") children.push_back(id);
  ASSERT_FALSE(children.empty()) << "the plan must give b children for this test";
  // b is demoted first (a probation that would end), then drained.
  ASSERT_TRUE(m.ReportParent(children.front(), {0, "b", ParentFault::kStalled}, 10, &notify).ok());
  std::vector<std::string> orphans;
  for (const auto& [id, p] : m.plan().parent[0])
    if (p == "c") orphans.push_back(id);
  const uint64_t epoch = m.epoch();
  notify.clear();
  ASSERT_TRUE(m.Drain("c", &notify).ok());
  // c's children, and c itself (re-attached as a leaf), nobody else.
  orphans.push_back("c");
  std::sort(notify.begin(), notify.end());
  std::sort(orphans.begin(), orphans.end());
  EXPECT_EQ(notify, orphans);
  EXPECT_EQ(m.epoch(), epoch + 1);
  EXPECT_TRUE(m.members().at("c").draining);
  for (const auto& [id, p] : m.plan().parent[0]) EXPECT_NE(p, "c") << id;
  ASSERT_TRUE(m.Drain("b", &notify).ok());
  notify.clear();
  ASSERT_TRUE(m.Drain("c", &notify).ok());  // again: nothing moves
  EXPECT_TRUE(notify.empty());
  EXPECT_TRUE(m.EndProbations(1000000).empty());  // b's probation is over, but b is drained
  for (int i = 0; i < 8; ++i) {
    const std::string id = "late" + std::to_string(i);
    ASSERT_TRUE(m.Join(Info(id, "eu"), 0, 2000, &notify).ok());
    const std::string parent = m.ParentsOf(id)->parents[0].id;
    EXPECT_NE(parent, "b");
    EXPECT_NE(parent, "c");
  }
  EXPECT_TRUE(topology::Validate(m.plan()).ok());
  EXPECT_EQ(m.Drain("nobody", &notify).code(), Code::kNotFound);
}

}  // namespace
}  // namespace tern::agent
