#include "transport/tcp/pipe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

namespace tern::tcp {

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

std::string SslErrors() {
  std::string out;
  char buf[256];
  while (unsigned long e = ERR_get_error()) {
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? std::string("TLS error") : out;
}

class TlsPipe final : public Pipe {
 public:
  TlsPipe(int fd, SSL* ssl) : Pipe(fd), ssl_(ssl) {}
  ~TlsPipe() override { SSL_free(ssl_); }
  IoResult Read(void* buf, size_t size) override {
    ERR_clear_error();
    size_t got = 0;
    int rc = SSL_read_ex(ssl_, buf, size, &got);
    if (rc == 1) return {Io::kOk, got, {}};
    return Failure(rc);
  }
  IoResult Write(const void* buf, size_t size) override {
    ERR_clear_error();
    size_t put = 0;
    int rc = SSL_write_ex(ssl_, buf, size, &put);
    if (rc == 1) return {Io::kOk, put, {}};
    return Failure(rc);
  }
  bool HasBuffered() const override { return SSL_pending(ssl_) > 0; }
  bool encrypted() const override { return true; }
  std::string peer_identity() const override { return identity_; }
  SSL* ssl() { return ssl_; }
  // After a successful handshake: remembers the verified peer certificate.
  void RecordPeer() {
    X509* cert = SSL_get1_peer_certificate(ssl_);
    if (cert == nullptr) return;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (X509_digest(cert, EVP_sha256(), md, &n) == 1) identity_.assign(reinterpret_cast<char*>(md), n);
    X509_free(cert);
  }

 private:
  IoResult Failure(int rc) {
    switch (SSL_get_error(ssl_, rc)) {
      case SSL_ERROR_WANT_READ: return {Io::kWantRead, 0, {}};
      case SSL_ERROR_WANT_WRITE: return {Io::kWantWrite, 0, {}};
      case SSL_ERROR_ZERO_RETURN: return {Io::kEof, 0, {}};
      case SSL_ERROR_SYSCALL:
        if (errno == 0 || errno == EPIPE || errno == ECONNRESET) {
          std::string e = SslErrors();
          if (e == "TLS error") return {Io::kEof, 0, {}};
          return {Io::kError, 0, e};
        }
        return {Io::kError, 0, std::strerror(errno)};
      default: {
        std::string e = SslErrors();
        // A peer that vanished without close_notify is a broken link, not
        // an authentication failure.
        if (e.find("unexpected eof") != std::string::npos) return {Io::kEof, 0, {}};
        return {Io::kError, 0, "TLS: " + e};
      }
    }
  }
  SSL* ssl_;
  std::string identity_;
};

}  // namespace

std::unique_ptr<Pipe> NewPlainPipe(int fd) { return std::make_unique<PlainPipe>(fd); }

Result<std::unique_ptr<TlsContext>> TlsContext::Load(const TlsConfig& config) {
  TERN_REQUIRE(!config.cert_file.empty() && !config.key_file.empty() && !config.ca_file.empty(),
               kInvalidArgument, "TLS needs a certificate, a key and a CA file");
  auto out = std::make_unique<TlsContext>();
  TERN_ASSIGN_OR_RETURN(out->rules_, PeerRules::FromConfig(config));
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  TERN_REQUIRE(ctx != nullptr, kInternal, "SSL_CTX_new: ", SslErrors());
  out->ctx_ = ctx;
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // No session tickets: they are post-handshake writes on the server that
  // would interleave with our framing for no benefit (streams are long-lived).
  SSL_CTX_set_num_tickets(ctx, 0);
  TERN_REQUIRE(SSL_CTX_use_certificate_chain_file(ctx, config.cert_file.c_str()) == 1,
               kInvalidArgument, "TLS certificate ", config.cert_file, ": ", SslErrors());
  TERN_REQUIRE(SSL_CTX_use_PrivateKey_file(ctx, config.key_file.c_str(), SSL_FILETYPE_PEM) == 1,
               kInvalidArgument, "TLS key ", config.key_file, ": ", SslErrors());
  TERN_REQUIRE(SSL_CTX_check_private_key(ctx) == 1, kInvalidArgument,
               "TLS key does not match the certificate: ", SslErrors());
  TERN_REQUIRE(SSL_CTX_load_verify_locations(ctx, config.ca_file.c_str(), nullptr) == 1,
               kInvalidArgument, "TLS CA ", config.ca_file, ": ", SslErrors());
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, VerifyPeer);
  return out;
}

TlsContext::~TlsContext() { SSL_CTX_free(static_cast<SSL_CTX*>(ctx_)); }

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

