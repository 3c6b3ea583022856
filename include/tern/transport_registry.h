// The transport registry: the one place that knows the shipped backends.
// Everything above the transport contract (the CLI, the agent's driver)
// makes its transports here, by name, and never includes a backend header
// (docs/architecture.md; scripts/check_layout.py enforces it).
//
//   By name:  NewTransport("tcp+tls", options) — what `--transport` and
//             `--transport-intra` name.
//   Probe:    ProbeTransports() says which backends work on this machine
//             and why the others do not (`tern transports`).
//
// Which backend carries which link is the operator's choice, not this
// header's: an agent runs its main transport (TCP with TLS) for every link
// and, inside its cluster, may run a second one (RDMA); the root picks one
// of the two per edge (docs/agent.md, "Transport per edge").
//
// Thread safety: every function may be called from any thread; they keep no
// state. NewTransport("ucx") sets UCX_TCP_CM_REUSEADDR (see below), the only
// process-wide effect.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tern/export.h"
#include "tern/status.h"
#include "tern/transport.h"
#include "tern/transport_options.h"
#include "tern/transport_probe.h"

namespace tern {

class LoopbackNetwork;  // tern/loopback_transport.h

// The options of every backend; NewTransport hands each backend its part.
struct TransportOptions {
  // "tcp" and "tcp+tls". The name decides TLS: "tcp+tls" turns tcp.tls on
  // (its files must be given); "tcp" refuses tcp.tls.enabled.
  TcpOptions tcp;
  UcxOptions ucx;
  VerbsOptions verbs;
  // "loopback": the in-process network to join; must outlive the transport.
  LoopbackNetwork* loopback_network = nullptr;
};

// The names NewTransport knows, in the order `tern transports` lists them:
// "verbs", "ucx", "tcp", "tcp+tls", "loopback".
TERN_EXPORT const std::vector<std::string>& TransportNames();

// Makes the backend `name` names. kInvalidArgument for an unknown name or
// options that contradict it; otherwise what the backend's constructor says:
// kUnavailable with the probe's reason where a backend cannot run here
// ("verbs: libibverbs.so.1 loaded, 0 devices", "built without UCX"), kIo or
// kInvalidArgument for TLS files that do not load.
//
// "ucx": a restarted server must be able to listen on its port again while
// its old connections linger in TIME_WAIT, as tcp can. UCX 1.13 binds its
// listening socket with SO_REUSEADDR only when the environment says so
// (ucp_config_modify does not reach its connection manager), so this sets
// UCX_TCP_CM_REUSEADDR=y in the process environment unless the user set it
// (a value the user set wins). Call it before other threads read the
// environment.
TERN_EXPORT Result<std::unique_ptr<Transport>> NewTransport(const std::string& name,
                                                            const TransportOptions& options,
                                                            Clock& clock = SteadyClock());

// Every backend, probed at run time, in preference order for peers inside
// one cluster (verbs, ucx, tcp, loopback).
TERN_EXPORT std::vector<BackendProbe> ProbeTransports();

// TEST ONLY: `inner` under the fault decorator (tern/fault_transport.h) with
// the policy `spec` writes as text: comma-separated KEY=VALUE of FaultPolicy
// fields (seed, corrupt_at_byte, tamper_at_byte, tamper_chunks,
// drop_after_bytes, drop_connections), decimal. For process-level tests that
// cannot build a FaultPolicy in code: tern-agent with TERN_TEST_FAULTS in
// its environment (tests/soak/soak.py). kInvalidArgument for an unknown key
// or a malformed value, so a typo never runs fault-free. `inner` must
// outlive the result.
TERN_EXPORT Result<std::unique_ptr<Transport>> NewTestFaultTransport(Transport& inner,
                                                                     std::string_view spec);

}  // namespace tern
