// The etcd client over TLS and as an etcd user, against a real etcd with
// https, --client-cert-auth and auth enabled (agent/testing/etcd_test_server.h
// makes the certificates); skipped only when there is no etcd binary. Also
// the client's secure-by-default rule, which needs no etcd.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "agent/etcd/etcd.h"
#include "agent/etcd/etcd_board_log.h"
#include "agent/testing/etcd_test_server.h"
#include "base/loopback_testing.h"
#include "tern/clock.h"
#include "tern/version_manifest.h"

namespace tern::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  EXPECT_TRUE(in.good() || in.eof()) << path;
  return s.str();
}

// Expects `status` to be `code` with every one of `words` in its message.
void ExpectError(const Status& status, Code code, std::initializer_list<const char*> words) {
  if (std::getenv("TERN_SHOW_ERRORS")) std::printf("  -> %s\n", status.ToString().c_str());
  EXPECT_EQ(status.code(), code) << status.ToString();
  for (const char* w : words) {
    EXPECT_NE(status.message().find(w), std::string::npos) << "'" << w << "' not in "
                                                           << status.ToString();
  }
}

// A client for options that Create accepts (the request is what fails).
std::unique_ptr<EtcdClient> Client(const EtcdOptions& o) {
  auto c = EtcdClient::Create(o);
  if (!c.ok()) {
    ADD_FAILURE() << c.status().ToString();
    std::abort();  // the test cannot go on without it
  }
  return std::move(*c);
}

size_t CountOf(const std::string& text, const std::string& word) {
  size_t n = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) ++n;
  return n;
}

// Collects log lines (the client logs re-authentication).
struct LogSink {
  std::mutex mu;
  std::string text;
  LogFn Fn() {
    return [this](std::string_view line) {
      std::lock_guard<std::mutex> lock(mu);
      text += std::string(line) + "\n";
    };
  }
  std::string Get() {
    std::lock_guard<std::mutex> lock(mu);
    return text;
  }
};

TEST(EtcdSecurityTest, RefusesInsecureEndpointsOffLoopbackUnlessInsecure) {
  EtcdOptions o;
  o.endpoints = {"http://10.0.0.1:2379"};
  ExpectError(EtcdClient::Create(o).status(), Code::kInvalidArgument,
              {"plain http off loopback", "--etcd-insecure"});
  o.user = "tern";
  o.password = "secret-password";
  ExpectError(EtcdClient::Create(o).status(), Code::kInvalidArgument, {"plain http off loopback"});
  o.insecure = true;
  EXPECT_TRUE(EtcdClient::Create(o).ok());  // said so: allowed (the password travels in clear)

  // TLS off loopback, but nobody authenticates.
  o = {};
  o.endpoints = {"https://etcd.example:2379"};
  ExpectError(EtcdClient::Create(o).status(), Code::kInvalidArgument,
              {"does not authenticate", "--etcd-cert", "--etcd-user"});
  o.user = "tern";
  o.password = "secret-password";
  EXPECT_TRUE(EtcdClient::Create(o).ok());
  // One bad endpoint among good ones is enough to refuse.
  o.endpoints = {"https://etcd.example:2379", "http://10.0.0.2:2379"};
  ExpectError(EtcdClient::Create(o).status(), Code::kInvalidArgument, {"10.0.0.2:2379"});

  // Loopback: plain and unauthenticated stays allowed (tests, one machine).
  for (const char* local : {"127.0.0.1:2379", "http://localhost:2379", "http://[::1]:2379"}) {
    o = {};
    o.endpoints = {local};
    EXPECT_TRUE(EtcdClient::Create(o).ok()) << local;
  }

  // TLS files with a plain endpoint: a mistake, refused even on loopback.
  o = {};
  o.endpoints = {"127.0.0.1:2379"};
  o.ca_pem = "-----BEGIN CERTIFICATE-----\n";
  ExpectError(EtcdClient::Create(o).status(), Code::kInvalidArgument, {"plain http", "https://"});

  // A user needs a password and the other way round; neither is echoed.
  o = {};
  o.endpoints = {"127.0.0.1:2379"};
  o.user = "tern";
  ExpectError(EtcdClient::Create(o).status(), Code::kInvalidArgument, {"password"});
  o.user.clear();
  o.password = "secret-password";
  auto refused = EtcdClient::Create(o);
  ExpectError(refused.status(), Code::kInvalidArgument, {"user"});
  EXPECT_EQ(refused.status().message().find("secret-password"), std::string::npos);
  o.user = std::string(300, 'u');
  ExpectError(EtcdClient::Create(o).status(), Code::kInvalidArgument, {"user name"});
  o.user = "tern";
  o.password = std::string(5000, 'p');
  ExpectError(EtcdClient::Create(o).status(), Code::kInvalidArgument, {"password"});

  // The board URL is syntax; the rule applies where the client is made.
  auto url = ParseEtcdBoardUrl("etcd://10.0.0.1:2379/tern/main");
  ASSERT_TRUE(url.ok()) << url.status().ToString();
  o = {};
  o.endpoints = url->endpoints;
  ExpectError(EtcdClient::Create(o).status(), Code::kInvalidArgument, {"plain http off loopback"});
}

