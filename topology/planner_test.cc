#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "tern/topology.h"

namespace tern::topology {
namespace {

constexpr double kGbps = 1e9 / 8;

Member M(std::string id, std::string region, std::string cluster, double up_gbps,
         double down_gbps = 0) {
  Member m;
  m.id = std::move(id);
  m.region = std::move(region);
  m.cluster = std::move(cluster);
  m.uplink_bytes_per_s = up_gbps * kGbps;
  m.downlink_bytes_per_s = (down_gbps > 0 ? down_gbps : up_gbps) * kGbps;
  return m;
}

Member Root() { return M("root", "us", "trainer", 100); }

// 3 regions x 2 clusters x 3 members; uplinks differ so the choice of heads
// is visible: member "<region>-<cluster>-<k>" has uplink 10 + k + cluster.
std::vector<Member> ThreeRegions() {
  std::vector<Member> out;
  for (std::string region : {"us", "eu", "ap"})
    for (int c = 0; c < 2; ++c)
      for (int k = 0; k < 3; ++k)
        out.push_back(M(region + "-c" + std::to_string(c) + "-" + std::to_string(k), region,
                        "c" + std::to_string(c), 10 + k + 5 * c));
  return out;
}

int CrossRegionEdgesInto(const Plan& plan, uint32_t stripe, const std::string& region) {
  int n = 0;
  for (const auto& [id, p] : plan.parent[stripe]) {
    const Member& child = plan.members.at(id);
    const Member& parent = p == plan.root.id ? plan.root : plan.members.at(p);
    if (child.region == region && Classify(parent, child) == Link::kCrossRegion) ++n;
  }
  return n;
}

TEST(Planner, ThreeRegionsCrossEachWanLinkOnceAndClustersHangTogether) {
  auto plan = MakePlan(Root(), ThreeRegions(), PlanOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_TRUE(Validate(*plan).ok()) << Validate(*plan).ToString();
  // eu and ap are entered once each, from the root; us (the root's region)
  // never across the WAN.
  EXPECT_EQ(CrossRegionEdgesInto(*plan, 0, "eu"), 1);
  EXPECT_EQ(CrossRegionEdgesInto(*plan, 0, "ap"), 1);
  EXPECT_EQ(CrossRegionEdgesInto(*plan, 0, "us"), 0);
  // The root feeds exactly one head per region: the region's fastest member.
  EXPECT_EQ(Children(*plan, 0, "root"),
            (std::vector<std::string>{"ap-c1-2", "eu-c1-2", "us-c1-2"}));
  // Inside a region, one edge joins the two clusters; everything else stays
  // inside its cluster.
  int cross_cluster = 0;
  for (const auto& [id, p] : plan->parent[0]) {
    if (p == "root") continue;
    if (Classify(plan->members.at(p), plan->members.at(id)) == Link::kSameRegion) ++cross_cluster;
  }
  EXPECT_EQ(cross_cluster, 3);  // one per region
}

TEST(Planner, SameInputInAnyOrderGivesTheSamePlan) {
  auto members = ThreeRegions();
  auto a = MakePlan(Root(), members, PlanOptions{});
  std::mt19937 rng(7);
  std::shuffle(members.begin(), members.end(), rng);
  auto b = MakePlan(Root(), members, PlanOptions{});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->parent, b->parent);
  EXPECT_TRUE(Diff(*a, *b).empty());
}

TEST(Planner, FanOutBoundsHoldAndFastMembersAreInterior) {
  std::vector<Member> members;
  for (int i = 0; i < 40; ++i) members.push_back(M("m" + std::to_string(100 + i), "eu", "", 1 + i));
  PlanOptions o;
  o.fanout_max = 3;
  o.root_fanout_max = 2;
  auto plan = MakePlan(Root(), members, o);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_TRUE(Validate(*plan).ok());
  std::map<std::string, int> kids;
  for (const auto& [id, p] : plan->parent[0]) ++kids[p];
  for (const auto& [p, n] : kids) EXPECT_LE(n, p == "root" ? 2 : 3) << p;
  // The fastest member heads the region; the 13 slowest (40 - 1 - 3*9 + ...)
  // are leaves: no interior member is slower than a leaf it could replace.
  EXPECT_EQ(Children(*plan, 0, "root").front(), "m139");
  double slowest_interior = 1e300, fastest_leaf = 0;
  for (const auto& [id, m] : plan->members) {
    if (kids.count(id)) {
      slowest_interior = std::min(slowest_interior, m.uplink_bytes_per_s);
    } else {
      fastest_leaf = std::max(fastest_leaf, m.uplink_bytes_per_s);
    }
  }
  EXPECT_GE(slowest_interior, fastest_leaf);
  // Balanced: 40 members under fan-out 3 below one region head need depth 4.
  uint32_t depth_max = 0;
  for (const auto& [id, m] : plan->members) depth_max = std::max(depth_max, *Depth(*plan, 0, id));
  EXPECT_LE(depth_max, 5u);
}

TEST(Planner, MembersThatMayNotRelayAreLeaves) {
  auto members = ThreeRegions();
  for (auto& m : members)
    if (m.id.back() == '2') m.may_relay = false;  // the fastest of every cluster
  auto plan = MakePlan(Root(), members, PlanOptions{});
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(Validate(*plan).ok());
  for (const auto& m : members) {
    if (!m.may_relay) {
      EXPECT_TRUE(Children(*plan, 0, m.id).empty()) << m.id;
    }
  }
}

TEST(Planner, RefusesBadInputClearly) {
  auto members = ThreeRegions();
  auto dup = members;
  dup.push_back(members[0]);
  EXPECT_EQ(MakePlan(Root(), dup, {}).status().code(), Code::kInvalidArgument);
  auto as_root = members;
  as_root.push_back(M("root", "eu", "", 1));
  EXPECT_EQ(MakePlan(Root(), as_root, {}).status().code(), Code::kInvalidArgument);
  for (double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    auto m = members;
    m[3].uplink_bytes_per_s = bad;
    EXPECT_EQ(MakePlan(Root(), m, {}).status().code(), Code::kInvalidArgument) << bad;
  }
  auto no_region = members;
  no_region[1].region.clear();
  EXPECT_EQ(MakePlan(Root(), no_region, {}).status().code(), Code::kInvalidArgument);
  auto long_id = members;
  long_id[2].id.assign(kMaxIdBytes + 1, 'x');
  EXPECT_EQ(MakePlan(Root(), long_id, {}).status().code(), Code::kInvalidArgument);
  PlanOptions o;
  o.stripes = 0;
  EXPECT_EQ(MakePlan(Root(), members, o).status().code(), Code::kInvalidArgument);
  o.stripes = 5;  // above fanout_max 4
  EXPECT_EQ(MakePlan(Root(), members, o).status().code(), Code::kInvalidArgument);
  o = PlanOptions{};
  o.members_max = 3;
  EXPECT_EQ(MakePlan(Root(), members, o).status().code(), Code::kResourceExhausted);
}

TEST(Planner, TooLittleFanOutIsResourceExhaustedNotAnOverfullRelay) {
  std::vector<Member> members;
  for (int i = 0; i < 10; ++i) {
    members.push_back(M("m" + std::to_string(i), "eu", "", 1));
    members.back().may_relay = i < 2;  // 2 relays x fan-out 2 + root 1 < 10
  }
  PlanOptions o;
  o.fanout_max = 2;
  o.root_fanout_max = 1;
  auto plan = MakePlan(Root(), members, o);
  EXPECT_EQ(plan.status().code(), Code::kResourceExhausted) << plan.status().ToString();
}

TEST(Planner, AddingAMemberMovesNoOtherEdge) {
  auto plan = MakePlan(Root(), ThreeRegions(), PlanOptions{});
  ASSERT_TRUE(plan.ok());
  auto grown = AddMember(*plan, M("eu-c0-9", "eu", "c0", 3));
  ASSERT_TRUE(grown.ok()) << grown.status().ToString();
  ASSERT_TRUE(Validate(*grown).ok());
  auto moves = Diff(*plan, *grown);
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0].id, "eu-c0-9");
  EXPECT_EQ(moves[0].old_parent, "");
  // Into its own cluster.
  EXPECT_EQ(plan->members.at(moves[0].new_parent).cluster, "c0");
  EXPECT_EQ(plan->members.at(moves[0].new_parent).region, "eu");
  EXPECT_EQ(AddMember(*grown, M("eu-c0-9", "eu", "c0", 3)).status().code(), Code::kAlreadyExists);
  // A new region is entered once, from the root.
  auto far = AddMember(*grown, M("sa-0", "sa", "", 5));
  ASSERT_TRUE(far.ok());
  EXPECT_EQ(far->parent[0].at("sa-0"), "root");
  auto far2 = AddMember(*far, M("sa-1", "sa", "", 4));
  ASSERT_TRUE(far2.ok());
  EXPECT_EQ(far2->parent[0].at("sa-1"), "sa-0");
}

