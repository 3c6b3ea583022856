// The root's admin port is secure by default (docs/security.md, "The admin
// port"): no mutating route off loopback without a token and TLS, publishable paths
// confined to --publish-dir, a version far beyond HEAD refused unless forced.
// Real agents, real admin HTTP. So is its board in etcd ("The board in
// etcd"): TLS and an etcd user, nothing plain off loopback.
#include <gtest/gtest.h>

#include <filesystem>

#include "agent/testing/agent_test_fixture.h"
#include "agent/testing/etcd_test_server.h"
#include "tern/agent.h"
#include "tern/env.h"
#include "transport/test_certs.h"

namespace tern::agent_test {
namespace {

class AgentAdminTest : public AgentSystemFixture {};

std::string Slurp(const std::string& path) {
  std::string text;
  EXPECT_TRUE(ReadFileToString(DefaultEnv(), path, 64 << 10, &text).ok()) << path;
  return text;
}

TEST_F(AgentAdminTest, ARootRefusesAnAdminPortOffLoopbackWithoutATokenAndTls) {
  const testing::TestPki& pki = testing::TestCerts();
  ASSERT_TRUE(pki.ok) << pki.error;
  auto attempt = [&](const std::string& name, auto set) {
    AgentOptions o = BaseOptions(name);
    o.root = true;
    o.transport = NewTransportFor(name);
    o.admin_listen = "0.0.0.0:0";
    set(o);
    return Agent::Start(o);
  };
  auto expect_refused = [](const Result<std::unique_ptr<Agent>>& r, const char* why) {
    ASSERT_FALSE(r.ok()) << why;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().ToString();
    EXPECT_NE(r.status().message().find("--admin-insecure"), std::string::npos)
        << r.status().ToString();
  };
  expect_refused(attempt("root-bare", [](AgentOptions&) {}), "no admin token");
  // A token alone would cross the network in clear.
  expect_refused(attempt("root-token", [](AgentOptions& o) { o.admin_token = "s3cret"; }),
                 "--admin-tls-cert");
  // TLS alone would let anyone who reaches it publish.
  expect_refused(attempt("root-tls",
                         [&](AgentOptions& o) {
                           o.admin_tls_cert_pem = Slurp(pki.server.cert_file);
                           o.admin_tls_key_pem = Slurp(pki.server.key_file);
                         }),
                 "no admin token");

  // TLS material without an admin port is a mistake, not ignored.
  auto no_port = attempt("root-no-port", [&](AgentOptions& o) {
    o.admin_listen.clear();
    o.admin_tls_cert_pem = Slurp(pki.server.cert_file);
    o.admin_tls_key_pem = Slurp(pki.server.key_file);
  });
  ASSERT_FALSE(no_port.ok());
  EXPECT_NE(no_port.status().message().find("no admin address"), std::string::npos)
      << no_port.status().ToString();

  // With a token and TLS, or said to be insecure on purpose, it starts.
  auto both = attempt("root-both", [&](AgentOptions& o) {
    o.admin_token = "s3cret";
    o.admin_tls_cert_pem = Slurp(pki.server.cert_file);
    o.admin_tls_key_pem = Slurp(pki.server.key_file);
  });
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ((*both)->Snapshot().admin_address.rfind("https://0.0.0.0:", 0), 0u)
      << (*both)->Snapshot().admin_address;
  (*both)->Stop();
  for (bool token : {false, true}) {
    auto insecure = attempt(token ? "root-insecure-token" : "root-insecure", [&](AgentOptions& o) {
      o.admin_insecure = true;
      if (token) o.admin_token = "s3cret";
    });
    ASSERT_TRUE(insecure.ok()) << insecure.status().ToString();
    EXPECT_EQ((*insecure)->Snapshot().admin_address.rfind("0.0.0.0:", 0), 0u);
    (*insecure)->Stop();
  }
}

// The root's admin port over TLS with the token "t0ken"; with
// require_client_cert, mutual TLS against the test CA.
std::function<void(AgentOptions&)> TlsAdminRoot(const testing::TestPki& pki,
                                                bool require_client_cert) {
  return [&pki, require_client_cert](AgentOptions& o) {
    if (o.id != "root") return;
    o.admin_listen = "127.0.0.1:0";
    o.admin_token = "t0ken";
    o.admin_tls_cert_pem = Slurp(pki.server.cert_file);
    o.admin_tls_key_pem = Slurp(pki.server.key_file);
    if (require_client_cert) o.admin_tls_client_ca_pem = Slurp(pki.server.ca_file);
  };
}

// The admin port over TLS end to end: tern publish's path (PublishToRoot)
// with a token and the CA, members follow bit for bit; a wrong CA or no
// token changes nothing; plain HTTP to the port is refused in plain words.
TEST_F(AgentAdminTest, PublishOverTlsWithATokenReachesTheMembers) {
  const testing::TestPki& pki = testing::TestCerts();
  ASSERT_TRUE(pki.ok) << pki.error;
  tweak_ = TlsAdminRoot(pki, /*require_client_cert=*/false);
  StartRoot();
  StartMember("m1", "us");
  StartMember("m2", "us");
  const std::string admin = root_->Snapshot().admin_address;
  ASSERT_EQ(admin.rfind("https://127.0.0.1:", 0), 0u) << admin;
  AgentClientOptions c;
  c.token = "t0ken";
  c.ca_pem = Slurp(pki.server.ca_file);
  c.timeout_ms = 60000;

  const std::string step = NextStep();
  AgentClientOptions rogue = c;
  rogue.ca_pem = Slurp(pki.dir + "/rogue-ca.pem");
  Status wrong_ca = PublishToRoot(admin, step, 1, rogue);
  EXPECT_EQ(wrong_ca.code(), Code::kAuth) << wrong_ca.ToString();
  EXPECT_NE(wrong_ca.message().find("certificate was refused"), std::string::npos)
      << wrong_ca.ToString();
  AgentClientOptions no_token = c;
  no_token.token.clear();
  Status unauthenticated = PublishToRoot(admin, step, 1, no_token);
  EXPECT_EQ(unauthenticated.code(), Code::kAuth) << unauthenticated.ToString();
  EXPECT_NE(unauthenticated.message().find("401"), std::string::npos) << unauthenticated.ToString();
  const std::string plain_address = admin.substr(std::string("https://").size());
  AgentClientOptions plain_http = c;  // the token, no CA: what a plain client sends
  plain_http.ca_pem.clear();
  Status plain = PublishToRoot(plain_address, step, 1, plain_http);
  EXPECT_EQ(plain.code(), Code::kInvalidArgument) << plain.ToString();
  EXPECT_NE(plain.message().find("speaks TLS"), std::string::npos) << plain.ToString();
  EXPECT_EQ(root_->Snapshot().head, 0u);

  Status ok = PublishToRoot(admin, step, 1, c);
  ASSERT_TRUE(ok.ok()) << ok.ToString();
  EXPECT_EQ(root_->Snapshot().head, 1u);
  ASSERT_TRUE(AllServe(1)) << Lagging(1);
  ExpectBitwiseEqual(1);
  auto status = AgentStatusJson(admin, c);
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_NE(status->find("\"head\""), std::string::npos) << *status;
}

// Mutual TLS on the admin port (AgentOptions::admin_tls_client_ca_pem):
// tern publish's and tern status's paths need a client certificate the CA
// signed and still the token; refusals change nothing.
TEST_F(AgentAdminTest, AdminClientCertificatesAreRequiredWhenAClientCaIsSet) {
  const testing::TestPki& pki = testing::TestCerts();
  ASSERT_TRUE(pki.ok) << pki.error;
  tweak_ = TlsAdminRoot(pki, /*require_client_cert=*/true);
  StartRoot();
  StartMember("m1", "us");
  const std::string admin = root_->Snapshot().admin_address;
  AgentClientOptions c;
  c.token = "t0ken";
  c.ca_pem = Slurp(pki.server.ca_file);
  c.timeout_ms = 60000;
  const std::string step = NextStep();

  Status no_cert = PublishToRoot(admin, step, 1, c);
  EXPECT_EQ(no_cert.code(), Code::kAuth) << no_cert.ToString();
  EXPECT_NE(no_cert.message().find("requires a client certificate"), std::string::npos)
      << no_cert.ToString();
  EXPECT_EQ(AgentStatusJson(admin, c).status().code(), Code::kAuth);
  AgentClientOptions rogue = c;
  rogue.cert_pem = Slurp(pki.rogue_client.cert_file);
  rogue.key_pem = Slurp(pki.rogue_client.key_file);
  Status other_ca = PublishToRoot(admin, step, 1, rogue);
  EXPECT_EQ(other_ca.code(), Code::kAuth) << other_ca.ToString();
  EXPECT_NE(other_ca.message().find("refused our client certificate"), std::string::npos)
      << other_ca.ToString();
  AgentClientOptions cert_only = c;
  cert_only.cert_pem = Slurp(pki.client.cert_file);
  cert_only.key_pem = Slurp(pki.client.key_file);
  cert_only.token.clear();
  Status no_token = PublishToRoot(admin, step, 1, cert_only);
  EXPECT_EQ(no_token.code(), Code::kAuth) << no_token.ToString();
  EXPECT_NE(no_token.message().find("401"), std::string::npos) << no_token.ToString();
  EXPECT_EQ(root_->Snapshot().head, 0u);

  AgentClientOptions both = cert_only;
  both.token = "t0ken";
  Status ok = PublishToRoot(admin, step, 1, both);
  ASSERT_TRUE(ok.ok()) << ok.ToString();
  ASSERT_TRUE(AllServe(1)) << Lagging(1);
  ExpectBitwiseEqual(1);
  auto status = AgentStatusJson(admin, cert_only);  // a public read: the certificate is enough
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_NE(status->find("\"head\": 1"), std::string::npos) << *status;
}

// The board in etcd is secure by default too (docs/agent/etcd.md §1,
// "Security"): a plain endpoint off loopback is refused before any
// connection; a root reaches a TLS etcd with --client-cert-auth and auth
// enabled through AgentOptions' certificate and user, and publishes there; a
// root with the wrong password fails at start, naming why, instead of
// waiting as a standby.
TEST_F(AgentAdminTest, ARootReachesEtcdOverTlsAsAUserAndRefusesAnInsecureOne) {
  AgentOptions plain = BaseOptions("root-plain");
  plain.root = true;
  plain.transport = NewTransportFor("root-plain");
  plain.board_etcd = "etcd://10.0.0.1:2379/tern/x";
  auto refused = Agent::Start(plain);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("--etcd-insecure"), std::string::npos)
      << refused.status().ToString();

