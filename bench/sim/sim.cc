#include "bench/sim/sim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "agent/board/publish.h"
#include "agent/membership/membership.h"
#include "bench/sim/sim_fluid.h"

namespace tern::sim {

double MathisBytesPerS(double mss_bytes, double rtt_s, double loss, double c) {
  if (loss <= 0 || rtt_s <= 0) return std::numeric_limits<double>::infinity();
  return mss_bytes / rtt_s * c / std::sqrt(loss);
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
const char kRootId[] = "root";

struct Island {
  uint32_t region = 0;
  agent::MemberInfo info;
};

// Per node and stripe, what a pass leaves behind.
struct NodeStripe {
  double first_s = kInf, last_s = kInf;
  double rate_bytes_per_s = 0;
  uint32_t held = 0;       // chunks held at the end of the pass (at the next failure)
  bool untouched = false;  // held every chunk when the pass began (its figures are older)
};

}  // namespace

struct Simulator::Impl {
  Scenario sc;
  Costs costs;
  std::unique_ptr<agent::Membership> membership;
  std::map<std::string, Island> islands;  // every island, up or down
  std::vector<std::string> island_ids;    // join order
  std::map<std::string, uint32_t> region_index;
  // Per ordered region pair: the WAN link (index into sc.links, -1: none).
  std::vector<std::vector<int>> link_of;

  const RegionSpec& RegionOf(const std::string& id) const {
    return id == kRootId ? sc.regions[region_index.at(sc.root_region)]
                         : sc.regions[islands.at(id).region];
  }
  uint32_t RegionIdx(const std::string& id) const {
    return id == kRootId ? region_index.at(sc.root_region) : islands.at(id).region;
  }

  // "joins": the root's Membership (Join -> topology::AddMember, one island
  // at a time, as the agent plans); "batch": topology::MakePlan over the
  // whole fleet at once, then the same AddMember/RemoveMember for changes
  // (each join copies the plan, so joins cost O(n^2) for n islands).
  bool batch = false;
  topology::Plan batch_plan;
  const topology::Plan& plan() const { return batch ? batch_plan : membership->plan(); }
  Status Join(const std::string& id) {
    if (batch) {
      TERN_ASSIGN_OR_RETURN(
          batch_plan,
          topology::AddMember(batch_plan, agent::ToTopologyMember(islands.at(id).info)));
      return Status::Ok();
    }
    std::vector<std::string> notify;
    return membership->Join(islands.at(id).info, 0, 0, &notify);
  }
  void Leave(const std::string& id) {
    if (batch) {
      if (auto next = topology::RemoveMember(batch_plan, id); next.ok())
        batch_plan = std::move(next).value();
      return;
    }
    std::vector<std::string> notify;
    membership->Leave(id, &notify);
  }

