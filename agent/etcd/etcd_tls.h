// TLS for the etcd client (agent/etcd/etcd.h, docs/agent/etcd.md §1): the
// PEM material parsed once, and the connections made with it. Private to
// agent/etcd.
//
// etcd's certificate must chain to the given CA(s) alone: the system's trust
// store is not consulted when a CA is given (a public CA's certificate for
// etcd's name is not etcd). Its subjectAltName must name the host we dialled
// (cpp-httplib checks IP and DNS names). Our client certificate, when given,
// is presented for etcd's --client-cert-auth.
//
// Thread safety: an EtcdTls is immutable after Create; Connect may be called
// from any thread. It must outlive every client it made (the verify callback
// points at it).
#pragma once

#include <signal.h>

#include <memory>
#include <string>

#include "tern/status.h"

namespace httplib {
class ClientImpl;
}

namespace tern::agent {

// OpenSSL writes with write(2), not send(MSG_NOSIGNAL): a write to a TLS
// connection etcd has closed raises SIGPIPE, whose default kills the
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

class EtcdTls {
 public:
  // ca_pem: one or more CA certificates (empty: the system's trust store);
  // cert_pem and key_pem: both or neither; the key must match the
  // certificate. kInvalidArgument naming which part is wrong; no PEM text in
  // messages.
  static Result<std::unique_ptr<EtcdTls>> Create(const std::string& ca_pem,
                                                 const std::string& cert_pem,
                                                 const std::string& key_pem);
  ~EtcdTls();
  EtcdTls(const EtcdTls&) = delete;
  EtcdTls& operator=(const EtcdTls&) = delete;

  bool has_client_cert() const;
  bool has_ca() const;
  // A new TLS client for host:port (connects lazily, as cpp-httplib does).
  Result<std::unique_ptr<httplib::ClientImpl>> Connect(const std::string& host, int port) const;
  // Why `client`'s last TLS handshake on this thread failed, for an error
  // message: the certificate verification result, or OpenSSL's error, or ""
  // if neither says anything. *server_refused (optional): etcd's
  // certificate failed verification (chain or name). Clears what it read.
  //
  // The verification is OpenSSL's, not cpp-httplib's: the connection is
  // made with SSL_VERIFY_PEER, our CA (or the system's store) and the
  // dialled host or IP set as the name to match, and httplib's own check
  // is off. Its subjectAltName matcher in 0.11 reads 16 bytes of an IPv4
  // SAN when the host dialled is IPv6 (a heap over-read ASan caught).
  static std::string HandshakeError(const httplib::ClientImpl& client,
                                    bool* server_refused = nullptr);

 private:
  struct Material;
  explicit EtcdTls(std::unique_ptr<Material> material);
  std::unique_ptr<Material> material_;
};

}  // namespace tern::agent