TEST(Planner, RemovingAMemberMovesOnlyItsChildren) {
  auto plan = MakePlan(Root(), ThreeRegions(), PlanOptions{});
  ASSERT_TRUE(plan.ok());
  // A leaf: nothing else moves.
  std::string leaf;
  for (const auto& [id, m] : plan->members)
    if (Children(*plan, 0, id).empty()) leaf = id;
  auto smaller = RemoveMember(*plan, leaf);
  ASSERT_TRUE(smaller.ok());
  ASSERT_TRUE(Validate(*smaller).ok());
  auto moves = Diff(*plan, *smaller);
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0].id, leaf);
  EXPECT_EQ(moves[0].new_parent, "");
  EXPECT_EQ(RemoveMember(*smaller, leaf).status().code(), Code::kNotFound);

  // The eu head: its children re-attach, the fastest takes its place under
  // the root, the region is still entered once, and nobody else moves.
  const std::string head = "eu-c1-2";
  ASSERT_EQ(plan->parent[0].at(head), "root");
  const auto orphans = Children(*plan, 0, head);
  ASSERT_FALSE(orphans.empty());
  auto headless = RemoveMember(*plan, head);
  ASSERT_TRUE(headless.ok()) << headless.status().ToString();
  ASSERT_TRUE(Validate(*headless).ok()) << Validate(*headless).ToString();
  EXPECT_EQ(CrossRegionEdgesInto(*headless, 0, "eu"), 1);
  for (const auto& mv : Diff(*plan, *headless)) {
    const bool orphan = std::find(orphans.begin(), orphans.end(), mv.id) != orphans.end();
    EXPECT_TRUE(orphan || mv.id == head) << mv.id << " moved";
  }
}

