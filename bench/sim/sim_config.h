// The simulator's inputs: measured component costs (costs.json, each value
// with its source) and a scenario (model, topology, plan options, transport
// settings, failures), both read from JSON. Units are SI inside (bytes,
// bytes per second, seconds); the JSON names carry theirs (_gbit_s, _ms).
//
// Thread safety: values.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tern/status.h"
#include "tern/topology.h"

namespace tern::sim {

// A piecewise log-linear table: x (> 0) -> y, interpolated in log(x),
// clamped outside its range. Used for figures measured at a few densities.
struct Curve {
  std::vector<std::pair<double, double>> points;  // sorted by x, x > 0
  double At(double x) const;
};

struct Costs {
  // Transport: goodput over link rate with the agent's 8 streams (BBR) on a
  // WAN edge and on a LAN edge.
  double wan_efficiency = 1.0;
  double lan_efficiency = 1.0;
  // Single-flow TCP under random loss (Mathis et al.: MSS/RTT * C/sqrt(p)),
  // applied per stream when the congestion control is loss-based ("cubic").
  double mss_bytes = 1448;
  double mathis_c = 1.22;
  double per_flow_cap_bytes_per_s = 0;  // a cloud's per-flow cap; 0: none
  // A relay's CPU per forwarded byte (receive, SHA-256 per chunk, TLS): a
  // chunk is verified before it is forwarded, so this is per-hop latency.
  double relay_s_per_byte = 0;
  double hop_s_per_chunk = 0;  // fixed cost per chunk and hop
  // Patch size: bits per changed value (format 1) against the changed
  // fraction; format 2 is format 1 times format2_ratio.
  Curve bits_per_change;
  double format2_ratio = 1.0;
  // Served bytes per parameter of each format ("bf16", "fp8", "mxfp4", ...).
  std::vector<std::pair<std::string, double>> view_bytes_per_param;
  // Apply (decode + write) and diff (encode) cost as a multiple of a memcpy
  // of the whole view, per core, against the changed fraction, for patch
  // formats 1 and 2 ([0], [1]); the memcpy rate per core.
  Curve apply_per_memcpy[2];
  Curve encode_per_memcpy[2];
  double memcpy_bytes_per_s = 1e10;
  double http_efficiency = 1.0;  // baseline (a): one HTTP stream per island
  // Apply while receiving: the share of a patch's apply left after its
  // last byte when it comes in more than one chunk (the rest runs as its
  // chunks arrive). 1: none of it overlaps.
  double stream_apply_tail = 1.0;
  // The root's time from a patch ready (written and signed) to its OFFER
  // (the board record): every time the simulator reports counts from ready.
  double offer_delay_s = 0;
};

struct RegionSpec {
  std::string name;
  uint32_t islands = 0;
  uint32_t clusters = 1;  // islands dealt round-robin to clusters
  double island_downlink_bytes_per_s = 0;
  double island_uplink_bytes_per_s = 0;
  double one_way_s = 0.0005;           // between clusters of the region
  double cluster_one_way_s = 0.00002;  // inside a cluster
  double lan_loss = 0;
  // Inter-region ingress of the region (all WAN edges into it share it);
  // 0: only the per-pair links limit.
  double ingress_bytes_per_s = 0;
};

struct WanLinkSpec {
  std::string a, b;             // region names; the link serves both directions
  double rate_bytes_per_s = 0;  // per direction
  double one_way_s = 0;
  double loss = 0;  // random loss probability per packet
};

struct FailureSpec {
  double relay_failures_per_hour = 0;  // per member; 0: none
  double detect_s =
      3.0;  // the root learns of it (closed connection: ~RTT; silent: --dead-after-ms)
  double repair_s = 600;  // a failed island joins again after this long
  uint64_t seed = 1;
  // Failures at given times of the run (seconds from the first publish),
  // besides the random ones: what-if runs and tests.
  std::vector<std::pair<double, std::string>> at;
};

struct Scenario {
  std::string name;
  // Model and change.
  double params = 0;
  std::string format = "bf16";
  double changed_fraction = 0.01;
  uint32_t patch_format = 2;
  double patch_bytes = 0;  // > 0: given (an anchor), not computed
  // Topology.
  std::string root_region;
  double root_uplink_bytes_per_s = 0;
  std::vector<RegionSpec> regions;
  std::vector<WanLinkSpec> links;
  // Planning (the agent's options) and the join order.
  topology::PlanOptions plan;
  std::string plan_build = "joins";  // "joins" (the root's Membership) or "batch" (MakePlan)
  // Transport and relay.
  uint64_t chunk_bytes = 0;     // 0: the root's (agent::DefaultChunkBytes)
  uint32_t window_chunks = 16;  // chunk windows per parent link (RelayOptions::window_chunks)
  uint64_t push_window_bytes = 2 << 20;  // 0: push off (OFFER -> WANT first)
  uint32_t streams = 8;
  std::string congestion = "bbr";  // "bbr": not loss-bound; "cubic": Mathis per stream
  // Islands' CPU for apply (cores), the root's for encode.
  double apply_cores = 16;
  // > 0: every island's apply shares this many cores (processor sharing), as
  // on one machine that hosts the whole fleet (the WAN testbed); each apply
  // still uses at most apply_cores. 0: every island has its own.
  double shared_apply_cores = 0;
  bool stream_apply = true;  // the agent's default (--no-stream-apply: false)
  double encode_cores = 32;
  double memcpy_bytes_per_s = 0;  // the hosts' memcpy per core; 0: the costs file's
  // Cores a relay spends forwarding: its sends are capped at
  // relay_cores / relay_s_per_byte bytes per second over all its children
  // (the measured CPU per forwarded byte as a rate). 0: no cap.
  double relay_cores = 0;
  // Versions and failures.
  uint32_t versions = 1;
  double version_interval_s = 60;
  FailureSpec failures;
  // Baselines: (a) full checkpoint over HTTP from the root, one stream per
  // island; (d) each island pulls the patch from one store (no relays).
  double store_egress_bytes_per_s = 0;  // 0: the root's uplink
  uint32_t baseline_http_streams = 1;
};

Result<Costs> ParseCosts(const std::string& json_text);
Result<Scenario> ParseScenario(const std::string& json_text);

// Bytes of the served view and of one version's patch.
Result<double> ViewBytes(const Scenario& s, const Costs& c);
Result<double> PatchBytes(const Scenario& s, const Costs& c);

}  // namespace tern::sim
