// Throwaway PKI for tests: a CA, a server and two client certificates it
// signed, and a rogue CA with its own client certificate; more certificates
// with chosen names on demand. Generated at test time with the openssl CLI
// into a fresh temporary directory, removed at exit; never committed.
#pragma once

#include <string>

#include "tern/status.h"
#include "tern/tcp_transport.h"

namespace tern::testing {

struct TestPki {
  bool ok = false;
  std::string error;
  std::string dir;         // where the files are
  TlsConfig server;        // signed by the CA; DNS:localhost, IP:127.0.0.1, IP:::1
  TlsConfig client;        // signed by the CA; DNS:client.tern.test
  TlsConfig other_client;  // signed by the CA too, DNS:other-client.tern.test
  TlsConfig rogue_client;  // signed by another CA, trusting ours; DNS:localhost, IP:127.0.0.1
};

// Generated once per process.
const TestPki& TestCerts();

// A certificate named `name` (a file stem: [a-z0-9-]) signed by the test CA,
// with the subjectAltName `sans` ("DNS:a.example,IP:127.0.0.1"; empty: none)
// and extendedKeyUsage `eku` ("serverAuth", "clientAuth"; empty: none),
// as a TlsConfig trusting the test CA. Minted once per name per process.
Result<TlsConfig> MintCert(const std::string& name, const std::string& sans,
                           const std::string& eku = "");

// The SHA-256 fingerprint of a PEM certificate, as TlsConfig::peer_sha256
// wants it ("sha256:" + 64 hex digits).
Result<std::string> CertSha256(const std::string& pem_file);

}  // namespace tern::testing