// A chain root -> a, then b and c under a (fan-out 2): b and c are equal
// candidates at depth 2 until measurements say otherwise.
Result<Plan> TwoEqualCandidates() {
  PlanOptions o;
  o.fanout_max = 2;
  o.root_fanout_max = 1;
  return MakePlan(Root(), {M("a", "eu", "", 10), M("b", "eu", "", 5), M("c", "eu", "", 5)}, o);
}

TEST(Planner, MeasuredUplinkPicksTheFasterParent) {
  auto plan = TwoEqualCandidates();
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->parent[0].at("b"), "a");
  ASSERT_EQ(plan->parent[0].at("c"), "a");
  // Equal figures: id order decides.
  auto d = AddMember(*plan, M("d", "eu", "", 1));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->parent[0].at("d"), "b");
  // c measured twice as fast as configured; b's figures stay: d goes to c.
  auto measured = UpdateFigures(*plan, "c", 10 * kGbps, 0, 0);
  ASSERT_TRUE(measured.ok()) << measured.status().ToString();
  EXPECT_TRUE(Diff(*plan, *measured).empty());  // measuring moves nobody
  d = AddMember(*measured, M("d", "eu", "", 1));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->parent[0].at("d"), "c");
  ASSERT_TRUE(Validate(*d).ok());
}

