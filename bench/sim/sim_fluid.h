// Flows sharing links by max-min fairness (a fluid model), for the
// baselines in which every island pulls from one source: (a) a full
// checkpoint over HTTP from the root, (d) each patch from one store. Flows
// of a class (one region's islands) are identical: same bytes, same caps.
// And islands' applies sharing cores (processor sharing), for a fleet
// hosted on one machine (the WAN testbed).
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

// One island's apply of a version in two phases: the part done while the
// patch arrives (apply while receiving: work0 core-seconds, from release0,
// its first chunk) and the part left after its last byte (work1, from
// release1, no earlier than phase 0's end). Works are >= 0; a phase of 0
// work takes no time.
struct ApplyJob {
  double release0 = 0, work0 = 0;
  double release1 = 0, work1 = 0;
};

// When each job's phase 1 ends. Each job runs on at most cores_per_job
// cores (> 0). shared_cores > 0: every running job shares those cores
// equally (processor sharing: n running jobs get min(cores_per_job,
// shared_cores / n) each, re-balanced whenever one starts or ends);
// shared_cores = 0: every job has its own cores_per_job.
std::vector<double> ApplyFinishTimes(const std::vector<ApplyJob>& jobs, double cores_per_job,
                                     double shared_cores);

}  // namespace tern::sim
