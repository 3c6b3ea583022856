#include "bench/sim/sim_fluid.h"

#include <algorithm>
#include <limits>

namespace tern::sim {

double FluidLastFinish(const std::vector<FluidClass>& classes, double source_bytes_per_s) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> left;
  std::vector<size_t> active;
  for (size_t i = 0; i < classes.size(); ++i) {
    left.push_back(classes[i].bytes_per_flow);
    if (classes[i].flows > 0 && classes[i].bytes_per_flow > 0) active.push_back(i);
  }
  double t = 0, last = 0;
  for (size_t round = 0; !active.empty() && round <= classes.size(); ++round) {
    // Each class's own bound per flow, then one water level for the source.
    std::vector<double> rate(classes.size(), 0);
    std::vector<size_t> order = active;
    for (size_t i : active)
      rate[i] = std::min(classes[i].per_flow_cap_bytes_per_s,
                         classes[i].shared_cap_bytes_per_s / classes[i].flows);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return rate[a] < rate[b]; });
    double budget = source_bytes_per_s;
    double flows_left = 0;
    for (size_t i : order) flows_left += classes[i].flows;
    for (size_t i : order) {
      const double level = budget / flows_left;
      if (rate[i] > level) rate[i] = level;
      budget -= rate[i] * classes[i].flows;
      flows_left -= classes[i].flows;
    }
    double dt = kInf;
    for (size_t i : active) dt = std::min(dt, left[i] / rate[i]);
    t += dt;
    std::vector<size_t> still;
    for (size_t i : active) {
      left[i] -= rate[i] * dt;
      if (left[i] <= classes[i].bytes_per_flow * 1e-12) {
        last = std::max(last, t + classes[i].latency_s);
      } else {
        still.push_back(i);
      }
    }
    active.swap(still);
  }
  return last;
}

}  // namespace tern::sim