TEST(Planner, MeasuredRoundTripPicksTheCloserParent) {
  auto plan = TwoEqualCandidates();
  ASSERT_TRUE(plan.ok());
  // Same uplinks; b is 80 ms from the root, c 2 ms: c's first chunk comes
  // ~39 ms sooner, which outweighs the 1 MiB at 5 Gbit/s either way.
  auto measured = UpdateFigures(*plan, "b", 0, 0, 0.080);
  ASSERT_TRUE(measured.ok());
  measured = UpdateFigures(*measured, "c", 0, 0, 0.002);
  ASSERT_TRUE(measured.ok());
  EXPECT_DOUBLE_EQ(measured->members.at("b").uplink_bytes_per_s, 5 * kGbps);  // 0 keeps
  auto d = AddMember(*measured, M("d", "eu", "", 1));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->parent[0].at("d"), "c");
  // But a much faster uplink wins over a few milliseconds.
  measured = UpdateFigures(*measured, "b", 1000 * kGbps, 0, 0.004);
  ASSERT_TRUE(measured.ok());
  d = AddMember(*measured, M("d", "eu", "", 1));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->parent[0].at("d"), "b");
  // Bad figures are refused, unknown ids too.
  EXPECT_EQ(UpdateFigures(*plan, "b", -1, 0, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(
      UpdateFigures(*plan, "b", 0, 0, std::numeric_limits<double>::quiet_NaN()).status().code(),
      Code::kInvalidArgument);
  EXPECT_EQ(UpdateFigures(*plan, "zz", 1, 1, 0).status().code(), Code::kNotFound);
}

TEST(Planner, DemotingARelayMovesOnlyItAndItsChildren) {
  auto plan = MakePlan(Root(), ThreeRegions(), PlanOptions{});
  ASSERT_TRUE(plan.ok());
  // The eu head relays to its region; its children found it bad.
  const std::string head = "eu-c1-2";
  ASSERT_EQ(plan->parent[0].at(head), "root");
  const auto orphans = Children(*plan, 0, head);
  ASSERT_FALSE(orphans.empty());
  auto demoted = DemoteRelay(*plan, head);
  ASSERT_TRUE(demoted.ok()) << demoted.status().ToString();
  ASSERT_TRUE(Validate(*demoted).ok()) << Validate(*demoted).ToString();
  EXPECT_TRUE(Children(*demoted, 0, head).empty());
  EXPECT_FALSE(demoted->members.at(head).may_relay);
  EXPECT_EQ(demoted->relay_stripe.at(head), Plan::kLeafEverywhere);
  EXPECT_EQ(CrossRegionEdgesInto(*demoted, 0, "eu"), 1);  // still entered once
  EXPECT_NE(demoted->parent[0].at(head), "root");         // a leaf inside its region now
  for (const auto& mv : Diff(*plan, *demoted)) {
    const bool orphan = std::find(orphans.begin(), orphans.end(), mv.id) != orphans.end();
    EXPECT_TRUE(orphan || mv.id == head) << mv.id << " moved";
  }
  // Again: nothing to do. Unknown: kNotFound. Later joins never pick it.
  auto again = DemoteRelay(*demoted, head);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(Diff(*demoted, *again).empty());
  EXPECT_EQ(DemoteRelay(*plan, "nobody").status().code(), Code::kNotFound);
  auto grown = AddMember(*demoted, M("eu-c1-9", "eu", "c1", 1));
  ASSERT_TRUE(grown.ok());
  EXPECT_NE(grown->parent[0].at("eu-c1-9"), head);
}

TEST(Planner, APromotedRelayTakesChildrenAgainAndNobodyMoves) {
  auto plan = MakePlan(Root(), ThreeRegions(), PlanOptions{});
  ASSERT_TRUE(plan.ok());
  const std::string head = "eu-c1-2";
  auto demoted = DemoteRelay(*plan, head);
  ASSERT_TRUE(demoted.ok());
  auto promoted = PromoteRelay(*demoted, head);
  ASSERT_TRUE(promoted.ok()) << promoted.status().ToString();
  ASSERT_TRUE(Validate(*promoted).ok()) << Validate(*promoted).ToString();
  EXPECT_TRUE(promoted->members.at(head).may_relay);
  EXPECT_EQ(promoted->relay_stripe.at(head), 0u);
  EXPECT_TRUE(Diff(*demoted, *promoted).empty()) << "promotion moved an edge";
  // Relay-capable again: a later join in its cluster may hang under it
  // (the demoted plan never let one).
  std::vector<std::string> under;
  Plan grown = *promoted;
  for (int k = 9; k < 13; ++k) {
    const std::string id = "eu-c1-" + std::to_string(k);
    auto next = AddMember(grown, M(id, "eu", "c1", 1));
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    grown = std::move(next).value();
    if (grown.parent[0].at(id) == head) under.push_back(id);
  }
  EXPECT_FALSE(under.empty()) << "no join picked the promoted relay";
  // Again: nothing to do. Unknown: kNotFound.
  auto again = PromoteRelay(*promoted, head);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->relay_stripe, promoted->relay_stripe);
  EXPECT_EQ(PromoteRelay(*plan, "nobody").status().code(), Code::kNotFound);
}

