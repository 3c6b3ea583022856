// Relay-tree planning for the transfer agent: which member receives a version
// from which. Region- and bandwidth-aware (a version crosses each WAN link
// once per region, then fans out inside the region, inside a cluster first),
// with bounded fan-out, striped over interior-disjoint trees (SplitStream:
// every relay-capable member is interior in at most one stripe, so leaves'
// uplinks carry data too), and re-planned incrementally: a join or a leave
// moves only the edges it must. Design and rules: docs/topology.md.
//
// Pure functions over values: no I/O, no clock, no randomness. The same
// inputs (in any order) give the same plan on every machine, so the root
// agent, a standby and the scale simulator agree.
//
// Thread safety: values and reentrant functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "tern/export.h"
#include "tern/status.h"

namespace tern::topology {

inline constexpr uint32_t kMaxStripes = 8;
inline constexpr uint32_t kMaxIdBytes = 256;

struct Member {
  std::string id;       // unique, 1..kMaxIdBytes bytes
  std::string region;   // non-empty
  std::string cluster;  // empty: a cluster of its own
  // Measured (or configured) rates in bytes per second; finite and > 0.
  double uplink_bytes_per_s = 0;
  double downlink_bytes_per_s = 0;
  bool may_relay = true;  // false: always a leaf (a node about to go, a busy engine)
  // Measured round trip to the root (seconds; finite, >= 0; 0: unknown).
  // Among parents at the same depth the planner prefers the one whose
  // first chunk arrives soonest: rtt/2 + one chunk over its uplink.
  double rtt_to_root_s = 0;
  // The intra-cluster transport backend it actually runs (the transport's
  // name after any fallback: "verbs", "ucx", "tcp", "tcp+tls"); empty: none.
  // At most kMaxIdBytes. Only ChooseEdgeTransport reads it.
  std::string intra_backend;
  // Relays and serves nothing (tern-agent --relay-only): no apply competes
  // with forwarding for its CPU, so the planner makes it interior before
  // serving members (placed first, and its open slots taken first among
  // slots at the same depth), within the region rules. Needs may_relay.
  bool relay_only = false;
};

// The chunk size the parent choice assumes (the agent's 1 MiB chunks).
inline constexpr double kPlanChunkBytes = 1 << 20;

struct PlanOptions {
  uint32_t fanout_max = 4;       // children of a member, per stripe (>= 1)
  uint32_t root_fanout_max = 8;  // children of the root, per stripe (>= 1)
  uint32_t stripes = 1;          // 1..kMaxStripes, at most fanout_max
  uint32_t members_max = 1u << 20;
};

// The class of the link an edge uses; the transport registry picks the
// backend from it (RDMA inside a cluster, TCP+TLS across clusters).
enum class Link : uint8_t { kSameCluster = 0, kSameRegion = 1, kCrossRegion = 2 };
TERN_EXPORT Link Classify(const Member& from, const Member& to);
TERN_EXPORT const char* LinkName(Link link);

// The transport an edge runs on, and why. An edge uses the intra-cluster
// transport only when it stays inside one cluster and both ends run the
// same intra backend; a cluster whose members chose different backends (or
// one fell back to none) would otherwise dial an address its transport
// cannot reach, and its members would stall.
enum class EdgeTransport : uint8_t {
  kIntra = 0,               // same cluster, the same intra backend at both ends
  kMainAcrossClusters = 1,  // the edge leaves the cluster (or the region)
  kMainNoIntra = 2,         // an end has no intra-cluster transport
  kMainBackendsDiffer = 3,  // same cluster, different intra backends
};
TERN_EXPORT EdgeTransport ChooseEdgeTransport(const Member& parent, const Member& child);
TERN_EXPORT const char* EdgeTransportName(EdgeTransport t);

// A plan: the root, the members and, per stripe, every member's parent.
struct Plan {
  Member root;
  PlanOptions options;
  std::map<std::string, Member> members;  // by id; the root is not a member
  // The stripe in which a member may relay (be interior); kLeafEverywhere
  // for members with may_relay false.
  static constexpr uint32_t kLeafEverywhere = ~0u;
  std::map<std::string, uint32_t> relay_stripe;
  // parent[s][id]: the parent of member `id` in stripe s (the root's id for
  // members the root feeds).
  std::vector<std::map<std::string, std::string>> parent;
};

// Plans from scratch. kInvalidArgument for bad members or options (duplicate
// or empty ids, a member with the root's id, rates not finite and > 0, empty
// region, relay_only without may_relay), kResourceExhausted when the fan-out
// bounds cannot hold everyone.
TERN_EXPORT Result<Plan> MakePlan(const Member& root, const std::vector<Member>& members,
                                  const PlanOptions& options);

// Incremental re-planning. AddMember attaches the new member in every stripe
// and changes no other edge. RemoveMember re-attaches only the departed
// member's children (their subtrees come along unchanged). A member whose
// rates or relay flag changed is removed and added again by the caller.
TERN_EXPORT Result<Plan> AddMember(const Plan& plan, const Member& member);
TERN_EXPORT Result<Plan> RemoveMember(const Plan& plan, std::string_view id);

// New measured figures for a member (rates and round trip; zero keeps the
// old value). No edge moves: later attachments (joins, re-attached orphans)
// use them. kNotFound for an unknown id, kInvalidArgument for figures that
// are not finite and >= 0.
TERN_EXPORT Result<Plan> UpdateFigures(const Plan& plan, std::string_view id,
                                       double uplink_bytes_per_s, double downlink_bytes_per_s,
                                       double rtt_to_root_s);

// Plans around a relay its children found bad (stalled, or sending chunks
// that fail verification): the member becomes a leaf everywhere
// (may_relay false), its children in its relay stripe are re-attached as
// RemoveMember would, and it is re-attached as a leaf. Every other edge
// stays. kNotFound for an unknown id; a member that already is a leaf
// everywhere gives the plan back unchanged.
TERN_EXPORT Result<Plan> DemoteRelay(const Plan& plan, std::string_view id);

// Undoes DemoteRelay once the member has served its probation (the agent's
// policy decides when: agent/membership/probation.h): it may relay again (may_relay
// true) in the stripe where its region has the fewest relays, as AddMember
// picks. No edge moves: later attachments (joins, re-attached orphans) may
// hang under it. kNotFound for an unknown id; a member that already relays
// gives the plan back unchanged.
TERN_EXPORT Result<Plan> PromoteRelay(const Plan& plan, std::string_view id);

// Checks every invariant: each member reaches the root in every stripe
// without cycles, fan-out bounds hold, only a stripe's relays are interior in
// it, and members/relay_stripe/parent agree. kInternal naming the first
// violation (a plan from the functions above always passes).
TERN_EXPORT Status Validate(const Plan& plan);

// One member's new parent in one stripe, between two plans.
struct Move {
  uint32_t stripe = 0;
  std::string id;
  std::string old_parent;  // empty: was not in the plan
  std::string new_parent;  // empty: left the plan
};
// What the root must tell members after a re-plan (sorted by stripe, id).
TERN_EXPORT std::vector<Move> Diff(const Plan& before, const Plan& after);

// Queries. Children are sorted by id.
TERN_EXPORT std::vector<std::string> Children(const Plan& plan, uint32_t stripe, std::string_view id);
// Edges from the root to `id` (0 for the root; kNotFound for an unknown id).
TERN_EXPORT Result<uint32_t> Depth(const Plan& plan, uint32_t stripe, std::string_view id);

// ---- A delivery-time model, for benchmarks and the demo --------------------
// A version of `bytes` is split evenly over the stripes and pipelined in
// chunks of `chunk_bytes` along every edge. An edge carries
// min(parent uplink / parent's children over all stripes, child downlink /
// stripes) and adds half its round trip. A member's last byte arrives no
// earlier than its parent's plus one chunk and the one-way latency, nor
// earlier than its first chunk plus its share at the edge's rate.
struct LinkModel {
  double rtt_same_cluster_s = 0.0002;
  double rtt_same_region_s = 0.002;
  double rtt_cross_region_s = 0.1;
};
struct Delivery {
  double first_chunk_s = 0;  // the latest first chunk of any member
  double last_byte_s = 0;    // when the last member has every byte
  std::string last_member;   // who that is
  uint32_t depth_max = 0;    // over all stripes
};
TERN_EXPORT Delivery EstimateDelivery(const Plan& plan, uint64_t bytes, uint64_t chunk_bytes,
                                      const LinkModel& model);

}  // namespace tern::topology