  // One-way latency and the rate of the edge parent -> child in a plan with
  // `children_of` children per parent (all stripes) and `pair_flows`
  // edges per ordered region pair, `ingress_flows` WAN edges into a region.
  struct Edge {
    double one_way_s = 0, rate_bytes_per_s = 0;
    bool wan = false;
    uint32_t from_region = 0, to_region = 0;
  };
  Edge EdgeOf(const topology::Plan& plan, const std::string& parent, const std::string& child,
              const std::unordered_map<std::string, uint32_t>& children_of,
              const std::vector<std::vector<uint32_t>>& pair_flows,
              const std::vector<uint32_t>& ingress_flows) const {
    Edge e;
    e.from_region = RegionIdx(parent);
    e.to_region = RegionIdx(child);
    const topology::Member& pm = parent == kRootId ? plan.root : plan.members.at(parent);
    const topology::Member& cm = plan.members.at(child);
    const double stripes = plan.options.stripes;
    double share = std::min(pm.uplink_bytes_per_s / std::max<uint32_t>(1, children_of.at(parent)),
                            cm.downlink_bytes_per_s / stripes);
    double per_stream = kInf;
    const RegionSpec& cr = sc.regions[e.to_region];
    if (e.from_region != e.to_region) {
      const WanLinkSpec& l = sc.links[link_of[e.from_region][e.to_region]];
      e.wan = true;
      e.one_way_s = l.one_way_s;
      share = std::min(share, l.rate_bytes_per_s / pair_flows[e.from_region][e.to_region]);
      if (cr.ingress_bytes_per_s > 0)
        share = std::min(share, cr.ingress_bytes_per_s / ingress_flows[e.to_region]);
      share *= costs.wan_efficiency;
      if (sc.congestion == "cubic")
        per_stream = MathisBytesPerS(costs.mss_bytes, 2 * l.one_way_s, l.loss, costs.mathis_c);
    } else {
      e.one_way_s =
          !pm.cluster.empty() && pm.cluster == cm.cluster ? cr.cluster_one_way_s : cr.one_way_s;
      share *= costs.lan_efficiency;
      if (sc.congestion == "cubic")
        per_stream = MathisBytesPerS(costs.mss_bytes, 2 * e.one_way_s, cr.lan_loss, costs.mathis_c);
    }
    if (costs.per_flow_cap_bytes_per_s > 0)
      per_stream = std::min(per_stream, costs.per_flow_cap_bytes_per_s);
    e.rate_bytes_per_s = std::min(share, per_stream * sc.streams);
    if (parent != kRootId && sc.relay_cores > 0 && costs.relay_s_per_byte > 0) {
      const double cpu =
          sc.relay_cores / costs.relay_s_per_byte / std::max<uint32_t>(1, children_of.at(parent));
      e.rate_bytes_per_s = std::min(e.rate_bytes_per_s, cpu);
    }
    return e;
  }

