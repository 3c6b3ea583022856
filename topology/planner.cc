// The relay-tree planner (include/tern/topology.h, docs/topology.md).
//
// One StripeTree edits one stripe. Members that may relay in the stripe and
// have spare fan-out sit in three ordered "open slot" sets (per cluster, per
// region, all), keyed shallowest first, then fastest uplink, then id, so each
// attachment is O(log n) and a plan of 10^5 members takes well under a second.
// Attaching a member picks, in order: a slot in its own cluster (RDMA), one
// in its region, the root when its region has no slot left (the member is
// the first of its region, or the region is full), and only then a slot in another
// region. That order is the whole policy: WAN links are crossed once per
// region (by the region's first, fastest relay), clusters hang together, and
// fast members end up interior because they are placed first.
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

namespace {

bool FinitePositive(double x) { return std::isfinite(x) && x > 0; }

Status CheckMember(const Member& m, const char* what) {
  TERN_REQUIRE(!m.id.empty() && m.id.size() <= kMaxIdBytes, kInvalidArgument, what,
               " id must be 1..", kMaxIdBytes, " bytes");
  TERN_REQUIRE(!m.region.empty(), kInvalidArgument, what, " '", m.id, "' has no region");
  TERN_REQUIRE(FinitePositive(m.uplink_bytes_per_s) && FinitePositive(m.downlink_bytes_per_s),
               kInvalidArgument, what, " '", m.id, "': rates must be finite and > 0");
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

// A cluster is named within its region; an empty cluster is the member's own.
std::string ClusterKey(const Member& m) {
  return m.region + '\x1f' + (m.cluster.empty() ? "\x1e" + m.id : m.cluster);
}

struct SlotKey {
  uint32_t depth;
  double uplink;
  std::string id;
  bool operator<(const SlotKey& o) const {
    if (depth != o.depth) return depth < o.depth;
    if (uplink != o.uplink) return uplink > o.uplink;
    return id < o.id;
  }
};

class StripeTree {
 public:
  StripeTree(const Plan& plan, uint32_t stripe) : plan_(plan), stripe_(stripe) {}

  // Loads plan.parent[stripe] (members already planned).
  void Load() {
    for (const auto& [id, parent] : plan_.parent[stripe_]) {
      parent_[id] = parent;
      children_[parent].push_back(id);
    }
    for (auto& [id, kids] : children_) std::sort(kids.begin(), kids.end());
    ConnectSubtree(plan_.root.id, 0);
  }

  // Attaches `id` (detached; its own subtree, if any, comes along).
  Status Attach(const std::string& id) {
    const Member& m = plan_.members.at(id);
    std::string parent;
    uint32_t parent_depth = 0;
    auto take = [&](const std::set<SlotKey>* open) {
      if (open == nullptr || open->empty()) return false;
      parent = open->begin()->id;
      parent_depth = open->begin()->depth;
      return true;
    };
    // Cluster, region, root (the region has no room: it is new, or full),
    // another region.
    const bool root_free = Kids(plan_.root.id) < plan_.options.root_fanout_max;
    if (!take(Find(open_cluster_, ClusterKey(m))) && !take(Find(open_region_, m.region))) {
      if (root_free) {
        parent = plan_.root.id;
      } else if (!take(&open_all_)) {
        return TERN_ERROR(kResourceExhausted, "stripe ", stripe_, ": no relay has room for '", id,
                          "' (fanout_max ", plan_.options.fanout_max, ", root_fanout_max ",
                          plan_.options.root_fanout_max, ", ", plan_.members.size(), " members)");
      }
    }
    Hang(id, parent, parent == plan_.root.id ? 0 : parent_depth);
    return Status::Ok();
  }

  // Removes `id`; returns its children, detached with their subtrees.
  std::vector<std::string> Remove(const std::string& id) {
    std::vector<std::string> orphans = children_[id];
    children_.erase(id);
    for (const auto& c : orphans) {
      parent_.erase(c);
      DisconnectSubtree(c);
    }
    const std::string parent = parent_.at(id);
    CloseSlot(id);
    Unattach(id);
    parent_.erase(id);
    const bool parent_is_root = parent == plan_.root.id;
    if (!parent_is_root) CloseSlot(parent);
    auto& kids = children_[parent];
    kids.erase(std::find(kids.begin(), kids.end(), id));
    if (!parent_is_root) OpenSlot(parent);
    return orphans;
  }

  std::map<std::string, std::string> Parents() const {
    return std::map<std::string, std::string>(parent_.begin(), parent_.end());
  }

 private:
  template <class M>
  static const std::set<SlotKey>* Find(const M& m, const std::string& key) {
    auto it = m.find(key);
    return it == m.end() ? nullptr : &it->second;
  }
  uint32_t Kids(const std::string& id) const {
    auto it = children_.find(id);
    return it == children_.end() ? 0 : static_cast<uint32_t>(it->second.size());
  }
  bool Relays(const std::string& id) const { return plan_.relay_stripe.at(id) == stripe_; }

  SlotKey KeyOf(const std::string& id) const {
    return SlotKey{depth_.at(id), plan_.members.at(id).uplink_bytes_per_s, id};
  }
  // A relay with spare fan-out is open; these two keep the sets in step
  // with depth_ and children_ (close before a change, open after it).
  void OpenSlot(const std::string& id) {
    if (!Relays(id) || Kids(id) >= plan_.options.fanout_max) return;
    const Member& m = plan_.members.at(id);
    const SlotKey key = KeyOf(id);
    open_cluster_[ClusterKey(m)].insert(key);
    open_region_[m.region].insert(key);
    open_all_.insert(key);
  }
  void CloseSlot(const std::string& id) {
    if (!depth_.count(id)) return;
    const Member& m = plan_.members.at(id);
    const SlotKey key = KeyOf(id);
    auto drop = [&](auto& sets, const std::string& k) {
      auto it = sets.find(k);
      if (it == sets.end()) return;
      it->second.erase(key);
      if (it->second.empty()) sets.erase(it);
    };
    drop(open_cluster_, ClusterKey(m));
    drop(open_region_, m.region);
    open_all_.erase(key);
  }
  void Unattach(const std::string& id) { depth_.erase(id); }

  void Hang(const std::string& id, const std::string& parent, uint32_t parent_depth) {
    const bool parent_is_root = parent == plan_.root.id;
    if (!parent_is_root) CloseSlot(parent);
    parent_[id] = parent;
    auto& kids = children_[parent];
    kids.insert(std::lower_bound(kids.begin(), kids.end(), id), id);
    if (!parent_is_root) OpenSlot(parent);
    ConnectSubtree(id, parent_is_root ? 1 : parent_depth + 1);
  }

  // Gives `top` and everything below it depths and open slots (breadth
  // first; bounded by the member count since the tree has no cycles).
  void ConnectSubtree(const std::string& top, uint32_t depth) {
    std::deque<std::pair<std::string, uint32_t>> todo{{top, depth}};
    while (!todo.empty()) {
      auto [id, d] = todo.front();
      todo.pop_front();
      if (id != plan_.root.id) {
        depth_[id] = d;
        OpenSlot(id);
      }
      auto it = children_.find(id);
      if (it == children_.end()) continue;
      for (const auto& c : it->second) todo.emplace_back(c, d + 1);
    }
  }
  void DisconnectSubtree(const std::string& top) {
    std::deque<std::string> todo{top};
    while (!todo.empty()) {
      std::string id = todo.front();
      todo.pop_front();
      CloseSlot(id);
      Unattach(id);
      auto it = children_.find(id);
      if (it == children_.end()) continue;
      for (const auto& c : it->second) todo.push_back(c);
    }
  }

  const Plan& plan_;
  const uint32_t stripe_;
  std::unordered_map<std::string, std::string> parent_;
  std::unordered_map<std::string, std::vector<std::string>> children_;  // sorted
  std::unordered_map<std::string, uint32_t> depth_;                     // attached members
  std::unordered_map<std::string, std::set<SlotKey>> open_cluster_, open_region_;
  std::set<SlotKey> open_all_;
};

// Fastest first: they become the interior of the trees.
bool FasterFirst(const Member& a, const Member& b) {
  if (a.uplink_bytes_per_s != b.uplink_bytes_per_s)
    return a.uplink_bytes_per_s > b.uplink_bytes_per_s;
  return a.id < b.id;
}

// Re-attaches a departed member's orphans as any member would attach,
// relays first and fastest first (the first takes the slot its parent just
// freed, or a better one; a departed region head is so replaced by the
// fastest member below it). Relays go first because their subtrees bring
// open slots along: when one finds no room, no orphan after it can.
Status Reattach(const Plan& plan, uint32_t stripe, StripeTree& tree,
                std::vector<std::string> orphans) {
  std::sort(orphans.begin(), orphans.end(), [&](const std::string& a, const std::string& b) {
    const bool ra = plan.relay_stripe.at(a) == stripe, rb = plan.relay_stripe.at(b) == stripe;
    if (ra != rb) return ra;
    return FasterFirst(plan.members.at(a), plan.members.at(b));
  });
  for (const auto& o : orphans) TERN_RETURN_IF_ERROR(tree.Attach(o));
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
  for (uint32_t s = 0; s < options.stripes; ++s) {
    // This stripe's relays first (fastest first), then everyone else.
    std::vector<const Member*> placing = order;
    std::stable_sort(placing.begin(), placing.end(), [&](const Member* a, const Member* b) {
      const bool ra = plan.relay_stripe[a->id] == s, rb = plan.relay_stripe[b->id] == s;
      if (ra != rb) return ra;
      return ra ? FasterFirst(*a, *b) : a->id < b->id;
    });
    StripeTree tree(plan, s);
    for (const Member* m : placing) TERN_RETURN_IF_ERROR(tree.Attach(m->id));
    plan.parent[s] = tree.Parents();
  }
  return plan;
}

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
  uint32_t stripe = Plan::kLeafEverywhere;
  if (member.may_relay) {
    // The stripe where this region has the fewest relays.
    std::vector<uint32_t> relays(plan.options.stripes, 0);
    for (const auto& [id, s] : plan.relay_stripe)
      if (s != Plan::kLeafEverywhere && plan.members.at(id).region == member.region) ++relays[s];
    stripe = static_cast<uint32_t>(std::min_element(relays.begin(), relays.end()) - relays.begin());
  }
  next.relay_stripe[member.id] = stripe;
  for (uint32_t s = 0; s < plan.options.stripes; ++s) {
    StripeTree tree(next, s);
    tree.Load();
    TERN_RETURN_IF_ERROR(tree.Attach(member.id));
    next.parent[s] = tree.Parents();
  }
  return next;
}

Result<Plan> RemoveMember(const Plan& plan, std::string_view id_view) {
  const std::string id(id_view);
  TERN_REQUIRE(plan.members.count(id), kNotFound, "member '", id, "' is not in the plan");
  Plan next = plan;
  for (uint32_t s = 0; s < plan.options.stripes; ++s) {
    StripeTree tree(next, s);
    tree.Load();
    std::vector<std::string> orphans = tree.Remove(id);
    TERN_RETURN_IF_ERROR(Reattach(next, s, tree, std::move(orphans)));
    next.parent[s] = tree.Parents();
  }
  next.members.erase(id);
  next.relay_stripe.erase(id);
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
  // A member's uplink is shared by its children in every stripe.
  std::map<std::string, uint32_t> fanout;
  std::vector<std::map<std::string, std::vector<std::string>>> kids(stripes);
  for (uint32_t s = 0; s < stripes; ++s)
    for (const auto& [id, p] : plan.parent[s]) {
      ++fanout[p];
      kids[s][p].push_back(id);
    }
  auto member = [&](const std::string& id) -> const Member& {
    return id == plan.root.id ? plan.root : plan.members.at(id);
  };
  auto rtt = [&](Link l) {
    return l == Link::kSameCluster  ? model.rtt_same_cluster_s
           : l == Link::kSameRegion ? model.rtt_same_region_s
                                    : model.rtt_cross_region_s;
  };
  std::map<std::string, double> first, last;
  for (uint32_t s = 0; s < stripes; ++s) {
    std::map<std::string, std::pair<double, double>> at{{plan.root.id, {0.0, 0.0}}};
    std::deque<std::pair<std::string, uint32_t>> todo{{plan.root.id, 0}};
    while (!todo.empty()) {
      auto [p, depth] = todo.front();
      todo.pop_front();
      out.depth_max = std::max(out.depth_max, depth);
      const Member& pm = member(p);
      auto [p_first, p_last] = at[p];
      for (const auto& c : kids[s][p]) {
        const Member& cm = member(c);
        const double rate = std::min(pm.uplink_bytes_per_s / fanout[p],
                                     cm.downlink_bytes_per_s / stripes);
        const double half_rtt = rtt(Classify(pm, cm)) / 2;
        const double c_first = p_first + half_rtt + chunk / rate;
        const double c_last =
            std::max(p_first + half_rtt + share / rate, p_last + half_rtt + chunk / rate);
        at[c] = {c_first, c_last};
        auto f = first.find(c);
        first[c] = f == first.end() ? c_first : std::min(f->second, c_first);
        last[c] = std::max(last[c], c_last);
        todo.emplace_back(c, depth + 1);
      }
    }
  }
  for (const auto& [id, t] : first) out.first_chunk_s = std::max(out.first_chunk_s, t);
  for (const auto& [id, t] : last)
    if (t > out.last_byte_s || out.last_member.empty()) {
      out.last_byte_s = t;
      out.last_member = id;
    }
  return out;
}

}  // namespace tern::topology
