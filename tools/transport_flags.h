// The flags that choose and configure the transport (--transport, --tls-*,
// --no-tls, TCP tuning), shared by `tern xfer` and `tern-agent`, and the
// transport they build through the registry. TLS is the default; RDMA
// backends need --no-tls said out loud. docs/cli.md.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "tern/log.h"
#include "tern/status.h"
#include "tern/transport.h"
#include "tern/transport_options.h"

namespace tern::cli {

// --tls-server-name is a client's, --tls-allow-client a server's: a command
// registers those two itself and stores the CLI::Option here.
struct TransportArgs {
  std::string transport, verbs_device, tls_cert, tls_key, tls_ca, tls_pin, tls_server_name,
      tls_allow_client, congestion;
  bool no_tls = false;
  uint64_t notsent_lowat_bytes = 0, socket_buffer_bytes = 0, idle_timeout_ms = 0,
           min_frame_bytes_per_s = 0;
  uint32_t min_wire_version = 1;
  // Given on the command line (an empty value is not the same as none);
  // null where the command has no such flag.
  const CLI::Option* verbs_device_flag = nullptr;
  const CLI::Option* tls_cert_flag = nullptr;
  const CLI::Option* tls_key_flag = nullptr;
  const CLI::Option* tls_ca_flag = nullptr;
  const CLI::Option* tls_pin_flag = nullptr;
  const CLI::Option* tls_server_name_flag = nullptr;
  const CLI::Option* tls_allow_client_flag = nullptr;
};

void AddTransportFlags(CLI::App& cmd, TransportArgs& t);
// "a,b" -> {"a", "b"}; an empty item stays (and is refused where it is used).
std::vector<std::string> CommaList(const std::string& text);
// The TCP options the flags ask for; kInvalidArgument for contradictions.
Result<TcpOptions> TransportOptions(const TransportArgs& t);
// The transport --transport names, from the registry (TLS on turns "tcp"
// into "tcp+tls").
Result<std::unique_ptr<Transport>> MakeTransport(const TransportArgs& f, TcpOptions o);
// tern-agent --transport-intra NAME: the transport for edges inside the
// agent's cluster. "tcp" is plain TCP (a cluster's private network; "tcp+tls"
// keeps the main TLS files), "verbs" and "ucx" RDMA (--verbs-device). A
// backend this machine cannot run (kUnavailable: no device, built without
// it) is no error: `log` gets one line saying so and the result is null, so
// the agent keeps `fallback` (the main transport's name) for those edges.
// Other errors (an unknown name, bad options) are returned.
Result<std::unique_ptr<Transport>> MakeIntraTransport(const std::string& name,
                                                      const TransportArgs& f, TcpOptions o,
                                                      const std::string& fallback,
                                                      const LogFn& log);

}  // namespace tern::cli