  agent::EtcdTestServerOptions so;
  so.tls = true;
  so.client_cert_auth = true;
  auto etcd = agent::EtcdTestServer::Start(so);
  if (etcd.status().code() == Code::kUnsupported) GTEST_SKIP() << etcd.status().ToString();
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  ASSERT_TRUE((*etcd)->AddUser("tern", "tern-password", "/tern/").ok());
  ASSERT_TRUE((*etcd)->EnableAuth("root-password").ok());
  auto read = [](const std::string& path) {
    std::string text;
    EXPECT_TRUE(ReadFileToString(DefaultEnv(), path, 64 << 10, &text).ok()) << path;
    return text;
  };
  auto root_options = [&](const std::string& name, const std::string& password) {
    AgentOptions o = BaseOptions(name);
    o.root = true;
    o.transport = NewTransportFor(name);
    o.board_etcd = "etcds://" + (*etcd)->host_port() + "/tern/secure";
    o.etcd_ca_pem = read((*etcd)->pki().ca_cert);
    o.etcd_cert_pem = read((*etcd)->pki().client_cert);
    o.etcd_key_pem = read((*etcd)->pki().client_key);
    o.etcd_user = "tern";
    o.etcd_password = password;
    o.etcd_lease_s = 2;
    return o;
  };
  auto root = Agent::Start(root_options("root", "tern-password"));
  ASSERT_TRUE(root.ok()) << root.status().ToString();
  ASSERT_TRUE((*root)->Publish(NextStep(), 1).ok());
  EXPECT_EQ((*root)->Snapshot().head, 1u);

