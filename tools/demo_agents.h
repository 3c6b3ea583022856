// `tern demo` (the default run): the transfer agent end to end on this
// machine; tools/demo_agents.cc. `tern demo --codec` is the codec alone.
#pragma once

#include <cstdint>
#include <string>

#include "tern/datagen.h"
#include "tern/status.h"

namespace tern::cli {

struct AgentDemoArgs {
  uint32_t members = 12;
  uint32_t regions = 3;
  uint32_t versions = 8;
  uint32_t stripes = 1;
  uint64_t params = 0;
  unsigned threads = 0;
  std::string dir;  // empty: a temporary directory
  bool keep = false;
  bool verbose = false;
  bool no_stream_apply = false;  // AgentOptions::stream_apply false for every member
  TraceConfig config;  // shape from params
};

Status RunAgentDemo(const AgentDemoArgs& a);

}  // namespace tern::cli
