// Who the TLS peer is, beyond "the CA signed it": a client refuses a server
// whose certificate does not name what it dialled (another host's
// certificate from the same CA, the client's own), checks IP SANs for an IP
// dial, honours pins; a server narrows its clients by name or pin. Every
// case runs the real backend on 127.0.0.1.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "base/loopback_testing.h"
#include "tern/connect.h"
#include "tern/tcp_transport.h"
#include "transport/tcp/raw_peer_testing.h"
#include "transport/tcp/tls_identity.h"
#include "transport/test_certs.h"

namespace tern::tcp {
namespace {

using namespace std::chrono_literals;

class TlsIdentity : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(testing::TestCerts().ok) << testing::TestCerts().error; }

  void TearDown() override { Reset(); }
  // Connections end before their transports.
  void Reset() {
    if (conn_) conn_->Close();
    conn_.reset();
    listener_.reset();
    client_.reset();
    server_.reset();
  }

  // Serves with `server`; the client dials 127.0.0.1 with `client` (the
  // connection, if any, in conn_).
  Status Dial(const TlsConfig& server, const TlsConfig& client) {
    Reset();
    TcpOptions o;
    o.streams = 2;
    o.handshake_timeout_ms = 20000;
    o.log = log_.Sink();
    TcpOptions c = o;
    c.log = [](std::string_view) {};
    o.tls = server;
    c.tls = client;
    TERN_ASSIGN_OR_RETURN(server_, NewTcpTransport(o));
    TERN_ASSIGN_OR_RETURN(client_, NewTcpTransport(c));
    TERN_ASSIGN_OR_RETURN(listener_,
                          server_->Listen("127.0.0.1:0", [](std::shared_ptr<Connection>) {
                            return ConnectionHandlers{};
                          }));
    // A refusal comes at once: one attempt, a deadline that load cannot hit.
    TERN_ASSIGN_OR_RETURN(
        conn_, ConnectWait(*client_, listener_->address(), {}, 30000, RetryPolicy{1, 10, 10}));
    return Status::Ok();
  }

  static TlsConfig Mint(const std::string& name, const std::string& sans,
                        const std::string& eku = "") {
    auto c = testing::MintCert(name, sans, eku);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? *c : TlsConfig{};
  }
  static std::string Pin(const TlsConfig& who) {
    auto p = testing::CertSha256(who.cert_file);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? *p : std::string();
  }

  const testing::TestPki& pki_ = testing::TestCerts();
  // Before the transports, whose log it is (TearDown resets them first anyway).
  testpeer::LogCapture log_;
  std::unique_ptr<Transport> server_, client_;
  std::unique_ptr<Listener> listener_;
  std::shared_ptr<Connection> conn_;
};

void ExpectRefused(const Status& st, const std::string& why) {
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Code::kAuth) << st.ToString();
  EXPECT_NE(st.message().find(why), std::string::npos) << st.ToString();
}

TEST_F(TlsIdentity, RightServerIsAccepted) {
  Status st = Dial(pki_.server, pki_.client);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(conn_->capabilities() & kCapEncrypted);
}

TEST_F(TlsIdentity, AnotherHostsCertificateFromTheSameCaIsRefused) {
  const TlsConfig other = Mint("other-host", "DNS:other.tern.test,IP:10.9.8.7", "serverAuth");
  ExpectRefused(Dial(other, pki_.client),
                "does not name 127.0.0.1 (it names DNS:other.tern.test, IP:10.9.8.7)");
}

TEST_F(TlsIdentity, TheClientsOwnCertificateIsRefused) {
  ExpectRefused(Dial(pki_.client, pki_.client),
                "does not name 127.0.0.1 (it names DNS:client.tern.test)");
}

// Dialled by IP, only an IP SAN counts: a certificate for "localhost" alone
// does not name 127.0.0.1; one with IP:127.0.0.1 does.
TEST_F(TlsIdentity, AnIpDialChecksTheIpSan) {
  ExpectRefused(Dial(Mint("dns-only", "DNS:localhost"), pki_.client), "does not name 127.0.0.1");
  Status c = Dial(Mint("ip-only", "IP:127.0.0.1"), pki_.client);
  EXPECT_TRUE(c.ok()) << c.ToString();
}

// An explicit name replaces the dialled host: the DNS SAN is checked.
TEST_F(TlsIdentity, AnExpectedNameIsCheckedAgainstDnsSans) {
  TlsConfig client = pki_.client;
  client.server_name = "other.tern.test";
  Status c = Dial(Mint("other-host", "DNS:other.tern.test,IP:10.9.8.7", "serverAuth"), client);
  EXPECT_TRUE(c.ok()) << c.ToString();
  client.server_name = "third.tern.test";
  ExpectRefused(Dial(pki_.server, client), "does not name third.tern.test");
}

// RFC 6125: the subject's CN is not a name (certificates must carry SANs).
TEST_F(TlsIdentity, TheCommonNameIsNotConsulted) {
  TlsConfig client = pki_.client;
  client.server_name = "localhost";
  ExpectRefused(Dial(Mint("localhost", ""), client), "no DNS or IP name; subject /CN=localhost");
}

// OpenSSL's purpose check: a certificate limited to clientAuth cannot serve,
// whatever names it holds.
TEST_F(TlsIdentity, AClientOnlyCertificateCannotServe) {
  ExpectRefused(Dial(Mint("client-eku", "IP:127.0.0.1", "clientAuth"), pki_.client),
                "unsuitable certificate purpose");
}