// A fake gateway with etcd's auth: the client sends its token with every
// request, renews it once when told it is invalid (never loops), and
// refuses a token that could not go into a header.
TEST(EtcdSecurityTest, TokensFromTheGatewayAreCheckedAndRenewedAtMostOnce) {
  httplib::Server fake;
  std::mutex mu;
  int authentications = 0;
  int requests = 0;
  std::string token = "tok-1";  // what authenticate hands out
  bool always_invalid = false;
  std::string seen_password;
  fake.Post("/v3/auth/authenticate", [&](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu);
    ++authentications;
    seen_password = req.body;
    res.set_content(R"({"header":{},"token":")" + token + R"("})", "application/json");
  });
  fake.Post("/v3/kv/range", [&](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu);
    ++requests;
    if (always_invalid || req.get_header_value("Authorization") != token) {
      res.status = 401;
      res.set_content(R"({"error":"etcdserver: invalid auth token","code":16})",
                      "application/json");
      return;
    }
    res.set_content(R"({"header":{"revision":"1"}})", "application/json");
  });
  fake.set_keep_alive_timeout(1);
  const int port = fake.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread serve([&] { fake.listen_after_bind(); });
  const auto until = steady_clock::now() + milliseconds(5000);
  while (!fake.is_running() && steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  LogSink sink;
  EtcdOptions o;
  o.endpoints = {"127.0.0.1:" + std::to_string(port)};
  o.user = "tern";
  o.password = "fake-password";
  o.log = sink.Fn();
  auto c = Client(o);

  EXPECT_TRUE(c->Get("/k").ok());
  EXPECT_TRUE(c->Get("/k").ok());
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(authentications, 1);  // one token for both requests
    EXPECT_NE(seen_password.find("fake-password"), std::string::npos);
    token = "tok-2";  // the server forgot tok-1
  }
  EXPECT_TRUE(c->Get("/k").ok());
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(authentications, 2);
    always_invalid = true;
    requests = 0;
  }
  // A server that refuses every token: one renewal, then the error.
  ExpectError(c->Get("/k").status(), Code::kAuth, {"invalid auth token"});
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(authentications, 3);
    EXPECT_EQ(requests, 2);
    always_invalid = false;
  }
  // Tokens that cannot go into a header, or too long: refused.
  for (const std::string& bad : {std::string("tok\\r\\nX-Evil: 1"), std::string("a b"),
                                std::string(5000, 't'), std::string()}) {
    {
      std::lock_guard<std::mutex> lock(mu);
      token = bad;
    }
    auto fresh = Client(o);
    ExpectError(fresh->Get("/k").status(), Code::kProtocol, {"no usable token"});
  }
  const std::string log = sink.Get();
  EXPECT_NE(log.find("no longer valid"), std::string::npos) << log;
  EXPECT_EQ(log.find("fake-password"), std::string::npos) << log;
  EXPECT_EQ(log.find("tok-1"), std::string::npos) << log;
  fake.stop();
  serve.join();
}

