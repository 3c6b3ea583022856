#include "agent/ops/admin_guard.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>
#include <mutex>
#include <system_error>
#include <thread>

namespace tern::agent {
namespace {

using Clock = std::chrono::steady_clock;

// After a refusal the client may still be sending; closing with unread
// bytes makes the kernel send RST, which can destroy the refusal before the
// client reads it. So: shut our side, read and drop for a short bounded while.
constexpr int kLingerMs = 500;
constexpr size_t kLingerBytes = 1 << 20;
constexpr size_t kRelayBufBytes = 16 << 10;
constexpr unsigned char kTlsHandshakeRecord = 0x16;  // RFC 8446 §5.1 ContentType

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd = std::exchange(o.fd, -1);
    }
    return *this;
  }
  ~Fd() { Reset(); }
  void Reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

std::string PeerName(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    port = ntohs(in6->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

std::string CannedResponse(int code, std::string_view reason, std::string_view why) {
  std::string body = "admin: " + std::string(why) + "\n";
  return "HTTP/1.1 " + std::to_string(code) + " " + std::string(reason) +
         "\r\nContent-Type: text/plain\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

// After our side is shut for writing: reads and drops what the client
// still sends, until it closes, kLingerMs pass, kLingerBytes are dropped or
// Stop. The bytes dropped.
size_t LingerDrain(int fd, int wake_fd) {
  const auto end = Clock::now() + std::chrono::milliseconds(kLingerMs);
  size_t drained = 0;
  char buf[4096];
  while (drained < kLingerBytes) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
    if (left.count() <= 0) break;
    pollfd p[2] = {{fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    if (::poll(p, 2, static_cast<int>(left.count())) <= 0 || p[1].revents) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR))) break;
    if (n > 0) drained += static_cast<size_t>(n);
  }
  return drained;
}

// Best effort: a refusal is short and fits the socket buffer of a fresh
// connection; a client that does not read it loses it.
// The bytes it read (and dropped) from the client.
size_t RefuseAndClose(Fd fd, int code, std::string_view reason, std::string_view why, int wake_fd,
                      bool linger) {
  const std::string r = CannedResponse(code, reason, why);
  (void)::send(fd.fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(fd.fd, SHUT_WR);
  if (!linger) {  // the accept thread must not wait: drop only what is queued now
    char buf[4096];
    size_t drained = 0;
    while (drained < (64 << 10)) {
      const ssize_t n = ::recv(fd.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n <= 0) break;
      drained += static_cast<size_t>(n);
    }
    return drained;
  }
  return LingerDrain(fd.fd, wake_fd);
}

}  // namespace

struct AdminGuard::Impl {
  GuardOptions options;
  std::string backend_path;
  Fd listen_fd;
  Fd wake_read, wake_write;  // a byte in the pipe: stop (level-triggered, never drained)
  uint16_t port = 0;
  std::thread acceptor;
  std::once_flag stop_once;

  struct Conn {
    std::thread thread;
    std::atomic<bool> done{false};
  };
  std::atomic<uint64_t> client_bytes{0};  // every byte read from clients
  std::atomic<uint32_t> open{0};          // relays running (Relay to its return)
  std::mutex mu;
  std::list<Conn> conns;  // at most max_connections (+ finished ones not yet reaped)

  void AcceptLoop();
  void Relay(Fd client, std::string peer);
  Status ConnectBackend(Clock::time_point deadline, Fd& out);
  size_t ReapLocked();
};

size_t AdminGuard::Impl::ReapLocked() {
  size_t active = 0;
  for (auto it = conns.begin(); it != conns.end();) {
    if (it->done.load()) {
      it->thread.join();
      it = conns.erase(it);
    } else {
      ++active, ++it;
    }
  }
  return active;
}

void AdminGuard::Impl::AcceptLoop() {
  for (;;) {
    pollfd p[2] = {{listen_fd.fd, POLLIN, 0}, {wake_read.fd, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      options.log(std::string("admin: poll: ") + std::strerror(errno));
      return;
    }
    if (p[1].revents) return;
    Fd client(::accept4(listen_fd.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (client.fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {  // back off instead of spinning
        options.log(std::string("admin: accept: ") + std::strerror(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      continue;
    }
    std::string peer = PeerName(client.fd);
    std::lock_guard lock(mu);
    if (ReapLocked() >= options.max_connections) {
      options.log("admin: refused " + peer + ": busy (" + std::to_string(options.max_connections) +
                  " connections open)");
      if (options.tls) continue;  // closed: a TLS client cannot read a plain answer
      client_bytes += RefuseAndClose(std::move(client), 503, "Service Unavailable",
                                     "busy, try again", -1, /*linger=*/false);
      continue;
    }
    Conn& c = conns.emplace_back();
    ++open;
    try {
      c.thread = std::thread([this, &c, fd = std::move(client), peer]() mutable {
        Relay(std::move(fd), std::move(peer));
        --open;
        c.done.store(true);
      });
    } catch (const std::system_error& e) {  // out of threads: refuse, do not die
      --open;
      conns.pop_back();
      options.log("admin: refused " + peer + ": cannot start a thread: " + e.what());
      // The client's Fd was moved into the lambda, destroyed (closed) with it.
    }
  }
}

// httplib's listen backlog is compiled in (5): a burst of connections finds
// it full (EAGAIN for a Unix socket, which cannot be polled for). Its accept
// loop drains it quickly, so retry briefly, within the request's deadline.
Status AdminGuard::Impl::ConnectBackend(Clock::time_point deadline, Fd& out) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, backend_path.c_str(), backend_path.size() + 1);
  for (int attempt = 0;; ++attempt) {
    Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (fd.fd < 0) return TERN_ERRNO("backend socket");
    if (::connect(fd.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      out = std::move(fd);
      return Status::Ok();
    }
    if (errno != EAGAIN) return TERN_ERRNO("backend connect");
    if (Clock::now() + std::chrono::milliseconds(2) >= deadline) {
      return TERN_ERROR(kResourceExhausted, "backend backlog full until the deadline");
    }
    pollfd p{wake_read.fd, POLLIN, 0};
    if (::poll(&p, 1, attempt < 10 ? 1 : 5) > 0) return TERN_ERROR(kCancelled, "stopping");
  }
}

// Pumps client <-> backend until the backend has answered and closed, the
// request breaks a bound, or Stop. Both sockets are non-blocking; each
// direction has one buffer, so a side that does not read stalls only itself.
void AdminGuard::Impl::Relay(Fd client, std::string peer) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(options.request_timeout_ms);
  Fd backend;
  if (Status s = ConnectBackend(deadline, backend); !s.ok()) {
    options.log("admin: refused " + peer + ": " + s.message());
    if (options.tls) return;
    client_bytes += RefuseAndClose(std::move(client), 503, "Service Unavailable", "busy, try again",
                                   wake_read.fd, true);
    return;
  }
  struct Dir {
    Dir(int f, int t) : from(f), to(t) {}
    int from, to;
    char buf[kRelayBufBytes];
    size_t off = 0, len = 0;
    bool eof = false;
    uint64_t total = 0;
  };
  auto up = std::make_unique<Dir>(client.fd, backend.fd);
  auto down = std::make_unique<Dir>(backend.fd, client.fd);

  // `plain`: the answer is for a client that speaks plain HTTP to a TLS
  // port; every other refusal of a TLS port closes without one.
  auto refuse = [&](int code, std::string_view reason, std::string why, bool plain = false) {
    options.log("admin: refused " + peer + ": " + why);
    backend.Reset();
    const bool answered = down->total != 0;
    up.reset(), down.reset();  // not held through the lingering close
    if (!answered && (!options.tls || plain)) {
      client_bytes += RefuseAndClose(std::move(client), code, reason, why, wake_read.fd, true);
    }
  };

  // httplib may answer from the request's head alone (a refusal: wrong
  // token, no such route, a body over the route's limit) and close without
  // reading the body. Then nothing more goes up; once the answer is through,
  // the client gets a lingering close: a plain close with its unread bytes
  // queued would send RST, which can destroy the answer before it is read.
  bool up_closed = false;  // the backend takes no more bytes
  for (;;) {
    if (down->eof && down->len == 0) {  // the answer is through; httplib closed
      const bool unread = !up->eof;
      // The buffers are done with: freed before a lingering close, which
      // can take seconds, so that a connection past its answer holds none.
      up.reset(), down.reset();
      if (unread) {
        ::shutdown(client.fd, SHUT_WR);
        client_bytes += LingerDrain(client.fd, wake_read.fd);
      }
      return;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      return refuse(
          408, "Request Timeout",
          "no complete exchange within " + std::to_string(options.request_timeout_ms) + " ms");
    }
    pollfd p[3] = {{wake_read.fd, POLLIN, 0}, {client.fd, 0, 0}, {backend.fd, 0, 0}};
    for (Dir* d : {up.get(), down.get()}) {
      if (d == up.get() && up_closed) continue;
      pollfd& from = p[d->from == client.fd ? 1 : 2];
      pollfd& to = p[d->to == client.fd ? 1 : 2];
      if (d->len > 0) {
        to.events |= POLLOUT;
      } else if (!d->eof) {
        from.events |= POLLIN;
      }
    }
    if (::poll(p, 3, static_cast<int>(left)) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[0].revents) return;  // Stop
    for (Dir* d : {up.get(), down.get()}) {
      if (d == up.get() && up_closed) continue;
      if (d->len > 0) {
        const ssize_t n = ::send(d->to, d->buf + d->off, d->len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
          if (d == down.get()) return;  // the client went away
          up_closed = true;             // httplib answered without reading it all: relay the answer
          d->len = 0;
          continue;
        }
        if (n > 0) {
          d->off += static_cast<size_t>(n), d->len -= static_cast<size_t>(n);
          if (d->len == 0 && d->eof) ::shutdown(d->to, SHUT_WR);
        }
        continue;
      }
      if (d->eof) continue;
      const ssize_t n = ::recv(d->from, d->buf, sizeof d->buf, MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) continue;
        if (d == up.get()) return;  // the client went away
        // httplib closed with request bytes unread (a refusal from the
        // head): a Unix socket reports ECONNRESET after the answer's bytes.
      }
      if (n <= 0) {
        d->eof = true;
        ::shutdown(d->to, SHUT_WR);
        continue;
      }
      if (options.tls && d == up.get() && d->total == 0 &&
          static_cast<unsigned char>(d->buf[0]) != kTlsHandshakeRecord) {
        return refuse(400, "Bad Request",
                      "this port speaks TLS: use https://HOST:PORT (plain HTTP refused)",
                      /*plain=*/true);
      }
      d->off = 0, d->len = static_cast<size_t>(n);
      d->total += static_cast<uint64_t>(n);
      if (d == up.get()) client_bytes += static_cast<uint64_t>(n);
      if (d == up.get() && d->total > options.max_request_bytes) {
        return refuse(
            413, "Payload Too Large",
            "request over " + std::to_string(options.max_request_bytes) + " bytes (head + body)");
      }
    }
  }
}

Result<std::unique_ptr<AdminGuard>> AdminGuard::Start(const std::string& host, uint16_t port,
                                                      std::string backend_path,
                                                      GuardOptions options) {
  TERN_REQUIRE(backend_path.size() < sizeof(sockaddr_un::sun_path), kInvalidArgument,
               "admin: unix socket path too long: ", backend_path);
  TERN_REQUIRE(options.max_connections > 0 && options.request_timeout_ms > 0, kInvalidArgument,
               "admin: max_connections and request_timeout_ms must be > 0");
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->backend_path = std::move(backend_path);

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0) {
    return TERN_ERROR(kInvalidArgument, "admin: cannot resolve ", host, ": ", gai_strerror(rc));
  }
  int last_errno = 0;
  for (addrinfo* ai = res; ai && impl->listen_fd.fd < 0; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    const int one = 1;
    if (fd.fd >= 0 && ::setsockopt(fd.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
        ::bind(fd.fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd.fd, 64) == 0) {
      impl->listen_fd = std::move(fd);
    } else {
      last_errno = errno;
    }
  }
  ::freeaddrinfo(res);
  if (impl->listen_fd.fd < 0) {
    errno = last_errno;
    return TERN_ERRNO("admin: cannot listen on ", host, ":", port);
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(impl->listen_fd.fd, reinterpret_cast<sockaddr*>(&ss), &len);
  impl->port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) != 0) return TERN_ERRNO("admin: pipe");
  impl->wake_read = Fd(pipefd[0]);
  impl->wake_write = Fd(pipefd[1]);
  impl->acceptor = std::thread([p = impl.get()] { p->AcceptLoop(); });
  return std::unique_ptr<AdminGuard>(new AdminGuard(std::move(impl)));
}

AdminGuard::AdminGuard(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AdminGuard::~AdminGuard() { Stop(); }
uint16_t AdminGuard::port() const { return impl_->port; }
uint64_t AdminGuard::client_bytes_read() const { return impl_->client_bytes.load(); }
uint32_t AdminGuard::connections_open() const { return impl_->open.load(); }

void AdminGuard::Stop() {
  std::call_once(impl_->stop_once, [this] {
    const char b = 1;
    (void)!::write(impl_->wake_write.fd, &b, 1);
    impl_->acceptor.join();
    impl_->listen_fd.Reset();
    // Every relay sees the pipe and returns; the acceptor is gone, so the
    // list no longer changes.
    for (auto& c : impl_->conns) c.thread.join();
    impl_->conns.clear();
  });
}

}  // namespace tern::agent
