// TLS for cpp-httplib, client and server, shared by the etcd client
// (agent/etcd, docs/agent/etcd.md §1) and the admin port with its clients
// (agent/ops, docs/agent/operations.md "TLS"): the PEM material parsed once
// with bounds, and connections and servers made with it.
//
// Client. The server's certificate must chain to the given CA(s) alone:
// the system's trust store is not consulted when a CA is given (a public
// CA's certificate for the server's name is not our server). Its
// subjectAltName must name the host we dialled. Our client certificate,
// when given, is presented (etcd's --client-cert-auth). The verification
// is OpenSSL's, during the handshake, not cpp-httplib's: the connection is
// made with SSL_VERIFY_PEER, our CA (or the system's store) and the
// dialled host or IP set as the name to match, and httplib's own check is
// off. Its subjectAltName matcher in 0.11 reads 16 bytes of an IPv4 SAN
// when the host dialled is IPv6 (a heap over-read ASan caught).
//
// Server. NewHttpsServer serves with a certificate (chain) and its key,
// TLS 1.2 or newer; with a client CA, only to clients that present a
// certificate chaining to it (mutual TLS; OpenSSL checks the chain and the
// clientAuth purpose during the handshake, and a client without one, or
// with one from another CA, ends in a handshake alert).
//
// Thread safety: an HttpsClientTls is immutable after Create; Connect may be
// called from any thread. It must outlive every client it made (the verify
// callback points at it).
#pragma once

#include <signal.h>

#include <memory>
#include <string>

#include "tern/status.h"

namespace httplib {
class ClientImpl;
class Server;
}  // namespace httplib

namespace tern::agent {

// OpenSSL writes with write(2), not send(MSG_NOSIGNAL): a write to a TLS
// connection the peer has closed raises SIGPIPE, whose default kills the
// process. For its scope this blocks SIGPIPE in the calling thread and, on
// the way out, discards one that our writes raised (libpq does the same);
// the process's disposition is untouched.
class SigpipeBlock {
 public:
  SigpipeBlock();
  ~SigpipeBlock();
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t old_;
  bool was_blocked_ = false;
  bool was_pending_ = false;
};

// How error messages name what was wrong: the user ("etcd TLS") and the
// flags that gave each file ("--etcd-cacert").
struct TlsNames {
  std::string what = "TLS";
  std::string ca_flag = "the CA file";
  std::string cert_flag = "the certificate file";
  std::string key_flag = "the key file";
};

class HttpsClientTls {
 public:
  // ca_pem: one or more CA certificates (empty: the system's trust store);
  // cert_pem and key_pem: both or neither; the key must match the
  // certificate. kInvalidArgument naming which part is wrong; no PEM text in
  // messages.
  static Result<std::unique_ptr<HttpsClientTls>> Create(const std::string& ca_pem,
                                                        const std::string& cert_pem,
                                                        const std::string& key_pem,
                                                        const TlsNames& names);
  ~HttpsClientTls();
  HttpsClientTls(const HttpsClientTls&) = delete;
  HttpsClientTls& operator=(const HttpsClientTls&) = delete;

  bool has_client_cert() const;
  bool has_ca() const;
  // A new TLS client for host:port (connects lazily, as cpp-httplib does).
  Result<std::unique_ptr<httplib::ClientImpl>> Connect(const std::string& host, int port) const;
  // Why the last TLS handshake on this thread failed, for an error
  // message: the certificate verification result, or OpenSSL's error, or ""
  // if neither says anything. *server_refused (optional): the server's
  // certificate failed verification (chain or name). Clears what it read.
  static std::string HandshakeError(bool* server_refused = nullptr);

 private:
  struct Material;
  explicit HttpsClientTls(std::unique_ptr<Material> material);
  std::unique_ptr<Material> material_;
};

// An httplib::SSLServer serving cert_pem (the leaf first, then any
// intermediates) with key_pem (unencrypted, matching the leaf). With
// client_ca_pem (one or more CA certificates, names.ca_flag names it), a
// client certificate signed by one of them is required. Bind and listen as
// with httplib::Server. kInvalidArgument naming the bad part.
// Its worker threads write with OpenSSL: run its listen loop in a thread
// that blocks SIGPIPE (the workers inherit the mask).
Result<std::unique_ptr<httplib::Server>> NewHttpsServer(const std::string& cert_pem,
                                                        const std::string& key_pem,
                                                        const TlsNames& names,
                                                        const std::string& client_ca_pem = "");

}  // namespace tern::agent
