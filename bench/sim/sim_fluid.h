// Flows sharing links by max-min fairness (a fluid model), for the
// baselines in which every island pulls from one source: (a) a full
// checkpoint over HTTP from the root, (d) each patch from one store. Flows
// of a class (one region's islands) are identical: same bytes, same caps.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

namespace tern::sim {

struct FluidClass {
  uint32_t flows = 0;
  double bytes_per_flow = 0;
  double per_flow_cap_bytes_per_s = 0;  // the island's downlink, its streams
  double shared_cap_bytes_per_s = 0;    // shared by the class (its WAN link); inf: none
  double latency_s = 0;                 // added to every flow's finish
};

// When the last flow finishes: all classes start at 0 and share
// source_bytes_per_s; rates are re-balanced (max-min) whenever a class ends.
double FluidLastFinish(const std::vector<FluidClass>& classes, double source_bytes_per_s);

}  // namespace tern::sim
