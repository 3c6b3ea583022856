// Who a TLS peer must be, beyond "the CA signed its certificate" (the rules
// of TlsConfig, include/tern/tcp_transport.h): the server's name or IP for a
// client, an allow-list of clients for a server, SHA-256 pins for both. The
// handshake (pipe.cc) attaches a PeerCheck to each SSL object; OpenSSL's
// verify callback applies it and keeps the reason of a refusal for the error.
#pragma once

#include <openssl/ssl.h>

#include <string>
#include <vector>

#include "tern/status.h"
#include "tern/tcp_transport.h"

namespace tern::tcp {

// TlsConfig's identity fields, validated.
struct PeerRules {
  std::string server_name;                // brackets stripped; empty: the dialled host
  std::vector<std::string> client_names;  // brackets stripped
  std::vector<std::string> pins;          // raw 32-byte SHA-256 digests

  // kInvalidArgument for a malformed name or pin, or more than kMaxTlsNames.
  static Result<PeerRules> FromConfig(const TlsConfig& config);
};

// One handshake's check. Lives on the handshake's stack; attached with
// Attach() for the handshake only (no post-handshake authentication).
struct PeerCheck {
  const PeerRules* rules = nullptr;
  bool server = false;   // we are the server: the peer is a client
  std::string expected;  // client: the name the server's certificate must hold
  std::string failure;   // the first reason the peer was refused; empty: none

  // Client: makes OpenSSL match the server's certificate against
  // rules->server_name, or dialled_host when that is empty (DNS SAN for a
  // name, also sent as SNI; IP SAN for an IP literal).
  Status ExpectServer(SSL* ssl, const std::string& dialled_host);
  void Attach(SSL* ssl) { SSL_set_app_data(ssl, this); }
  static void Detach(SSL* ssl) { SSL_set_app_data(ssl, nullptr); }
};

// The verify callback for SSL_CTX_set_verify: applies the attached
// PeerCheck (none attached: OpenSSL's verdict stands).
int VerifyPeer(int ok, X509_STORE_CTX* store);

// "sha256:" + 64 hex digits (':' between bytes allowed) -> 32 raw bytes.
Result<std::string> ParseSha256Pin(const std::string& text);

}  // namespace tern::tcp
