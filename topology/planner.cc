// The relay-tree planner (include/tern/topology.h, docs/topology.md).
//
// One StripeTree edits one stripe. Members that may relay in the stripe and
// have spare fan-out sit in three ordered "open slot" sets (per cluster, per
// region, all), keyed shallowest first, then fastest uplink, then member index
// (id order), so each attachment is O(log n) (costs: docs/topology.md).
// Attaching a member picks, in order: a slot in its own cluster (RDMA), one
// in its region, the root when its region has no slot left (the member is
// the first of its region, or the region is full), and only then a slot in
// another region. That order is the whole policy: WAN links are crossed once
// per region (by the region's first, fastest relay), clusters hang together,
// and fast members end up interior because they are placed first.
#include <algorithm>
#include <cmath>
#include <deque>
#include <set>
#include <unordered_map>

#include "tern/topology.h"

namespace tern::topology {

Link Classify(const Member& from, const Member& to) {
  if (from.region != to.region) return Link::kCrossRegion;
  if (!from.cluster.empty() && from.cluster == to.cluster) return Link::kSameCluster;
  return Link::kSameRegion;
}

const char* LinkName(Link link) {
  switch (link) {
    case Link::kSameCluster:
      return "same-cluster";
    case Link::kSameRegion:
      return "same-region";
    case Link::kCrossRegion:
      return "cross-region";
  }
  return "?";
}

EdgeTransport ChooseEdgeTransport(const Member& parent, const Member& child) {
  if (Classify(parent, child) != Link::kSameCluster) return EdgeTransport::kMainAcrossClusters;
  if (parent.intra_backend.empty() || child.intra_backend.empty())
    return EdgeTransport::kMainNoIntra;
  if (parent.intra_backend != child.intra_backend) return EdgeTransport::kMainBackendsDiffer;
  return EdgeTransport::kIntra;
}

const char* EdgeTransportName(EdgeTransport t) {
  switch (t) {
    case EdgeTransport::kIntra:
      return "intra-cluster";
    case EdgeTransport::kMainAcrossClusters:
      return "main (the edge leaves the cluster)";
    case EdgeTransport::kMainNoIntra:
      return "main (an end has no intra-cluster transport)";
    case EdgeTransport::kMainBackendsDiffer:
      return "main (the ends run different intra-cluster backends)";
  }
  return "?";
}

namespace {

bool FinitePositive(double x) { return std::isfinite(x) && x > 0; }

Status CheckMember(const Member& m, const char* what) {
  TERN_REQUIRE(!m.id.empty() && m.id.size() <= kMaxIdBytes, kInvalidArgument, what,
               " id must be 1..", kMaxIdBytes, " bytes");
  TERN_REQUIRE(!m.region.empty(), kInvalidArgument, what, " '", m.id, "' has no region");
  TERN_REQUIRE(FinitePositive(m.uplink_bytes_per_s) && FinitePositive(m.downlink_bytes_per_s),
               kInvalidArgument, what, " '", m.id, "': rates must be finite and > 0");
  TERN_REQUIRE(std::isfinite(m.rtt_to_root_s) && m.rtt_to_root_s >= 0, kInvalidArgument, what, " '",
               m.id, "': round trip must be finite and >= 0");
  TERN_REQUIRE(m.intra_backend.size() <= kMaxIdBytes, kInvalidArgument, what, " '", m.id,
               "': intra backend name longer than ", kMaxIdBytes, " bytes");
  TERN_REQUIRE(!m.relay_only || m.may_relay, kInvalidArgument, what, " '", m.id,
               "' is relay-only but may not relay");
  return Status::Ok();
}

Status CheckOptions(const PlanOptions& o) {
  TERN_REQUIRE(o.fanout_max >= 1 && o.root_fanout_max >= 1, kInvalidArgument,
               "fan-out bounds must be >= 1");
  TERN_REQUIRE(o.stripes >= 1 && o.stripes <= kMaxStripes, kInvalidArgument, "stripes must be 1..",
               kMaxStripes);
  TERN_REQUIRE(o.stripes <= o.fanout_max, kInvalidArgument, "stripes (", o.stripes,
               ") above fanout_max (", o.fanout_max,
               "): a stripe's relays could not hold the others as leaves");
  return Status::Ok();
}

// Members by index in id order (plan.members is sorted, so comparing
// indices compares ids), the root last; clusters and regions interned.
struct Index {
  static constexpr uint32_t kNone = ~0u;
  std::vector<const Member*> member;
  std::unordered_map<std::string_view, uint32_t> of;
  std::vector<uint32_t> relay_stripe, cluster, region;
  uint32_t root = 0, clusters = 0, regions = 0;

