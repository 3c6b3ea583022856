// The transport registry: the one place that knows the shipped backends.
// Everything above the transport contract (the CLI, the agent) makes its
// transports here, by name or by peer, and never includes a backend header
// (docs/architecture.md; scripts/check_layout.py enforces it).
//
//   By name:  NewTransport("tcp+tls", options) — what `--transport` names.
//   By peer:  ChooseTransport(policy, self, peer, probes) applies the rule
//             "RDMA (verbs, else UCX) inside one cluster, multi-stream TCP
//             with TLS across clusters and regions" to what the run-time
//             probe found; NewTransportForPeer makes the chosen one.
//   Probe:    ProbeTransports() says which backends work on this machine
//             and why the others do not (`tern transports`).
//
// Thread safety: every function may be called from any thread; they keep no
// state. NewTransport("ucx") sets UCX_TCP_CM_REUSEADDR (see below), the only
// process-wide effect.
#pragma once

#include <map>
#include <memory>
#include <string>
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

// ---- choosing by peer ----

struct PeerLocation {
  std::string id;  // stable peer name, the key of overrides
  std::string region;
  std::string cluster;
};

// Two peers are in one cluster when both name the same region and the same
// non-empty cluster; everything else (another cluster, another region, an
// unknown location) leaves the cluster.
struct PeerPolicy {
  // Preference inside one cluster, the first available wins.
  std::vector<std::string> same_cluster = {"verbs", "ucx", "tcp"};
  std::string cross_cluster = "tcp";
  // TLS on links that leave the cluster (and inside it). Only tcp carries
  // TLS: where TLS is on, an RDMA backend is not chosen, and an override
  // pinning one is refused; turn TLS off for a trusted private interconnect.
  bool tls_leaving_cluster = true;
  bool tls_inside_cluster = false;
  std::map<std::string, std::string> overrides;  // peer id -> backend name
};

// The backend name (as NewTransport takes it: "verbs", "ucx", "tcp",
// "tcp+tls") for `peer`, given what the probe found (`probes`: usually
// ProbeTransports()). kUnavailable when no available backend fits, with
// the probe's reasons for the preferred ones; kInvalidArgument for a policy
// naming an unknown backend, or an override that is unavailable here or
// carries no TLS where TLS is required. Pure function of its inputs.
TERN_EXPORT Result<std::string> ChooseTransport(const PeerPolicy& policy, const PeerLocation& self,
                                                const PeerLocation& peer,
                                                const std::vector<BackendProbe>& probes);

// ChooseTransport with ProbeTransports(), then NewTransport. An agent that
// talks to many peers chooses per peer and keeps one transport per name.
TERN_EXPORT Result<std::unique_ptr<Transport>> NewTransportForPeer(const PeerPolicy& policy,
                                                                   const PeerLocation& self,
                                                                   const PeerLocation& peer,
                                                                   const TransportOptions& options,
                                                                   Clock& clock = SteadyClock());

}  // namespace tern
