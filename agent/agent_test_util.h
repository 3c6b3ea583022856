// Helpers shared by the agent system tests (agent_test.cc, agent_edge_test.cc).
#pragma once

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "tern/checkpoint.h"

namespace tern::agent_test {

// Bounded waits on real time: the agents run their own threads.
inline bool WaitFor(const std::function<bool()>& cond, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return cond();
}

// "" when every tensor's bytes are equal (names, layouts and data), else the
// first difference.
inline std::string FirstDifference(const std::string& a_path, const std::string& b_path) {
  auto a = Checkpoint::Open(a_path);
  auto b = Checkpoint::Open(b_path);
  if (!a.ok()) return "cannot open " + a_path + ": " + a.status().ToString();
  if (!b.ok()) return "cannot open " + b_path + ": " + b.status().ToString();
  const ServeView& va = (*a)->view();
  const ServeView& vb = (*b)->view();
  if (va.tensors.size() != vb.tensors.size()) return "tensor counts differ";
  for (size_t i = 0; i < va.tensors.size(); ++i) {
    const auto& ta = va.tensors[i];
    const auto& tb = vb.tensors[i];
    if (!ta.desc->SameLayout(*tb.desc) || ta.desc->name != tb.desc->name) return "layout of " + ta.desc->name;
    if (std::memcmp(ta.data, tb.data, ta.desc->bytes()) != 0) return "bytes of " + ta.desc->name;
  }
  return "";
}

}  // namespace tern::agent_test