  explicit Index(const Plan& plan) {
    const size_t n = plan.members.size();
    member.reserve(n + 1);
    of.reserve(n + 1);
    std::unordered_map<std::string, uint32_t> cluster_ids, region_ids;
    auto intern = [](std::unordered_map<std::string, uint32_t>& ids, std::string key) {
      return ids.emplace(std::move(key), static_cast<uint32_t>(ids.size())).first->second;
    };
    auto add = [&](const Member& m, uint32_t stripe) {
      of.emplace(m.id, static_cast<uint32_t>(member.size()));
      member.push_back(&m);
      relay_stripe.push_back(stripe);
      // A cluster is named within its region; an empty one is the member's own.
      cluster.push_back(intern(cluster_ids, m.region + '\x1f' +
                                                (m.cluster.empty() ? "\x1e" + m.id : m.cluster)));
      region.push_back(intern(region_ids, m.region));
    };
    for (const auto& [id, m] : plan.members) add(m, plan.relay_stripe.at(id));
    root = static_cast<uint32_t>(n);
    add(plan.root, Plan::kLeafEverywhere);
    clusters = static_cast<uint32_t>(cluster_ids.size());
    regions = static_cast<uint32_t>(region_ids.size());
  }
  uint32_t At(std::string_view id) const {
    auto it = of.find(id);
    return it == of.end() ? kNone : it->second;
  }
  const std::string& Id(uint32_t i) const { return member[i]->id; }
};

// When a parent's first chunk reaches a child: half its round trip to the
// root (how late it gets the chunk) plus one chunk over its uplink. With
// unknown round trips (0) this orders by uplink, fastest first.
double FirstChunkCost(const Member& m) {
  return m.rtt_to_root_s / 2 + kPlanChunkBytes / m.uplink_bytes_per_s;
}

// Shallowest first (latency), then a relay-only member (nothing else
// competes for its CPU; Member::relay_only), then the soonest first chunk.
struct SlotKey {
  uint32_t depth;
  bool serves;      // !relay_only: false sorts first
  double cost;      // FirstChunkCost: lower is better
  uint32_t member;  // index: id order
  bool operator<(const SlotKey& o) const {
    if (depth != o.depth) return depth < o.depth;
    if (serves != o.serves) return !serves;
    if (cost != o.cost) return cost < o.cost;
    return member < o.member;
  }
};

class StripeTree {
 public:
  static constexpr uint32_t kNone = Index::kNone;

  StripeTree(const Plan& plan, const Index& index, uint32_t stripe)
      : plan_(plan),
        ix_(index),
        stripe_(stripe),
        parent_(index.member.size(), kNone),
        children_(index.member.size()),
        depth_(index.member.size(), kNone),
        open_cluster_(index.clusters),
        open_region_(index.regions) {}

  // Loads plan.parent[stripe] (members already planned).
  void Load() {
    for (const auto& [id, parent] : plan_.parent[stripe_]) {
      const uint32_t c = ix_.At(id), p = ix_.At(parent);
      TERN_ASSERT(c != kNone && p != kNone, "plan names unknown member");
      parent_[c] = p;
      children_[p].push_back(c);
    }
    for (auto& kids : children_) std::sort(kids.begin(), kids.end());
    ConnectSubtree(ix_.root, 0);
  }

  // Attaches member `m` (detached; its own subtree, if any, comes along).
  Status Attach(uint32_t m) {
    uint32_t parent = kNone, parent_depth = 0;
    auto take = [&](const std::set<SlotKey>& open) {
      if (open.empty()) return false;
      parent = open.begin()->member;
      parent_depth = open.begin()->depth;
      return true;
    };
    // Cluster, region, root (the region has no room: it is new, or full),
    // another region.
    const bool root_free = Kids(ix_.root) < plan_.options.root_fanout_max;
    if (!take(open_cluster_[ix_.cluster[m]]) && !take(open_region_[ix_.region[m]])) {
      if (root_free) {
        parent = ix_.root;
      } else if (!take(open_all_)) {
        return TERN_ERROR(kResourceExhausted, "stripe ", stripe_, ": no relay has room for '",
                          ix_.Id(m), "' (fanout_max ", plan_.options.fanout_max,
                          ", root_fanout_max ", plan_.options.root_fanout_max, ", ",
                          plan_.members.size(), " members)");
      }
    }
    Hang(m, parent, parent == ix_.root ? 0 : parent_depth);
    return Status::Ok();
  }

