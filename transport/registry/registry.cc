// The transport registry (tern/transport_registry.h): the only code above
// the backends that includes their headers.
#include "tern/transport_registry.h"

#include <cstdlib>

#include <algorithm>

#include "tern/loopback_transport.h"
#include "tern/tcp_transport.h"
#include "tern/ucx_transport.h"
#include "tern/verbs_transport.h"

namespace tern {

namespace {

bool Known(const std::string& name) {
  const auto& names = TransportNames();
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string KnownList() {
  std::string out;
  for (const auto& n : TransportNames()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Only tcp encrypts (kCapEncrypted); the RDMA backends and loopback do not.
bool CarriesTls(const std::string& name) { return name == "tcp" || name == "tcp+tls"; }

// The probe's name for a registry name ("tcp+tls" is tcp's).
std::string ProbeName(const std::string& name) { return name == "tcp+tls" ? "tcp" : name; }

const BackendProbe* Find(const std::vector<BackendProbe>& probes, const std::string& name) {
  for (const auto& p : probes) {
    if (p.backend == ProbeName(name)) return &p;
  }
  return nullptr;
}

bool Available(const std::vector<BackendProbe>& probes, const std::string& name) {
  const BackendProbe* p = Find(probes, name);
  return p != nullptr && p->available;
}

std::string WhyNot(const std::vector<BackendProbe>& probes, const std::string& name) {
  const BackendProbe* p = Find(probes, name);
  if (p == nullptr) return name + ": not probed";
  return name + ": " + (p->detail.empty() ? "unavailable" : p->detail);
}

// A backend that cannot run here says why; the probe may know more (which
// devices and ports it found), and the registry promises its reason.
Result<std::unique_ptr<Transport>> WithProbeReason(Result<std::unique_ptr<Transport>> made,
                                                   BackendProbe (*probe)()) {
  if (made.ok() || made.status().code() != Code::kUnavailable || probe == nullptr) return made;
  const BackendProbe p = probe();
  if (p.detail.empty() || made.status().message().find(p.detail) != std::string::npos) return made;
  return Status(Code::kUnavailable, made.status().message() + " (probe: " + p.detail + ")");
}

// The name to make for a backend chosen with or without TLS.
std::string WithTls(const std::string& backend, bool tls) {
  return backend == "tcp" && tls ? "tcp+tls" : backend;
}

}  // namespace

const std::vector<std::string>& TransportNames() {
  static const std::vector<std::string> kNames = {"verbs", "ucx", "tcp", "tcp+tls", "loopback"};
  return kNames;
}

Result<std::unique_ptr<Transport>> NewTransport(const std::string& name,
                                                const TransportOptions& options, Clock& clock) {
  if (name == "tcp") {
    TERN_REQUIRE(!options.tcp.tls.enabled, kInvalidArgument,
                 "transport 'tcp' is plain TCP but its options turn TLS on; ask for 'tcp+tls'");
    return NewTcpTransport(options.tcp, clock);
  }
  if (name == "tcp+tls") {
    TcpOptions tcp = options.tcp;
    tcp.tls.enabled = true;
    TERN_REQUIRE(!tcp.tls.cert_file.empty() && !tcp.tls.key_file.empty() && !tcp.tls.ca_file.empty(),
                 kInvalidArgument, "transport 'tcp+tls' needs a certificate, its key and a CA");
    return NewTcpTransport(std::move(tcp), clock);
  }
  if (name == "ucx") {
    // tern/transport_registry.h says why; overwrite=0 keeps the user's value.
    ::setenv("UCX_TCP_CM_REUSEADDR", "y", /*overwrite=*/0);
    return WithProbeReason(NewUcxTransport(options.ucx, clock), ProbeUcx);
  }
  if (name == "verbs") {
    // The probe looks at the system's libibverbs only (not a test's softverbs).
    const bool system_library = options.verbs.library == VerbsOptions{}.library;
    return WithProbeReason(NewVerbsTransport(options.verbs, clock),
                           system_library ? ProbeVerbs : nullptr);
  }
  if (name == "loopback") {
    TERN_REQUIRE(options.loopback_network != nullptr, kInvalidArgument,
                 "transport 'loopback' needs TransportOptions::loopback_network");
    return NewLoopbackTransport(*options.loopback_network);
  }
  return TERN_ERROR(kInvalidArgument, "unknown transport '", name, "' (known: ", KnownList(), ")");
}

Result<std::string> ChooseTransport(const PeerPolicy& policy, const PeerLocation& self,
                                    const PeerLocation& peer, const std::vector<BackendProbe>& probes) {
  for (const auto& name : policy.same_cluster) {
    TERN_REQUIRE(Known(name), kInvalidArgument, "peer policy: unknown backend '", name,
                 "' in same_cluster (known: ", KnownList(), ")");
  }
  TERN_REQUIRE(Known(policy.cross_cluster), kInvalidArgument, "peer policy: unknown backend '",
               policy.cross_cluster, "' in cross_cluster (known: ", KnownList(), ")");
  const bool same_cluster =
      !self.cluster.empty() && self.region == peer.region && self.cluster == peer.cluster;
  const bool tls = same_cluster ? policy.tls_inside_cluster : policy.tls_leaving_cluster;

  if (auto it = policy.overrides.find(peer.id); it != policy.overrides.end()) {
    const std::string& pinned = it->second;
    TERN_REQUIRE(Known(pinned), kInvalidArgument, "peer ", peer.id, " is pinned to unknown backend '",
                 pinned, "' (known: ", KnownList(), ")");
    TERN_REQUIRE(Available(probes, pinned), kInvalidArgument, "peer ", peer.id,
                 " is pinned to backend '", pinned, "', which is not available here (",
                 WhyNot(probes, pinned), ")");
    TERN_REQUIRE(!tls || CarriesTls(pinned), kInvalidArgument, "peer ", peer.id, " is pinned to '",
                 pinned, "', which carries no TLS, but its link ",
                 same_cluster ? "inside the cluster" : "leaves the cluster",
                 " must be encrypted (turn TLS off for a trusted interconnect)");
    return WithTls(pinned, tls);
  }

  const std::vector<std::string> candidates =
      same_cluster ? policy.same_cluster : std::vector<std::string>{policy.cross_cluster};
  std::string why;
  for (const auto& name : candidates) {
    if (tls && !CarriesTls(name)) {
      why += "; " + name + ": carries no TLS";
    } else if (!Available(probes, name)) {
      why += "; " + WhyNot(probes, name);
    } else {
      return WithTls(name, tls);
    }
  }
  return TERN_ERROR(kUnavailable, "no available backend reaches peer ", peer.id, " (",
                    same_cluster ? "same cluster" : "other cluster or region",
                    tls ? ", TLS required" : "", why, ")");
}

Result<std::unique_ptr<Transport>> NewTransportForPeer(const PeerPolicy& policy,
                                                       const PeerLocation& self,
                                                       const PeerLocation& peer,
                                                       const TransportOptions& options,
                                                       Clock& clock) {
  TERN_ASSIGN_OR_RETURN(std::string name, ChooseTransport(policy, self, peer, ProbeTransports()));
  return NewTransport(name, options, clock);
}

}  // namespace tern
