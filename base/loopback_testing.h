// Tests only: a TCP listener on 127.0.0.1 at a port the kernel picks, for
// tests that play a peer by hand (one that trickles, stalls, or answers
// another protocol), and a port nobody listens on. Header-only; no gtest, so
// that a test says itself what a failure means (ASSERT_TRUE(l.ok())).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace tern::testnet {

class LoopbackListener {
 public:
  // Bound and listening with `backlog`; ok() is false when any step failed.
  explicit LoopbackListener(int backlog = 8) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(fd_, backlog) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      Close();
      return;
    }
    port_ = ntohs(a.sin_port);
  }
  ~LoopbackListener() { Close(); }
  LoopbackListener(const LoopbackListener&) = delete;
  LoopbackListener& operator=(const LoopbackListener&) = delete;

  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // Closes the socket now (a peer's dial is then refused); idempotent.
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// "127.0.0.1:PORT" of a port that was free a moment ago: bound, read,
// closed. A dial there is refused unless something took the port since.
// Empty when no socket could be bound.
inline std::string UnusedLoopbackAddress() {
  LoopbackListener l(1);
  return l.ok() ? l.address() : std::string();
}

}  // namespace tern::testnet
