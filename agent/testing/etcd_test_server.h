// A real etcd for tests: one member on 127.0.0.1, random free ports, a
// fresh data directory under $TMPDIR, output in <dir>/etcd.log. Shipped for
// the agent's tests (etcd and the lead's multi-agent tests), not for
// production.
//
//   auto server = EtcdTestServer::Start();
//   if (!server.ok() && server.status().code() == Code::kUnsupported)
//     GTEST_SKIP() << server.status().ToString();   // no etcd binary
//   EtcdOptions o; o.endpoints = {(*server)->endpoint()};
//
// The binary is $TERN_ETCD, else `etcd` on PATH; Start returns kUnsupported
// (and nothing else) when there is none, so a test can skip on exactly that.
// Every wait is bounded (start_timeout_ms). The destructor kills etcd
// (SIGKILL) and removes the data directory.
//
// With options.tls, etcd serves https with a certificate from a throwaway
// CA made at Start with the openssl CLI (pki(): the files, in <dir>/pki);
// with client_cert_auth it also requires a client certificate from that CA.
// AddUser and EnableAuth turn etcd's users on through its JSON API, as root.
//
// Thread safety: one thread drives a server; endpoint() is constant while
// running (Restart keeps the ports).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "tern/status.h"

namespace httplib {
class ClientImpl;
}

namespace tern::agent {

struct EtcdTestServerOptions {
  uint32_t start_timeout_ms = 15000;  // until /health answers
  // Raft ticks small enough for leases of 1-2 s (etcd's minimum lease TTL
  // is 1.5 election timeouts).
  uint32_t heartbeat_ms = 50;
  uint32_t election_ms = 250;
  // https on the client URL (--cert-file, --key-file, --trusted-ca-file);
  // client_cert_auth: etcd's --client-cert-auth (needs tls).
  bool tls = false;
  bool client_cert_auth = false;
  // etcd's --auth-token-ttl: an auth token unused this long is invalid
  // (0: etcd's default, 300 s).
  uint32_t auth_token_ttl_s = 0;
};

// PEM files made for a TLS server (each certificate's key beside it).
struct EtcdTestPki {
  std::string ca_cert;  // signed etcd's certificate; etcd trusts it for clients
  // Signed by ca_cert, no Common Name: what etcd's gateway accepts while its
  // auth is enabled (etcd 3.4 refuses a client certificate with a CN there).
  std::string client_cert, client_key;
  std::string cn_client_cert, cn_client_key;  // signed by ca_cert, CN=tern-client
  std::string other_ca_cert;                  // a CA that signed nothing of etcd's
  std::string other_client_cert, other_client_key;  // signed by other_ca_cert
};

class EtcdTestServer {
 public:
  static Result<std::unique_ptr<EtcdTestServer>> Start(EtcdTestServerOptions options = {});
  ~EtcdTestServer();
  EtcdTestServer(const EtcdTestServer&) = delete;
  EtcdTestServer& operator=(const EtcdTestServer&) = delete;

  // "127.0.0.1:<client port>" ("https://127.0.0.1:<port>" with tls), for
  // EtcdOptions::endpoints.
  std::string endpoint() const;
  // "127.0.0.1:<client port>".
  std::string host_port() const;
  const EtcdTestPki& pki() const { return pki_; }

  // Users (call AddUser before EnableAuth, or after it: then as root). A
  // role named after the user may read and write [prefix, prefix end);
  // empty prefix: no permission at all.
  Status AddUser(const std::string& name, const std::string& password, const std::string& prefix);
  // As root: sets the user's password (etcd drops the user's tokens).
  Status ChangePassword(const std::string& name, const std::string& password);
  // Creates root (with root_password) and enables etcd's auth.
  Status EnableAuth(const std::string& root_password);
  const std::string& data_dir() const { return dir_; }
  bool running() const { return pid_ > 0; }

  // SIGKILL (a crash) or SIGTERM (a clean stop), then waits for the exit.
  Status Kill();
  Status Stop();
  // Starts etcd again on the same ports and data (after Kill/Stop).
  Status Restart();

 private:
  EtcdTestServer(EtcdTestServerOptions options, std::string binary, std::string dir);
  Status Launch();
  Status WaitHealthy();
  Status Signal(int sig);
  Status MakePki();
  // An HTTP(S) client for etcd's client URL (with tls: trusting the CA,
  // presenting the client certificate).
  std::unique_ptr<httplib::ClientImpl> Http() const;
  // POSTs a JSON body to etcd's API (as root once auth is enabled); OK when
  // etcd answers 200 without an error.
  Status Api(const std::string& path, const std::string& body);

  EtcdTestServerOptions options_;
  std::string binary_;
  std::string dir_;
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
  EtcdTestPki pki_;
  std::string root_password_;  // set once auth is enabled
};

}  // namespace tern::agent
