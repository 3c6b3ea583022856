#include "transport/net/socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/text.h"

namespace tern::net {

Pipe::~Pipe() {
  if (fd_ >= 0) ::close(fd_);
}

void Pipe::Shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

namespace {

class PlainPipe final : public Pipe {
 public:
  using Pipe::Pipe;
  IoResult Read(void* buf, size_t size) override {
    for (;;) {
      ssize_t n = ::recv(fd(), buf, size, 0);
      if (n > 0) return {Io::kOk, static_cast<size_t>(n), {}};
      if (n == 0) return {Io::kEof, 0, {}};
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return {Io::kWantRead, 0, {}};
      return {Io::kError, 0, std::strerror(errno)};
    }
  }
  IoResult Write(const void* buf, size_t size) override {
    for (;;) {
      ssize_t n = ::send(fd(), buf, size, MSG_NOSIGNAL);
      if (n >= 0) return {Io::kOk, static_cast<size_t>(n), {}};
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return {Io::kWantWrite, 0, {}};
      return {Io::kError, 0, std::strerror(errno)};
    }
  }
};

}  // namespace

std::unique_ptr<Pipe> NewPlainPipe(int fd) { return std::make_unique<PlainPipe>(fd); }

Status WaitFd(int fd, bool want_write, uint64_t deadline_us, Clock& clock) {
  for (;;) {
    const uint64_t now = clock.NowUs();
    TERN_REQUIRE(now < deadline_us, kTimeout, "peer did not answer in time");
    pollfd p{fd, static_cast<short>(want_write ? POLLOUT : POLLIN), 0};
    const int wait_ms = static_cast<int>(std::min<uint64_t>((deadline_us - now) / 1000 + 1, 100));
    int rc = ::poll(&p, 1, wait_ms);
    if (rc > 0) return Status::Ok();
    if (rc < 0 && errno != EINTR) return TERN_ERRNO("poll");
  }
}

Status PipeError(const Pipe& pipe, const IoResult& r) {
  if (r.io == Io::kEof) return TERN_ERROR(kUnavailable, "connection closed by peer");
  if (pipe.encrypted() && IsTlsCertificateAlert(r.error)) return TERN_ERROR(kAuth, r.error);
  return TERN_ERROR(kUnavailable, r.error);
}

Status ReadFull(Pipe& pipe, void* buf, size_t size, uint64_t deadline_us, Clock& clock) {
  size_t got = 0;
  while (got < size) {
    IoResult r = pipe.Read(static_cast<uint8_t*>(buf) + got, size - got);
    if (r.io == Io::kOk) {
      got += r.bytes;
    } else if (r.io == Io::kWantRead || r.io == Io::kWantWrite) {
      TERN_RETURN_IF_ERROR(WaitFd(pipe.fd(), r.io == Io::kWantWrite, deadline_us, clock));
    } else {
      return PipeError(pipe, r);
    }
  }
  return Status::Ok();
}

Status WriteFull(Pipe& pipe, const void* buf, size_t size, uint64_t deadline_us, Clock& clock) {
  size_t put = 0;
  while (put < size) {
    IoResult r = pipe.Write(static_cast<const uint8_t*>(buf) + put, size - put);
    if (r.io == Io::kOk) {
      put += r.bytes;
    } else if (r.io == Io::kWantRead || r.io == Io::kWantWrite) {
      TERN_RETURN_IF_ERROR(WaitFd(pipe.fd(), r.io == Io::kWantWrite, deadline_us, clock));
    } else {
      return PipeError(pipe, r);
    }
  }
  return Status::Ok();
}

namespace {
Result<addrinfo*> Resolve(const std::string& address, bool passive) {
  TERN_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(address));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(hp.port);
  int rc = ::getaddrinfo(hp.host.c_str(), service.c_str(), &hints, &res);
  TERN_REQUIRE(rc == 0 && res != nullptr, kUnavailable, "cannot resolve '", address,
               "': ", gai_strerror(rc));
  return res;
}

}  // namespace

void SetSocketBuffers(int fd, uint64_t buffer_bytes) {
  if (buffer_bytes == 0) return;
  int bytes = static_cast<int>(std::min<uint64_t>(buffer_bytes, 1u << 30));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

Result<int> ListenSocket(const std::string& address, uint64_t buffer_bytes) {
  TERN_ASSIGN_OR_RETURN(addrinfo * res, Resolve(address, true));
  Status last = TERN_ERROR(kUnavailable, "no usable address for '", address, "'");
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    SetSocketBuffers(fd, buffer_bytes);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 512) == 0) {
      ::freeaddrinfo(res);
      return fd;
    }
    last = TERN_ERRNO("listen on ", address);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return last;
}

std::string SockaddrText(const sockaddr* address) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (address->sa_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(address);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    return std::string(host) + ":" + std::to_string(ntohs(a->sin_port));
  }
  if (address->sa_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(address);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(a->sin6_port));
  }
  return "?";
}

std::string SocketAddress(int fd, bool peer) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len)
                : ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  return rc == 0 ? SockaddrText(reinterpret_cast<const sockaddr*>(&ss)) : "?";
}

Result<int> ConnectSocket(const std::string& address, uint64_t buffer_bytes, uint64_t deadline_us,
                          Clock& clock) {
  TERN_ASSIGN_OR_RETURN(addrinfo * res, Resolve(address, false));
  Status last = TERN_ERROR(kUnavailable, "no usable address for '", address, "'");
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    SetSocketBuffers(fd, buffer_bytes);  // before connect, so the window scale fits
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno != EINPROGRESS) {
      last = TERN_ERROR(kUnavailable, "connect to ", address, ": ", std::strerror(errno));
      ::close(fd);
      continue;
    }
    if (rc != 0) {
      Status st = WaitFd(fd, true, deadline_us, clock);
      int err = 0;
      socklen_t len = sizeof err;
      if (st.ok()) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (!st.ok() || err != 0) {
        last = st.ok() ? TERN_ERROR(kUnavailable, "connect to ", address, ": ", std::strerror(err))
                       : st.WithContext("connect to " + address);
        ::close(fd);
        continue;
      }
    }
    ::freeaddrinfo(res);
    return fd;
  }
  ::freeaddrinfo(res);
  return last;
}

}  // namespace tern::net