TEST(Planner, APromotedRelayGoesToItsRegionsLeastRelayedStripe) {
  std::vector<Member> members;
  for (int i = 0; i < 6; ++i) members.push_back(M("m" + std::to_string(i), "eu", "", 10 + i));
  PlanOptions o;
  o.stripes = 2;
  auto plan = MakePlan(Root(), members, o);
  ASSERT_TRUE(plan.ok());
  // Two relays demoted from stripe 1 leave it the poorer one.
  Plan p = *plan;
  std::vector<std::string> in1;
  for (const auto& [id, s] : p.relay_stripe)
    if (s == 1) in1.push_back(id);
  ASSERT_GE(in1.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    auto d = DemoteRelay(p, in1[i]);
    ASSERT_TRUE(d.ok());
    p = std::move(d).value();
  }
  auto promoted = PromoteRelay(p, in1[0]);
  ASSERT_TRUE(promoted.ok());
  ASSERT_TRUE(Validate(*promoted).ok()) << Validate(*promoted).ToString();
  EXPECT_EQ(promoted->relay_stripe.at(in1[0]), 1u);
}

TEST(Planner, AnIntraEdgeNeedsOneClusterAndTheSameBackendAtBothEnds) {
  auto with = [](Member m, std::string backend) {
    m.intra_backend = std::move(backend);
    return m;
  };
  const Member a = with(M("a", "eu", "c1", 10), "verbs");
  EXPECT_EQ(ChooseEdgeTransport(a, with(M("b", "eu", "c1", 10), "verbs")), EdgeTransport::kIntra);
  // The ends chose differently, or one fell back to TCP: the main transport.
  EXPECT_EQ(ChooseEdgeTransport(a, with(M("b", "eu", "c1", 10), "tcp")),
            EdgeTransport::kMainBackendsDiffer);
  EXPECT_EQ(ChooseEdgeTransport(with(M("b", "eu", "c1", 10), "ucx"), a),
            EdgeTransport::kMainBackendsDiffer);
  EXPECT_EQ(ChooseEdgeTransport(a, M("b", "eu", "c1", 10)), EdgeTransport::kMainNoIntra);
  EXPECT_EQ(ChooseEdgeTransport(M("b", "eu", "c1", 10), a), EdgeTransport::kMainNoIntra);
  // Leaving the cluster wins over everything, even with matching backends.
  EXPECT_EQ(ChooseEdgeTransport(a, with(M("b", "eu", "c2", 10), "verbs")),
            EdgeTransport::kMainAcrossClusters);
  EXPECT_EQ(ChooseEdgeTransport(a, with(M("b", "us", "c1", 10), "verbs")),
            EdgeTransport::kMainAcrossClusters);
  EXPECT_EQ(
      ChooseEdgeTransport(with(M("x", "eu", "", 10), "verbs"), with(M("y", "eu", "", 10), "verbs")),
      EdgeTransport::kMainAcrossClusters);  // no cluster: a cluster of its own
  EXPECT_STREQ(EdgeTransportName(EdgeTransport::kMainBackendsDiffer),
               "main (the ends run different intra-cluster backends)");
  // The name is bounded like an id.
  EXPECT_EQ(AddMember(*MakePlan(Root(), {}, PlanOptions{}),
                      with(M("b", "eu", "c1", 1), std::string(kMaxIdBytes + 1, 'v')))
                .status()
                .code(),
            Code::kInvalidArgument);
}

