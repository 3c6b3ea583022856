// Two UCX transports for tests that need a server and a client (the shared
// conformance suite): UCX's tcp transport on loopback only, quiet logs.
#pragma once

#include <memory>
#include <utility>

#include "tern/ucx_transport.h"

namespace tern::ucx {

inline Result<std::pair<std::unique_ptr<Transport>, std::unique_ptr<Transport>>> NewLoopbackPairForTests() {
  UcxOptions o;
  o.tls = "tcp";
  o.net_devices = "lo";
  o.log = [](std::string_view) {};
  TERN_ASSIGN_OR_RETURN(auto server, NewUcxTransport(o));
  TERN_ASSIGN_OR_RETURN(auto client, NewUcxTransport(o));
  return std::make_pair(std::move(server), std::move(client));
}

}  // namespace tern::ucx