  // One pass of a version over one plan: every chunk not yet held flows from
  // t_restart on; edges in new_edges (re-attached orphans) start only after
  // the recovery delay. held: chunks each node held when the pass starts.
  struct PassOut {
    std::unordered_map<std::string, std::vector<NodeStripe>> nodes;
    std::map<std::string, double> wan_bytes;
  };
  PassOut Pass(const topology::Plan& plan, double patch_bytes, double t_restart, double t_next,
               const std::unordered_map<std::string, std::vector<uint32_t>>& held,
               const std::set<std::pair<uint32_t, std::string>>& new_edges,
               double recovery_s) const {
    const uint32_t S = plan.options.stripes;
    std::unordered_map<std::string, uint32_t> children_of;
    children_of[kRootId] = 0;
    for (const auto& [id, m] : plan.members) children_of[id] = 0;
    const size_t R = sc.regions.size();
    std::vector<std::vector<uint32_t>> pair_flows(R, std::vector<uint32_t>(R, 0));
    std::vector<uint32_t> ingress_flows(R, 0);
    std::vector<std::unordered_map<std::string, std::vector<std::string>>> kids(S);
    for (uint32_t s = 0; s < S; ++s) {
      for (const auto& [id, parent] : plan.parent[s]) {
        ++children_of[parent];
        kids[s][parent].push_back(id);
        const uint32_t a = RegionIdx(parent), b = RegionIdx(id);
        if (a != b) ++pair_flows[a][b], ++ingress_flows[b];
      }
    }
    PassOut out;
    for (const auto& [id, m] : plan.members) out.nodes[id].resize(S);
    for (uint32_t s = 0; s < S; ++s) {
      // Stripe s carries bytes [s*B/S, (s+1)*B/S).
      const double stripe_bytes = patch_bytes / S;
      const uint64_t chunk = ChunkBytes(patch_bytes);
      const uint64_t n =
          std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(stripe_bytes / chunk)));
      const double last_chunk = stripe_bytes - static_cast<double>(n - 1) * chunk;
      auto size_of = [&](uint64_t i) {
        return i + 1 == n ? last_chunk : static_cast<double>(chunk);
      };
      // Chunks that fit the push window go without the OFFER -> WANT round trip.
      const uint64_t push_chunks = sc.push_window_bytes / chunk;
      std::vector<double> root_arrivals(n, 0.0);
      // Depth-first: a node's arrivals live while its subtree is visited.
      std::function<void(const std::string&, const std::vector<double>&)> visit =
          [&](const std::string& parent, const std::vector<double>& ap) {
            auto it = kids[s].find(parent);
            if (it == kids[s].end()) return;
            const bool parent_is_root = parent == kRootId;
            for (const std::string& child : it->second) {
              const Edge e = EdgeOf(plan, parent, child, children_of, pair_flows, ingress_flows);
              uint32_t k = 0;
              if (auto h = held.find(child); h != held.end()) k = h->second[s];
              const bool fresh = new_edges.count({s, child}) != 0;
              const double edge_start = t_restart + (fresh ? recovery_s + 4 * e.one_way_s : 0);
              std::vector<double> ac(n, t_restart);
              double prev_end = edge_start, t_offer = edge_start;
              if (k < n)
                t_offer = std::max(
                    edge_start, ap[k] + (parent_is_root ? 0 : size_of(k) * costs.relay_s_per_byte));
              double wan_sent = 0;
              for (uint64_t i = k; i < n; ++i) {
                const double sz = size_of(i);
                const double ready =
                    ap[i] +
                    (parent_is_root ? 0 : sz * costs.relay_s_per_byte + costs.hop_s_per_chunk);
                double credit;
                if (i < k + sc.window_chunks) {
                  // A new object (or a new parent) starts with OFFER -> WANT
                  // past the push window; an edge that carried on through a
                  // re-plan keeps the credits it had.
                  const bool standing = i - k < push_chunks || (k > 0 && !fresh);
                  credit = standing ? t_offer : t_offer + 2 * e.one_way_s;
                } else {
                  credit = ac[i - sc.window_chunks] + e.one_way_s;  // the credit comes back
                }
                const double start = std::max({ready, prev_end, credit});
                prev_end = start + sz / e.rate_bytes_per_s;
                ac[i] = prev_end + e.one_way_s;
                if (e.wan && start < t_next) wan_sent += sz;
              }
              NodeStripe& ns = out.nodes[child][s];
              ns.untouched = k >= n;
              ns.first_s = ac[0];
              ns.last_s = ac[n - 1];
              ns.rate_bytes_per_s = e.rate_bytes_per_s;
              ns.held = static_cast<uint32_t>(std::upper_bound(ac.begin(), ac.end(), t_next) -
                                              ac.begin());
              if (e.wan) {
                out.wan_bytes[sc.regions[e.from_region].name + "->" +
                              sc.regions[e.to_region].name] += wan_sent;
              }
              visit(child, ac);
            }
          };
      visit(kRootId, root_arrivals);
    }
    return out;
  }

  // The root's chunking: the scenario's, or what the agent publishes with
  // (agent::DefaultChunkBytes).
  uint64_t ChunkBytes(double object_bytes) const {
    return sc.chunk_bytes ? sc.chunk_bytes
                          : agent::DefaultChunkBytes(static_cast<uint64_t>(object_bytes));
  }

  double Memcpy() const {
    return sc.memcpy_bytes_per_s > 0 ? sc.memcpy_bytes_per_s : costs.memcpy_bytes_per_s;
  }
  double ApplySeconds(double view_bytes) const {
    return view_bytes * costs.apply_per_memcpy[sc.patch_format - 1].At(sc.changed_fraction) /
           Memcpy() / sc.apply_cores;
  }

  void Baselines(double view_bytes, double patch_bytes, double apply_s, RunResult* r) const {
    const uint32_t root = region_index.at(sc.root_region);
    auto run = [&](double bytes, double egress, double eff, uint32_t streams, BaselineResult* out) {
      std::vector<FluidClass> classes;
      for (uint32_t i = 0; i < sc.regions.size(); ++i) {
        const RegionSpec& rg = sc.regions[i];
        if (rg.islands == 0) continue;
        FluidClass c;
        c.flows = rg.islands;
        c.bytes_per_flow = bytes;
        double one_way = rg.one_way_s, loss = rg.lan_loss;
        c.shared_cap_bytes_per_s = kInf;
        if (i != root) {
          const WanLinkSpec& l = sc.links[link_of[root][i]];
          one_way += l.one_way_s;
          loss = l.loss;
          c.shared_cap_bytes_per_s = l.rate_bytes_per_s * eff;
          if (rg.ingress_bytes_per_s > 0)
            c.shared_cap_bytes_per_s =
                std::min(c.shared_cap_bytes_per_s, rg.ingress_bytes_per_s * eff);
          out->wan_bytes[sc.regions[root].name + "->" + rg.name] = bytes * rg.islands;
        }
        double per_stream = kInf;
        if (sc.congestion == "cubic")
          per_stream = MathisBytesPerS(costs.mss_bytes, 2 * one_way, loss, costs.mathis_c);
        if (costs.per_flow_cap_bytes_per_s > 0)
          per_stream = std::min(per_stream, costs.per_flow_cap_bytes_per_s);
        c.per_flow_cap_bytes_per_s =
            std::min(rg.island_downlink_bytes_per_s * eff, per_stream * streams);
        // Connect, TLS and the request: 2.5 round trips before the first byte lands.
        c.latency_s = 5 * one_way;
        classes.push_back(c);
      }
      out->last_holding_s = FluidLastFinish(classes, egress * eff);
    };
    const double store =
        sc.store_egress_bytes_per_s > 0 ? sc.store_egress_bytes_per_s : sc.root_uplink_bytes_per_s;
    run(view_bytes, sc.root_uplink_bytes_per_s, costs.http_efficiency, sc.baseline_http_streams,
        &r->full_star);
    r->full_star.last_serving_s =
        r->full_star.last_holding_s;  // a reload, no apply (its load is not modelled)
    run(patch_bytes, store, costs.wan_efficiency, sc.streams, &r->store_pull);
    r->store_pull.last_serving_s = r->store_pull.last_holding_s + apply_s;
  }

  void Bound(double patch_bytes, RunResult* r) const {
    const uint32_t root = region_index.at(sc.root_region);
    double rate = sc.root_uplink_bytes_per_s;
    std::string narrowest = "root uplink";
    double far = 0;
    for (uint32_t i = 0; i < sc.regions.size(); ++i) {
      const RegionSpec& rg = sc.regions[i];
      if (rg.islands == 0) continue;
      double one_way = rg.one_way_s;
      if (i != root) {
        const WanLinkSpec& l = sc.links[link_of[root][i]];
        const double ingress =
            rg.ingress_bytes_per_s > 0 ? rg.ingress_bytes_per_s : l.rate_bytes_per_s;
        if (ingress < rate) rate = ingress, narrowest = rg.name + " ingress";
        one_way += l.one_way_s;
      }
      if (rg.island_downlink_bytes_per_s < rate)
        rate = rg.island_downlink_bytes_per_s, narrowest = rg.name + " island downlink";
      far = std::max(far, one_way);
    }
    r->bound_rate_bytes_per_s = rate;
    r->bound_narrowest = narrowest;
    r->farthest_one_way_s = far;
    r->bound_s = patch_bytes / rate + far;
  }
};

