// Throwaway PKI for tests: a CA, a server and two client certificates it
// signed, and a rogue CA with its own client certificate. Generated at test time with
// the openssl CLI into a fresh temporary directory; never committed.
#pragma once

#include <string>

#include "tern/tcp_transport.h"

namespace tern::testing {

struct TestPki {
  bool ok = false;
  std::string error;
  TlsConfig server;        // signed by the CA
  TlsConfig client;        // signed by the CA
  TlsConfig other_client;  // signed by the CA too, another identity
  TlsConfig rogue_client;  // signed by another CA, trusting ours
};

// Generated once per process.
const TestPki& TestCerts();

}  // namespace tern::testing
