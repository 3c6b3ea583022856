// The tern_agent handle (include/tern/tern.h), shared by agent_api.cc and
// events_api.cc: it owns the agent and the transport it runs on; a
// shared_mutex lets every call run from any thread while tern_agent_stop
// waits for the calls in flight.
#pragma once

#include <atomic>
#include <memory>
#include <shared_mutex>

#include "capi/capi_internal.h"
#include "tern/agent.h"
#include "tern/transport.h"

struct tern_agent {
  static constexpr uint32_t kTag = 0x74416774;  // "tAgt"
  uint32_t tag = kTag;
  // Shared by every call; exclusive while stopping. glibc's rwlock prefers
  // readers, so callers polling in a loop would starve Stop: once
  // `stopping` is set new calls answer kUnavailable without the lock.
  std::shared_mutex mu;
  std::atomic<bool> stopping{false};
  // The agent runs on `transport`: destroyed before it (reset in Stop).
  std::unique_ptr<tern::Transport> transport;
  std::unique_ptr<tern::Agent> agent;  // null once stopped
};

namespace tern::capi {

// The caller's tern_tensor array as PublishTensors' list (the bytes
// borrowed). The stride is tensors[0].struct_size; every element must say
// the same. Checks each tensor's fields, not the list as a whole.
Result<std::vector<PublishTensor>> ReadTensors(const tern_tensor* tensors, size_t count);

inline Status CheckHandle(const tern_agent* a) {
  TERN_REQUIRE(a != nullptr, kInvalidArgument, "agent is NULL");
  TERN_REQUIRE(a->tag == tern_agent::kTag, kInvalidArgument,
               "agent is not a tern_agent (another handle, or one already freed)");
  return Status::Ok();
}

// Runs `body(agent)` under the handle's shared lock; kUnavailable once
// stopped. A body must not block for long (Stop waits for it): event waits
// run in slices (events_api.cc).
template <class Body>
Status WithAgent(tern_agent* a, Body&& body) {
  TERN_RETURN_IF_ERROR(CheckHandle(a));
  TERN_REQUIRE(!a->stopping.load(), kUnavailable, "the agent is stopped (tern_agent_stop)");
  std::shared_lock lock(a->mu);
  TERN_REQUIRE(a->agent != nullptr, kUnavailable, "the agent is stopped (tern_agent_stop)");
  return body(*a->agent);
}

}  // namespace tern::capi