Simulator::Simulator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Simulator::~Simulator() = default;
const topology::Plan& Simulator::plan() const { return impl_->plan(); }

Result<std::unique_ptr<Simulator>> Simulator::Create(const Scenario& scenario, const Costs& costs) {
  auto impl = std::make_unique<Impl>();
  impl->sc = scenario;
  impl->costs = costs;
  const Scenario& sc = impl->sc;
  for (uint32_t i = 0; i < sc.regions.size(); ++i) impl->region_index[sc.regions[i].name] = i;
  const size_t R = sc.regions.size();
  impl->link_of.assign(R, std::vector<int>(R, -1));
  for (size_t l = 0; l < sc.links.size(); ++l) {
    const uint32_t a = impl->region_index.at(sc.links[l].a),
                   b = impl->region_index.at(sc.links[l].b);
    impl->link_of[a][b] = impl->link_of[b][a] = static_cast<int>(l);
  }
  // Any two regions that hold islands (or the root) may be joined by an edge.
  auto used = [&](uint32_t i) {
    return sc.regions[i].islands > 0 || sc.regions[i].name == sc.root_region;
  };
  for (uint32_t a = 0; a < R; ++a)
    for (uint32_t b = 0; b < R; ++b)
      TERN_REQUIRE(a == b || !used(a) || !used(b) || impl->link_of[a][b] >= 0, kInvalidArgument,
                   "no WAN link between regions ", sc.regions[a].name, " and ", sc.regions[b].name);

  agent::MemberInfo root;
  root.id = kRootId;
  root.region = sc.root_region;
  root.cluster = "root";
  root.data_address = "sim:root";
  root.uplink_bytes_per_s = sc.root_uplink_bytes_per_s;
  root.downlink_bytes_per_s = sc.root_uplink_bytes_per_s;
  impl->membership = std::make_unique<agent::Membership>(
      root, sc.plan, static_cast<uint64_t>(sc.failures.detect_s * 1e6));
  impl->batch = sc.plan_build == "batch";
  std::vector<topology::Member> all;

  // Regions interleaved: the k-th island of every region, then the next.
  uint32_t most = 0;
  for (const RegionSpec& r : sc.regions) most = std::max(most, r.islands);
  char buf[64];
  for (uint32_t k = 0; k < most; ++k) {
    for (uint32_t ri = 0; ri < R; ++ri) {
      const RegionSpec& r = sc.regions[ri];
      if (k >= r.islands) continue;
      Island is;
      is.region = ri;
      std::snprintf(buf, sizeof buf, "/c%04u", k % r.clusters);
      is.info.cluster = r.name + buf;
      std::snprintf(buf, sizeof buf, "/i%06u", k);
      is.info.id = r.name + buf;
      is.info.region = r.name;
      is.info.island = is.info.id;
      is.info.data_address = "sim:" + is.info.id;
      is.info.uplink_bytes_per_s = r.island_uplink_bytes_per_s;
      is.info.downlink_bytes_per_s = r.island_downlink_bytes_per_s;
      const std::string id = is.info.id;
      impl->islands.emplace(id, std::move(is));
      impl->island_ids.push_back(id);
      if (impl->batch) {
        all.push_back(agent::ToTopologyMember(impl->islands.at(id).info));
      } else {
        TERN_RETURN_IF_ERROR(impl->Join(id));
      }
    }
  }
  if (impl->batch) {
    TERN_ASSIGN_OR_RETURN(impl->batch_plan,
                          topology::MakePlan(agent::ToTopologyMember(root), all, sc.plan));
  }
  return std::unique_ptr<Simulator>(new Simulator(std::move(impl)));
}

