// TLS 1.3 pipes over a non-blocking TCP socket and the TCP tuning of the
// backend's streams; plain pipes and socket set-up are in transport/net/.
// One thread owns a pipe at a time (OpenSSL forbids concurrent use of one
// SSL object), which is why each stream has a single I/O thread that both
// reads and writes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tern/tcp_transport.h"
#include "tern/transport.h"
#include "transport/net/socket.h"
#include "transport/tcp/tls_identity.h"

namespace tern::tcp {

// The TCP backend's pipes are the shared ones (transport/net/); TLS adds a
// pipe type here.
using net::Io;
using net::IoResult;
using net::NewPlainPipe;
using net::Pipe;
using net::PipeError;
using net::ReadFull;
using net::WaitFd;
using net::WriteFull;

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
// it). Failures: kAuth for a verdict on a certificate (ours on the peer's,
// or the peer's alert on ours), with the reason; kUnavailable for a
// handshake cut short or corrupted, or a peer that does not speak TLS;
// kTimeout at the deadline.
Result<std::unique_ptr<Pipe>> TlsHandshake(const TlsContext& tls, int fd, bool server,
                                           const std::string& dialled_host, uint64_t deadline_us,
                                           Clock& clock);

// TCP_NODELAY, buffers, congestion control; returns the congestion control in
// use (the requested one if the kernel took it, else its default).
std::string TuneSocket(int fd, const TcpOptions& options);

// The sending side of a stream's socket as the kernel sees it (TCP_INFO);
// false where it says nothing (send_state.cc).
struct SendState {
  uint64_t pacing_bytes_per_s = 0;  // 0: no rate yet
  uint64_t notsent_bytes = 0;       // written by us, not yet sent
};
bool ReadSendState(int fd, SendState* out);

}  // namespace tern::tcp