TEST_F(TlsIdentity, APinMismatchIsRefused) {
  TlsConfig client = pki_.client;
  client.peer_sha256 = {Pin(pki_.other_client)};
  const std::string presented = Pin(pki_.server).substr(7);
  ExpectRefused(Dial(pki_.server, client),
                "has fingerprint sha256:" + presented + ", which is not pinned");
}

TEST_F(TlsIdentity, AGoodPinPasses) {
  TlsConfig client = pki_.client;
  // One of several (rotation), in openssl's "AB:CD:..." spelling.
  std::string hex = Pin(pki_.server).substr(7);
  std::string colons;
  for (size_t i = 0; i < hex.size(); i += 2) colons += (i ? ":" : "") + hex.substr(i, 2);
  for (auto& ch : colons) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  client.peer_sha256 = {Pin(pki_.other_client), "sha256:" + colons};
  Status c = Dial(pki_.server, client);
  EXPECT_TRUE(c.ok()) << c.ToString();
}

// A pin is checked in addition to the name, not instead of it.
TEST_F(TlsIdentity, APinDoesNotExcuseAWrongName) {
  TlsConfig client = pki_.client;
  client.peer_sha256 = {Pin(pki_.other_client)};
  ExpectRefused(Dial(pki_.other_client, client), "does not name 127.0.0.1");
}

TEST_F(TlsIdentity, AServerMayAllowOnlyNamedClients) {
  TlsConfig server = pki_.server;
  server.client_names = {"client.tern.test", "10.1.1.1"};
  Status c = Dial(server, pki_.client);
  EXPECT_TRUE(c.ok()) << c.ToString();
  Status refused = Dial(server, pki_.other_client);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.code(), Code::kAuth) << refused.ToString();
  EXPECT_NE(refused.message().find("the server refused our TLS certificate"), std::string::npos)
      << refused.ToString();
  EXPECT_TRUE(log_.Has(
      "names DNS:other-client.tern.test: none of the allowed clients (client.tern.test, 10.1.1.1)"))
      << log_.Text();
}

TEST_F(TlsIdentity, AServerMayPinItsClients) {
  TlsConfig server = pki_.server;
  server.peer_sha256 = {Pin(pki_.client)};
  Status c = Dial(server, pki_.client);
  EXPECT_TRUE(c.ok()) << c.ToString();
  Status refused = Dial(server, pki_.other_client);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.code(), Code::kAuth) << refused.ToString();
  EXPECT_TRUE(log_.Has("which is not pinned")) << log_.Text();
}

TEST_F(TlsIdentity, MalformedNamesAndPinsAreRefusedAtLoad) {
  struct Case {
    void (*set)(TlsConfig&);
    const char* why;
  } cases[] = {
      {[](TlsConfig& t) { t.peer_sha256 = {"sha256:abcd"}; }, "want sha256:<64 hex digits>"},
      {[](TlsConfig& t) { t.peer_sha256 = {std::string(64, 'a')}; }, "want sha256:<64 hex digits>"},
      {[](TlsConfig& t) { t.peer_sha256 = {"sha256:" + std::string(63, 'a') + "g"}; },
       "want sha256"},
      {[](TlsConfig& t) { t.server_name = "bad name"; }, "want a DNS name or an IP address"},
      {[](TlsConfig& t) { t.server_name = "*.tern.test"; }, "want a DNS name or an IP address"},
      {[](TlsConfig& t) { t.client_names = {""}; }, "want a DNS name or an IP address"},
      {[](TlsConfig& t) { t.client_names.assign(kMaxTlsNames + 1, "a"); }, "more than 64"},
  };
  for (const Case& k : cases) {
    TcpOptions o;
    o.tls = pki_.client;
    k.set(o.tls);
    auto t = NewTcpTransport(o);
    ASSERT_FALSE(t.ok()) << k.why;
    EXPECT_EQ(t.status().code(), Code::kInvalidArgument);
    EXPECT_NE(t.status().message().find(k.why), std::string::npos) << t.status().ToString();
  }
  auto pin = ParseSha256Pin("sha256:" + std::string(64, 'F'));
  ASSERT_TRUE(pin.ok());
  EXPECT_EQ(*pin, std::string(32, '\xff'));
}

// A port that does not speak TLS fails the client's handshake with
// kUnavailable, not kAuth: no certificate was judged, and the agent's relay
// reads kAuth from a parent as evidence against it (docs/transport.md).
TEST_F(TlsIdentity, APlainPortFailsTheHandshakeAsTheLinksFault) {
  testnet::LoopbackListener listener;
  ASSERT_TRUE(listener.ok());
  TcpOptions o;
  o.streams = 1;
  o.handshake_timeout_ms = 20000;
  o.log = [](std::string_view) {};
  o.tls = pki_.client;
  auto client = NewTcpTransport(o);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  // Answers every stream's ClientHello with a plain HTTP reply and closes.
  std::thread plain([fd = listener.fd()] {
    for (int i = 0; i < 2; ++i) {
      const int c = ::accept(fd, nullptr, nullptr);
      if (c < 0) return;
      char sink[4096];
      (void)!::recv(c, sink, sizeof sink, 0);
      static const char kReply[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
      (void)!::send(c, kReply, sizeof kReply - 1, MSG_NOSIGNAL);
      ::close(c);
    }
  });
  auto c = ConnectWait(**client, listener.address(), {}, 30000, RetryPolicy{1, 10, 10});
  ::shutdown(listener.fd(), SHUT_RDWR);
  plain.join();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kUnavailable) << c.status().ToString();
  EXPECT_NE(c.status().message().find("TLS handshake failed"), std::string::npos)
      << c.status().ToString();
}

}  // namespace
}  // namespace tern::tcp