  // Removes `m`; returns its children, detached with their subtrees.
  std::vector<uint32_t> Remove(uint32_t m) {
    std::vector<uint32_t> orphans = std::move(children_[m]);
    children_[m].clear();
    for (uint32_t c : orphans) {
      parent_[c] = kNone;
      DisconnectSubtree(c);
    }
    const uint32_t parent = parent_[m];
    CloseSlot(m);
    depth_[m] = kNone;
    parent_[m] = kNone;
    if (parent != ix_.root) CloseSlot(parent);
    auto& kids = children_[parent];
    kids.erase(std::find(kids.begin(), kids.end(), m));
    if (parent != ix_.root) OpenSlot(parent);
    return orphans;
  }

  std::map<std::string, std::string> Parents() const {
    std::map<std::string, std::string> out;
    for (uint32_t m = 0; m < ix_.root; ++m)
      if (parent_[m] != kNone) out.emplace_hint(out.end(), ix_.Id(m), ix_.Id(parent_[m]));
    return out;
  }

 private:
  uint32_t Kids(uint32_t m) const { return static_cast<uint32_t>(children_[m].size()); }
  bool Relays(uint32_t m) const { return ix_.relay_stripe[m] == stripe_; }
  SlotKey KeyOf(uint32_t m) const {
    const Member& member = *ix_.member[m];
    return SlotKey{depth_[m], !member.relay_only, FirstChunkCost(member), m};
  }

  // A relay with spare fan-out is open; these two keep the sets in step
  // with depth_ and children_ (close before a change, open after it).
  void OpenSlot(uint32_t m) {
    if (!Relays(m) || Kids(m) >= plan_.options.fanout_max) return;
    const SlotKey key = KeyOf(m);
    open_cluster_[ix_.cluster[m]].insert(key);
    open_region_[ix_.region[m]].insert(key);
    open_all_.insert(key);
  }
  void CloseSlot(uint32_t m) {
    if (depth_[m] == kNone) return;
    const SlotKey key = KeyOf(m);
    open_cluster_[ix_.cluster[m]].erase(key);
    open_region_[ix_.region[m]].erase(key);
    open_all_.erase(key);
  }

  void Hang(uint32_t m, uint32_t parent, uint32_t parent_depth) {
    if (parent != ix_.root) CloseSlot(parent);
    parent_[m] = parent;
    auto& kids = children_[parent];
    kids.insert(std::lower_bound(kids.begin(), kids.end(), m), m);
    if (parent != ix_.root) OpenSlot(parent);
    ConnectSubtree(m, parent == ix_.root ? 1 : parent_depth + 1);
  }

  // Gives `top` and everything below it depths and open slots (breadth
  // first; bounded by the member count since the tree has no cycles).
  void ConnectSubtree(uint32_t top, uint32_t depth) {
    std::deque<std::pair<uint32_t, uint32_t>> todo{{top, depth}};
    while (!todo.empty()) {
      auto [m, d] = todo.front();
      todo.pop_front();
      if (m != ix_.root) {
        depth_[m] = d;
        OpenSlot(m);
      }
      for (uint32_t c : children_[m]) todo.emplace_back(c, d + 1);
    }
  }
  void DisconnectSubtree(uint32_t top) {
    std::deque<uint32_t> todo{top};
    while (!todo.empty()) {
      const uint32_t m = todo.front();
      todo.pop_front();
      CloseSlot(m);
      depth_[m] = kNone;
      for (uint32_t c : children_[m]) todo.push_back(c);
    }
  }

