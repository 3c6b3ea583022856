#include "transport/tcp/pipe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/text.h"

namespace tern::tcp {

namespace {

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
    // kAuth for a verdict on a certificate: ours refusing the peer's
    // (check.failure) or the peer's alert refusing ours. A handshake cut
    // short, a record corrupted on the wire or a peer that does not speak
    // TLS is the link's: kUnavailable, as on an established connection
    // (PipeError), so that a relay is not taken for a liar.
    const bool verdict = !check.failure.empty() || IsTlsCertificateAlert(why);
    if (verdict) return TERN_ERROR(kAuth, "TLS handshake failed: ", why);
    return TERN_ERROR(kUnavailable, "TLS handshake failed: ", why);
  }
  pipe->RecordPeer();
  return std::unique_ptr<Pipe>(std::move(pipe));
}


std::string TuneSocket(int fd, const TcpOptions& options) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  net::SetSocketBuffers(fd, options.socket_buffer_bytes);
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