Result<RunResult> Simulator::Run() {
  Impl& m = *impl_;
  const Scenario& sc = m.sc;
  RunResult r;
  TERN_ASSIGN_OR_RETURN(r.view_bytes, ViewBytes(sc, m.costs));
  TERN_ASSIGN_OR_RETURN(r.patch_bytes, PatchBytes(sc, m.costs));
  r.apply_s = m.ApplySeconds(r.view_bytes);
  // One island's apply in core-seconds, and the share of it left after the
  // last byte (apply while receiving engages on a patch of several chunks).
  const double apply_core_s = r.apply_s * sc.apply_cores;
  const bool streamed =
      sc.stream_apply && r.patch_bytes > static_cast<double>(m.ChunkBytes(r.patch_bytes));
  const double apply_tail = streamed ? m.costs.stream_apply_tail : 1.0;
  r.encode_s = r.view_bytes *
               m.costs.encode_per_memcpy[sc.patch_format - 1].At(sc.changed_fraction) / m.Memcpy() /
               sc.encode_cores;
  r.stripes = sc.plan.stripes;
  m.Bound(r.patch_bytes, &r);
  m.Baselines(r.view_bytes, r.patch_bytes, r.apply_s, &r);
  {
    const topology::Plan& p = m.plan();
    TERN_RETURN_IF_ERROR(topology::Validate(p));
    r.members = static_cast<uint32_t>(p.members.size());
    std::set<std::string> relays;
    for (uint32_t s = 0; s < p.options.stripes; ++s)
      for (const auto& [id, parent] : p.parent[s])
        if (parent != kRootId) relays.insert(parent);
    r.relays = static_cast<uint32_t>(relays.size());
    double cross = 0, region = 0;
    for (const WanLinkSpec& l : sc.links) cross = std::max(cross, 2 * l.one_way_s);
    for (const RegionSpec& rg : sc.regions) region = std::max(region, 2 * rg.one_way_s);
    topology::LinkModel lm;
    lm.rtt_cross_region_s = cross;
    lm.rtt_same_region_s = region;
    lm.rtt_same_cluster_s = 2 * sc.regions[0].cluster_one_way_s;
    const topology::Delivery d = topology::EstimateDelivery(p, static_cast<uint64_t>(r.patch_bytes),
                                                            m.ChunkBytes(r.patch_bytes), lm);
    r.planner_estimate_s = d.last_byte_s;
    r.depth_max = d.depth_max;
  }

  // Failures: a Poisson process over all islands (thinned: one that is down
  // when drawn does not fail again), each failed island back after repair_s.
  struct Event {
    double t;
    bool repair;
    std::string id;
    bool operator<(const Event& o) const {
      return std::tie(t, repair, id) < std::tie(o.t, o.repair, o.id);
    }
  };
  std::multiset<Event> events;
  const double horizon = sc.versions * sc.version_interval_s;
  if (sc.failures.relay_failures_per_hour > 0 && !m.island_ids.empty()) {
    std::mt19937_64 rng(sc.failures.seed);
    const double lambda = m.island_ids.size() * sc.failures.relay_failures_per_hour / 3600;
    std::exponential_distribution<double> gap(lambda);
    std::uniform_int_distribution<size_t> pick(0, m.island_ids.size() - 1);
    for (double t = gap(rng); t < horizon; t += gap(rng))
      events.insert({t, false, m.island_ids[pick(rng)]});
  }
  for (const auto& [t, id] : sc.failures.at) {
    TERN_REQUIRE(m.islands.count(id), kInvalidArgument, "failures.at: no island '", id, "'");
    events.insert({t, false, id});
  }
  std::set<std::string> down;
  auto apply_event = [&](const Event& e) -> Status {
    if (e.repair) {
      down.erase(e.id);
      return m.Join(e.id);
    }
    if (down.count(e.id)) return Status::Ok();  // thinned
    down.insert(e.id);
    m.Leave(e.id);
    events.insert({e.t + sc.failures.repair_s, true, e.id});
    return Status::Ok();
  };

  for (uint32_t v = 0; v < sc.versions; ++v) {
    const double start = v * sc.version_interval_s;
    while (!events.empty() && events.begin()->t < start) {
      const Event e = *events.begin();
      events.erase(events.begin());
      TERN_RETURN_IF_ERROR(apply_event(e));
    }
    VersionResult vr;
    vr.version = v + 1;
    vr.start_s = start;
    // Members that must receive this version: the plan's at publish.
    std::set<std::string> receivers;
    for (const auto& [id, mem] : m.plan().members) receivers.insert(id);
    std::unordered_map<std::string, std::vector<NodeStripe>> final_nodes;
    std::unordered_map<std::string, std::vector<uint32_t>> held;
    std::set<std::pair<uint32_t, std::string>> new_edges;
    // The root offers the patch offer_delay_s after it is ready (its board
    // record): every time below counts from ready.
    double t_restart = m.costs.offer_delay_s;
    std::set<std::string> failed;
    for (;;) {
      // The next failure inside this version, if any (repairs wait).
      double t_next = kInf;
      auto next = events.end();
      for (auto it = events.begin(); it != events.end() && it->t < start + sc.version_interval_s;
           ++it) {
        if (!it->repair && !down.count(it->id)) {
          next = it;
          t_next = it->t - start;
          break;
        }
      }
      Impl::PassOut pass =
          m.Pass(m.plan(), r.patch_bytes, t_restart, t_next, held, new_edges, sc.failures.detect_s);
      for (auto& [id, ns] : pass.nodes) {
        auto& f = final_nodes[id];
        if (f.empty()) f = ns;
        for (size_t s = 0; s < ns.size(); ++s) {
          if (ns[s].untouched) continue;
          f[s].last_s = ns[s].last_s;
          f[s].rate_bytes_per_s = ns[s].rate_bytes_per_s;
          if (held.count(id) == 0 || held[id][s] == 0) f[s].first_s = ns[s].first_s;
        }
      }
      double done = 0;
      for (const auto& [id, ns] : pass.nodes)
        for (const NodeStripe& x : ns) done = std::max(done, x.last_s);
      for (const auto& [k, b] : pass.wan_bytes) vr.wan_bytes[k] += b;
      if (next == events.end() || t_next >= done) break;
      // A member fails while the version flows: the root re-plans
      // (Membership::Leave); its orphans resume what they hold from new parents.
      const Event e = *next;
      events.erase(next);
      const topology::Plan before = m.plan();
      TERN_RETURN_IF_ERROR(apply_event(e));
      failed.insert(e.id);
      held.clear();
      for (const auto& [id, ns] : pass.nodes) {
        auto& h = held[id];
        for (const NodeStripe& x : ns) h.push_back(x.held);
      }
      new_edges.clear();
      const topology::Plan& after = m.plan();
      for (uint32_t s = 0; s < after.options.stripes; ++s)
        for (const auto& [id, parent] : after.parent[s]) {
          auto b = before.parent[s].find(id);
          if (b == before.parent[s].end() || b->second != parent) new_edges.insert({s, id});
        }
      ++vr.replans;
      t_restart = t_next;
    }
    vr.failed = static_cast<uint32_t>(failed.size());
    vr.first_holding_s = kInf;
    std::string last;
    uint32_t last_stripe = 0;
    std::vector<ApplyJob> applies;
    for (const std::string& id : receivers) {
      if (failed.count(id)) continue;
      auto it = final_nodes.find(id);
      if (it == final_nodes.end()) continue;
      ++vr.islands;
      double first = kInf, lastt = 0;
      uint32_t ls = 0;
      for (uint32_t s = 0; s < it->second.size(); ++s) {
        first = std::min(first, it->second[s].first_s);
        if (it->second[s].last_s > lastt) lastt = it->second[s].last_s, ls = s;
      }
      vr.first_holding_s = std::min(vr.first_holding_s, first);
      if (lastt > vr.last_holding_s || last.empty())
        vr.last_holding_s = lastt, last = id, last_stripe = ls;
      // Its apply: the share left after the last byte (all of it for a
      // patch of one chunk), the rest as the chunks arrive.
      ApplyJob job;
      job.release0 = first;
      job.work0 = (1 - apply_tail) * apply_core_s;
      job.release1 = lastt;
      job.work1 = apply_tail * apply_core_s;
      applies.push_back(job);
    }
    if (vr.islands == 0) vr.first_holding_s = 0;
    const std::vector<double> served =
        ApplyFinishTimes(applies, sc.apply_cores, sc.shared_apply_cores);
    vr.first_serving_s = served.empty() ? 0 : *std::min_element(served.begin(), served.end());
    vr.last_serving_s = served.empty() ? 0 : *std::max_element(served.begin(), served.end());
    vr.last_island = last;
    // The critical path: the last island's ancestors in its last stripe.
    const topology::Plan& p = m.plan();
    for (std::string at = last; !at.empty();) {
      Hop h;
      h.id = at;
      h.region = m.RegionOf(at).name;
      if (at != kRootId) {
        const NodeStripe& ns = final_nodes.at(at)[last_stripe];
        h.first_chunk_s = ns.first_s;
        h.last_chunk_s = ns.last_s;
        h.rate_bytes_per_s = ns.rate_bytes_per_s;
      }
      vr.critical_path.push_back(h);
      if (at == kRootId) break;
      auto pit = p.parent[last_stripe].find(at);
      at = pit == p.parent[last_stripe].end() ? std::string() : pit->second;
      if (vr.critical_path.size() > 64) break;
    }
    std::reverse(vr.critical_path.begin(), vr.critical_path.end());
    r.versions.push_back(std::move(vr));
  }
  return r;
}

}  // namespace tern::sim
