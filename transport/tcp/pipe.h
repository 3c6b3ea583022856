// Byte pipes over a non-blocking TCP socket, plain or TLS 1.3, and the
// socket set-up the backend needs. One thread owns a pipe at a time (OpenSSL
// forbids concurrent use of one SSL object), which is why each stream has a
// single I/O thread that both reads and writes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tern/tcp_transport.h"
#include "tern/transport.h"
#include "transport/tcp/tls_identity.h"

namespace tern::tcp {

enum class Io { kOk, kWantRead, kWantWrite, kEof, kError };
struct IoResult {
  Io io = Io::kOk;
  size_t bytes = 0;
  std::string error;  // for kError
};

class Pipe {
 public:
  explicit Pipe(int fd) : fd_(fd) {}
  virtual ~Pipe();
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;

  int fd() const { return fd_; }
  virtual IoResult Read(void* buf, size_t size) = 0;
  virtual IoResult Write(const void* buf, size_t size) = 0;
  // Decrypted bytes waiting inside the library (poll cannot see them).
  virtual bool HasBuffered() const { return false; }
  virtual bool encrypted() const { return false; }
  // Who authenticated on the other end: the SHA-256 of the peer's TLS
  // certificate (DER) once the handshake is done; empty for plain TCP.
  virtual std::string peer_identity() const { return {}; }
  // Wakes a thread blocked on this socket; the pipe fails from then on.
  void Shutdown();

 private:
  int fd_;
};

std::unique_ptr<Pipe> NewPlainPipe(int fd);

// An SSL_CTX for both roles: TLS 1.3 only, our certificate and key, peers
// must present a certificate signed by the CA (mutual authentication) and
// satisfy the identity rules of the config (tls_identity.h).
class TlsContext {
 public:
  static Result<std::unique_ptr<TlsContext>> Load(const TlsConfig& config);
  ~TlsContext();
  void* ctx() const { return ctx_; }
  const PeerRules& rules() const { return rules_; }

 private:
  void* ctx_ = nullptr;
  PeerRules rules_;
};

// Runs the TLS handshake on a connected non-blocking socket by the deadline;
// takes ownership of fd either way. A client checks the server's certificate
// against the configured server name, else dialled_host (a server ignores
// it). Failures are kAuth (credentials or identity, with the reason) or
// kTimeout.
Result<std::unique_ptr<Pipe>> TlsHandshake(const TlsContext& tls, int fd, bool server,
                                           const std::string& dialled_host, uint64_t deadline_us,
                                           Clock& clock);

// Blocking-with-deadline helpers for the handshake phase.
Status ReadFull(Pipe& pipe, void* buf, size_t size, uint64_t deadline_us, Clock& clock);
Status WriteFull(Pipe& pipe, const void* buf, size_t size, uint64_t deadline_us, Clock& clock);
// Waits for readability (want_write false) or writability; kTimeout at deadline.
Status WaitFd(int fd, bool want_write, uint64_t deadline_us, Clock& clock);

struct HostPort {
  std::string host;
  std::string port;
};
Result<HostPort> ParseHostPort(const std::string& address);

// Non-blocking listening socket with SO_REUSEADDR and buffer sizes set (they
// are inherited by accepted sockets).
Result<int> ListenSocket(const std::string& address, const TcpOptions& options);
// "host:port" of a socket's local or remote end.
std::string SocketAddress(int fd, bool peer);
// Non-blocking connect with deadline.
Result<int> ConnectSocket(const std::string& address, const TcpOptions& options,
                          uint64_t deadline_us, Clock& clock);
// TCP_NODELAY, buffers, congestion control; returns the congestion control in
// use (the requested one if the kernel took it, else its default).
std::string TuneSocket(int fd, const TcpOptions& options);

}  // namespace tern::tcp
