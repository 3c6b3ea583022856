// Byte pipes over non-blocking TCP sockets and the socket set-up that more
// than one backend needs: the TCP backend's streams, and the verbs
// backend's side channel (queue-pair set-up and peer-death detection). A
// helper two backends share lives here, a floor below both, so that no
// backend includes another (docs/architecture.md).
//
// One thread owns a pipe at a time (OpenSSL forbids concurrent use of one
// SSL object, and the TLS pipe of transport/tcp/ is a Pipe too).
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tern/status.h"
#include "tern/transport.h"

namespace tern::net {

enum class Io { kOk, kWantRead, kWantWrite, kEof, kError };
struct IoResult {
  Io io = Io::kOk;
  size_t bytes = 0;
  std::string error;  // for kError
};

class Pipe {
 public:
  explicit Pipe(int fd) : fd_(fd) {}
  virtual ~Pipe();  // closes the socket
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

// Takes ownership of a connected non-blocking socket.
std::unique_ptr<Pipe> NewPlainPipe(int fd);

// The status of a pipe's failed read or write (kEof or kError): kAuth only
// when the peer's TLS alert refuses our certificate (IsTlsCertificateAlert:
// a verdict that arrives at the first read after a TLS 1.3 handshake);
// kUnavailable for a hang-up, a reset or a TLS record that failed (bytes
// corrupted or cut on the wire), which are the link's and prove nothing
// against the peer. The message is the pipe's error text.
Status PipeError(const Pipe& pipe, const IoResult& r);

// Blocking-with-deadline helpers for handshakes. Failures: kTimeout at the
// deadline, otherwise PipeError's.
Status ReadFull(Pipe& pipe, void* buf, size_t size, uint64_t deadline_us, Clock& clock);
Status WriteFull(Pipe& pipe, const void* buf, size_t size, uint64_t deadline_us, Clock& clock);
// Waits for readability (want_write false) or writability; kTimeout at deadline.
Status WaitFd(int fd, bool want_write, uint64_t deadline_us, Clock& clock);

// SO_SNDBUF/SO_RCVBUF (capped at 1 GiB); 0 leaves the kernel's autotuning.
void SetSocketBuffers(int fd, uint64_t buffer_bytes);
// Non-blocking listening socket with SO_REUSEADDR and buffer sizes set (they
// are inherited by accepted sockets).
Result<int> ListenSocket(const std::string& address, uint64_t buffer_bytes);
// "host:port" of a socket's local or remote end ("?" when unknown).
std::string SocketAddress(int fd, bool peer);
// "host:port" or "[v6]:port" of an IPv4 or IPv6 socket address ("?" for
// another family): what SocketAddress says, for addresses a library hands
// over (UCX's listener and connection requests).
std::string SockaddrText(const sockaddr* address);
// Non-blocking connect with deadline; buffers are sized before connect so
// the window scale fits them.
Result<int> ConnectSocket(const std::string& address, uint64_t buffer_bytes, uint64_t deadline_us,
                          Clock& clock);

}  // namespace tern::net
