// Which transport backends this process can use, found at run time (not by
// #ifdef): a backend absent here says why ("verbs: libibverbs.so.1 loaded,
// 0 devices"). Used by the CLI (`tern transports`), by the registry's
// reasons and by tests that skip a backend with the probe's reason.
//
// Probing is cheap (no connections, no traffic) but not free: the UCX probe
// creates and destroys a UCX context. Thread safety: safe from any thread.
#pragma once

#include <string>
#include <vector>

#include "tern/export.h"

namespace tern {

struct BackendProbe {
  std::string backend;     // "loopback", "tcp", "ucx", "verbs"
  bool available = false;  // NewXTransport can be expected to succeed
  std::string detail;      // what was found, or why it is unavailable
};

// Each RDMA backend's own probe; ProbeTransports (tern/transport_registry.h)
// runs them all.
TERN_EXPORT BackendProbe ProbeUcx();
TERN_EXPORT BackendProbe ProbeVerbs();

}  // namespace tern