// A TLS handshake that never completes ends within the request deadline.
TEST(EtcdSecurityTest, AStalledTlsHandshakeEndsWithinTheDeadline) {
  testnet::LoopbackListener listener(4);  // the kernel accepts; nobody ever answers
  ASSERT_TRUE(listener.ok());
  EtcdOptions o;
  o.endpoints = {"https://" + listener.address()};
  o.timeout_ms = 500;
  auto c = Client(o);
  const auto start = steady_clock::now();
  auto r = c->Get("/k");
  const auto took = steady_clock::now() - start;
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().ToString();
  EXPECT_LT(took, milliseconds(2500));
}

#define START_ETCD(var, options)                                                  \
  auto var##_started = EtcdTestServer::Start(options);                            \
  if (!var##_started.ok() && var##_started.status().code() == Code::kUnsupported) \
    GTEST_SKIP() << var##_started.status().ToString();                            \
  ASSERT_TRUE(var##_started.ok()) << var##_started.status().ToString();           \
  EtcdTestServer& var = **var##_started

EtcdOptions TlsOptions(const EtcdTestServer& server) {
  EtcdOptions o;
  o.endpoints = {server.endpoint()};
  o.timeout_ms = 3000;
  o.ca_pem = Slurp(server.pki().ca_cert);
  o.cert_pem = Slurp(server.pki().client_cert);
  o.key_pem = Slurp(server.pki().client_key);
  o.log = [](std::string_view) {};
  return o;
}

// The board log and the election, end to end with these options.
void ExpectBoardAndElectionWork(const EtcdOptions& o, const std::string& prefix) {
  EtcdBoardLogOptions lo;
  lo.prefix = prefix + "/board";
  auto log = EtcdBoardLog::Open(o, lo);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  BoardId id{};
  id[0] = 7;
  auto got = (*log)->InitId(id);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, id);
  ASSERT_TRUE((*log)->Append({0, 1}, 0, std::string(100, 'm'), true, {0, 0}).ok());
  auto all = (*log)->LoadAll();
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->size(), 1u);
  EXPECT_EQ(*(*log)->Head(), 1u);

  ElectionOptions eo;
  eo.prefix = prefix;
  eo.id = "root-a";
  eo.lease_ttl_s = 2;
  auto election = Election::Campaign(o, eo, SteadyClock(), 5000);
  ASSERT_TRUE(election.ok()) << election.status().ToString();
  EXPECT_TRUE((*election)->IsLeader());
  auto reader = EtcdClient::Create(o);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ(*Election::Leader(**reader, prefix), "root-a");
  // A fenced append under this leadership.
  (*log)->SetFence((*election)->Fence());
  EXPECT_TRUE((*log)->Append({0, 2}, 0, std::string(100, 'n'), true, {0, 1}).ok());
  ASSERT_TRUE((*election)->Resign().ok());
  EXPECT_EQ(*Election::Leader(**reader, prefix), "");
}

