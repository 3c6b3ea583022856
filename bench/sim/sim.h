// The scale simulator: a version's patch flowing chunk by chunk through the
// relay trees that the agent's own root would plan for a fleet (islands join
// the root's agent::Membership, which plans with topology::AddMember; a
// failed relay leaves it through Membership::Leave, topology::RemoveMember),
// with link serialisation, store-and-forward per chunk, credit windows,
// TCP throughput under loss, relay verify costs and apply. Design, model
// and its limits: docs/scale.md.
//
// Thread safety: none; a Simulator is used by one thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/sim/sim_config.h"
#include "tern/status.h"
#include "tern/topology.h"

namespace tern::sim {

struct Hop {
  std::string id;  // "root" for the root
  std::string region;
  double first_chunk_s = 0;
  double last_chunk_s = 0;
  double rate_bytes_per_s = 0;  // of the edge into this node (0 for the root)
};

struct VersionResult {
  uint64_t version = 0;
  double start_s = 0;                              // publish time on the run's clock
  double first_holding_s = 0, last_holding_s = 0;  // from publish
  double first_serving_s = 0, last_serving_s = 0;
  std::string last_island;
  uint32_t islands = 0;                     // members that had to receive it
  uint32_t failed = 0;                      // members that failed while it flowed
  uint32_t replans = 0;                     // plan changes while it flowed
  std::vector<Hop> critical_path;           // root .. last island, in the last stripe to finish
  std::map<std::string, double> wan_bytes;  // "from->to" -> bytes sent on that link
};

struct BaselineResult {
  double last_holding_s = 0;
  double last_serving_s = 0;
  std::map<std::string, double> wan_bytes;
};

struct RunResult {
  double view_bytes = 0, patch_bytes = 0;
  double encode_s = 0, apply_s = 0;
  // The physical bound: patch / narrowest of (root uplink, each region's
  // ingress, each island's downlink) + one-way latency to the farthest island.
  double bound_s = 0;
  double bound_rate_bytes_per_s = 0;
  std::string bound_narrowest;
  double farthest_one_way_s = 0;
  // The planner's own delivery model (topology::EstimateDelivery) on the
  // first version's plan, for comparison.
  double planner_estimate_s = 0;
  uint32_t members = 0, depth_max = 0, relays = 0, stripes = 0;
  std::vector<VersionResult> versions;
  BaselineResult full_star;   // (a)
  BaselineResult store_pull;  // (d)
};

class Simulator {
 public:
  // Builds the fleet: every island joins the root's Membership in turn
  // (regions interleaved, as they would come up together).
  static Result<std::unique_ptr<Simulator>> Create(const Scenario& scenario, const Costs& costs);
  ~Simulator();

  Result<RunResult> Run();

  // The current plan (what the agent's root holds).
  const topology::Plan& plan() const;

 private:
  struct Impl;
  explicit Simulator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One TCP stream's rate under random loss p at round trip rtt
// (Mathis: MSS/RTT * C/sqrt(p)); infinity for p = 0.
double MathisBytesPerS(double mss_bytes, double rtt_s, double loss, double c);

}  // namespace tern::sim