TEST(Planner, DemotingTheOnlyRootChildFreesTheRootSlot) {
  // root_fanout_max 1: the demoted relay held the root's only slot, which
  // one of its children must take (else nobody could be re-attached).
  PlanOptions o;
  o.fanout_max = 2;
  o.root_fanout_max = 1;
  auto plan = MakePlan(Root(), {M("a", "eu", "", 10), M("b", "eu", "", 5), M("c", "eu", "", 4)}, o);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->parent[0].at("a"), "root");
  auto demoted = DemoteRelay(*plan, "a");
  ASSERT_TRUE(demoted.ok()) << demoted.status().ToString();
  ASSERT_TRUE(Validate(*demoted).ok());
  EXPECT_EQ(demoted->parent[0].at("b"), "root");
  EXPECT_EQ(demoted->parent[0].at("c"), "b");
  EXPECT_EQ(demoted->parent[0].at("a"), "b");
}

// Relay-only members (tern-agent --relay-only) serve nothing, so no apply
// competes with forwarding on them: the planner makes them interior before
// serving members, slower or not, within the region and cluster rules.
Member RelayOnly(std::string id, std::string region, std::string cluster, double up_gbps) {
  Member m = M(std::move(id), std::move(region), std::move(cluster), up_gbps);
  m.relay_only = true;
  return m;
}

