// Test helpers for the TCP transport's wire tests (bad_input_test.cc,
// message_check_test.cc, tls_test.cc): a raw peer on a plain socket that
// writes frames by hand, and a log sink a test can wait on. Tests only.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>

#include "transport/tcp/connection.h"
#include "transport/tcp/frame.h"

namespace tern::tcp::testpeer {

// A frame header as the connection encodes it (connection.h's MakeFrame).
inline std::string RawHeader(uint8_t version, FrameType type, uint32_t payload_bytes,
                             uint64_t a0 = 0, uint64_t a1 = 0, uint64_t a2 = 0) {
  const OutFrame f = MakeFrame(version, type, a0, a1, a2, 0, payload_bytes);
  return std::string(reinterpret_cast<const char*>(f.header), kHeaderBytes);
}

inline void SendAll(int fd, const std::string& s) {
  ASSERT_EQ(::send(fd, s.data(), s.size(), MSG_NOSIGNAL), static_cast<ssize_t>(s.size()));
}

// Reads exactly n bytes, or fewer when the peer closes or the socket's
// receive timeout passes.
inline std::string ReceiveExactly(int fd, size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::recv(fd, out.data() + got, n - got, 0);
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  out.resize(got);
  return out;
}

// Blocking sends and receives on fd end within 20 s even when the other
// side neither answers nor hangs up.
inline void BoundWaits(int fd) {
  const timeval bound{20, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &bound, sizeof bound);
}

// A plain TCP socket connected to 127.0.0.1:port, its waits bounded.
// rcvbuf_bytes > 0: a small receive buffer (set before connect, so the
// kernel does not autotune it) for a peer that does not read.
inline int RawConnect(int port, int rcvbuf_bytes = 0) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  BoundWaits(fd);
  if (rcvbuf_bytes > 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf_bytes, sizeof rcvbuf_bytes);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

// A raw one-stream peer (stream 0 of 1, connection id 1234) that completed
// the handshake in `version`: the server's HELLO_ACK came, in that version,
// accepting it.
inline int RawHandshake(int port, uint8_t version, int rcvbuf_bytes = 0) {
  int fd = RawConnect(port, rcvbuf_bytes);
  SendAll(fd, RawHeader(version, FrameType::kHello, 0, 1234, PackStream(0, 1)));
  const std::string ack = ReceiveExactly(fd, kHeaderBytes);
  EXPECT_EQ(ack.size(), kHeaderBytes);
  if (ack.size() == kHeaderBytes) {
    FrameHeader h;
    EXPECT_TRUE(DecodeHeader(reinterpret_cast<const uint8_t*>(ack.data()), &h).ok());
    EXPECT_EQ(h.type, FrameType::kHelloAck);
    EXPECT_EQ(h.version, version);
    EXPECT_EQ(h.arg[1], 0u) << "hello refused";
  }
  return fd;
}

// The port of a listener's "host:port" address.
inline int PortOf(const std::string& address) {
  return std::stoi(address.substr(address.rfind(':') + 1));
}

// True when the server closes fd within the timeout (reads drain to EOF;
// what they read is appended to `got`).
inline bool ClosedByServer(int fd, std::chrono::milliseconds timeout, std::string* got = nullptr) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;
    if (got) got->append(buf, n);
  }
  return false;
}

// A transport's log, appended to on its threads, that a test waits on.
// Declare it before the transport it logs for, so that it outlives it.
class LogCapture {
 public:
  std::function<void(std::string_view)> Sink() {
    return [this](std::string_view line) {
      std::lock_guard<std::mutex> lock(mu_);
      text_ += std::string(line) + "\n";
      cv_.notify_all();
    };
  }
  // Waits up to 20 s for `needle` to appear.
  bool Has(const std::string& needle) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20),
                        [&] { return text_.find(needle) != std::string::npos; });
  }
  std::string Text() {
    std::lock_guard<std::mutex> lock(mu_);
    return text_;
  }
  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    text_.clear();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::string text_;
};

}  // namespace tern::tcp::testpeer