// etcd with https and --client-cert-auth, without users.
TEST(EtcdTlsTest, BoardAndElectionWorkWithAClientCertificateAndEachMistakeIsNamed) {
  EtcdTestServerOptions so;
  so.tls = true;
  so.client_cert_auth = true;
  START_ETCD(server, so);
  const EtcdOptions good = TlsOptions(server);
  ExpectBoardAndElectionWork(good, "/tern/tls");

  // A CA that did not sign etcd's certificate.
  EtcdOptions o = good;
  o.ca_pem = Slurp(server.pki().other_ca_cert);
  ExpectError(Client(o)->Get("/k").status(), Code::kAuth,
              {"certificate was refused", "--etcd-cacert"});
  // The system's trust store does not know the test CA either.
  o.ca_pem.clear();
  ExpectError(Client(o)->Get("/k").status(), Code::kAuth,
              {"certificate was refused", "system's trust store"});

  // The right CA, but a name etcd's certificate does not hold: the same
  // 127.0.0.1, dialled as an IPv4-mapped IPv6 address (its SAN says
  // IP:127.0.0.1 and DNS:localhost only).
  o = good;
  o.endpoints = {"https://[::ffff:" + server.host_port().substr(0, server.host_port().find(':')) +
                 "]" + server.host_port().substr(server.host_port().find(':'))};
  ExpectError(Client(o)->Get("/k").status(), Code::kAuth, {"certificate was refused", "name"});

  // No client certificate: etcd refuses the handshake.
  o = good;
  o.cert_pem.clear();
  o.key_pem.clear();
  auto no_cert = Client(o)->Get("/k").status();
  ExpectError(no_cert, no_cert.code(), {});
  EXPECT_FALSE(no_cert.ok());
  EXPECT_NE(no_cert.message().find("client certificate"), std::string::npos) << no_cert.ToString();

  // A client certificate from a CA etcd does not trust.
  o = good;
  o.cert_pem = Slurp(server.pki().other_client_cert);
  o.key_pem = Slurp(server.pki().other_client_key);
  auto foreign = Client(o)->Get("/k").status();
  ExpectError(foreign, foreign.code(), {});
  EXPECT_FALSE(foreign.ok());
  EXPECT_NE(foreign.message().find("client certificate"), std::string::npos) << foreign.ToString();

  // A user given to an etcd whose auth is off: said, not silently ignored.
  o = good;
  o.user = "tern";
  o.password = "tern-password";
  ExpectError(Client(o)->Get("/k").status(), Code::kAuth,
              {"user 'tern' given, but etcd does not check users"});

  // Plain http to etcd's TLS port.
  o = {};
  o.endpoints = {"http://" + server.host_port()};
  o.timeout_ms = 2000;
  const auto start = steady_clock::now();
  auto plain = Client(o)->Get("/k").status();
  EXPECT_EQ(plain.code(), Code::kUnavailable) << plain.ToString();
  EXPECT_NE(plain.message().find("https://"), std::string::npos) << plain.ToString();
  EXPECT_LT(steady_clock::now() - start, milliseconds(4000));  // within the deadline

  // Bad material is refused before anything is sent.
  o = good;
  o.ca_pem = "not a certificate";
  ExpectError(EtcdClient::Create(o).status(), Code::kInvalidArgument, {"--etcd-cacert"});
  o = good;
  o.key_pem = Slurp(server.pki().other_client_key);
  ExpectError(EtcdClient::Create(o).status(), Code::kInvalidArgument, {"does not match"});
  o = good;
  o.key_pem.clear();
  ExpectError(EtcdClient::Create(o).status(), Code::kInvalidArgument, {"both"});
  // A passphrase-protected key is refused, never prompted for.
  const std::string encrypted = server.data_dir() + "/pki/client-encrypted.key";
  ASSERT_EQ(std::system(("openssl pkey -in " + server.pki().client_key +
                         " -aes256 -passout pass:x -out " + encrypted + " >/dev/null 2>&1")
                            .c_str()),
            0);
  o = good;
  o.key_pem = Slurp(encrypted);
  ExpectError(EtcdClient::Create(o).status(), Code::kInvalidArgument, {"unencrypted"});
  o = good;
  o.cert_pem = std::string(65 << 10, 'x');
  ExpectError(EtcdClient::Create(o).status(), Code::kInvalidArgument, {"PEM of"});
}