Result<std::unique_ptr<Pipe>> TlsHandshake(const TlsContext& tls, int fd, bool server,
                                           const std::string& dialled_host, uint64_t deadline_us,
                                           Clock& clock) {
  SSL* ssl = SSL_new(static_cast<SSL_CTX*>(tls.ctx()));
  if (ssl == nullptr) {
    ::close(fd);
    return TERN_ERROR(kInternal, "SSL_new: ", SslErrors());
  }
  auto pipe = std::make_unique<TlsPipe>(fd, ssl);
  SSL_set_fd(ssl, fd);
  PeerCheck check;
  check.rules = &tls.rules();
  check.server = server;
  if (server) {
    SSL_set_accept_state(ssl);
  } else {
    TERN_RETURN_IF_ERROR(check.ExpectServer(ssl, dialled_host));
    SSL_set_connect_state(ssl);
  }
  // `check` is read by VerifyPeer during the handshake and must not be
  // reachable after it.
  check.Attach(ssl);
  struct Detach {
    SSL* ssl;
    ~Detach() { PeerCheck::Detach(ssl); }
  } detach{ssl};
  for (;;) {
    ERR_clear_error();
    int rc = SSL_do_handshake(ssl);
    if (rc == 1) break;
    int err = SSL_get_error(ssl, rc);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      Status st = WaitFd(fd, err == SSL_ERROR_WANT_WRITE, deadline_us, clock);
      if (!st.ok()) return st.WithContext("TLS handshake");
      continue;
    }
    std::string why = check.failure.empty() ? SslErrors() : check.failure;
    if (err == SSL_ERROR_SYSCALL && why == "TLS error") why = "connection closed during handshake";
    if (server) {
      // Linger briefly so our alert reaches the client before a reset
      // (bytes it sent after its Finished would otherwise trigger an RST
      // that discards the alert), then close. Bounded: 1 s.
      ::shutdown(fd, SHUT_WR);
      const uint64_t until = std::min(deadline_us, clock.NowUs() + 1000000);
      char sink[4096];
      while (WaitFd(fd, false, until, clock).ok() && ::recv(fd, sink, sizeof sink, 0) > 0) {
      }
    }
    return TERN_ERROR(kAuth, "TLS handshake failed: ", why);
  }
  pipe->RecordPeer();
  return std::unique_ptr<Pipe>(std::move(pipe));
}

namespace {
Status IoError(const Pipe& pipe, const IoResult& r) {
  if (r.io == Io::kEof) return TERN_ERROR(kUnavailable, "connection closed by peer");
  if (pipe.encrypted() && r.error.rfind("TLS: ", 0) == 0) return TERN_ERROR(kAuth, r.error);
  return TERN_ERROR(kUnavailable, r.error);
}
}  // namespace

Status ReadFull(Pipe& pipe, void* buf, size_t size, uint64_t deadline_us, Clock& clock) {
  size_t got = 0;
  while (got < size) {
    IoResult r = pipe.Read(static_cast<uint8_t*>(buf) + got, size - got);
    if (r.io == Io::kOk) {
      got += r.bytes;
    } else if (r.io == Io::kWantRead || r.io == Io::kWantWrite) {
      TERN_RETURN_IF_ERROR(WaitFd(pipe.fd(), r.io == Io::kWantWrite, deadline_us, clock));
    } else {
      return IoError(pipe, r);
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
      return IoError(pipe, r);
    }
  }
  return Status::Ok();
}

Result<HostPort> ParseHostPort(const std::string& address) {
  HostPort hp;
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    TERN_REQUIRE(close != std::string::npos && close + 1 < address.size() && address[close + 1] == ':',
                 kInvalidArgument, "bad address '", address, "' (want [V6]:PORT)");
    hp.host = address.substr(1, close - 1);
    hp.port = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    TERN_REQUIRE(colon != std::string::npos, kInvalidArgument, "bad address '", address,
                 "' (want HOST:PORT)");
    hp.host = address.substr(0, colon);
    hp.port = address.substr(colon + 1);
  }
  TERN_REQUIRE(!hp.port.empty() && hp.port.size() <= 5 &&
                   hp.port.find_first_not_of("0123456789") == std::string::npos &&
                   std::stoul(hp.port) <= 65535,
               kInvalidArgument, "bad port in '", address, "'");
  return hp;
}

namespace {
Result<addrinfo*> Resolve(const std::string& address, bool passive) {
  TERN_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(address));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(hp.host.empty() ? nullptr : hp.host.c_str(), hp.port.c_str(), &hints, &res);
  TERN_REQUIRE(rc == 0 && res != nullptr, kUnavailable, "cannot resolve '", address,
               "': ", gai_strerror(rc));
  return res;
}

void SetBuffers(int fd, const TcpOptions& options) {
  if (options.socket_buffer_bytes == 0) return;
  int bytes = static_cast<int>(std::min<uint64_t>(options.socket_buffer_bytes, 1u << 30));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}
}  // namespace

Result<int> ListenSocket(const std::string& address, const TcpOptions& options) {
  TERN_ASSIGN_OR_RETURN(addrinfo * res, Resolve(address, true));
  Status last = TERN_ERROR(kUnavailable, "no usable address for '", address, "'");
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    SetBuffers(fd, options);
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

std::string SocketAddress(int fd, bool peer) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len)
                : ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  if (rc != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
  ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
  port = ntohs(a->sin6_port);
  return "[" + std::string(host) + "]:" + std::to_string(port);
}

Result<int> ConnectSocket(const std::string& address, const TcpOptions& options,
                          uint64_t deadline_us, Clock& clock) {
  TERN_ASSIGN_OR_RETURN(addrinfo * res, Resolve(address, false));
  Status last = TERN_ERROR(kUnavailable, "no usable address for '", address, "'");
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    SetBuffers(fd, options);  // before connect, so the window scale fits
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

std::string TuneSocket(int fd, const TcpOptions& options) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  SetBuffers(fd, options);
  if (options.notsent_lowat_bytes != 0) {
    int lowat = static_cast<int>(std::min<uint64_t>(options.notsent_lowat_bytes, 1u << 30));
    ::setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, sizeof lowat);
  }
  if (!options.congestion.empty()) {
    // Silently keeps the default where the kernel lacks the module; the
    // caller reports what is in use.
    ::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, options.congestion.data(),
                 static_cast<socklen_t>(options.congestion.size()));
  }
  char name[32] = {0};
  socklen_t len = sizeof name - 1;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return "?";
  return std::string(name, strnlen(name, len));
}

}  // namespace tern::tcp
