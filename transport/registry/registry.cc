// The transport registry (tern/transport_registry.h): the only code above
// the backends that includes their headers.
#include "tern/transport_registry.h"

#include <cstdlib>

#include "tern/loopback_transport.h"
#include "tern/tcp_transport.h"
#include "tern/ucx_transport.h"
#include "tern/verbs_transport.h"

namespace tern {

namespace {

std::string KnownList() {
  std::string out;
  for (const auto& n : TransportNames()) out += (out.empty() ? "" : ", ") + n;
  return out;
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

}  // namespace tern
