#include "bench/sim/sim_fluid.h"

#include <algorithm>
#include <limits>

#include "tern/status.h"

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

std::vector<double> ApplyFinishTimes(const std::vector<ApplyJob>& jobs, double cores_per_job,
                                     double shared_cores) {
  const size_t n = jobs.size();
  std::vector<double> finish(n, 0);
  if (shared_cores <= 0) {
    for (size_t i = 0; i < n; ++i) {
      const ApplyJob& j = jobs[i];
      const double end0 = j.release0 + j.work0 / cores_per_job;
      finish[i] = std::max(end0, j.release1) + j.work1 / cores_per_job;
    }
    return finish;
  }
  // Each job's phase (0, 1; 2: done) and the work left in it. A round
  // ends at a release or a completion, each of which happens once per
  // phase: at most 4 rounds per job (the bound on the loop).
  std::vector<int> phase(n, 0);
  std::vector<double> left(n);
  for (size_t i = 0; i < n; ++i) left[i] = jobs[i].work0;
  auto release = [&](size_t i) { return phase[i] == 0 ? jobs[i].release0 : jobs[i].release1; };
  // A phase with no work left ends at once (phase 1 once it is released).
  auto settle = [&](size_t i, double t) {
    if (phase[i] == 0 && left[i] <= 0 && t >= jobs[i].release0) {
      phase[i] = 1;
      left[i] = jobs[i].work1;
    }
    if (phase[i] == 1 && left[i] <= 0 && t >= jobs[i].release1) {
      phase[i] = 2;
      finish[i] = t;
    }
  };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  double t = kInf;
  for (size_t i = 0; i < n; ++i) t = std::min(t, jobs[i].release0);
  for (size_t round = 0; round <= 4 * n + 4; ++round) {
    std::vector<size_t> running;
    double next_release = kInf;
    bool pending = false;
    for (size_t i = 0; i < n; ++i) {
      settle(i, t);
      if (phase[i] == 2) continue;
      pending = true;
      if (t >= release(i))
        running.push_back(i);
      else
        next_release = std::min(next_release, release(i));
    }
    if (!pending) break;
    if (running.empty()) {
      t = next_release;
      continue;
    }
    const double rate = std::min(cores_per_job, shared_cores / double(running.size()));
    double dt = next_release - t;
    for (size_t i : running) dt = std::min(dt, left[i] / rate);
    // The phase that ends at t + dt ends exactly (no rounding residue
    // left for another round).
    for (size_t i : running) left[i] = left[i] <= rate * dt * (1 + 1e-12) ? 0 : left[i] - rate * dt;
    t += dt;
  }
  for (size_t i = 0; i < n; ++i) TERN_ASSERT(phase[i] == 2);  // the bound above holds
  return finish;
}

}  // namespace tern::sim