TEST(Planner, RelayOnlyMemberHeadsItsRegionWithinTheRegionRules) {
  auto members = ThreeRegions();
  // The slowest member of eu; without the flag eu-c1-2 (uplink 17) leads eu.
  members.push_back(RelayOnly("eu-c0-r", "eu", "c0", 1));
  auto plan = MakePlan(Root(), members, PlanOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_TRUE(Validate(*plan).ok()) << Validate(*plan).ToString();
  EXPECT_EQ(Children(*plan, 0, "root"),
            (std::vector<std::string>{"ap-c1-2", "eu-c0-r", "us-c1-2"}));
  EXPECT_EQ(Children(*plan, 0, "eu-c0-r").size(), PlanOptions{}.fanout_max);
  // The region rules hold: eu is entered once, and each cluster hangs
  // together (one same-region edge per region joins its two clusters).
  EXPECT_EQ(CrossRegionEdgesInto(*plan, 0, "eu"), 1);
  int cross_cluster = 0;
  for (const auto& [id, p] : plan->parent[0]) {
    if (p == "root") continue;
    if (Classify(plan->members.at(p), plan->members.at(id)) == Link::kSameRegion) ++cross_cluster;
  }
  EXPECT_EQ(cross_cluster, 3);
  // It may not relay: refused.
  Member bad = RelayOnly("x", "eu", "", 1);
  bad.may_relay = false;
  EXPECT_EQ(AddMember(*plan, bad).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(MakePlan(Root(), {bad}, PlanOptions{}).status().code(), Code::kInvalidArgument);
}

TEST(Planner, LaterJoinsPreferARelayOnlyParentAtTheSameDepth) {
  // The region head "a" serves; "r" (relay-only) and "b" (serving, faster,
  // and first by id) join below it and fill it (fan-out 2). Joins after
  // that find two slots at depth 2 and take r's, until it is full.
  PlanOptions o;
  o.fanout_max = 2;
  o.root_fanout_max = 1;
  for (bool relay_only : {true, false}) {
    SCOPED_TRACE(relay_only ? "r relay-only" : "r serving (control)");
    auto plan = MakePlan(Root(), {M("a", "eu", "", 10)}, o);
    ASSERT_TRUE(plan.ok());
    Member r = M("r", "eu", "", 1);
    r.relay_only = relay_only;
    for (const Member& m : {r, M("b", "eu", "", 5), M("c", "eu", "", 5), M("d", "eu", "", 5)}) {
      auto next = AddMember(*plan, m);
      ASSERT_TRUE(next.ok()) << next.status().ToString();
      ASSERT_EQ(Diff(*plan, *next).size(), 1u);  // still only the newcomer's edge
      plan = std::move(next);
    }
    ASSERT_TRUE(Validate(*plan).ok());
    EXPECT_EQ(Children(*plan, 0, "a"), (std::vector<std::string>{"b", "r"}));
    const std::vector<std::string> none, both{"c", "d"};
    EXPECT_EQ(Children(*plan, 0, "r"), relay_only ? both : none);
    EXPECT_EQ(Children(*plan, 0, "b"), relay_only ? none : both);
  }
}

TEST(Planner, ARelayOnlyOrphanTakesTheDepartedHeadsSlot) {
  PlanOptions o;
  o.fanout_max = 2;
  o.root_fanout_max = 1;
  // a heads eu; r (relay-only, slowest) and b below it.
  auto plan = MakePlan(Root(), {M("a", "eu", "", 10)}, o);
  ASSERT_TRUE(plan.ok());
  for (const Member& m : {RelayOnly("r", "eu", "", 1), M("b", "eu", "", 5)}) {
    plan = AddMember(*plan, m);
    ASSERT_TRUE(plan.ok());
  }
  auto headless = RemoveMember(*plan, "a");
  ASSERT_TRUE(headless.ok()) << headless.status().ToString();
  ASSERT_TRUE(Validate(*headless).ok());
  EXPECT_EQ(headless->parent[0].at("r"), "root");
  EXPECT_EQ(headless->parent[0].at("b"), "r");
  // Demoted, it is an ordinary leaf: the flag goes with may_relay.
  auto demoted = DemoteRelay(*headless, "r");
  ASSERT_TRUE(demoted.ok());
  ASSERT_TRUE(Validate(*demoted).ok());
  EXPECT_FALSE(demoted->members.at("r").relay_only);
  EXPECT_EQ(demoted->parent[0].at("b"), "root");
}

TEST(Planner, StripesHaveDisjointInteriors) {
  std::vector<Member> members;
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 12; ++i)
      members.push_back(M("r" + std::to_string(r) + "-" + std::to_string(i),
                          "region" + std::to_string(r), "", 1 + i));
  PlanOptions o;
  o.stripes = 2;
  auto plan = MakePlan(Root(), members, o);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_TRUE(Validate(*plan).ok()) << Validate(*plan).ToString();
  std::set<std::string> interior[2];
  for (uint32_t s = 0; s < 2; ++s)
    for (const auto& [id, p] : plan->parent[s])
      if (p != "root") interior[s].insert(p);
  for (const auto& id : interior[0]) EXPECT_FALSE(interior[1].count(id)) << id;
  EXPECT_FALSE(interior[0].empty());
  EXPECT_FALSE(interior[1].empty());
  // Each stripe still enters each region once.
  for (uint32_t s = 0; s < 2; ++s)
    for (int r = 0; r < 3; ++r) EXPECT_EQ(CrossRegionEdgesInto(*plan, s, "region" + std::to_string(r)), 1);
}

// Random joins and leaves keep every invariant, with 1 and 3 stripes.
TEST(Planner, ChurnKeepsEveryInvariant) {
  for (uint32_t stripes : {1u, 3u}) {
    std::mt19937 rng(42 + stripes);
    PlanOptions o;
    o.stripes = stripes;
    // Each stripe's relays hold everyone: a third of the relays need twice
    // the fan-out (tight bounds are RefusesBadInput's and
    // TooLittleFanOut's business).
    o.fanout_max = stripes == 1 ? 4 : 8;
    auto plan = MakePlan(Root(), ThreeRegions(), o);
    ASSERT_TRUE(plan.ok());
    int next_id = 0;
    for (int step = 0; step < 300; ++step) {
      const bool join = plan->members.size() < 8 || rng() % 3 != 0;
      Result<Plan> changed = Status(Code::kInternal, "unset");
      if (join) {
        const char* regions[] = {"us", "eu", "ap", "sa"};
        Member m = M("n" + std::to_string(next_id++), regions[rng() % 4],
                     "c" + std::to_string(rng() % 3), 1 + rng() % 20);
        m.may_relay = rng() % 5 != 0;
        changed = AddMember(*plan, m);
      } else {
        auto it = plan->members.begin();
        std::advance(it, rng() % plan->members.size());
        changed = RemoveMember(*plan, it->first);
      }
      ASSERT_TRUE(changed.ok()) << step << ": " << changed.status().ToString();
      ASSERT_TRUE(Validate(*changed).ok()) << step << ": " << Validate(*changed).ToString();
      plan = std::move(changed);
    }
  }
}

TEST(Planner, ValidateCatchesBrokenPlans) {
  auto plan = MakePlan(Root(), ThreeRegions(), PlanOptions{});
  ASSERT_TRUE(plan.ok());
  Plan cycle = *plan;
  const std::string a = "eu-c0-0", b = "eu-c0-1";
  cycle.parent[0][a] = b;
  cycle.parent[0][b] = a;
  EXPECT_EQ(Validate(cycle).code(), Code::kInternal);
  Plan leaf_parent = *plan;
  leaf_parent.members.at("eu-c0-1").may_relay = false;
  leaf_parent.relay_stripe.at("eu-c0-1") = Plan::kLeafEverywhere;
  leaf_parent.parent[0]["eu-c0-0"] = "eu-c0-1";
  EXPECT_EQ(Validate(leaf_parent).code(), Code::kInternal);
  Plan crowded = *plan;
  for (const auto& [id, m] : crowded.members) crowded.parent[0][id] = "root";
  EXPECT_EQ(Validate(crowded).code(), Code::kInternal);
  Plan missing = *plan;
  missing.parent[0].erase("ap-c0-0");
  EXPECT_EQ(Validate(missing).code(), Code::kInternal);
}

TEST(Planner, LargePlansStayValidAndShallow) {
  std::vector<Member> members;
  std::mt19937 rng(1);
  for (int i = 0; i < 20000; ++i)
    members.push_back(M("m" + std::to_string(i), "r" + std::to_string(i % 7),
                        "c" + std::to_string(i % 40), 1 + rng() % 100));
  PlanOptions o;
  o.fanout_max = 8;
  auto plan = MakePlan(Root(), members, o);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_TRUE(Validate(*plan).ok());
  auto d = EstimateDelivery(*plan, 1 << 20, 1 << 20, LinkModel{});
  EXPECT_LE(d.depth_max, 10u);
}

// The model against hand-computed figures: a chain root -> a -> b.
TEST(Estimate, ChainMatchesTheFormula) {
  Member root = M("root", "us", "", 8);  // 1 GB/s
  std::vector<Member> members = {M("a", "eu", "", 8), M("b", "eu", "", 4)};
  members[0].downlink_bytes_per_s = 1e9;
  members[1].downlink_bytes_per_s = 0.5e9;
  PlanOptions o;
  o.root_fanout_max = 1;
  auto plan = MakePlan(root, members, o);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->parent[0].at("b"), "a");
  LinkModel lm;
  lm.rtt_cross_region_s = 0.1;
  lm.rtt_same_region_s = 0.002;
  const uint64_t bytes = 100'000'000, chunk = 1'000'000;
  auto d = EstimateDelivery(*plan, bytes, chunk, lm);
  // a: 0.05 + 1e8/1e9 = 0.15 s; b starts at a's first chunk (0.05 + 1e-3)
  // and runs at 0.5 GB/s: 0.051 + 0.001 + 0.2 = 0.252 s.
  EXPECT_NEAR(d.last_byte_s, 0.252, 1e-9);
  EXPECT_EQ(d.last_member, "b");
  EXPECT_NEAR(d.first_chunk_s, 0.051 + 0.001 + 0.002, 1e-9);
  EXPECT_EQ(d.depth_max, 2u);
}

// A star divides the root's uplink; a tree pays a few chunk times per level.
TEST(Estimate, TreeBeatsStarWhenTheRootUplinkIsTheBottleneck) {
  std::vector<Member> members;
  for (int i = 0; i < 16; ++i) members.push_back(M("m" + std::to_string(i), "eu", "", 10));
  Member root = M("root", "us", "", 10);
  PlanOptions star;
  star.root_fanout_max = 16;
  star.fanout_max = 16;
  // Everyone in eu has room under the eu head, so force a star by making
  // them leaves.
  auto leaves = members;
  for (auto& m : leaves) m.may_relay = false;
  auto s = MakePlan(root, leaves, star);
  auto t = MakePlan(root, members, PlanOptions{});
  ASSERT_TRUE(s.ok() && t.ok());
  const uint64_t bytes = 1'000'000'000;
  auto ds = EstimateDelivery(*s, bytes, 4 << 20, LinkModel{});
  auto dt = EstimateDelivery(*t, bytes, 4 << 20, LinkModel{});
  EXPECT_GT(ds.last_byte_s, 3 * dt.last_byte_s) << ds.last_byte_s << " vs " << dt.last_byte_s;
}

}  // namespace
}  // namespace tern::topology