// etcd with https, --client-cert-auth and users: the deployment the docs
// recommend.
TEST(EtcdTlsTest, BoardAndElectionWorkAsAUserAndEachRefusalIsNamed) {
  EtcdTestServerOptions so;
  so.tls = true;
  so.client_cert_auth = true;
  so.auth_token_ttl_s = 2;
  START_ETCD(server, so);
  ASSERT_TRUE(server.AddUser("tern", "tern-password", "/tern/").ok());
  ASSERT_TRUE(server.AddUser("stranger", "stranger-password", "/elsewhere/").ok());
  ASSERT_TRUE(server.EnableAuth("root-password").ok());

  EtcdOptions good = TlsOptions(server);
  good.user = "tern";
  good.password = "tern-password";
  ExpectBoardAndElectionWork(good, "/tern/auth");

  // Wrong password: named, and the password is in no message.
  EtcdOptions o = good;
  o.password = "wrong-password";
  auto wrong = Client(o)->Put("/tern/k", "v").status();
  ExpectError(wrong, Code::kAuth, {"user 'tern'", "wrong user or password"});
  EXPECT_EQ(wrong.message().find("wrong-password"), std::string::npos);

  // A user whose role does not cover the board's prefix.
  o = good;
  o.user = "stranger";
  o.password = "stranger-password";
  ExpectError(Client(o)->Put("/tern/k", "v").status(), Code::kAuth,
              {"user 'stranger' has no permission"});
  EtcdBoardLogOptions lo;
  lo.prefix = "/tern/auth/board";
  ExpectError(EtcdBoardLog::Open(o, lo).status(), Code::kAuth, {"no permission"});
  ElectionOptions eo;
  eo.prefix = "/tern/auth";
  eo.id = "intruder";
  ExpectError(Election::Campaign(o, eo, SteadyClock(), 1000).status(), Code::kAuth,
              {"no permission"});

  // No user at all: etcd's auth wants one.
  o = good;
  o.user.clear();
  o.password.clear();
  ExpectError(Client(o)->Put("/tern/k", "v").status(), Code::kAuth,
              {"gave no user", "--etcd-user"});

  // etcd's gateway refuses a client certificate with a Common Name here.
  o = good;
  o.cert_pem = Slurp(server.pki().cn_client_cert);
  o.key_pem = Slurp(server.pki().cn_client_key);
  ExpectError(Client(o)->Put("/tern/k", "v").status(), Code::kAuth,
              {"Common Name"});
}

// etcd drops a token unused for --auth-token-ttl, and every token of a user
// whose password changes: the client authenticates again on its own, says
// so in its log, and never logs a secret.
TEST(EtcdTlsTest, AnExpiredOrRevokedTokenIsRenewedTransparently) {
  EtcdTestServerOptions so;
  so.tls = true;
  so.client_cert_auth = true;
  so.auth_token_ttl_s = 1;
  START_ETCD(server, so);
  ASSERT_TRUE(server.AddUser("tern", "tern-password", "/tern/").ok());
  ASSERT_TRUE(server.EnableAuth("root-password").ok());
  LogSink sink;
  EtcdOptions o = TlsOptions(server);
  o.user = "tern";
  o.password = "tern-password";
  o.log = sink.Fn();
  auto client = EtcdClient::Create(o);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_TRUE((*client)->Put("/tern/renew", "1").ok());
  EXPECT_EQ(sink.Get().find("no longer valid"), std::string::npos) << sink.Get();
  // etcd checks token TTLs once a second.
  std::this_thread::sleep_for(milliseconds(3000));
  auto put = (*client)->Put("/tern/renew", "2");
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  auto got = (*client)->Get("/tern/renew");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->kvs.size(), 1u);
  EXPECT_EQ(got->kvs[0].value, "2");
  const std::string log = sink.Get();
  EXPECT_NE(log.find("no longer valid"), std::string::npos) << log;
  EXPECT_EQ(log.find("tern-password"), std::string::npos) << log;

  // Revoked: a password change drops the user's tokens at once.
  ASSERT_TRUE(server.ChangePassword("tern", "tern-password").ok());
  auto after = (*client)->Put("/tern/renew", "3");
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_GE(CountOf(sink.Get(), "no longer valid"), 2u) << sink.Get();
}

}  // namespace
}  // namespace tern::agent
