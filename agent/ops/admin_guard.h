// Private to agent/ops/admin_http.cc: the TCP front of the admin port. It
// accepts connections and relays their bytes, unparsed, to the HTTP server's
// Unix socket, bounding what httplib 0.11 does not: connections at once,
// bytes per request, time per request (admin_http.h has the contract).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tern/log.h"
#include "tern/status.h"

namespace tern::agent {

struct GuardOptions {
  uint32_t max_connections = 16;
  uint64_t max_request_bytes = (64 << 10) + (1 << 20);
  uint32_t request_timeout_ms = 10000;
  // The backend speaks TLS: a client whose first byte is not a TLS record
  // (0x16, a handshake) is answered a plain "400 use https://" and closed;
  // other refusals close without a plain-text answer a TLS client could
  // not read.
  bool tls = false;
  LogFn log;  // never null here
};

class AdminGuard {
 public:
  // Listens on host:port (port 0: any) and relays to the Unix socket at
  // `backend_path`, which must already be listening.
  static Result<std::unique_ptr<AdminGuard>> Start(const std::string& host, uint16_t port,
                                                   std::string backend_path, GuardOptions options);
  ~AdminGuard();  // Stop()
  uint16_t port() const;
  // Every byte read from clients since Start: relayed, or read and dropped
  // while refusing or closing.
  uint64_t client_bytes_read() const;
  // Connections being relayed now, lingering closes included: a count of
  // bytes read is final for a connection only once it has left this.
  uint32_t connections_open() const;
  // Closes the port and every relayed connection; joins every thread.
  void Stop();

  struct Impl;

 private:
  explicit AdminGuard(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tern::agent
