// The simulator against hand-computed cases: one link and a chain are
// bytes/rate plus latency (and the pipeline's chunk times), a window-bound
// edge waits for its credits, a tree beats a star when the root's uplink is
// narrow, a failed relay costs exactly the recovery delay on the critical
// path, and the plans are the agent's own (Membership, MakePlan).
#include "bench/sim/sim.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "agent/membership/membership.h"
#include "bench/sim/sim_fluid.h"

namespace tern::sim {
namespace {

constexpr double kGbit = 1e9 / 8;
constexpr double kMiB = 1 << 20;

Costs IdealCosts() {
  Costs c;
  c.wan_efficiency = c.lan_efficiency = c.http_efficiency = 1.0;
  c.bits_per_change.points = {{0.001, 13.77}, {0.01, 9.93}, {0.05, 7.57}};
  c.format2_ratio = 0.72;
  c.view_bytes_per_param = {{"bf16", 2.0}, {"fp8", 1.03125}};
  for (int f = 0; f < 2; ++f) {
    c.apply_per_memcpy[f].points = {{0.01, 0.0}};
    c.encode_per_memcpy[f].points = {{0.01, 0.0}};
  }
  return c;
}

RegionSpec Region(const std::string& name, uint32_t islands, double gbit, double one_way_s) {
  RegionSpec r;
  r.name = name;
  r.islands = islands;
  r.clusters = std::max<uint32_t>(1, islands);  // every island its own cluster
  r.island_downlink_bytes_per_s = r.island_uplink_bytes_per_s = gbit * kGbit;
  r.one_way_s = one_way_s;
  return r;
}

Scenario Base(double patch_bytes) {
  Scenario s;
  s.params = 1e9;
  s.patch_bytes = patch_bytes;
  s.chunk_bytes = 1 << 20;
  s.window_chunks = 4096;
  s.push_window_bytes = uint64_t{1} << 40;  // every credit standing: no OFFER -> WANT
  return s;
}

RunResult MustRun(const Scenario& s, const Costs& c = IdealCosts()) {
  auto sim = Simulator::Create(s, c);
  EXPECT_TRUE(sim.ok()) << sim.status().ToString();
  auto r = (*sim)->Run();
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return *r;
}

// Root in region a (no islands), one island in b over a 1 Gbit/s link.
Scenario OneLink(double patch_bytes) {
  Scenario s = Base(patch_bytes);
  s.root_region = "a";
  s.root_uplink_bytes_per_s = 100 * kGbit;
  s.regions = {Region("a", 0, 100, 0), Region("b", 1, 100, 0)};
  s.links = {{"a", "b", 1 * kGbit, 0.05, 0}};
  return s;
}

TEST(Sim, OneLinkIsBytesOverRatePlusLatency) {
  const RunResult r = MustRun(OneLink(100e6));
  ASSERT_EQ(r.versions.size(), 1u);
  EXPECT_NEAR(r.versions[0].last_holding_s, 100e6 / (1 * kGbit) + 0.05, 1e-9);
  // The first chunk: one chunk over the link plus the latency.
  EXPECT_NEAR(r.versions[0].first_holding_s, kMiB / kGbit + 0.05, 1e-9);
  // The bound is the same here: one link, nothing else.
  EXPECT_NEAR(r.bound_s, r.versions[0].last_holding_s, 1e-9);
  EXPECT_EQ(r.versions[0].wan_bytes.at("a->b"), 100e6);
}

TEST(Sim, ChainIsPipelinedStoreAndForward) {
  // root -> 1 -> 2 -> 3 in one region: fan-out 1 makes a chain.
  Scenario s = Base(10 * kMiB);
  s.root_region = "a";
  s.root_uplink_bytes_per_s = 1 * kGbit;
  s.regions = {Region("a", 3, 1, 0.001)};
  s.plan.fanout_max = 1;
  s.plan.root_fanout_max = 1;
  Costs c = IdealCosts();
  c.relay_s_per_byte = 1e-9;  // verify before forwarding, per hop
  const RunResult r = MustRun(s, c);
  EXPECT_EQ(r.depth_max, 3u);
  const double chunk_s = kMiB / kGbit;
  // Last byte at the first hop, then one chunk (and its verify) and one
  // latency per further hop.
  const double expect = 10 * kMiB / kGbit + 3 * 0.001 + 2 * (chunk_s + kMiB * 1e-9);
  EXPECT_NEAR(r.versions[0].last_holding_s, expect, 1e-9);
  ASSERT_EQ(r.versions[0].critical_path.size(), 4u);  // root and three hops
  EXPECT_EQ(r.versions[0].critical_path[0].id, "root");
}

TEST(Sim, ARelaysCpuCapsWhatItForwards) {
  // root -> a -> b, fast links; a forwards at most relay_cores / (s per byte).
  Scenario s = Base(100 * kMiB);
  s.root_region = "a";
  s.root_uplink_bytes_per_s = 100 * kGbit;
  s.regions = {Region("a", 2, 100, 0)};
  s.plan.fanout_max = 1;
  s.plan.root_fanout_max = 1;
  Costs c = IdealCosts();
  c.relay_s_per_byte = 1e-9;  // 1 GB/s per core
  const double uncapped = MustRun(s, c).versions[0].last_holding_s;
  s.relay_cores = 0.5;  // 0.5 GB/s: the second hop takes 100 MiB / 0.5 GB/s
  const double capped = MustRun(s, c).versions[0].last_holding_s;
  EXPECT_LT(uncapped, 0.05);
  EXPECT_NEAR(capped, 100 * kMiB / 0.5e9 + kMiB / (100 * kGbit) + kMiB * 1e-9, 1e-6);
}

TEST(Sim, AWindowOfOneChunkWaitsARoundTripPerChunk) {
  Scenario s = OneLink(8 * kMiB);
  s.window_chunks = 1;
  s.push_window_bytes = 1 << 20;  // the first chunk is pushed
  const double c = kMiB / kGbit, L = 0.05;
  EXPECT_NEAR(MustRun(s).versions[0].last_holding_s, 8 * c + 15 * L, 1e-9);
  s.push_window_bytes = 0;  // OFFER -> WANT before the first chunk
  EXPECT_NEAR(MustRun(s).versions[0].last_holding_s, 8 * c + 17 * L, 1e-9);
}

TEST(Sim, ATreeBeatsAStarWhenTheRootUplinkIsNarrow) {
  Scenario s = Base(64 * kMiB);
  s.root_region = "a";
  s.root_uplink_bytes_per_s = 1 * kGbit;
  s.regions = {Region("a", 64, 10, 0.0005)};
  s.plan.fanout_max = 4;
  s.plan.root_fanout_max = 4;
  const RunResult tree = MustRun(s);
  const double tree_s = tree.versions[0].last_holding_s;
  // The star is baseline (d): every island pulls the patch over the root's
  // uplink, 64 copies (plus 2.5 round trips of connection and request).
  const double star_s = tree.store_pull.last_holding_s;
  EXPECT_NEAR(star_s, 64 * 64 * kMiB / kGbit + 5 * 0.0005, 1e-6);
  EXPECT_LT(tree_s * 8, star_s);
  EXPECT_GT(tree_s, 64 * kMiB / kGbit);  // no faster than one copy over the root's uplink
  // A fan-out of 64 is a star below one relay (rule 1: a member takes a
  // relay in its region before the root): the head's uplink sends 63 copies.
  s.plan.fanout_max = 64;
  s.plan.root_fanout_max = 64;
  const RunResult wide = MustRun(s);
  EXPECT_EQ(wide.depth_max, 2u);
  EXPECT_NEAR(wide.versions[0].last_holding_s, 63 * 64 * kMiB / (10 * kGbit), 0.02);
  EXPECT_LT(tree_s, wide.versions[0].last_holding_s);
}

TEST(Sim, WanBytesAreTheCrossRegionEdgesOfThePlan) {
  Scenario s = Base(64 * kMiB);
  s.root_region = "a";
  s.root_uplink_bytes_per_s = 10 * kGbit;
  s.regions = {Region("a", 0, 10, 0.0005), Region("b", 40, 10, 0.0005),
               Region("c", 40, 10, 0.0005)};
  s.links = {{"a", "b", 10 * kGbit, 0.04, 0},
             {"a", "c", 10 * kGbit, 0.07, 0},
             {"b", "c", 10 * kGbit, 0.09, 0}};
  for (const char* build : {"batch", "joins"}) {
    for (uint32_t stripes : {1u, 2u, 4u}) {
      s.plan.stripes = stripes;
      s.plan_build = build;
      auto sim = Simulator::Create(s, IdealCosts());
      ASSERT_TRUE(sim.ok());
      const topology::Plan& plan = (*sim)->plan();
      std::map<std::string, double> expect;
      for (uint32_t st = 0; st < stripes; ++st)
        for (const auto& [id, parent] : plan.parent[st]) {
          const std::string from = parent == "root" ? "a" : plan.members.at(parent).region;
          const std::string to = plan.members.at(id).region;
          if (from != to) expect[from + "->" + to] += 64 * kMiB / stripes;
        }
      auto r = (*sim)->Run();
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(r->versions[0].wan_bytes, expect) << build << " " << stripes;
      EXPECT_EQ(r->versions[0].islands, 80u);
      // MakePlan crosses into each region once per stripe: one patch per
      // region. (Incremental joins cross more often with stripes > 1: a
      // region's early joiners hang under the root in the stripes their
      // region has no relay for yet; docs/scale.md.)
      if (std::string(build) == "batch") {
        EXPECT_NEAR(expect.at("a->b"), 64 * kMiB, 1) << stripes;
        EXPECT_NEAR(expect.at("a->c"), 64 * kMiB, 1) << stripes;
      } else {
        EXPECT_GE(expect.at("a->b"), 64 * kMiB - 1) << stripes;
      }
    }
  }
}

TEST(Sim, ThePlanIsTheRootsOwn) {
  Scenario s = Base(kMiB);
  s.root_region = "a";
  s.root_uplink_bytes_per_s = 10 * kGbit;
  s.regions = {Region("a", 7, 10, 0.0005), Region("b", 9, 25, 0.0005)};
  s.regions[1].clusters = 3;
  s.links = {{"a", "b", 10 * kGbit, 0.04, 0}};
  s.plan.stripes = 2;
  auto sim = Simulator::Create(s, IdealCosts());
  ASSERT_TRUE(sim.ok());
  const topology::Plan& plan = (*sim)->plan();
  ASSERT_TRUE(topology::Validate(plan).ok());
  // The same joins fed to the agent's Membership give the same plan.
  agent::MemberInfo root;
  root.id = "root";
  root.region = "a";
  root.cluster = "root";
  root.data_address = "x";
  root.uplink_bytes_per_s = root.downlink_bytes_per_s = 10 * kGbit;
  agent::Membership mem(root, s.plan, 3000000);
  std::vector<topology::Member> all;
  char buf[32];
  for (uint32_t k = 0; k < 9; ++k) {
    for (const RegionSpec& r : s.regions) {
      if (k >= r.islands) continue;
      agent::MemberInfo m;
      std::snprintf(buf, sizeof buf, "/i%06u", k);
      m.id = r.name + buf;
      std::snprintf(buf, sizeof buf, "/c%04u", k % r.clusters);
      m.cluster = r.name + buf;
      m.region = r.name;
      m.data_address = "x";
      m.uplink_bytes_per_s = r.island_uplink_bytes_per_s;
      m.downlink_bytes_per_s = r.island_downlink_bytes_per_s;
      std::vector<std::string> notify;
      ASSERT_TRUE(mem.Join(m, 0, 0, &notify).ok());
      all.push_back(agent::ToTopologyMember(m));
    }
  }
  EXPECT_EQ(plan.parent, mem.plan().parent);
  // "batch" is topology::MakePlan over the same members.
  s.plan_build = "batch";
  auto batch = Simulator::Create(s, IdealCosts());
  ASSERT_TRUE(batch.ok());
  auto made = topology::MakePlan(agent::ToTopologyMember(root), all, s.plan);
  ASSERT_TRUE(made.ok());
  EXPECT_EQ((*batch)->plan().parent, made->parent);
}

// root -> a/i0 -> a/i1 -> a/i2: the middle relay fails while chunks flow.
Scenario FailingChain(double detect_s) {
  Scenario s = Base(100 * kMiB);
  s.root_region = "a";
  s.root_uplink_bytes_per_s = 1 * kGbit;
  s.regions = {Region("a", 3, 1, 0.001)};
  s.plan.fanout_max = 1;
  s.plan.root_fanout_max = 1;
  s.failures.detect_s = detect_s;
  s.failures.repair_s = 1000;
  s.versions = 2;
  s.version_interval_s = 60;
  return s;
}

TEST(Sim, AFailedRelaysChildrenResumeFromANewParentAfterTheRecovery) {
  const RunResult clean = MustRun(FailingChain(1.0));
  Scenario s = FailingChain(1.0);
  s.failures.at = {{0.3, "a/i000000"}};  // the root's child, mid-transfer (the whole takes ~0.84 s)
  const RunResult one = MustRun(s);
  s.failures.detect_s = 2.0;
  const RunResult two = MustRun(s);
  ASSERT_EQ(one.versions.size(), 2u);
  const VersionResult& v = one.versions[0];
  EXPECT_EQ(v.failed, 1u);
  EXPECT_EQ(v.replans, 1u);
  EXPECT_EQ(v.islands, 2u);  // the failed island is not counted
  EXPECT_GT(v.last_holding_s, clean.versions[0].last_holding_s + 1.0);
  // The recovery delay is on the critical path, second for second.
  EXPECT_NEAR(two.versions[0].last_holding_s - v.last_holding_s, 1.0, 1e-9);
  // The orphan resumed: it did not fetch again what it held (the bytes
  // after the failure are less than a whole patch at the link's rate).
  EXPECT_LT(v.last_holding_s, 0.3 + 1.0 + 100 * kMiB / kGbit + 0.1);
  // The next version flows through the re-planned chain: two islands.
  EXPECT_EQ(one.versions[1].islands, 2u);
  EXPECT_EQ(one.versions[1].failed, 0u);
  // No failure: the same as the run without the option.
  Scenario none = FailingChain(1.0);
  none.failures.relay_failures_per_hour = 0;
  EXPECT_EQ(MustRun(none).versions[0].last_holding_s, clean.versions[0].last_holding_s);
}

TEST(Sim, RandomFailuresAreSeededAndCounted) {
  Scenario s = FailingChain(3.0);
  s.regions[0].islands = 30;
  s.regions[0].clusters = 30;
  s.plan.fanout_max = 2;
  s.plan.root_fanout_max = 2;
  s.versions = 200;
  s.version_interval_s = 10;
  s.failures.relay_failures_per_hour = 20;  // ~0.17 per second over the fleet
  s.failures.repair_s = 30;
  const RunResult a = MustRun(s), b = MustRun(s);
  uint32_t failed = 0;
  for (size_t i = 0; i < a.versions.size(); ++i) {
    EXPECT_EQ(a.versions[i].last_holding_s, b.versions[i].last_holding_s);
    failed += a.versions[i].failed;
  }
  EXPECT_GT(failed, 0u);
}

TEST(Sim, MathisAndTheLossBoundEdge) {
  EXPECT_NEAR(MathisBytesPerS(1448, 0.1, 1e-4, 1.22), 1448 / 0.1 * 1.22 / 0.01, 1e-6);
  EXPECT_TRUE(std::isinf(MathisBytesPerS(1448, 0.1, 0, 1.22)));
  Scenario s = OneLink(100e6);
  s.links[0].loss = 1e-4;
  s.congestion = "cubic";
  s.streams = 4;
  const double rate = 4 * MathisBytesPerS(1448, 0.1, 1e-4, 1.22);
  EXPECT_NEAR(MustRun(s).versions[0].last_holding_s, 100e6 / rate + 0.05, 1e-6);
  s.congestion = "bbr";  // not loss-bound: the link's rate
  EXPECT_NEAR(MustRun(s).versions[0].last_holding_s, 100e6 / kGbit + 0.05, 1e-9);
}

TEST(Sim, PatchBytesFollowTheMeasuredBitsPerChange) {
  const Costs c = IdealCosts();
  Scenario s;
  s.params = 1e9;
  s.format = "bf16";
  s.changed_fraction = 0.01;
  s.patch_format = 1;
  EXPECT_NEAR(*PatchBytes(s, c), 1e9 * 0.01 * 9.93 / 8, 1);
  s.patch_format = 2;
  EXPECT_NEAR(*PatchBytes(s, c), 1e9 * 0.01 * 9.93 * 0.72 / 8, 1);
  EXPECT_NEAR(c.bits_per_change.At(std::sqrt(0.001 * 0.01)), (13.77 + 9.93) / 2, 1e-9);
  EXPECT_EQ(c.bits_per_change.At(1e-6), 13.77);  // clamped
  s.format = "int3";
  EXPECT_FALSE(PatchBytes(s, c).ok());
  Scenario fp8;
  fp8.params = 1e12;
  fp8.format = "fp8";
  EXPECT_NEAR(*ViewBytes(fp8, c), 1.03125e12, 1);
}

TEST(Sim, FluidSharesTheSourceMaxMin) {
  // Two classes of 10 flows, 100 bytes each, source 100 B/s; class 0 capped
  // at 2 B/s per flow: class 1 gets 80 B/s until it ends at 12.5 s, then
  // class 0 keeps 2 B/s per flow: it ends at 50 s.
  std::vector<FluidClass> c(2);
  c[0] = {10, 100, 2, std::numeric_limits<double>::infinity(), 0};
  c[1] = {10, 100, 1e9, std::numeric_limits<double>::infinity(), 0.5};
  EXPECT_NEAR(FluidLastFinish(c, 100), 50, 1e-9);
  c[0].per_flow_cap_bytes_per_s = 1e9;  // equal shares: 5 B/s each, 20 s, plus class 1's latency
  EXPECT_NEAR(FluidLastFinish(c, 100), 20.5, 1e-9);
}

TEST(Sim, AppliesShareTheirCoresByProcessorSharing) {
  auto job = [](double r0, double w0, double r1, double w1) { return ApplyJob{r0, w0, r1, w1}; };
  // Own cores: phase 1 starts at the later of its release and phase 0's end.
  auto own = ApplyFinishTimes({job(0, 1, 2, 1), job(0, 3, 1, 1), job(0, 0, 0.5, 0)}, 1, 0);
  EXPECT_DOUBLE_EQ(own[0], 3);    // phase 0 done at 1, phase 1 from 2
  EXPECT_DOUBLE_EQ(own[1], 4);    // phase 0 outlasts the last byte
  EXPECT_DOUBLE_EQ(own[2], 0.5);  // no work: serving at the last byte
  // Three jobs on 2 shared cores, each allowed 2: 2/3 of a core each.
  auto three = ApplyFinishTimes({job(0, 0, 0, 1), job(0, 0, 0, 1), job(0, 0, 0, 1)}, 2, 2);
  for (double f : three) EXPECT_NEAR(f, 1.5, 1e-12);
  // Staggered: A alone at 2 cores until B comes at 0.5 (1 core-s left),
  // then one core each: A done at 1.5, B (1 core-s left) alone at 2 cores.
  auto staggered = ApplyFinishTimes({job(0, 0, 0, 2), job(0, 0, 0.5, 2)}, 2, 2);
  EXPECT_NEAR(staggered[0], 1.5, 1e-12);
  EXPECT_NEAR(staggered[1], 2.0, 1e-12);
  // A job that is not released holds no core: B runs alone meanwhile.
  auto apart = ApplyFinishTimes({job(0, 0, 5, 1), job(0, 0, 0, 2)}, 2, 2);
  EXPECT_NEAR(apart[0], 5.5, 1e-12);
  EXPECT_NEAR(apart[1], 1.0, 1e-12);
  // Large works end exactly when they should (no rounding residue left
  // for extra rounds): A alone, then both at one core, B alone, A's phase
  // 1 beside B, B alone, B's phase 1 of no work at its release.
  auto big = ApplyFinishTimes({job(0, 1e6, 1e6, 1e6), job(0.1, 3e6, 5e6, 0)}, 2, 2);
  EXPECT_NEAR(big[0], 2e6, 1e-3);
  EXPECT_NEAR(big[1], 5e6, 1e-3);
}

TEST(Sim, ServingCountsTheApplyLeftAfterTheLastByte) {
  // One island; a 1 GB view (0.5e9 params of BF16) whose apply costs one
  // memcpy at 1 GB/s on one core: 1 core-second.
  Costs c = IdealCosts();
  c.apply_per_memcpy[1].points = {{0.01, 1.0}};
  c.memcpy_bytes_per_s = 1e9;
  c.stream_apply_tail = 0.4;
  Scenario s = OneLink(100e6);  // 0.85 s on the link, 1 MiB chunks
  s.params = 0.5e9;
  s.format = "bf16";
  s.patch_format = 2;
  s.apply_cores = 1;
  RunResult r = MustRun(s, c);
  const VersionResult& v = r.versions[0];
  EXPECT_NEAR(r.apply_s, 1.0, 1e-9);
  // Streamed: 0.6 core-s while the chunks arrive (done before the last
  // byte), 0.4 after it.
  EXPECT_NEAR(v.last_serving_s, v.last_holding_s + 0.4, 1e-9);
  s.stream_apply = false;  // --no-stream-apply: the whole apply after it
  EXPECT_NEAR(MustRun(s, c).versions[0].last_serving_s, v.last_holding_s + 1.0, 1e-9);
  // A patch of one chunk is applied whole after its last byte.
  s.stream_apply = true;
  s.patch_bytes = 1e5;
  const VersionResult one = MustRun(s, c).versions[0];
  EXPECT_NEAR(one.last_serving_s, one.last_holding_s + 1.0, 1e-9);
  // The root offers offer_delay_s after ready: every time moves by it.
  c.offer_delay_s = 0.007;
  const VersionResult later = MustRun(s, c).versions[0];
  EXPECT_NEAR(later.last_holding_s, one.last_holding_s + 0.007, 1e-9);
  EXPECT_NEAR(later.last_serving_s, one.last_serving_s + 0.007, 1e-9);
}

TEST(Sim, BadInputsAreRefused) {
  EXPECT_FALSE(ParseScenario("[]").ok());
  EXPECT_FALSE(ParseScenario(R"({"topology": {"root_region": "x", "root_uplink_gbit_s": 1,
      "regions": [{"name": "a", "islands": 1, "island_downlink_gbit_s": 1}]}})")
                   .ok());
  EXPECT_FALSE(ParseScenario(R"({"topology": {"root_region": "a", "root_uplink_gbit_s": 1,
      "regions": [{"name": "a", "islands": 1, "island_downlink_gbit_s": "fast"}]}})")
                   .ok());
  auto ok = ParseScenario(R"({"topology": {"root_region": "a", "root_uplink_gbit_s": 8,
      "regions": [{"name": "a", "islands": 2, "island_downlink_gbit_s": 8}]},
      "plan": {"fanout_max": 2}, "failures": {"at": [{"t_s": 1, "island": "a/i000001"}]}})");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->root_uplink_bytes_per_s, 1e9);
  EXPECT_EQ(ok->plan.fanout_max, 2u);
  EXPECT_EQ(ok->failures.at.size(), 1u);
  EXPECT_TRUE(ok->stream_apply);
  EXPECT_EQ(ok->shared_apply_cores, 0);
  auto shared = ParseScenario(R"({"topology": {"root_region": "a", "root_uplink_gbit_s": 8,
      "regions": [{"name": "a", "islands": 2, "island_downlink_gbit_s": 8}]},
      "hosts": {"apply_cores": 2, "shared_apply_cores": 2, "stream_apply": false}})");
  ASSERT_TRUE(shared.ok()) << shared.status().ToString();
  EXPECT_EQ(shared->shared_apply_cores, 2);
  EXPECT_FALSE(shared->stream_apply);
  EXPECT_FALSE(ParseScenario(R"({"topology": {"root_region": "a", "root_uplink_gbit_s": 8,
      "regions": [{"name": "a", "islands": 2, "island_downlink_gbit_s": 8}]},
      "hosts": {"stream_apply": "yes"}})")
                   .ok());
  // A region pair without a link cannot be planned over.
  Scenario s = OneLink(1e6);
  s.links.clear();
  EXPECT_FALSE(Simulator::Create(s, IdealCosts()).ok());
}

}  // namespace
}  // namespace tern::sim