  auto wrong = Agent::Start(root_options("root-wrong", "wrong-password"));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), Code::kAuth) << wrong.status().ToString();
  EXPECT_NE(wrong.status().message().find("wrong user or password"), std::string::npos)
      << wrong.status().ToString();
  EXPECT_EQ(wrong.status().message().find("wrong-password"), std::string::npos);
  (*root)->Stop();
}

TEST_F(AgentAdminTest, AMemberMayServeStatusOffLoopbackWithoutAToken) {
  // Members have no mutating route: /metrics and /status for a scraper.
  StartRoot();
  tweak_ = [](AgentOptions& o) { o.admin_listen = "0.0.0.0:0"; };
  StartMember("m1", "us");
  EXPECT_FALSE(members_["m1"].agent->Snapshot().admin_address.empty());
}

TEST_F(AgentAdminTest, PublishReadsOnlyUnderThePublishDirAndBoundsTheVersionJump) {
  const std::string inside = NextStep();  // under dir_/trace
  tweak_ = [this](AgentOptions& o) {
    if (o.id != "root") return;
    o.admin_listen = "127.0.0.1:0";
    o.admin_token = "t0ken";
    o.publish_dir = (dir_ / "trace").string();
    o.max_version_jump = 100;
  };
  StartRoot();
  const std::string admin = root_->Snapshot().admin_address;
  AgentClientOptions c;
  c.token = "t0ken";
  c.timeout_ms = 60000;

  // Outside the directory, also through a link that points out of it.
  namespace fs = std::filesystem;
  fs::create_directories(dir_ / "elsewhere");
  fs::copy(inside, dir_ / "elsewhere" / "ckpt", fs::copy_options::recursive);
  Status out = PublishToRoot(admin, (dir_ / "elsewhere" / "ckpt").string(), 1, c);
  EXPECT_EQ(out.code(), Code::kAuth) << out.ToString();
  EXPECT_NE(out.message().find("outside the publish directory"), std::string::npos)
      << out.ToString();
  fs::create_directory_symlink(dir_ / "elsewhere" / "ckpt", dir_ / "trace" / "link");
  out = PublishToRoot(admin, (dir_ / "trace" / "link").string(), 1, c);
  EXPECT_EQ(out.code(), Code::kAuth) << out.ToString();
  EXPECT_EQ(root_->Snapshot().head, 0u);

  // Far beyond HEAD: refused, then accepted when forced.
  Status far = PublishToRoot(admin, inside, 1000, c);
  EXPECT_EQ(far.code(), Code::kInvalidArgument) << far.ToString();
  EXPECT_NE(far.message().find("beyond HEAD"), std::string::npos) << far.ToString();
  EXPECT_EQ(root_->Snapshot().head, 0u);
  Status near = PublishToRoot(admin, inside, 100, c);
  EXPECT_TRUE(near.ok()) << near.ToString();
  EXPECT_EQ(root_->Snapshot().head, 100u);
  const std::string next = NextStep();
  c.force = true;
  Status forced = PublishToRoot(admin, next, 5000, c);
  EXPECT_TRUE(forced.ok()) << forced.ToString();
  EXPECT_EQ(root_->Snapshot().head, 5000u);
}

}  // namespace
}  // namespace tern::agent_test