  const Plan& plan_;
  const Index& ix_;
  const uint32_t stripe_;
  std::vector<uint32_t> parent_;
  std::vector<std::vector<uint32_t>> children_;  // sorted
  std::vector<uint32_t> depth_;                  // kNone: detached
  std::vector<std::set<SlotKey>> open_cluster_, open_region_;
  std::set<SlotKey> open_all_;
};

// Relay-only members first, then fastest first: they become the interior
// of the trees.
bool FasterFirst(const Member& a, const Member& b) {
  if (a.relay_only != b.relay_only) return a.relay_only;
  if (a.uplink_bytes_per_s != b.uplink_bytes_per_s)
    return a.uplink_bytes_per_s > b.uplink_bytes_per_s;
  return a.id < b.id;
}

// Re-attaches a departed member's orphans as any member would attach,
// relays first and fastest first (the first takes the slot its parent just
// freed, or a better one; a departed region head is so replaced by the
// fastest member below it). Relays go first because their subtrees bring
// open slots along: when one finds no room, no orphan after it can.
Status Reattach(const Index& ix, uint32_t stripe, StripeTree& tree,
                std::vector<uint32_t> orphans) {
  std::sort(orphans.begin(), orphans.end(), [&](uint32_t a, uint32_t b) {
    const bool ra = ix.relay_stripe[a] == stripe, rb = ix.relay_stripe[b] == stripe;
    if (ra != rb) return ra;
    return FasterFirst(*ix.member[a], *ix.member[b]);
  });
  for (uint32_t o : orphans) TERN_RETURN_IF_ERROR(tree.Attach(o));
  return Status::Ok();
}

}  // namespace

Result<Plan> MakePlan(const Member& root, const std::vector<Member>& members,
                      const PlanOptions& options) {
  TERN_RETURN_IF_ERROR(CheckOptions(options));
  TERN_RETURN_IF_ERROR(CheckMember(root, "root"));
  TERN_REQUIRE(members.size() <= options.members_max, kResourceExhausted, members.size(),
               " members, above members_max ", options.members_max);
  Plan plan;
  plan.root = root;
  plan.options = options;
  for (const auto& m : members) {
    TERN_RETURN_IF_ERROR(CheckMember(m, "member"));
    TERN_REQUIRE(m.id != root.id, kInvalidArgument, "member '", m.id, "' has the root's id");
    TERN_REQUIRE(plan.members.emplace(m.id, m).second, kInvalidArgument, "member id '", m.id,
                 "' appears twice");
  }
  // Each region's relays, fastest first, are dealt round-robin to the
  // stripes, so every region with >= stripes relays has one in each.
  std::map<std::string, std::vector<const Member*>> relays_by_region;
  std::vector<const Member*> order;
  for (const auto& [id, m] : plan.members) {
    order.push_back(&m);
    if (m.may_relay) relays_by_region[m.region].push_back(&m);
    plan.relay_stripe[id] = Plan::kLeafEverywhere;
  }
  for (auto& [region, relays] : relays_by_region) {
    std::sort(relays.begin(), relays.end(),
              [](const Member* a, const Member* b) { return FasterFirst(*a, *b); });
    for (size_t i = 0; i < relays.size(); ++i)
      plan.relay_stripe[relays[i]->id] = static_cast<uint32_t>(i % options.stripes);
  }
  plan.parent.resize(options.stripes);
  const Index index(plan);
  for (uint32_t s = 0; s < options.stripes; ++s) {
    // This stripe's relays first (fastest first), then everyone else.
    std::vector<const Member*> placing = order;
    std::stable_sort(placing.begin(), placing.end(), [&](const Member* a, const Member* b) {
      const bool ra = index.relay_stripe[index.At(a->id)] == s,
                 rb = index.relay_stripe[index.At(b->id)] == s;
      if (ra != rb) return ra;
      return ra ? FasterFirst(*a, *b) : a->id < b->id;
    });
    StripeTree tree(plan, index, s);
    for (const Member* m : placing) TERN_RETURN_IF_ERROR(tree.Attach(index.At(m->id)));
    plan.parent[s] = tree.Parents();
  }
  return plan;
}

namespace {

// The stripe in which a new relay of `region` goes: the one where that
// region has the fewest relays (ties: the lowest stripe).
uint32_t LeastRelayedStripe(const Plan& plan, const std::string& region) {
  std::vector<uint32_t> relays(plan.options.stripes, 0);
  for (const auto& [id, s] : plan.relay_stripe)
    if (s != Plan::kLeafEverywhere && plan.members.at(id).region == region) ++relays[s];
  return static_cast<uint32_t>(std::min_element(relays.begin(), relays.end()) - relays.begin());
}

}  // namespace

Result<Plan> AddMember(const Plan& plan, const Member& member) {
  TERN_RETURN_IF_ERROR(CheckMember(member, "member"));
  TERN_REQUIRE(member.id != plan.root.id, kInvalidArgument, "member '", member.id,
               "' has the root's id");
  TERN_REQUIRE(!plan.members.count(member.id), kAlreadyExists, "member '", member.id,
               "' is already planned");
  TERN_REQUIRE(plan.members.size() < plan.options.members_max, kResourceExhausted,
               "members_max ", plan.options.members_max, " reached");
  Plan next = plan;
  next.members.emplace(member.id, member);
  next.relay_stripe[member.id] =
      member.may_relay ? LeastRelayedStripe(plan, member.region) : Plan::kLeafEverywhere;
  const Index index(next);
  for (uint32_t s = 0; s < plan.options.stripes; ++s) {
    StripeTree tree(next, index, s);
    tree.Load();
    TERN_RETURN_IF_ERROR(tree.Attach(index.At(member.id)));
    next.parent[s] = tree.Parents();
  }
  return next;
}

Result<Plan> RemoveMember(const Plan& plan, std::string_view id_view) {
  const std::string id(id_view);
  TERN_REQUIRE(plan.members.count(id), kNotFound, "member '", id, "' is not in the plan");
  Plan next = plan;
  const Index index(next);
  for (uint32_t s = 0; s < plan.options.stripes; ++s) {
    StripeTree tree(next, index, s);
    tree.Load();
    std::vector<uint32_t> orphans = tree.Remove(index.At(id));
    TERN_RETURN_IF_ERROR(Reattach(index, s, tree, std::move(orphans)));
    next.parent[s] = tree.Parents();
  }
  next.members.erase(id);
  next.relay_stripe.erase(id);
  return next;
}

Result<Plan> UpdateFigures(const Plan& plan, std::string_view id_view, double uplink_bytes_per_s,
                           double downlink_bytes_per_s, double rtt_to_root_s) {
  const std::string id(id_view);
  auto it = plan.members.find(id);
  TERN_REQUIRE(it != plan.members.end(), kNotFound, "member '", id, "' is not in the plan");
  for (double x : {uplink_bytes_per_s, downlink_bytes_per_s, rtt_to_root_s})
    TERN_REQUIRE(std::isfinite(x) && x >= 0, kInvalidArgument, "member '", id,
                 "': measured figures must be finite and >= 0");
  Plan next = plan;
  Member& m = next.members.at(id);
  if (uplink_bytes_per_s > 0) m.uplink_bytes_per_s = uplink_bytes_per_s;
  if (downlink_bytes_per_s > 0) m.downlink_bytes_per_s = downlink_bytes_per_s;
  if (rtt_to_root_s > 0) m.rtt_to_root_s = rtt_to_root_s;
  return next;
}

Result<Plan> DemoteRelay(const Plan& plan, std::string_view id_view) {
  const std::string id(id_view);
  TERN_REQUIRE(plan.members.count(id), kNotFound, "member '", id, "' is not in the plan");
  const uint32_t stripe = plan.relay_stripe.at(id);
  if (stripe == Plan::kLeafEverywhere) return plan;
  Plan next = plan;
  next.members.at(id).may_relay = false;
  next.members.at(id).relay_only = false;  // relay_only needs may_relay; a leaf now
  next.relay_stripe[id] = Plan::kLeafEverywhere;
  // Indexed as a leaf: it opens no slot while its old children are moved.
  const Index index(next);
  StripeTree tree(next, index, stripe);
  tree.Load();
  const uint32_t m = index.At(id);
  std::vector<uint32_t> orphans = tree.Remove(m);
  TERN_RETURN_IF_ERROR(Reattach(index, stripe, tree, std::move(orphans)));
  // Hung again after its children, so that one of them may take the slot
  // it held (the root's, when it was a region head).
  TERN_RETURN_IF_ERROR(tree.Attach(m));
  next.parent[stripe] = tree.Parents();
  return next;
}

Result<Plan> PromoteRelay(const Plan& plan, std::string_view id_view) {
  const std::string id(id_view);
  auto it = plan.members.find(id);
  TERN_REQUIRE(it != plan.members.end(), kNotFound, "member '", id, "' is not in the plan");
  if (plan.relay_stripe.at(id) != Plan::kLeafEverywhere) return plan;
  Plan next = plan;
  next.members.at(id).may_relay = true;
  // A leaf has no children in any stripe, so relaying in the chosen one
  // breaks no invariant and moves nobody.
  next.relay_stripe[id] = LeastRelayedStripe(plan, it->second.region);
  return next;
}

Status Validate(const Plan& plan) {
  TERN_RETURN_IF_ERROR(CheckOptions(plan.options));
  const PlanOptions& o = plan.options;
  TERN_REQUIRE(plan.parent.size() == o.stripes, kInternal, plan.parent.size(), " stripe maps for ",
               o.stripes, " stripes");
  TERN_REQUIRE(plan.relay_stripe.size() == plan.members.size(), kInternal,
               "relay_stripe and members disagree");
  for (const auto& [id, m] : plan.members) {
    TERN_REQUIRE(m.id == id, kInternal, "member keyed '", id, "' is '", m.id, "'");
    auto rs = plan.relay_stripe.find(id);
    TERN_REQUIRE(rs != plan.relay_stripe.end(), kInternal, "'", id, "' has no relay stripe");
    TERN_REQUIRE(m.may_relay == (rs->second != Plan::kLeafEverywhere), kInternal, "'", id,
                 "': may_relay ", m.may_relay, " but relay stripe ", rs->second);
    TERN_REQUIRE(!m.may_relay || rs->second < o.stripes, kInternal, "'", id,
                 "' relays in stripe ", rs->second, " of ", o.stripes);
  }
  for (uint32_t s = 0; s < o.stripes; ++s) {
    const auto& parent = plan.parent[s];
    TERN_REQUIRE(parent.size() == plan.members.size(), kInternal, "stripe ", s, " places ",
                 parent.size(), " of ", plan.members.size(), " members");
    std::map<std::string, uint32_t> kids;
    for (const auto& [id, p] : parent) {
      TERN_REQUIRE(plan.members.count(id), kInternal, "stripe ", s, " places unknown '", id, "'");
      if (p == plan.root.id) {
        ++kids[p];
        continue;
      }
      auto pm = plan.relay_stripe.find(p);
      TERN_REQUIRE(pm != plan.relay_stripe.end(), kInternal, "stripe ", s, ": '", id,
                   "' hangs from unknown '", p, "'");
      TERN_REQUIRE(pm->second == s, kInternal, "stripe ", s, ": '", p,
                   "' is interior but relays in stripe ", pm->second);
      ++kids[p];
    }
    for (const auto& [p, n] : kids) {
      const uint32_t bound = p == plan.root.id ? o.root_fanout_max : o.fanout_max;
      TERN_REQUIRE(n <= bound, kInternal, "stripe ", s, ": '", p, "' has ", n, " children, bound ",
                   bound);
    }
    // Every member reaches the root: walk up, remembering who is known good.
    std::set<std::string> good{plan.root.id};
    for (const auto& [id, p] : parent) {
      std::vector<std::string> path;
      std::string at = id;
      while (!good.count(at)) {
        TERN_REQUIRE(path.size() <= parent.size(), kInternal, "stripe ", s, ": cycle through '",
                     id, "'");
        path.push_back(at);
        at = parent.at(at);
      }
      good.insert(path.begin(), path.end());
    }
  }
  return Status::Ok();
}

std::vector<Move> Diff(const Plan& before, const Plan& after) {
  std::vector<Move> moves;
  const size_t stripes = std::max(before.parent.size(), after.parent.size());
  static const std::map<std::string, std::string> kNone;
  for (size_t s = 0; s < stripes; ++s) {
    const auto& a = s < before.parent.size() ? before.parent[s] : kNone;
    const auto& b = s < after.parent.size() ? after.parent[s] : kNone;
    std::set<std::string> ids;
    for (const auto& [id, p] : a) ids.insert(id);
    for (const auto& [id, p] : b) ids.insert(id);
    for (const auto& id : ids) {
      auto ia = a.find(id);
      auto ib = b.find(id);
      std::string pa = ia == a.end() ? "" : ia->second;
      std::string pb = ib == b.end() ? "" : ib->second;
      if (pa != pb) moves.push_back(Move{static_cast<uint32_t>(s), id, pa, pb});
    }
  }
  return moves;
}

std::vector<std::string> Children(const Plan& plan, uint32_t stripe, std::string_view id) {
  std::vector<std::string> kids;
  if (stripe >= plan.parent.size()) return kids;
  for (const auto& [child, p] : plan.parent[stripe])
    if (p == id) kids.push_back(child);
  return kids;
}

Result<uint32_t> Depth(const Plan& plan, uint32_t stripe, std::string_view id) {
  TERN_REQUIRE(stripe < plan.parent.size(), kOutOfRange, "stripe ", stripe, " of ",
               plan.parent.size());
  if (id == plan.root.id) return uint32_t{0};
  const auto& parent = plan.parent[stripe];
  std::string at(id);
  uint32_t depth = 0;
  while (at != plan.root.id) {
    auto it = parent.find(at);
    TERN_REQUIRE(it != parent.end(), kNotFound, "'", at, "' is not in stripe ", stripe);
    TERN_REQUIRE(depth <= parent.size(), kInternal, "cycle through '", id, "'");
    at = it->second;
    ++depth;
  }
  return depth;
}

Delivery EstimateDelivery(const Plan& plan, uint64_t bytes, uint64_t chunk_bytes,
                          const LinkModel& model) {
  Delivery out;
  const uint32_t stripes = static_cast<uint32_t>(plan.parent.size());
  if (stripes == 0 || plan.members.empty()) return out;
  const double share = static_cast<double>(bytes) / stripes;
  const double chunk = std::min(share, static_cast<double>(std::max<uint64_t>(chunk_bytes, 1)));
  const Index ix(plan);
  const size_t n = ix.member.size();
  // A member's uplink is shared by its children in every stripe.
  std::vector<uint32_t> fanout(n, 0);
  std::vector<std::vector<std::vector<uint32_t>>> kids(stripes, std::vector<std::vector<uint32_t>>(n));
  for (uint32_t s = 0; s < stripes; ++s)
    for (const auto& [id, p] : plan.parent[s]) {
      const uint32_t pi = ix.At(p);
      ++fanout[pi];
      kids[s][pi].push_back(ix.At(id));
    }
  auto rtt = [&](Link l) {
    return l == Link::kSameCluster  ? model.rtt_same_cluster_s
           : l == Link::kSameRegion ? model.rtt_same_region_s
                                    : model.rtt_cross_region_s;
  };
  constexpr double kUnset = -1;
  std::vector<double> first(n, kUnset), last(n, 0);
  std::vector<double> at_first(n), at_last(n);
  for (uint32_t s = 0; s < stripes; ++s) {
    at_first[ix.root] = at_last[ix.root] = 0;
    std::deque<std::pair<uint32_t, uint32_t>> todo{{ix.root, 0}};
    while (!todo.empty()) {
      auto [p, depth] = todo.front();
      todo.pop_front();
      out.depth_max = std::max(out.depth_max, depth);
      const Member& pm = *ix.member[p];
      for (uint32_t c : kids[s][p]) {
        const Member& cm = *ix.member[c];
        const double rate =
            std::min(pm.uplink_bytes_per_s / fanout[p], cm.downlink_bytes_per_s / stripes);
        const double half_rtt = rtt(Classify(pm, cm)) / 2;
        at_first[c] = at_first[p] + half_rtt + chunk / rate;
        at_last[c] = std::max(at_first[p] + half_rtt + share / rate,
                              at_last[p] + half_rtt + chunk / rate);
        first[c] = first[c] == kUnset ? at_first[c] : std::min(first[c], at_first[c]);
        last[c] = std::max(last[c], at_last[c]);
        todo.emplace_back(c, depth + 1);
      }
    }
  }
  for (uint32_t m = 0; m < ix.root; ++m) {
    out.first_chunk_s = std::max(out.first_chunk_s, first[m]);
    if (out.last_member.empty() || last[m] > out.last_byte_s) {
      out.last_byte_s = last[m];
      out.last_member = ix.Id(m);
    }
  }
  return out;
}

}  // namespace tern::topology
